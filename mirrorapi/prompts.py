"""Every prompt format of the project, named and versioned, and the parsers of what models answer.

The data builders and the server call the same functions, so a model is always served with the
format it was trained on; the format name goes into the training data, the model card and the
cache provenance (`simulated:<model>@<format>`).

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
  budget (`select_history`). Each earlier call is one compact JSON line (`history_line`). With no
  earlier call the list reads `(none)`. The server uses it for calls that carry a session id; the
  data builder renders `--history K` records with it from real episodes.
- `stabletoolbench` / `stabletoolbench-cache`: the user-message layout of StableToolBench's
  MirrorAPI servers (`API doc:` + Python repr of the doc, blank line, `Request:` + repr of the
  arguments), with a system prompt read from a user's file, to serve released MirrorAPI weights.
  `-cache` sends the normalised API name, like its `main_mirrorapi_cache.py`. Tool names are sent
  as upstream builds them (cut at the first `_for_`), and the server's defaults for these formats are
  upstream's request settings (`STABLETOOLBENCH_REQUEST_SETTINGS`: seed 42, 2,048 tokens, no
  structured output).
- `stabletoolbench-cot`: MirrorAPI's chain-of-thought mode. The `stabletoolbench` user message; the system
  prompt (a user's file, like the other stabletoolbench formats) must start with the tag line
  `[CHAIN_OF_THOUGHT]`, as StableToolBench's `COT_SYSTEM` does. The model answers
  `{"mechanism_of_the_api", "error", "response"}`: the observation is `error`/`response`, the rationale
  (`cot_rationale`) goes to the request log, never to the agent.

Agent format
- `agent-v1`: the tool-using agent of the benchmark runner (StableToolBench's CoT / DFS protocol):
  a system prompt with the task rules and the tool list, the query as the user message, and the
  "try something different" message DFS sends before a sibling branch. Our own wording of the
  protocol StableToolBench's agents follow (think, call one function per step, finish with
  `Finish`, give up with `give_up_and_restart`). The functions go to the engine as OpenAI `tools`.
- `agent-react-v1`: the same protocol for a model whose engine cannot pass tool calls (a chat template
  without tool support, e.g. SmolLM2's): a text protocol in the layout ToolBench's ReAct-style agents
  used. The system prompt lists the functions with their JSON-schema arguments and asks for
  `Thought: ...` / `Action: <function name>` / `Action Input: <JSON object>`; each result comes back
  as a user message `Observation: <result>`. `parse_react_step` reads a reply into one call;
  `react_conversation` renders the runner's history (StableToolBench's messages: `tool_calls`,
  `tool` results) as that text, so answer files keep StableToolBench's format.

Judge formats
- `fac-v1`: query + final answer -> `Verdict: Solved|Unsolved` and `Reason: ...` on labelled lines.
- `sopr-v1`: query + the trajectory's tool calls + final answer -> `Verdict: Solved|Unsolved|Unsure`
  (StableToolBench's SoPR statuses; Unsure scores 0.5) and `Reason: ...`.
- `sowr-v1`: query + two answers (A, B) with their tool calls -> `Preferred: A|B` and `Reason: ...`
  (the pairwise step of StableToolBench's SoWR).
- `tooleyes-v1`: query + the trajectory's tool calls + final answer -> five labelled 0-10 ratings
  (`Focus`, `Validity`, `Quality`, `Selection`, `Relevance`: five lines), ToolEyes' judged criteria.
Both show the judge the text of the final answer (`extract_final_answer`), query and answer cut by
`cut_judge_text`, for FAC, judge agreement and the judge's training data alike.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Sequence
from typing import Any

import json_repair
import jsonschema

from mirrorapi.names import api_key_name
from mirrorapi.records import canonical_json, observation_json
from mirrorapi.tools import ApiDoc

SESSION_FORMAT = "mirrorapi-session-v1"
COT_FORMAT = "stabletoolbench-cot"  # see the CoT block below
STRUCTURED_FORMAT = "mirrorapi-v2"  # responses as JSON values (see the docstring)
OUR_SIMULATOR_FORMATS = ("mirrorapi-v1", STRUCTURED_FORMAT, SESSION_FORMAT)  # our system prompt, no file needed
SIMULATOR_FORMATS = ("mirrorapi-v1", STRUCTURED_FORMAT, SESSION_FORMAT, "stabletoolbench", "stabletoolbench-cache",
                     COT_FORMAT)
DEFAULT_SIMULATOR_FORMAT = "mirrorapi-v1"
JUDGE_FORMATS = ("fac-v1", "sopr-v1")
TOOLEYES_FORMAT = "tooleyes-v1"  # see the ToolEyes block below
AGENT_FORMATS = ("agent-v1", "agent-react-v1")
DEFAULT_AGENT_FORMAT = "agent-v1"
# Agent formats in which the model acts through its text, not through the engine's tool calls.
TEXT_AGENT_FORMATS = ("agent-react-v1",)
PREFERENCE_FORMATS = ("sowr-v1",)
DEFAULT_JUDGE_FORMAT = "fac-v1"

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

_SKELETON_TYPES = {"str": {"type": "string"}, "int": {"type": "number"}, "float": {"type": "number"},
                   "bool": {"type": "boolean"}, "empty list": {"type": "array"}}


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


def observation_schema(doc: ApiDoc, fmt: str) -> dict:
    """The JSON schema a simulator's answer is held to when the engine has structured output.

    `mirrorapi-v2`, for an API whose doc gives an object or array response (its schema, or its template as a
    skeleton): a success (`error` "") must answer a `response` of that shape, so the engine's grammar writes
    the documented JSON whenever the model answers a success; an error answers any `response`. No branch for a
    tau-bench in-band error (`error` "", `response` "Error: ..."): a model that leans towards a plain string
    for a success escapes into it (measured: "Errores", "Errormg" for 10 of 21 successes). Otherwise
    OBSERVATION_SCHEMA."""
    schema = response_schema(doc) if fmt == STRUCTURED_FORMAT else None
    if not schema or schema.get("type") not in ("object", "array"):
        return OBSERVATION_SCHEMA

    def branch(error: dict, response: dict) -> dict:
        return {"type": "object", "properties": {"error": error, "response": response},
                "required": ["error", "response"], "additionalProperties": False}

    return {"anyOf": [branch({"const": ""}, schema), branch({"type": "string", "minLength": 1}, {})]}


SIMULATOR_SYSTEM_V1 = (
    "You are the server behind a web API. You receive the API's documentation and one request, and you "
    "answer exactly as the real API would. Reply with a single JSON object with two keys: \"error\" (an "
    "empty string when the call succeeds, otherwise the error message the API returns) and \"response\" "
    "(the API's output). Follow the documented response format when one is given. Reject a request the "
    "real API would reject, such as one missing a required parameter or with an invalid value. "
    "Output nothing but the JSON object."
)

SIMULATOR_SYSTEM_SESSION_V1 = SIMULATOR_SYSTEM_V1 + (
    " The request is part of a session: the session's earlier calls and their answers are listed, newest "
    "first. Stay consistent with them: what they created (ids, tokens, names, bookings) exists, what they "
    "deleted does not, and values they returned keep their values."
)


def _cut(text: str, budget: int) -> str:
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
    return observation_json(error, structured_response(response) if fmt == STRUCTURED_FORMAT else response)


# ---------------------------------------------------------------------------------- simulator
def _param_v1(p: dict) -> dict:
    out = {"name": api_key_name(p["name"]), "type": p.get("type", ""),
           "description": _cut(p.get("description") or "", PARAM_DESCRIPTION_CHAR_BUDGET)}
    if p.get("default") not in ("", None):
        out["default"] = p["default"]
    return out


def render_doc_v1(doc: ApiDoc) -> str:
    """The API doc as compact JSON; parameter names are the wire names agents send (`is_id`, not `id`)."""
    body: dict[str, Any] = {
        "category": doc.category,
        "tool": doc.tool_title,
        "tool_description": _cut(doc.tool_description.strip(), DESCRIPTION_CHAR_BUDGET),
        "api": doc.api_title,
        "api_description": _cut(doc.description.strip(), DESCRIPTION_CHAR_BUDGET),
        "method": doc.method,
        "required_parameters": [_param_v1(p) for p in doc.required_parameters],
        "optional_parameters": [_param_v1(p) for p in doc.optional_parameters],
    }
    if doc.template_response:
        body["response_template"] = _cut(canonical_json(doc.template_response), TEMPLATE_CHAR_BUDGET)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


# What StableToolBench's MirrorAPI servers send besides the messages (`main_mirrorapi*.py`): seed 42,
# up to 2,048 new tokens, no `response_format`. The server takes these as its defaults for the
# `stabletoolbench` formats (each can still be set), so released weights are asked as upstream asks.
STABLETOOLBENCH_REQUEST_SETTINGS = {"seed": 42, "max_tokens": 2048, "structured_output": False}


def history_line(tool: str, api: str, arguments: dict, error: str, response: Any) -> str:
    """One earlier call of a session as the simulator sees it: `{"tool","api","request","answer"}`,
    compact, with the wire names of the API (the server and the data builder both render it here)."""
    return (f'{{"tool":{json.dumps(tool, ensure_ascii=False)},"api":{json.dumps(api, ensure_ascii=False)},'
            f'"request":{canonical_json(arguments)},"answer":{observation_json(error, truncate_response(response))}}}')


def select_history(lines: list[str], max_calls: int = DEFAULT_HISTORY_CALLS,
                   char_budget: int = HISTORY_CHAR_BUDGET) -> list[str]:
    """The history a prompt shows: of `lines` (oldest first), the newest calls first, at most
    `max_calls`, stopping at the first that would pass `char_budget` (calls are never cut, and an
    older call is never shown without the newer ones)."""
    chosen: list = []
    used = 0
    for line in reversed(lines):
        if len(chosen) == max_calls or used + len(line) > char_budget:
            break
        chosen.append(line)
        used += len(line) + 1
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
    (`mirrorapi-v1` formats only). `history` (`mirrorapi-session-v1` only) is the session's earlier
    calls as `select_history` chose them, newest first. `system_prompt` is required for the
    `stabletoolbench` formats (the text of the MirrorAPI model's system prompt, which we do not
    ship) and replaces ours otherwise.
    """
    if history is not None and fmt != SESSION_FORMAT:
        raise ValueError(f"prompt format {fmt!r} has no session history; use {SESSION_FORMAT!r}")
    if fmt in OUR_SIMULATOR_FORMATS:
        parts = ["API documentation:\n" + render_doc_v1(doc)]
        if examples:
            shots = [f"Request: {canonical_json(a)}\nResponse: {render_observation(o.get('error', ''), o.get('response', ''), fmt)}"
                     for a, o in examples]
            parts.append("Examples:\n" + "\n".join(shots))
        if fmt == SESSION_FORMAT:
            parts.append("Earlier calls in this session, newest first:\n" + ("\n".join(history) if history else "(none)"))
        parts.append("Request:\n" + canonical_json(arguments))
        default_system = SIMULATOR_SYSTEM_SESSION_V1 if fmt == SESSION_FORMAT else SIMULATOR_SYSTEM_V1
        return [{"role": "system", "content": system_prompt or default_system},
                {"role": "user", "content": "\n\n".join(parts)}]
    if fmt in ("stabletoolbench", "stabletoolbench-cache", COT_FORMAT):
        if not system_prompt:
            raise ValueError(f"prompt format {fmt!r} needs a system prompt (the MirrorAPI model's own, from a file)")
        if fmt == COT_FORMAT:
            check_cot_system_prompt(system_prompt)
        return [{"role": "system", "content": system_prompt},
                {"role": "user", "content": _stabletoolbench_user(doc, arguments, fmt == "stabletoolbench-cache")}]
    raise ValueError(f"unknown simulator prompt format {fmt!r}; known: {', '.join(SIMULATOR_FORMATS)}")


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
    """
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
    if found:
        error = json.loads('"' + found.group(1) + '"')
        tail = found.group(2).strip()
        if tail.endswith("}"):
            tail = tail[:-1].rstrip()
        try:
            return {"error": error, "response": json.loads(tail)}, "regex"
        except ValueError:
            if tail.startswith('"'):
                return {"error": error, "response": tail[1:-1] if tail.endswith('"') and len(tail) > 1 else tail[1:]}, "regex"
    if "{" in body:
        repaired = json_repair.loads(body[body.index("{"):])
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


# ------------------------------------------------------------------------- chain-of-thought simulator
# MirrorAPI's CoT mode (StableToolBench server/system_prompts.py `COT_SYSTEM`, commit aa4ed9f): the system
# prompt's first line is the tag; the answer adds `mechanism_of_the_api` before `error` and `response`.
COT_TAG = "[CHAIN_OF_THOUGHT]"
COT_RATIONALE_KEY = "mechanism_of_the_api"
_COT_RATIONALE = re.compile(r'"mechanism_of_the_api"\s*:\s*"(.*?)"\s*,\s*"error"', re.DOTALL)


def check_cot_system_prompt(system_prompt: str) -> None:
    """A CoT-mode system prompt starts with the tag line (the tag is what switches MirrorAPI to CoT)."""
    if system_prompt.lstrip().split("\n", 1)[0].strip() != COT_TAG:
        raise ValueError(f"prompt format {COT_FORMAT!r} needs a system prompt whose first line is {COT_TAG}")


def cot_rationale(text: str) -> str:
    """The `mechanism_of_the_api` of a CoT answer ("" when there is none): from its JSON, else (upstream's
    answers put unescaped quotes in it) the text between its key and `"error"`."""
    observation_text = (text or "").strip()
    try:
        value = json.loads(observation_text)
        if isinstance(value, dict) and isinstance(value.get(COT_RATIONALE_KEY), str):
            return value[COT_RATIONALE_KEY]
    except ValueError:
        pass
    found = _COT_RATIONALE.search(observation_text)
    return found.group(1) if found else ""


# -------------------------------------------------------------------------------------- judge
FAC_SYSTEM_V1 = (
    "You decide whether an AI assistant's final answer solves a user's query. Judge the final answer "
    "alone and do not check its facts against your own knowledge.\n"
    "Solved: the answer genuinely addresses every part of the query and gives what was asked for; after "
    "reasonable attempts, reporting that nothing could be found also counts.\n"
    "Unsolved: a refusal, an apology or a promise instead of an answer, an answer that leaves a part of "
    "the query unaddressed, or an answer about something else.\n"
    "Reply in exactly this form:\n"
    "Verdict: Solved or Unsolved\n"
    "Reason: one short sentence"
)

VERDICTS = ("Solved", "Unsolved", "Unsure")
_LABELLED = re.compile(r"^[\s*#>_-]*(?:verdict|answer status)[\s*_]*[:：]?[\s*_]*\n?[\s*_]*(unsolved|solved|unsure)\b",
                       re.IGNORECASE | re.MULTILINE)
_REASON = re.compile(r"^[\s*#>_-]*reason[\s*_]*[:：]?[\s*_]*(.*)", re.IGNORECASE | re.MULTILINE | re.DOTALL)


SOPR_SYSTEM_V1 = (
    "You decide whether an AI assistant solved a user's query, from the tool calls it made and its final "
    "answer. Do not check facts against your own knowledge.\n"
    "Solved: the final answer addresses every part of the query and agrees with the tool results.\n"
    "Unsolved: a refusal, an apology or a promise instead of an answer, a part of the query left "
    "unaddressed, an answer that contradicts the tool results, or tool calls that all failed.\n"
    "Unsure: the answer looks complete, but the tool results neither confirm nor contradict it.\n"
    "Reply in exactly this form:\n"
    "Verdict: Solved, Unsolved or Unsure\n"
    "Reason: one short sentence"
)

# The verdicts each judge format may give (what `parse_verdict` accepts for it).
JUDGE_VERDICTS = {"fac-v1": ("Solved", "Unsolved"), "sopr-v1": ("Solved", "Unsolved", "Unsure")}


# Queries and answers longer than this are cut (and marked) before a judge sees them, by FAC, judge
# agreement and the judge's training data alike: one huge answer cannot exceed a judge's context
# and fail on every rerun, and a judge is trained on what it is shown.
JUDGE_TEXT_CHAR_BUDGET = 8000
# What a final answer may hold instead of text to judge (scored Unsolved without a judge call).
EMPTY, GIVE_UP = "empty", "give_up"


def cut_judge_text(text: str) -> str:
    """`text` stripped and cut to JUDGE_TEXT_CHAR_BUDGET characters (+ TRUNCATION_MARK when cut)."""
    return _cut(text.strip(), JUDGE_TEXT_CHAR_BUDGET)


def extract_final_answer(final_answer: Any) -> tuple[str, str]:
    """(status, text) of a converted answer's `final_answer` field.

    The field usually holds the raw Finish arguments, `{"return_type": ..., "final_answer": ...}`:
    the inner text is what gets judged (StableToolBench's FAC script judged the whole JSON string,
    notes §8.21). `give_up_and_restart` -> GIVE_UP; nothing to judge -> EMPTY. Text that is not
    Finish JSON (another agent's plain answer) is judged as it is.
    """
    if final_answer is None:
        return EMPTY, ""
    text = final_answer if isinstance(final_answer, str) else json.dumps(final_answer, ensure_ascii=False)
    text = text.strip()
    if not text:
        return EMPTY, ""
    finish = _finish_arguments(text)
    if finish is None:
        return ("answer", text) if "give_up_and_restart" not in text else (GIVE_UP, "")
    if str(finish.get("return_type", "")).strip() == "give_up_and_restart":
        return GIVE_UP, ""
    inner = finish.get("final_answer", "")
    inner = (inner if isinstance(inner, str) else json.dumps(inner, ensure_ascii=False)).strip()
    return ("answer", inner) if inner else (EMPTY, "")


def _finish_arguments(text: str) -> dict | None:
    """The Finish arguments dict, also from the slightly broken JSON agents write; None when not Finish JSON."""
    if not text.startswith("{") or ("final_answer" not in text and "return_type" not in text):
        return None
    try:
        parsed = json.loads(text, strict=False)  # strict=False: raw newlines inside strings, as agents write them
    except ValueError:
        parsed = json_repair.loads(text)
    return parsed if isinstance(parsed, dict) and ("final_answer" in parsed or "return_type" in parsed) else None


def judge_messages(query: str, answer: str, fmt: str = DEFAULT_JUDGE_FORMAT, steps: str = "") -> list[dict]:
    """The judge's chat messages; `steps` (the rendered tool calls) is used by `sopr-v1` only.

    `answer` is the text to judge (`extract_final_answer`); query and answer are cut by
    `cut_judge_text` here, so every caller (FAC, judge agreement, training data) shows the same."""
    query, answer = cut_judge_text(query), cut_judge_text(answer)
    if fmt == "sopr-v1":
        return [{"role": "system", "content": SOPR_SYSTEM_V1},
                {"role": "user", "content": f"Query:\n{query}\n\nTool calls:\n{steps.strip() or '(none)'}"
                                            f"\n\nFinal answer:\n{answer}"}]
    if fmt != "fac-v1":
        raise ValueError(f"unknown judge prompt format {fmt!r}; known: {', '.join(JUDGE_FORMATS)}")
    return [{"role": "system", "content": FAC_SYSTEM_V1},
            {"role": "user", "content": f"Query:\n{query}\n\nFinal answer:\n{answer}"}]


def judge_completion(verdict: str, reason: str = "") -> str:
    """The judge's training target: the verdict line, and a reason line when one is known."""
    return f"Verdict: {verdict}" + (f"\nReason: {reason.strip()}" if reason.strip() else "")


def parse_verdict(text: str, allowed: tuple[str, ...] = ("Solved", "Unsolved")) -> tuple[str | None, str]:
    """(verdict or None, reason) read from the label line (`Verdict:`, or StableToolBench's `Answer Status`).

    Only the labelled line decides: a reason that mentions "unsolved" does not flip a Solved verdict.
    A bare first line that is exactly a verdict word is accepted too. None when nothing matches.
    """
    text = text or ""
    found = _LABELLED.search(text)
    verdict = found.group(1).capitalize() if found else None
    if verdict is None:
        first = next((line.strip(" *#.:`") for line in text.splitlines() if line.strip()), "")
        verdict = first.capitalize() if first.lower() in {v.lower() for v in VERDICTS} else None
    if verdict not in allowed:
        verdict = None
    reason = _REASON.search(text[found.end():] if found else text)
    return verdict, (reason.group(1).strip() if reason else "")


# -------------------------------------------------------------------------------------- agent
AGENT_SYSTEM_V1 = (
    "You are an agent that solves a user's task with the functions you are given.\n"
    "Work step by step. At each step, think briefly (at most five sentences) about where you stand and "
    "what to do next, then call one function to act. You will see the function's result and can decide "
    "on the next step.\n"
    "Rules:\n"
    "1. A step cannot be undone. When you are stuck, or the functions keep failing, call Finish with "
    "return_type \"give_up_and_restart\" to start over.\n"
    "2. Always end by calling Finish. With return_type \"give_answer\", put everything the user needs into "
    "final_answer: it is the only part the user sees.\n"
    "3. Call the functions by their own names, never by the tool names.\n"
    "Task: answer the user's real-time query with the functions. You can use these tools:\n"
    "{tools}"
)


AGENT_SYSTEM_REACT_V1 = (
    "You are an agent that solves a user's task with the functions listed below. You use a function by "
    "writing its name and arguments; its result is then shown to you.\n"
    "Reply to every message in exactly this layout, then stop:\n"
    "Thought: where you stand and what to do next, in at most five sentences\n"
    "Action: the name of ONE function from the list\n"
    "Action Input: the arguments of that function as one JSON object\n"
    "The result comes back to you as \"Observation: ...\". Do not write observations yourself.\n"
    "Rules:\n"
    "1. A step cannot be undone. When you are stuck, or the functions keep failing, write \"Action: Finish\" "
    "and \"Action Input: {\"return_type\": \"give_up_and_restart\"}\" to start over.\n"
    "2. Always end with \"Action: Finish\" and \"Action Input: {\"return_type\": \"give_answer\", "
    "\"final_answer\": \"...\"}\": the final answer is the only part the user sees, so make it complete.\n"
    "3. Use the function names exactly as listed, never the tool names.\n"
    "Task: answer the user's real-time query with the functions. You can use these tools:\n"
    "{tools}\n"
    "Functions (name: description; arguments as a JSON schema):\n"
    "{functions}"
)
REACT_OBSERVATION = "Observation: "
# What the model is told after a reply in which no `Action:` line was found.
REACT_NO_ACTION = (REACT_OBSERVATION + "no action found in your reply. Reply with a \"Thought:\" line, an "
                   "\"Action:\" line naming one function and an \"Action Input:\" line with its JSON arguments.")
_REACT_LABEL = re.compile(r"^[\s*#>_`-]*(thought|action input|action|observation)[\s*_`]*:[\s*_]*",
                          re.IGNORECASE | re.MULTILINE)
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def agent_function_list(functions: Sequence[dict]) -> str:
    """One line per function for text agent formats: `name: description; arguments: {json schema}`."""
    lines = []
    for schema in functions:
        function = schema.get("function", schema)
        parameters = json.dumps(function.get("parameters") or {}, ensure_ascii=False, separators=(",", ":"))
        lines.append(f"{function.get('name')}: {function.get('description') or ''}; arguments: {parameters}")
    return "\n".join(lines)


class ReactStep:
    """One `agent-react-v1` reply read as a step: the thought, at most one action and its arguments.

    `arguments` is the Action Input as the function gets it (a JSON string); `problem` says what was
    wrong with the reply's layout ("" when nothing was)."""

    def __init__(self, thought: str, action: str | None, arguments: str | None, problem: str = ""):
        self.thought, self.action, self.arguments, self.problem = thought, action, arguments, problem

    def __repr__(self) -> str:
        return f"ReactStep({self.thought!r}, {self.action!r}, {self.arguments!r}, {self.problem!r})"


def _react_arguments(text: str) -> tuple[str, str]:
    """(arguments, problem) from the text after `Action Input:`: JSON as written when it parses, else the
    object json_repair recovers (small models leave quotes and braces open), else the text as it is."""
    text = re.sub(r"^```(?:json)?\s*|\s*```\s*$", "", text.strip()).strip()
    if not text:
        return "{}", "empty Action Input"
    try:
        json.loads(text, strict=False)
        return text, ""
    except ValueError:
        pass
    if "{" in text:
        repaired = json_repair.loads(text[text.index("{"):])
        if isinstance(repaired, dict):
            return json.dumps(repaired, ensure_ascii=False), "Action Input repaired"
    return text, "Action Input is not JSON"


def parse_react_step(text: str) -> ReactStep:
    """Read an `agent-react-v1` reply. The first `Action:` is the step's one call; what follows an
    `Observation:` line the model wrote itself is dropped (it is not a result). Labels are matched
    without regard to case or markdown (`**Action:**`). An action without `Action Input` gets `{}`."""
    text = text or ""
    parts: list[tuple[str, str]] = []  # (label, text) in order
    found = list(_REACT_LABEL.finditer(text))
    lead = text[:found[0].start()] if found else text
    for index, match in enumerate(found):
        end = found[index + 1].start() if index + 1 < len(found) else len(text)
        parts.append((match.group(1).lower(), text[match.end():end].strip()))
    thought_parts, action, arguments, problems = [lead.strip()] if lead.strip() else [], None, None, []
    for label, body in parts:
        if label == "observation":
            if action is not None:
                problems.append("wrote an Observation itself (dropped)")
            break
        if label == "thought" and action is None:
            thought_parts.append(body)
        elif label == "action" and action is None:
            name = _FUNCTION_NAME.match(body.strip("`'\"* "))
            action = name.group(0) if name else ""
        elif label == "action input" and action is not None and arguments is None:
            arguments, problem = _react_arguments(body)
            problems += [problem] if problem else []
        elif action is not None:
            problems.append("more than one action; the first is taken")
            break
    thought = "\n".join(thought_parts).strip()
    if action is None:
        return ReactStep(thought, None, None, "no Action line")
    if arguments is None:
        arguments, problems = "{}", problems + ["no Action Input"]
    return ReactStep(thought, action, arguments, "; ".join(problems))


# A JSON object in GBNF (llama.cpp's grammar language); whitespace kept short so a model cannot loop in it.
_GBNF_JSON = r"""object ::= "{" ws ( string ws ":" ws value ( ws "," ws string ws ":" ws value )* )? ws "}"
value ::= object | array | string | number | "true" | "false" | "null"
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? [0-9]+ ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= " "?
"""


def react_grammar(function_names: list[str], thought_chars: int = 400) -> str:
    """A GBNF grammar of one `agent-react-v1` reply: a one-line thought (at most `thought_chars` characters),
    one of `function_names`, a JSON object. For engines with grammar-constrained decoding (llama.cpp's
    servers take it as the request's `grammar`), so a model that does not keep the layout still acts."""
    names = " | ".join(json.dumps(name) for name in dict.fromkeys(function_names))
    return (f'root ::= "Thought: " thought "\\nAction: " action "\\nAction Input: " object\n'
            f"thought ::= [^\\n]{{1,{thought_chars}}}\naction ::= {names}\n" + _GBNF_JSON)


def render_react_step(thought: str, calls: list[tuple[str, str]]) -> str:
    """An assistant step (its text, its calls as (name, arguments)) in the `agent-react-v1` layout."""
    lines = [f"Thought: {thought.strip()}"] if thought and thought.strip() else []
    for name, arguments in calls:
        lines += [f"Action: {name}", f"Action Input: {arguments}"]
    return "\n".join(lines) or "Thought:"


def react_conversation(messages: list[dict]) -> list[dict]:
    """The runner's history (StableToolBench's messages) as `agent-react-v1` text messages: assistant steps
    rendered as Thought / Action / Action Input, each tool result as a user message `Observation: ...`,
    and after a reply without an action, the reminder of the layout."""
    out: list[dict] = []
    for message in messages:
        role, content = message.get("role"), message.get("content") or ""
        if role == "assistant":
            calls = [((c.get("function") or {}).get("name", ""), (c.get("function") or {}).get("arguments", ""))
                     for c in message.get("tool_calls") or []]
            out.append({"role": "assistant", "content": render_react_step(content, calls)})
            if not calls:
                out.append({"role": "user", "content": REACT_NO_ACTION})
        elif role in ("tool", "function"):
            out.append({"role": "user", "content": REACT_OBSERVATION + content})
        else:
            out.append({"role": role, "content": content})
    return out


def agent_tool_list(tools: list[tuple[str, str]]) -> str:
    """The numbered tool list of the agent's system prompt: `1.<std_tool>: <description>`.

    Like StableToolBench's task description: at most 512 characters of a tool's description, newlines
    removed, `None` when it has none.
    """
    lines = []
    for number, (name, description) in enumerate(tools, 1):
        text = (description or "")[:512].replace("\n", "").strip() or "None"
        lines.append(f"{number}.{name}: {text}")
    return "\n".join(lines)


def agent_messages(query: str, tools: list[tuple[str, str]], fmt: str = DEFAULT_AGENT_FORMAT,
                   system_prompt: str | None = None, functions: Sequence[dict] = ()) -> list[dict]:
    """The first two messages of an agent run. `system_prompt` (a user's own text, e.g. from a file)
    replaces ours; `{tools}` in it is replaced by the tool list, `{functions}` by the function list
    (`functions`: the OpenAI tool schemas, which text formats show in the prompt)."""
    if fmt not in AGENT_FORMATS:
        raise ValueError(f"unknown agent prompt format {fmt!r}; known: {', '.join(AGENT_FORMATS)}")
    default = AGENT_SYSTEM_REACT_V1 if fmt == "agent-react-v1" else AGENT_SYSTEM_V1
    system = (system_prompt or default).replace("{tools}", agent_tool_list(tools))
    system = system.replace("{functions}", agent_function_list(functions))
    # The query between newlines and a closing "Begin!": the user-message layout StableToolBench's
    # agents were trained with.
    return [{"role": "system", "content": system}, {"role": "user", "content": f"\n{query}\nBegin!\n"}]


def agent_diversity_message(candidates: list[dict], observation: str = "") -> dict:
    """DFS's message before a sibling branch: earlier actions from this state, to be avoided."""
    text = ("Your earlier attempts from this point did not succeed. These are the actions you already took "
            "here:\n" + json.dumps(candidates, ensure_ascii=False, indent=2) + "\n")
    if observation:
        text += f"The last observation before them was: {observation}\n"
    text += ("You are still in the middle of the task. Look at the current state and choose an action that "
             "differs from all of the above.")
    return {"role": "user", "content": text}


# ------------------------------------------------------------------------------ SoWR preference
SOWR_SYSTEM_V1 = (
    "You compare two AI assistants' attempts at the same user query and pick the better one. Each "
    "attempt shows the tool calls it made and its final answer. Prefer the answer that solves more of the "
    "query, agrees with its tool results and gives the user more useful information. Do not check facts "
    "against your own knowledge; ignore the order in which the answers are shown.\n"
    "Reply in exactly this form:\n"
    "Preferred: A or B\n"
    "Reason: one short sentence"
)
_PREFERRED = re.compile(r"^[\s*#>_-]*(?:preferred|better answer|winner)[\s*_]*[:：]?[\s*_]*(?:answer\s*)?([AB])\b",
                        re.IGNORECASE | re.MULTILINE)


def preference_messages(query: str, answers: tuple[tuple[str, str], tuple[str, str]],
                        fmt: str = "sowr-v1") -> list[dict]:
    """The `sowr-v1` judge messages; `answers` = ((steps A, final answer A), (steps B, final answer B))."""
    if fmt not in PREFERENCE_FORMATS:
        raise ValueError(f"unknown preference prompt format {fmt!r}; known: {', '.join(PREFERENCE_FORMATS)}")
    parts = [f"Query:\n{query.strip()}"]
    for label, (steps, answer) in zip("AB", answers, strict=True):
        parts.append(f"Answer {label}\nTool calls:\n{steps.strip() or '(none)'}\nFinal answer:\n"
                     f"{answer.strip() or '(no final answer)'}")
    return [{"role": "system", "content": SOWR_SYSTEM_V1}, {"role": "user", "content": "\n\n".join(parts)}]


def parse_preference(text: str) -> tuple[str | None, str]:
    """("A" | "B" | None, reason) from a `Preferred: A` line (a bare first line `A` / `B` also counts)."""
    text = text or ""
    found = _PREFERRED.search(text)
    choice = found.group(1).upper() if found else None
    if choice is None:
        first = next((line.strip(" *#.:`") for line in text.splitlines() if line.strip()), "")
        choice = first.upper() if first.upper() in ("A", "B") else None
    reason = _REASON.search(text[found.end():] if found else text)
    return choice, (reason.group(1).strip() if reason else "")


# ------------------------------------------------------------------------------- ToolEyes judge (tooleyes-v1)
# ToolEyes' judged criteria (arXiv 2401.00741; Code/Evaluation/util/utils.py reads them as thought_foucus,
# thought_validity, thought_quality, action_thought_match, relavance, each 0-10), in our own words.
TOOLEYES_RATINGS = ("focus", "validity", "quality", "selection", "relevance")
TOOLEYES_SYSTEM_V1 = (
    "You rate how an AI assistant used tools to serve a user's query. You see the query, the tool calls it made "
    "(with what they returned) and its final answer. Rate each criterion from 0 (worst) to 10 (best):\n"
    "Focus: its steps stay on what the user asked, without drifting to other goals.\n"
    "Validity: its plan of calls is feasible and each step follows from what came before.\n"
    "Quality: the plan is efficient and complete, without useless or repeated calls.\n"
    "Selection: each tool called suits the step it was called for.\n"
    "Relevance: the final answer addresses the query with the information the tools returned.\n"
    "Reply with exactly five lines:\nFocus: N\nValidity: N\nQuality: N\nSelection: N\nRelevance: N")
_RATING = re.compile(r"^[\s*#>_-]*(focus|validity|quality|selection|relevance)[\s*_]*[:：][\s*_]*(\d+(?:\.\d+)?)",
                     re.IGNORECASE | re.MULTILINE)


def tooleyes_messages(query: str, steps: str, answer: str) -> list[dict]:
    user = (f"Query:\n{cut_judge_text(query)}\n\nTool calls:\n{steps or '(none)'}\n\n"
            f"Final answer:\n{cut_judge_text(answer) or '(none)'}")
    return [{"role": "system", "content": TOOLEYES_SYSTEM_V1}, {"role": "user", "content": user}]


def parse_tooleyes_ratings(text: str) -> dict[str, float] | None:
    """The five ratings (clipped to 0-10) of a `tooleyes-v1` answer; None unless all five are there."""
    found = {name.lower(): min(10.0, float(value)) for name, value in _RATING.findall(text or "")}
    return found if set(found) >= set(TOOLEYES_RATINGS) else None
