"""A call's arguments as the server reads them, whichever door they came by (/virtual's `tool_input`, an MCP
`tools/call`, an OpenEnv step): the argument object and its canonical JSON (the cache key), with the bounds every
door applies (nesting, valid Unicode); `ParsedArguments` when the server's worker process parsed them (a large
body, `handler.LargeBodies`)."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

from mirrorapi.records import canonical_json
from mirrorapi.serving.protocol import ToolInputError

MAX_ARGUMENT_DEPTH = 100  # nesting of tool_input objects/arrays; real APIs take a few levels
# Bodies this large are parsed in a worker process (`LargeBodies`): JSON parsing holds the GIL, so a thread
# would stall the event loop as much; a 3 MB argument held it 2-3 s (4.9 s through /mcp).
LARGE_BODY_BYTES = 64 * 1024
# One decoder for every tool_input: `json.loads(text, strict=False)` builds a new one per call.
# strict=False: raw model output often holds literal newlines inside strings.
_DECODE_LENIENT = json.JSONDecoder(strict=False).decode


class ParsedArguments(NamedTuple):
    """A call's arguments as `LargeBodies`' worker parsed them (a large OpenEnv step): the object (None when too
    large to simulate: the key alone finds a recorded answer), the key, the ToolInputError they raised (then both
    None), and what an episode's `state` keeps of them."""

    arguments: dict | None
    key: str | None
    error: Exception | None
    kept: str


def parsed_arguments(arguments: Any, max_arguments_chars: int, kept: str = "") -> ParsedArguments:
    """`ParsedArguments` of a call's arguments (an object, or /virtual's `tool_input` text), in `LargeBodies`'
    worker: /virtual's large bodies and OpenEnv's large steps by one rule."""
    try:
        arguments, key = parse_arguments(arguments)
    except ToolInputError as exc:
        return ParsedArguments(None, None, exc, kept)
    return ParsedArguments(arguments if len(key) <= max_arguments_chars else None, key, None, kept)


def parse_arguments(value: Any) -> tuple[dict, str]:
    """`tool_input` -> (the argument object, its canonical JSON: the cache key); raises ToolInputError
    for anything that is not an object of valid Unicode text nested at most MAX_ARGUMENT_DEPTH deep."""
    arguments = parse_tool_input(value)
    try:
        key = canonical_json(arguments)
    except RecursionError:
        raise ToolInputError(f"tool_input is nested too deeply (more than {MAX_ARGUMENT_DEPTH} levels)") from None
    if not key.isascii():  # a lone surrogate ("\ud800" in the JSON) is not text SQLite or a model can take
        try:
            key.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ToolInputError(
                f"tool_input holds a lone surrogate {key[exc.start : exc.end]!r} at character "
                f"{exc.start}: not valid Unicode text"
            ) from None
    # Counting brackets is cheap; only a key with many of them is looked at closer.
    if key.count("{") + key.count("[") > MAX_ARGUMENT_DEPTH and json_text_nested_deeper_than(key, MAX_ARGUMENT_DEPTH):
        raise ToolInputError(f"tool_input is nested too deeply (more than {MAX_ARGUMENT_DEPTH} levels)")
    return arguments, key


_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_INNERMOST_PAIR = re.compile(r"\[\]|\{\}")
_BRACKETS_ONLY = str.maketrans("", "", "".join(chr(c) for c in range(128) if chr(c) not in "[]{}"))


def json_text_nested_deeper_than(key: str, limit: int) -> bool:
    """Whether the objects/arrays of a canonical JSON text nest more than `limit` levels: its brackets outside
    strings, their innermost pairs removed once per level, in C (walking the objects in Python took 1.7 s for
    `[[1]] * 600,000`)."""
    skeleton = _JSON_STRING.sub("", key).translate(_BRACKETS_ONLY)  # outside strings all is ASCII
    for _ in range(limit):
        skeleton = _INNERMOST_PAIR.sub("", skeleton)
        if not skeleton:
            return False
    return True


def parse_tool_input(value: Any) -> dict:
    """`tool_input` -> the argument object; raises ToolInputError for anything that is not an object."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        if value == "":  # StableToolBench's servers map "" alone to {}; whitespace is a parse error there
            return {}
        try:
            parsed = _DECODE_LENIENT(value)
        except ValueError as exc:
            raise ToolInputError(f"tool_input is not valid JSON: {exc}") from None
        except RecursionError:
            raise ToolInputError(f"tool_input is nested too deeply (more than {MAX_ARGUMENT_DEPTH} levels)") from None
        if isinstance(parsed, dict):
            return parsed
        raise ToolInputError(f"tool_input must be a JSON object, got {type(parsed).__name__}: {value[:80]}")
    raise ToolInputError(f"tool_input must be a JSON object or a string holding one, got {type(value).__name__}")
