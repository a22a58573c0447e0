"""How alike two calls' arguments are (`argument_similarity`) and which examples `select_examples` shows, pinned by
hand-computed cases of their docstrings: shared argument values count twice as much as shared argument names
(Jaccard of each); among equally similar examples the shortest, or the one nearest the median size of those tied
(the lower middle of an even count; then the shorter), then the lexically first. The builder-against-server parity
test (test_few_shot_parity.py) cannot catch a wrong rule: both sides call the same function."""

import json

import pytest

from mirrorapi.few_shot import argument_similarity, select_examples


@pytest.mark.parametrize(
    "first, second, expected",
    [
        # every name and value shared: 2 x 1 + 1
        ({"a": 1, "b": 2}, {"a": 1, "b": 2}, 3.0),
        # the same name, another value: values 0/2, names 1/1
        ({"a": 1}, {"a": 2}, 1.0),
        # one value of two shared: values 1/3 ({a=1, b=2, b=3}), names 2/2
        ({"a": 1, "b": 2}, {"a": 1, "b": 3}, 2 * 1 / 3 + 1),
        # one of four values shared, one more name: values 1/4, names 2/3
        ({"a": 1, "b": 2}, {"a": 1, "b": 0, "c": 0}, 2 * 1 / 4 + 2 / 3),
        # the same value under another name shares nothing
        ({"a": 1}, {"b": 1}, 0.0),
        # a nested value is one value: shared whole or not at all
        ({"a": [1, 2], "b": "x"}, {"a": [1, 2], "b": "y"}, 2 * 1 / 3 + 1),
        ({"a": [1, 2]}, {"a": [1, 3]}, 1.0),
    ],
)
def test_values_count_twice_as_much_as_names(first, second, expected):
    assert argument_similarity(first, second) == pytest.approx(expected)
    assert argument_similarity(second, first) == pytest.approx(expected)


def _candidate(arguments: dict, response: str) -> tuple[str, str]:
    return json.dumps(arguments, sort_keys=True), json.dumps({"error": "", "response": response})


def _shown(candidates, arguments, k=1, ties="shortest"):
    return [
        (args, observation["response"])
        for args, observation in select_examples(candidates, arguments, k, char_budget=100_000, ties=ties)
    ]


def test_a_shared_value_outweighs_a_shared_name():
    """Two of four values (and their names) shared against every name and no value: 2 x 2/5 + 2/5 = 1.2 against
    1.0; were values weighed as names, 0.8 against 1.0 would show the other call."""
    call = {"a": 1, "b": 2, "c": 3, "d": 4}
    values = _candidate({"a": 1, "b": 2, "e": 0}, "two values")
    names = _candidate({"a": 9, "b": 9, "c": 9, "d": 9}, "every name")
    assert _shown([names, values], call) == [({"a": 1, "b": 2, "e": 0}, "two values")]
    assert _shown([values, names], call, k=2) == [
        ({"a": 1, "b": 2, "e": 0}, "two values"),
        ({"a": 9, "b": 9, "c": 9, "d": 9}, "every name"),
    ]


# Four examples equally similar to {"q": "x"} (the name shared, not the value), of responses of 60, 30, 10 and 20
# characters: the lexical order is not the order of size. And one more similar example, the longest of all.
SIZES = {"a": 60, "b": 30, "c": 10, "d": 20}
TIED = [_candidate({"q": letter}, letter * size) for letter, size in SIZES.items()]
CLOSER = _candidate({"q": "x", "page": 2}, "x" * 100)


def _order(candidates, ties):
    return "".join(response[0] for _, response in _shown(candidates, {"q": "x"}, k=len(candidates), ties=ties))


def test_ties_go_to_the_shortest():
    assert _order(TIED + [CLOSER], "shortest") == "xcdba"


def test_ties_go_to_the_median_size_the_lower_middle_of_an_even_count():
    # sizes 10, 20, 30, 60: the lower middle is 20 ("d"); then 10 ("c") and 30 ("b"), 10 away each: the shorter first
    assert _order(TIED + [CLOSER], "median") == "xdcba"
    # an odd count, 20, 30, 60 ("c" left out): the middle is 30 ("b"), then 20 ("d", 10 away), then 60
    assert _order([c for c in TIED if '"c"' not in c[0]], "median") == "bda"


@pytest.mark.parametrize("ties", ["shortest", "median"])
def test_equal_sizes_go_to_the_lexically_first(ties):
    same_size = [_candidate({"q": letter}, "r" * 10) for letter in "zmb"]
    assert _shown(same_size, {"q": "x"}, k=3, ties=ties) == [
        ({"q": "b"}, "r" * 10),
        ({"q": "m"}, "r" * 10),
        ({"q": "z"}, "r" * 10),
    ]


def test_the_call_itself_is_never_its_own_example():
    assert _shown([_candidate({"q": "x"}, "itself"), _candidate({"q": "y"}, "other")], {"q": "x"}, k=2) == [
        ({"q": "y"}, "other")
    ]
