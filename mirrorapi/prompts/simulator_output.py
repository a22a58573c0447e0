"""What a simulator answers, read: the observation (`parse_simulator_output`), strictness, and
the rationale of a chain-of-thought answer (`cot_rationale`)."""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

import json_repair

from mirrorapi.records import utf8_only

_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)
_ERROR_RESPONSE = re.compile(r'"error"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"response"\s*:\s*(.*)$', re.DOTALL)


def _as_observation(obj: Any) -> dict | None:
    if not isinstance(obj, dict) or ("error" not in obj and "response" not in obj):
        return None
    error = obj.get("error")
    error = "" if error is None else error if isinstance(error, str) else json.dumps(error, ensure_ascii=False)
    return {"error": error, "response": obj.get("response", "")}


def parse_simulator_output(text: str) -> tuple[dict | None, str]:
    """A model's answer -> (`{"error", "response"}` or None, how it was read).

    Tried in order: strict JSON, fenced JSON, a Python-literal dict, the `"error": "...",
    "response": ...` tail (also inside the `mechanism_of_the_api` variant), then JSON repair.
    `mechanism_of_the_api` and other extra keys are dropped. `{"error": "", "response": ""}` is a
    valid (empty) answer, not a failure. `how` is one of json, fenced, literal, regex, repaired, failed.
    Its text is always UTF-8: a lone surrogate escape (`"\ud83d"`, half an emoji's pair, which a small model
    writes) becomes U+FFFD, since no store, log or client body can hold one.
    Its values are JSON's: NaN and Infinity (Python's json reads them; RFC 8259 has neither, and a strict client
    cannot parse a body holding one) become null, and a Python literal holding what JSON cannot (a set, bytes) is
    not an answer.
    """
    try:
        observation, how = _parse(text)
        return (None, how) if observation is None else (utf8_only(_json_data(observation)), how)
    except (ValueError, RecursionError):  # a literal that is not JSON; text nested past Python's recursion limit
        return None, "failed"


def _json_data(value: Any) -> Any:
    """`value` as JSON holds it (a tuple a list, a non-finite float null); ValueError for what JSON cannot hold."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        return [_json_data(item) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {key: _json_data(item) for key, item in value.items()}
    raise ValueError(f"not JSON data: {type(value).__name__}")


def _parse(text: str) -> tuple[dict | None, str]:
    text = (text or "").strip()
    match = _FENCE.match(text)
    candidates = [(text, "json")] + ([(match.group(1).strip(), "fenced")] if match else [])
    for candidate, how in candidates:
        try:
            obs = _as_observation(json.loads(candidate))
        except ValueError:
            continue
        if obs is not None:
            return obs, how
    body = candidates[-1][0]
    try:
        obs = _as_observation(ast.literal_eval(body))
        if obs is not None:
            return obs, "literal"
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    found = _ERROR_RESPONSE.search(body)
    error = None
    if found:
        try:
            error = json.loads('"' + found.group(1) + '"')
        except ValueError:  # a raw control character or a bad \u escape in it: not this reading
            found = None
    if found:
        tail = found.group(2).strip()
        if tail.endswith("}"):
            tail = tail[:-1].rstrip()
        try:
            return {"error": error, "response": json.loads(tail)}, "regex"
        except ValueError:
            if tail.startswith('"'):
                return {
                    "error": error,
                    "response": tail[1:-1] if tail.endswith('"') and len(tail) > 1 else tail[1:],
                }, "regex"
    if "{" in body:
        repaired = json_repair.loads(body[body.index("{") :])
        obs = _as_observation(repaired)
        if obs is not None:
            return obs, "repaired"
    return None, "failed"


def is_strict_observation(text: str) -> bool:
    """True when `text` is exactly one JSON object with `error` (a string) and `response`."""
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    return isinstance(obj, dict) and isinstance(obj.get("error"), str) and "response" in obj


COT_RATIONALE_KEY = "mechanism_of_the_api"
_COT_RATIONALE = re.compile(r'"mechanism_of_the_api"\s*:\s*"(.*?)"\s*,\s*"error"', re.DOTALL)


def cot_rationale(text: str) -> str:
    """The `mechanism_of_the_api` of a CoT answer ("" when there is none): from its JSON, else (upstream's
    answers put unescaped quotes in it) the text between its key and `"error"`."""
    observation_text = (text or "").strip()
    try:
        value = json.loads(observation_text)
        if isinstance(value, dict) and isinstance(value.get(COT_RATIONALE_KEY), str):
            return utf8_only(value[COT_RATIONALE_KEY])
    except (ValueError, RecursionError):
        pass
    found = _COT_RATIONALE.search(observation_text)
    # UTF-8 as the observation is (a lone surrogate once failed the store's write, and every write of its turn)
    return utf8_only(found.group(1)) if found else ""
