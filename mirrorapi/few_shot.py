"""Few-shot examples for the simulator: one choice, used by the server and by the SFT data builder."""

from __future__ import annotations

import functools
import heapq
import json
from collections.abc import Iterable

from mirrorapi.records import canonical_json

# Candidates read per API when choosing few-shot examples (bounds the cost of a miss).
FEW_SHOT_CANDIDATES = 256
SHRINK_MARK = "..."  # the end of a string cut by `shrink_response`
# Which of the examples equally similar to a call is shown first (`select_examples`): the shortest, or the one
# nearest the median size of those tied. The shortest of many equally similar calls is often an atypical answer
# (an empty result, an error); measured in docs/training.md ("Served, and which example a prompt shows").
FEW_SHOT_TIES = ("shortest", "median")


def _compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _shrink_value(value, budget: int):
    """`value` with its compact JSON made to fit `budget` characters where its structure allows: a list keeps
    its first items that fit (at least its first, shrunk), an object keeps every key and shrinks its longest
    values first, a string is cut and marked. Numbers, booleans and null are kept: the result may be a little
    over the budget, never invalid JSON."""
    size = len(_compact(value))
    if size <= budget:
        return value
    if isinstance(value, str):
        keep = max(0, budget - 2 - len(SHRINK_MARK))
        return value[:keep] + SHRINK_MARK if keep < len(value) else value
    if isinstance(value, list):
        kept: list = []
        used = 2
        for item in value:
            item_size = len(_compact(item)) + (1 if kept else 0)
            if used + item_size > budget:
                if not kept:
                    kept.append(_shrink_value(item, budget - used))
                break
            kept.append(item)
            used += item_size
        return kept
    if isinstance(value, dict):
        shrunk = dict(value)
        # Each round shrinks the longest value; bounded, the budget may be unreachable.
        for _ in range(4 * len(shrunk)):
            excess = len(_compact(shrunk)) - budget
            if excess <= 0:
                break
            key = max(
                shrunk, key=lambda k: len(_compact(shrunk[k])) if isinstance(shrunk[k], (str, list, dict)) else 0
            )
            current = len(_compact(shrunk[key]))
            smaller = _shrink_value(shrunk[key], max(2, current - excess))
            if len(_compact(smaller)) >= current:
                break
            shrunk[key] = smaller
        return shrunk
    return value


def shrink_response(response, chars: int):
    """A response made to fit about `chars` characters, still valid where it was JSON: a string that holds a
    JSON object or array (how the pairs keep responses) is shrunk as that value and written back as compact
    JSON text; another string is cut and marked. Shorter responses are returned as they are. Used for the
    few-shot examples a prompt shows and for the training targets of long real answers (StableToolBench also
    cuts long observations), so a record of a long answer fits a CPU's training length instead of being dropped."""
    if not chars:
        return response
    if isinstance(response, str):
        if len(response) <= chars:
            return response
        if response.lstrip()[:1] in ("{", "["):
            try:
                value = json.loads(response)
            except ValueError:
                value = None
            if isinstance(value, (dict, list)):
                return _compact(_shrink_value(value, chars))
        return _shrink_value(response, chars + 2)
    return _shrink_value(response, chars)


def candidate_pool(candidates: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The few-shot candidates of one API: the FEW_SHOT_CANDIDATES (canonical arguments, observation
    JSON) pairs with the smallest canonical arguments, in that order. The one order of the project:
    the data builder applies it to the training calls, the server to its cache's recorded entries
    (whose query, `ORDER BY arguments LIMIT`, reads the same ones: SQLite compares the UTF-8 bytes,
    which order as the code points Python compares). Input order never matters."""
    return heapq.nsmallest(FEW_SHOT_CANDIDATES, candidates, key=lambda candidate: candidate[0])


def _value_key(value) -> object:
    # Equal exactly when the canonical JSON is equal (1, 1.0 and True differ); scalars skip the
    # serialisation, which made up most of the cost of a few-shot choice over 256 candidates.
    if isinstance(value, (str, int, float, bool)) or value is None:
        return type(value), value
    return canonical_json(value)


def _items(arguments: dict) -> frozenset:
    return frozenset((k, _value_key(v)) for k, v in arguments.items())


def _similarity(names_a: frozenset, items_a: frozenset, names_b: frozenset, items_b: frozenset) -> float:
    # A union's size from the intersection's (|A ∪ B| = |A| + |B| - |A ∩ B|): the same integers, so the same
    # float, without building the union (a full data build scores ~5 million candidates).
    shared_names, shared_items = len(names_a & names_b), len(items_a & items_b)
    names = shared_names / max(1, len(names_a) + len(names_b) - shared_names)
    return 2 * shared_items / max(1, len(items_a) + len(items_b) - shared_items) + names


@functools.lru_cache(maxsize=1 << 15)
def _candidate(args_json: str) -> tuple[dict, frozenset, frozenset] | None:
    """A candidate's parsed arguments, their names and their items, or None when they are not an object. Read-only:
    shared by every choice that reads the same candidate (a full data build makes ~29,000 choices among the same
    pools; parsing each candidate again for each was half of the build's time)."""
    args = json.loads(args_json)
    return (args, frozenset(args), _items(args)) if isinstance(args, dict) else None


def argument_similarity(a: dict, b: dict) -> float:
    """How alike two calls' arguments are: shared argument values count twice as much as shared
    argument names (Jaccard of each). Few-shot selection and the fidelity baseline both use it."""
    return _similarity(frozenset(a), _items(a), frozenset(b), _items(b))


def select_examples(
    candidates: list[tuple[str, str]],
    arguments: dict,
    k: int,
    char_budget: int,
    response_chars: int = 0,
    ties: str = "shortest",
) -> list[tuple[dict, dict]]:
    """Up to `k` (arguments, observation) pairs of `candidate_pool(candidates)` most similar to
    `arguments`, whose rendered size
    (arguments + observation JSON) fits `char_budget` together. Deterministic: among equally similar
    examples, `ties="shortest"` takes the shorter first, `ties="median"` the one whose size is nearest the
    median size of those tied (the lower middle of an even count; then the shorter); then the lexically
    first. With `response_chars`, each example's response is first
    shrunk to about that many characters (`shrink_response`), so the most similar calls are shown even
    when their answers are long; examples that still do not fit are skipped, never cut."""
    if ties not in FEW_SHOT_TIES:
        raise ValueError(f"unknown few-shot tie rule {ties!r}; known: {', '.join(FEW_SHOT_TIES)}")
    if k <= 0:
        return []
    scored = []
    names, items = frozenset(arguments), _items(arguments)
    for args_json, observation_json in candidate_pool(candidates):
        parsed = _candidate(args_json)
        if parsed is not None and parsed[0] != arguments:
            similarity = _similarity(names, items, parsed[1], parsed[2])
            scored.append((-similarity, len(args_json) + len(observation_json), args_json, observation_json))
    if ties == "median":
        sizes: dict[float, list[int]] = {}
        for negative_similarity, size, *_ in scored:
            sizes.setdefault(negative_similarity, []).append(size)
        median = {similarity: sorted(group)[(len(group) - 1) // 2] for similarity, group in sizes.items()}
        scored.sort(key=lambda item: (item[0], abs(item[1] - median[item[0]]), item[1], item[2]))
    else:
        scored.sort(key=lambda item: item[:3])
    chosen, used = [], 0
    for _, size, args_json, observation_json in scored:
        observation = json.loads(observation_json)
        if response_chars and isinstance(observation, dict):
            shrunk = shrink_response(observation.get("response", ""), response_chars)
            if shrunk is not observation.get("response"):
                observation = {**observation, "response": shrunk}
                size = len(args_json) + len(_compact(observation))
        if used + size <= char_budget:
            chosen.append((json.loads(args_json), observation))  # the caller's own copy, not the cached one
            used += size
            if len(chosen) == k:
                break
    return chosen
