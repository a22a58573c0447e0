"""The /virtual contract without HTTP: tool_input parsing and the validation policy."""

import pytest

from mirrorapi.serving.arguments import parse_tool_input
from mirrorapi.serving.protocol import ToolInputError
from mirrorapi.tools import ArgumentError, ToolRegistry, check_arguments


@pytest.mark.parametrize(
    "value, expected",
    [
        ("", {}),
        ("{}", {}),
        ({"a": 1}, {"a": 1}),
        ('{\n  "name": "Lionel Messi"\n}', {"name": "Lionel Messi"}),
        ('{"text": "two\nlines"}', {"text": "two\nlines"}),  # a literal newline inside a string, as models write it
    ],
    ids=["empty", "empty-object", "object", "agent-string", "raw-newline"],
)
def test_tool_input_objects(value, expected):
    assert parse_tool_input(value) == expected


@pytest.mark.parametrize(
    "value, message",
    [
        ("[1, 2]", "must be a JSON object, got list"),
        ("5", "got int"),
        ('"text"', "got str"),
        ("{'a': 1}", "not valid JSON"),
        ('{"a": 1', "not valid JSON"),
        (None, "got NoneType"),
        (7, "got int"),
        # StableToolBench's servers map "" alone to {} (server/main.py); blanks are a parse error there.
        ("   ", "not valid JSON"),
    ],
    ids=["list", "number", "string", "python-repr", "truncated", "null", "int", "blank"],
)
def test_tool_input_that_is_not_an_object(value, message):
    with pytest.raises(ToolInputError, match=message):
        parse_tool_input(value)


@pytest.fixture(scope="module")
def add_agenda(samples):
    registry = ToolRegistry.load([samples / "tools"])
    return registry.resolve("APIBank", "apibank_agenda", "AddAgenda")


def test_missing_required_argument_is_rejected_by_default_policy(add_agenda):
    required, _ = add_agenda.parameter_names()
    arguments = {name: "x" for name in required}
    check_arguments(add_agenda, arguments, "reject", "simulate")  # complete: accepted
    missing = required[-1]
    del arguments[missing]
    with pytest.raises(ArgumentError, match=f"Missing required parameter '{missing}' of AddAgenda"):
        check_arguments(add_agenda, arguments, "reject", "simulate")
    check_arguments(add_agenda, arguments, "simulate", "simulate")  # policy: let the model answer


def test_unknown_argument_policy(add_agenda):
    arguments = {name: "x" for name in add_agenda.parameter_names()[0]} | {"colour": "red"}
    check_arguments(add_agenda, arguments, "reject", "simulate")
    with pytest.raises(ArgumentError, match="addagenda\\(\\) got an unexpected keyword argument 'colour'"):
        check_arguments(add_agenda, arguments, "reject", "reject")
