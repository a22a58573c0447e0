"""The simulator's prompt formats: the API doc and the request in, one observation out.

Simulator formats
- `mirrorapi-v1` (ours, default): a fixed system prompt; the user message holds the API doc as
  compact JSON (static part first, so a prefix cache can share it), optional real examples, then
  the request as canonical JSON. The answer is one JSON object `{"error": str, "response": ...}`.
- `mirrorapi-v2`: `mirrorapi-v1` with responses written as JSON values: a response that is a string holding a
  JSON object or array (most recorded APIs: the pairs keep every response as text) is written as that object
  or array, unescaped, in the answer the model is trained to give and in the examples it is shown
  (`structured_response`). A small model then writes JSON, not JSON escaped inside a string (every quote a
  `\"`), and an engine with structured output enforces the inner JSON with its grammar too: the
  observation schema's `response` is any JSON value. The server answers the value as the model wrote it.
- `mirrorapi-session-v1`: `mirrorapi-v1` for a call inside a session (an episode): the system prompt
  asks for answers consistent with the session, and between the examples and the request the user
  message lists the session's earlier calls and answers, newest first, whole calls only, within a
  budget (`select_history`). Each earlier call is one compact JSON line (`history_line`). The server uses
  it for calls that carry a session id and have an earlier call to show; the data builder renders `--history K`
  records with it from real episodes. A call with none to show (a session's first) is asked in the stateless
  format by both (`mirrorapi.serving.sessions.Session.history`); rendered here, its list reads `(none)`.
- `mirrorapi-session-v2`: `mirrorapi-session-v1` with `mirrorapi-v2`'s JSON values, in the examples, the
  earlier calls' answers and the answer itself: what a `mirrorapi-v2` server's calls inside a session use
  (`session_format`), so a model trained on JSON values is never shown them escaped.
- `stabletoolbench` / `stabletoolbench-cache`: the user-message layout of StableToolBench's
  MirrorAPI servers (`API doc:` + Python repr of the doc, blank line, `Request:` + repr of the
  arguments), with a system prompt read from a user's file, to serve released MirrorAPI weights.
  `-cache` sends the normalised API name, like its `main_mirrorapi_cache.py`. Tool names are sent
  as upstream builds them (cut at the first `_for_`), and the server's defaults for these formats are
  upstream's request settings (`STABLETOOLBENCH_REQUEST_SETTINGS`: seed 42, 2,048 tokens, no
  structured output, no second try).
- `stabletoolbench-cot`: MirrorAPI's chain-of-thought mode. The `stabletoolbench` user message; the system
  prompt (a user's file, like the other stabletoolbench formats) must start with the tag line
  `[CHAIN_OF_THOUGHT]`, as StableToolBench's `COT_SYSTEM` does. The model answers
  `{"mechanism_of_the_api", "error", "response"}`: the observation is `error`/`response`, the rationale
  (`cot_rationale`) goes to the request log, never to the agent.

The answers are read by `mirrorapi.prompts.simulator_output`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import jsonschema

from mirrorapi.names import api_key_name
from mirrorapi.records import canonical_json, observation_json
from mirrorapi.tools import ApiDoc

SESSION_FORMAT = "mirrorapi-session-v1"
COT_FORMAT = "stabletoolbench-cot"  # see the CoT block below
STRUCTURED_FORMAT = "mirrorapi-v2"  # responses as JSON values (see the docstring)
STRUCTURED_SESSION_FORMAT = "mirrorapi-session-v2"
SESSION_FORMATS = (SESSION_FORMAT, STRUCTURED_SESSION_FORMAT)
STRUCTURED_FORMATS = (STRUCTURED_FORMAT, STRUCTURED_SESSION_FORMAT)
OUR_SIMULATOR_FORMATS = ("mirrorapi-v1", *STRUCTURED_FORMATS, SESSION_FORMAT)  # our system prompt, no file needed
SIMULATOR_FORMATS = (*OUR_SIMULATOR_FORMATS, "stabletoolbench", "stabletoolbench-cache", COT_FORMAT)
DEFAULT_SIMULATOR_FORMAT = "mirrorapi-v1"

# Responses longer than this are cut (and marked) both in training data and in what the server
# stores, so the two never disagree. 2,048 characters is what StableToolBench's real server kept.
RESPONSE_CHAR_BUDGET = 2048
TRUNCATION_MARK = "..."
# Doc fields are capped so one verbose RapidAPI description cannot eat the context.
DESCRIPTION_CHAR_BUDGET = 1024
PARAM_DESCRIPTION_CHAR_BUDGET = 256
TEMPLATE_CHAR_BUDGET = 1024
# A session's earlier calls shown to the simulator: at most this many, newest first, whole calls
# only, within this many characters (one long answer must not push the doc out of the context).
DEFAULT_HISTORY_CALLS = 8
HISTORY_CHAR_BUDGET = 4096

# JSON schema of an observation, for engines with structured output (vLLM `response_format`).
OBSERVATION_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "string"}, "response": {}},
    "required": ["error", "response"],
    "additionalProperties": False,
}


def session_format(fmt: str) -> str:
    """The format of a call inside a session, for a server whose stateless calls use `fmt`: responses written
    as JSON values (`mirrorapi-session-v2`) when `fmt` writes them so, else `mirrorapi-session-v1`."""
    return STRUCTURED_SESSION_FORMAT if fmt in STRUCTURED_FORMATS else SESSION_FORMAT


def stateless_format(fmt: str) -> str:
    """The format of a call outside any session, for a session format (its inverse: `mirrorapi-session-v2` ->
    `mirrorapi-v2`, `mirrorapi-session-v1` -> `mirrorapi-v1`); any other format is its own."""
    return {STRUCTURED_SESSION_FORMAT: STRUCTURED_FORMAT, SESSION_FORMAT: DEFAULT_SIMULATOR_FORMAT}.get(fmt, fmt)


_SKELETON_TYPES = {
    "str": {"type": "string"},
    "int": {"type": "number"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "empty list": {"type": "array"},
}


def skeleton_schema(template: Any) -> dict:
    """A ToolBench `template_response` type skeleton as a JSON schema.

    Keys of objects are required (extra keys allowed); lists take the schema of their first item;
    int and float both mean "number" and `NoneType` means any type, since one sampled value says
    no more than that.
    """
    if isinstance(template, dict):
        properties = {k: skeleton_schema(v) for k, v in template.items() if k != "_list_length"}
        return {"type": "object", "properties": properties, "required": sorted(properties)}
    if isinstance(template, list):
        return {"type": "array", "items": skeleton_schema(template[0])} if template else {"type": "array"}
    if isinstance(template, str) and template.startswith("list of"):
        return {"type": "array"}
    return dict(_SKELETON_TYPES.get(template, {})) if isinstance(template, str) else {}


def response_schema(doc: ApiDoc | None) -> dict | None:
    """The doc's JSON schema (ToolEnv2404 `schema`), else its template skeleton; None when it has neither (or an
    unusable one)."""
    if doc is None:
        return None
    template = doc.template_response
    skeleton = template if isinstance(template, (dict, list)) or template in _SKELETON_TYPES else None
    schema = doc.response_schema or (skeleton_schema(skeleton) if skeleton is not None else None)
    if not schema:
        return None
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError:
        return None
    return schema


# tau-bench's in-band failure, `"Error: <message>"`, as its tools return it (one of the forms
# `mirrorapi.transport_failures.in_band_error` reads as a failure); the message without quotes or backslashes,
# so that a grammar built from the pattern cannot run past the string's end.
IN_BAND_ERROR_PATTERN = '^Error: [^"\\\\]+$'


def observation_schema(doc: ApiDoc, fmt: str) -> dict:
    """The JSON schema a simulator's answer is held to when the engine has structured output.

    `mirrorapi-v2`, for an API whose doc gives an object or array response (its schema, or its template as a
    skeleton): a success (`error` "") must answer a `response` of that shape, so the engine's grammar writes
    the documented JSON whenever the model answers a success; an error answers any `response`; and an in-band
    error as tau-bench's tools write one (`error` "", `response` "Error: ..."), which without its branch the
    grammar forbids: the shipped simulator, asked its own training calls that failed so, answered none of 30 with
    a failure under the grammar and 17 without it. The branch is that exact prefix, not any string: with any
    string, a model leaning towards a plain string for a success escaped into it ("Errores", "Errormg" for 10 of
    21 successes). Otherwise OBSERVATION_SCHEMA."""
    schema = response_schema(doc) if fmt in STRUCTURED_FORMATS else None
    if not schema or schema.get("type") not in ("object", "array"):
        return OBSERVATION_SCHEMA

    def branch(error: dict, response: dict) -> dict:
        return {
            "type": "object",
            "properties": {"error": error, "response": response},
            "required": ["error", "response"],
            "additionalProperties": False,
        }

    # A doc schema's own definitions move to the top, where its references (`#/definitions/...`, `#/$defs/...`,
    # from the root of the document they are in) find them once it is nested in the observation.
    definitions = {key: schema[key] for key in ("definitions", "$defs") if key in schema}
    nested = {key: value for key, value in schema.items() if key not in definitions}
    return {
        **definitions,
        "anyOf": [
            branch({"const": ""}, nested),
            branch({"type": "string", "minLength": 1}, {}),
            branch({"const": ""}, {"type": "string", "pattern": IN_BAND_ERROR_PATTERN}),
        ],
    }


SIMULATOR_SYSTEM_V1 = (
    "You are the server behind a web API. You receive the API's documentation and one request, and you "
    'answer exactly as the real API would. Reply with a single JSON object with two keys: "error" (an '
    'empty string when the call succeeds, otherwise the error message the API returns) and "response" '
    "(the API's output). Follow the documented response format when one is given. Reject a request the "
    "real API would reject, such as one missing a required parameter or with an invalid value. "
    "Output nothing but the JSON object."
)

SIMULATOR_SYSTEM_SESSION_V1 = SIMULATOR_SYSTEM_V1 + (
    " The request is part of a session: the session's earlier calls and their answers are listed, newest "
    "first. Stay consistent with them: what they created (ids, tokens, names, bookings) exists, what they "
    "deleted does not, and values they returned keep their values."
)


def cut_text(text: str, budget: int) -> str:
    """`text` cut to `budget` characters, + TRUNCATION_MARK when cut (doc fields here, judge texts in
    `judge_formats`)."""
    return text if len(text) <= budget else text[:budget] + TRUNCATION_MARK


def truncate_response(response: Any) -> Any:
    """Cut a string response to RESPONSE_CHAR_BUDGET characters (structured responses are left whole)."""
    if isinstance(response, str) and len(response) > RESPONSE_CHAR_BUDGET:
        return response[:RESPONSE_CHAR_BUDGET] + TRUNCATION_MARK
    return response


def structured_response(response: Any) -> Any:
    """`mirrorapi-v2`'s rendering of a response: a string holding a JSON object or array becomes that value;
    anything else (plain text, a Python repr, a cut response, a scalar) stays as it is."""
    if isinstance(response, str) and response.lstrip()[:1] in ("{", "["):
        try:
            value = json.loads(response)
        except ValueError:
            return response
        if isinstance(value, (dict, list)):
            return value
    return response


def render_observation(error: str, response: Any, fmt: str) -> str:
    """An observation as a simulator prompt format writes it (a target, an example)."""
    return observation_json(error, structured_response(response) if fmt in STRUCTURED_FORMATS else response)


def _param_v1(p: dict) -> dict:
    out = {
        "name": api_key_name(p["name"]),
        "type": p.get("type", ""),
        "description": cut_text(p.get("description") or "", PARAM_DESCRIPTION_CHAR_BUDGET),
    }
    if p.get("default") not in ("", None):
        out["default"] = p["default"]
    return out


def render_doc_v1(doc: ApiDoc) -> str:
    """The API doc as compact JSON; parameter names are the wire names agents send (`is_id`, not `id`)."""
    body: dict[str, Any] = {
        "category": doc.category,
        "tool": doc.tool_title,
        "tool_description": cut_text(doc.tool_description.strip(), DESCRIPTION_CHAR_BUDGET),
        "api": doc.api_title,
        "api_description": cut_text(doc.description.strip(), DESCRIPTION_CHAR_BUDGET),
        "method": doc.method,
        "required_parameters": [_param_v1(p) for p in doc.required_parameters],
        "optional_parameters": [_param_v1(p) for p in doc.optional_parameters],
    }
    if doc.template_response:
        body["response_template"] = cut_text(canonical_json(doc.template_response), TEMPLATE_CHAR_BUDGET)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


# What StableToolBench's MirrorAPI servers send besides the messages (`main_mirrorapi*.py`): seed 42,
# up to 2,048 new tokens, no `response_format`, and one request per call (no second try of a cut answer). The
# server takes these as its defaults for the `stabletoolbench` formats (each can still be set), so released
# weights are asked as upstream asks.
STABLETOOLBENCH_REQUEST_SETTINGS = {
    "seed": 42,
    "max_tokens": 2048,
    "structured_output": False,
    "second_try_temperature": 0.0,
}


def history_line(tool: str, api: str, arguments: dict, error: str, response: Any, fmt: str = SESSION_FORMAT) -> str:
    """One earlier call of a session as the simulator sees it in session format `fmt`:
    `{"tool","api","request","answer"}`, compact, with the wire names of the API, the answer's response
    written as `fmt` writes responses (the server and the data builder both render it here)."""
    return keyed_history_line(tool, api, canonical_json(arguments), error, response, fmt)


def keyed_history_line(tool: str, api: str, key: str, error: str, response: Any, fmt: str = SESSION_FORMAT) -> str:
    """`history_line` of a call given by its canonical JSON `key` (the server has it, not always the object).

    A structured response longer than the response budget (a simulated answer the server parsed) is cut as its JSON
    text: the data builder's recorded responses are text, cut so, and one kept whole (a few KB) would leave no room
    in the session's character budget for the calls before it."""
    if isinstance(response, (dict, list)):
        text = json.dumps(response, ensure_ascii=False, separators=(",", ":"))
        response = text if len(text) > RESPONSE_CHAR_BUDGET else response
    answer = render_observation(error, truncate_response(response), fmt)
    return (
        f'{{"tool":{json.dumps(tool, ensure_ascii=False)},"api":{json.dumps(api, ensure_ascii=False)},'
        f'"request":{key},"answer":{answer}}}'
    )


# Which of a session's kept calls a prompt shows (`select_history`): every one ("recent"), or only those related to
# the call asked ("related": a call of the same API, or one whose request or answer holds a value of the call's
# arguments). Measured in docs/training.md ("A session's unrelated calls").
HISTORY_RULES = ("recent", "related")
HISTORY_HEADING = "Earlier calls in this session, newest first:\n"  # in our session formats' user message
# An argument value shorter than this (as text) relates nothing: "en", 1 and 10 are shared by chance.
MIN_SHARED_VALUE_CHARS = 3


def _value_texts(value: Any) -> list[str]:
    """The scalar values inside `value` as text (strings as they are, numbers as JSON writes them); booleans and
    null, which say nothing about which call a value came from, are left out."""
    if isinstance(value, dict):
        return [text for item in value.values() for text in _value_texts(item)]
    if isinstance(value, list):
        return [text for item in value for text in _value_texts(item)]
    if isinstance(value, str):
        return [value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [json.dumps(value)]
    return []


def related_to_call(line: str, api: str, arguments: dict) -> bool:
    """Whether an earlier call (a `history_line`) bears on a call of `api` with `arguments`: it is a call of the
    same API (what it answered shows the API's shape and state), or one of the call's argument values of at least
    MIN_SHARED_VALUE_CHARS characters is among the earlier call's request or answer values, or inside one of them
    (a token a login returned, a user id inside a reservation, a username inside an email)."""
    earlier = json.loads(line)
    if earlier.get("api") == api:
        return True
    wanted = {text for text in _value_texts(arguments) if len(text) >= MIN_SHARED_VALUE_CHARS}
    if not wanted:
        return False
    held = _value_texts([earlier.get("request"), earlier.get("answer")])
    return any(value == text or value in text for value in wanted for text in held)


def shown_history(messages: list[dict]) -> list[str]:
    """The earlier calls (`history_line`s, newest first) a prompt of our session formats shows, read back from its
    user message; [] for a prompt that shows none (a stateless prompt, or a session's empty list)."""
    user = messages[-1]["content"]
    start = user.find(HISTORY_HEADING)
    if start < 0:
        return []
    listed = user[start + len(HISTORY_HEADING) : user.index("\n\nRequest:\n", start)]
    return [] if listed == "(none)" else listed.split("\n")  # a history line is one line of compact JSON


def select_history(
    lines: list[str],
    max_calls: int = DEFAULT_HISTORY_CALLS,
    char_budget: int = HISTORY_CHAR_BUDGET,
    related_to: tuple[str, dict] | None = None,
) -> list[str]:
    """The history a prompt shows: of `lines` (oldest first), the newest calls first, at most
    `max_calls`, stopping at the first that would pass `char_budget` (calls are never cut, and an
    older call is never shown without the newer ones). With `related_to` (the call's API and arguments: the
    "related" rule of HISTORY_RULES), only those of them `related_to_call`, newest first."""
    chosen: list = []
    used = 0
    for line in reversed(lines):
        if len(chosen) == max_calls or used + len(line) > char_budget:
            break
        chosen.append(line)
        used += len(line) + 1
    if related_to is not None:
        chosen = [line for line in chosen if related_to_call(line, *related_to)]
    return chosen


def _stabletoolbench_user(doc: ApiDoc, arguments: dict, normalised_api_name: bool) -> str:
    # Same keys, order and Python-repr rendering as StableToolBench's MirrorAPI servers (notes §4).
    api_doc = {
        "api_name": doc.api if normalised_api_name else doc.api_title,
        "api_description": doc.description,
        "required_parameters": doc.required_parameters,
        "optional_parameters": doc.optional_parameters,
        "tool_description": doc.tool_description,
        # Upstream sends the client's tool name cut at its first `_for_` (clients send the file stem,
        # `doc.tool`): a tool whose own name holds `_for_` (`email_regex_for_lazy`) is sent as
        # `email_regex`, the name MirrorAPI was trained with, though its doc is found correctly here.
        "tool_name": doc.tool.split("_for_")[0],
        "tool_category": doc.category,
    }
    request = {k: v for k, v in arguments.items() if k != "toolbench_key"}
    return "API doc:\n" + str(api_doc) + "\n\nRequest:\n" + str(request)


def simulator_messages(
    doc: ApiDoc,
    arguments: dict,
    examples: Sequence[tuple[dict, dict]] = (),
    fmt: str = DEFAULT_SIMULATOR_FORMAT,
    system_prompt: str | None = None,
    history: list[str] | None = None,
) -> list[dict]:
    """Chat messages asking the simulator for the answer of `doc` to `arguments`.

    `examples` are (arguments, observation) pairs of the same API, shown before the request
    (`mirrorapi-*` formats only). `history` (session formats only) is the session's earlier
    calls as `select_history` chose them, newest first. `system_prompt` is required for the
    `stabletoolbench` formats (the text of the MirrorAPI model's system prompt, which we do not
    ship) and replaces ours otherwise.
    """
    if history is not None and fmt not in SESSION_FORMATS:
        raise ValueError(
            f"prompt format {fmt!r} has no session history; use {' or '.join(map(repr, SESSION_FORMATS))}"
        )
    if fmt in OUR_SIMULATOR_FORMATS:
        parts = ["API documentation:\n" + render_doc_v1(doc)]
        if examples:
            shots = [
                f"Request: {canonical_json(a)}\n"
                f"Response: {render_observation(o.get('error', ''), o.get('response', ''), fmt)}"
                for a, o in examples
            ]
            parts.append("Examples:\n" + "\n".join(shots))
        if fmt in SESSION_FORMATS:
            parts.append(HISTORY_HEADING + ("\n".join(history) if history else "(none)"))
        parts.append("Request:\n" + canonical_json(arguments))
        default_system = SIMULATOR_SYSTEM_SESSION_V1 if fmt in SESSION_FORMATS else SIMULATOR_SYSTEM_V1
        return [
            {"role": "system", "content": system_prompt or default_system},
            {"role": "user", "content": "\n\n".join(parts)},
        ]
    if fmt in ("stabletoolbench", "stabletoolbench-cache", COT_FORMAT):
        if not system_prompt:
            raise ValueError(f"prompt format {fmt!r} needs a system prompt (the MirrorAPI model's own, from a file)")
        if fmt == COT_FORMAT:
            check_cot_system_prompt(system_prompt)
        return [
            {"role": "system", "content": system_prompt},
            {"role": "user", "content": _stabletoolbench_user(doc, arguments, fmt == "stabletoolbench-cache")},
        ]
    raise ValueError(f"unknown simulator prompt format {fmt!r}; known: {', '.join(SIMULATOR_FORMATS)}")


# MirrorAPI's CoT mode (StableToolBench server/system_prompts.py `COT_SYSTEM`, commit aa4ed9f): the system
# prompt's first line is the tag; the answer adds `mechanism_of_the_api` before `error` and `response`
# (read by `simulator_output.cot_rationale`).
COT_TAG = "[CHAIN_OF_THOUGHT]"


def check_cot_system_prompt(system_prompt: str) -> None:
    """A CoT-mode system prompt starts with the tag line (the tag is what switches MirrorAPI to CoT)."""
    if system_prompt.lstrip().split("\n", 1)[0].strip() != COT_TAG:
        raise ValueError(f"prompt format {COT_FORMAT!r} needs a system prompt whose first line is {COT_TAG}")
