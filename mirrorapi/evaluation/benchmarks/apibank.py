"""API-Bank level-1 (Call) and level-2 (Retrieve+Call): API-call accuracy and response ROUGE-L on our virtual server.

API-Bank (Li et al., EMNLP 2023, arXiv 2304.08244; AlibabaResearch/DAMO-ConvAI `api-bank/`, read at commit
5c38bb7d1d78c7a7f12aa415d620d6305dbe2078) evaluates a model on annotated dialogues. Every API turn of a dialogue
gives two samples (its `evaluator.py`, `Sample.from_chat_history`):
- a *call* sample: the history before the API turn; the model writes `[ApiName(key='value', ...)]`; the call is
  executed and counted correct when the API's own `check_api_call_correctness` accepts the executed result against
  the annotated one (`RULES` below restates those per-API rules);
- a *response* sample: the history up to and including the API turn; the model writes the AI's next utterance,
  scored by ROUGE-L F against the annotated one. When the next turn is itself an API call, API-Bank counts it as
  one more call sample (the same call with one more turn of history); we do the same.
Level 1 shows the model the descriptions of the dialogue's APIs; level 2 only the ToolSearcher's.

What differs from API-Bank, and why:
- The call is executed on OUR virtual server (`POST /virtual`, tools `data/samples/tools/APIBank`), not on API-Bank's
  Python classes: API-Bank's recorded results are imported into the server's cache (`write_recorded_pairs`), so an
  annotated call gets its recorded answer and any other call gets the simulator's (or, in replay mode, an error).
- ToolSearcher is API-Bank's retriever over its own tool list (sentence-transformers), not a tool the simulator
  serves: its calls are answered from the recorded ToolSearcher results of the dialogues (same arguments, same
  answer); a query the recordings do not hold gets no output and an exception, i.e. counts as wrong.
- The server speaks JSON text: a recorded output and a served one are both read back with `json.loads` where they
  are JSON text, so `"success"` and `success` compare equal, as do a dict and its JSON.
- ROUGE-L is rouge-score's `rougeL` F-measure (the project's ROUGE library); API-Bank used the `rouge` package,
  whose tokenizer keeps case and punctuation, so values differ slightly.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mirrorapi.engine_client import EngineClient, EngineError

LEVELS = {1: "level-1.jsonl", 2: "level-2.jsonl"}
LEVEL_NAMES = {1: "Call", 2: "Retrieve+Call"}
CATEGORY = "APIBank"
TOOL_SEARCHER = "ToolSearcher"

# API-Bank's two instructions (evaluator.py), as the benchmark states them: the model is scored on this text.
CALL_INSTRUCTION = """
Based on the given API description and the existing conversation history 1..t, please generate the API request \
that the AI should call in step t+1 and output it in the format of [ApiName(key1='value1', key2='value2', ...)], \
replace the ApiName with the actual API name, and replace the key and value with the actual parameters. 
Your output should start with a square bracket "[" and end with a square bracket "]". Do not output any other \
explanation or prompt or the result of the API call in your output. 
This year is 2023.
Input: 
User: [User's utterence]
AI: [AI's utterence]

Expected output:
[ApiName(key1='value1', key2='value2', ...)]

API descriptions:
"""
RESPONSE_INSTRUCTION = """
Based on the given API description and the existing conversation history 1..t, please generate the next dialog \
that the AI should response after the API call t.
This year is 2023.
Input: 
User: [User's utterence]
AI: [AI's utterence]
[ApiName(key1='value1', key2='value2', \u2026)]

Expected output:
AI: [AI's utterence]

API descriptions:
"""


# ------------------------------------------------------------------------------- data
@dataclass
class Sample:
    """One call or response sample of a dialogue (API-Bank's `Sample`)."""

    level: int
    dialogue: str  # the dialogue's file in API-Bank's lv1-lv2-samples/
    history: list[dict]
    apis: list[str]  # the APIs the dialogue uses (sorted; API-Bank used a set)
    truth: dict  # the annotated turn: role API (a call sample) or AI (a response sample)

    @property
    def kind(self) -> str:
        return "call" if self.truth["role"] == "API" else "response"


def load_dialogues(data: str | Path, level: int) -> list[dict]:
    """`{"file", "turns"}` per dialogue of `<data>/level-N.jsonl` (data/apibank: API-Bank's own dialogues)."""
    path = Path(data) / LEVELS[level]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no API-Bank level-{level} dialogues (expected data/apibank/{LEVELS[level]})")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def samples_of(dialogue: dict, level: int) -> list[Sample]:
    turns = dialogue["turns"]
    apis = sorted({t["api_name"] for t in turns if t["role"] == "API"})
    out = []
    for i, turn in enumerate(turns):
        if turn["role"] != "API":
            continue
        out.append(Sample(level, dialogue["file"], turns[:i], apis, turn))
        if i + 1 < len(turns):  # API-Bank indexes past the end here (a crash); no dialogue of levels 1-2 ends so
            out.append(Sample(level, dialogue["file"], turns[:i + 1], apis, turns[i + 1]))
    return out


def load_descriptions(data: str | Path) -> dict[str, str]:
    """API name -> the description text API-Bank shows (`ToolManager.get_api_description`: JSON of name,
    description, input_parameters, output_parameters; data/apibank/api_descriptions.json holds the class
    attributes)."""
    raw = json.loads((Path(data) / "api_descriptions.json").read_text(encoding="utf-8"))
    return {name: json.dumps(info) for name, info in raw.items()}


# ------------------------------------------------------------------------------- prompts
def call_text(api_name: str, params: dict) -> str:
    return "[{}({})]".format(api_name, ", ".join(f"{k}='{v}'" for k, v in params.items()))


def build_messages(sample: Sample, descriptions: dict[str, str]) -> list[dict]:
    """API-Bank's chat for a sample: the instruction and descriptions as system message, then the history
    (an API turn becomes a system message `[Api(k='v')] Response: <Python str of the output>`)."""
    if sample.kind == "call":
        shown = [TOOL_SEARCHER] if sample.level == 2 else sample.apis
        system = CALL_INSTRUCTION + "\n".join(descriptions[name] for name in shown)
    else:
        system = RESPONSE_INSTRUCTION + "\n".join(descriptions[name] for name in sample.apis)
    messages = [{"role": "system", "content": system}]
    for turn in sample.history:
        if turn["role"] == "User":
            messages.append({"role": "user", "content": turn["text"]})
        elif turn["role"] == "AI":
            messages.append({"role": "assistant", "content": turn["text"]})
        elif turn["role"] == "API":
            content = f"{call_text(turn['api_name'], turn['param_dict'])} Response: {turn['result']['output']}"
            messages.append({"role": "system", "content": content})
        else:
            raise ValueError(f"{sample.dialogue}: unknown role {turn['role']!r}")
    return messages


# ------------------------------------------------------------------------------- parsing a predicted call
_CALL = re.compile(r"\[(\w+)\((.*)\)\]")
# API-Bank's argument pattern (api_call_extraction.py): quoted values, [lists], or bare words; all become strings.
_ARGUMENT = re.compile(r"(\w+)\s*=\s*['\"](.+?)['\"]|(\w+)\s*=\s*(\[.*\])|(\w+)\s*=\s*(\w+)")


def parse_call(text: str) -> tuple[str, dict[str, str]] | None:
    """(API name, arguments) of the first `[Name(...)]` in a model's output; None when there is none."""
    match = _CALL.search(text)
    if match is None:
        return None
    arguments = {}
    for m in _ARGUMENT.finditer(match.group(2)):
        key, value = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4)) if m.group(3) else (
            m.group(5), m.group(6))
        arguments[key] = value
    return match.group(1), arguments


# ------------------------------------------------------------------------------- API-Bank's correctness rules
# Each API's `check_api_call_correctness` (api-bank/apis/*.py) compares the executed result {api_name, input,
# output, exception} with the annotated one. Restated here per API; the default is input, output and exception equal.
Result = dict


def _same(*keys: str) -> Callable[[Result, Result], bool]:
    return lambda r, g: all(r[k] == g[k] for k in keys)


def _words_overlap(a: str, b: str) -> bool:
    """API-Bank's content test: Jaccard similarity of the space-split words above 0.5."""
    x, y = set(a.split(" ")), set(b.split(" "))
    return len(x & y) / len(x | y) > 0.5


def _zfill_year(value: str) -> str:
    parts = value.strip().split("-")
    if len(parts) == 3 and len(parts[0]) != 4:
        parts[0] = parts[0].zfill(4)
    return "-".join(parts)


def _date_as(value: str, fmt: str) -> Any:
    """API-Bank's format_check: zero-fill the year, parse with `fmt`. An unparsable value becomes its exception
    object there, equal to nothing; a fresh `object()` here."""
    try:
        return datetime.datetime.strptime(_zfill_year(value), fmt).strftime(fmt)
    except ValueError:
        return object()


def _history_date(value: str) -> str:
    """QueryHistoryToday's filter_date_format: month-day of a %Y-%m-%d or %m-%d date."""
    value = _zfill_year(value)
    for fmt in ("%Y-%m-%d", "%m-%d"):
        try:
            return datetime.datetime.strptime(value, fmt).strftime("%m-%d")
        except ValueError:
            continue
    return object()  # type: ignore[return-value]  # a sentinel equal to no string: no date matches


def _fields(**normalizers: Callable[[Any], Any]) -> Callable[[Result, Result], bool]:
    """Named input fields equal after a normalizer, then output and exception equal."""
    def check(r: Result, g: Result) -> bool:
        return all(norm(r["input"][k]) == norm(g["input"][k]) for k, norm in normalizers.items()) and _same(
            "output", "exception")(r, g)
    return check


def _content(field_name: str, lower: bool, exact: tuple[str, ...] | None) -> Callable[[Result, Result], bool]:
    """Agenda/reminder/meeting APIs: the free-text field by word overlap; `exact` fields (None: all the others)
    equal; then output and exception."""
    def check(r: Result, g: Result) -> bool:
        a, b = r["input"][field_name], g["input"][field_name]
        if not _words_overlap(a.lower() if lower else a, b.lower() if lower else b):
            return False
        if exact is None:
            rest = {k: v for k, v in r["input"].items() if k != field_name}
            if rest != {k: v for k, v in g["input"].items() if k != field_name}:
                return False
        elif any(r["input"][k] != g["input"][k] for k in exact):
            return False
        return _same("output", "exception")(r, g)
    return check


def _delete_by_time(r: Result, g: Result) -> bool:
    """Delete{Agenda,Meeting,Reminder}: both succeeded -> the time alone decides; else output and exception."""
    if g["output"] == "success" and r["output"] == "success":
        return r["input"]["time"] == g["input"]["time"]
    return _same("output", "exception")(r, g)


def _none_output_or(check_inputs: Callable[[Result, Result], bool]) -> Callable[[Result, Result], bool]:
    """APIs returning random ids/tokens: the output only has to be absent when the annotated one is."""
    def check(r: Result, g: Result) -> bool:
        if g["output"] is None and r["output"] is not None:
            return False
        return check_inputs(r, g) and r["exception"] == g["exception"]
    return check


def _scene(compare_output: bool) -> Callable[[Result, Result], bool]:
    def devices(result: Result) -> list:
        items = [{**d, "name": d["name"].strip().lower(), "description": d["description"].strip()}
                 for d in result["input"]["devices"]]
        return sorted(items, key=lambda d: d["name"])

    def check(r: Result, g: Result) -> bool:
        if r["input"]["name"].strip().lower() != g["input"]["name"].strip().lower() or devices(r) != devices(g):
            return False
        if compare_output and r["output"] != g["output"]:
            return False
        if not compare_output and g["output"] is None and r["output"] is not None:
            return False
        return r["exception"] == g["exception"]
    return check


def _search_engine(r: Result, g: Result) -> bool:
    def ordered(output: Any) -> Any:
        return sorted(output, key=lambda x: x["title"] + x["abstract"], reverse=True) if output is not None else None
    return r["exception"] == g["exception"] and ordered(r["output"]) == ordered(g["output"])


def _strip(value: Any) -> Any:
    return value.strip() if isinstance(value, str) else value


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _upper(value: Any) -> Any:
    return str(value).upper().strip()


_STAMP, _DAY = "%Y-%m-%d %H:%M:%S", "%Y-%m-%d"
RULES: dict[str, Callable[[Result, Result], bool]] = {
    "AddAgenda": _content("content", lower=False, exact=("time", "location")),
    "ModifyAgenda": _content("content", lower=False, exact=("time", "location")),
    "QueryAgenda": _content("content", lower=False, exact=("time", "location")),
    "AddReminder": _content("content", lower=True, exact=("time",)),
    "ModifyReminder": _content("content", lower=True, exact=("time",)),
    "QueryReminder": _content("content", lower=True, exact=("time",)),
    "AddMeeting": _content("meeting_topic", lower=False, exact=None),
    "ModifyMeeting": _content("meeting_topic", lower=False, exact=None),
    "QueryMeeting": _content("meeting_topic", lower=False, exact=None),
    "DeleteAgenda": _delete_by_time, "DeleteMeeting": _delete_by_time, "DeleteReminder": _delete_by_time,
    "Calculator": _fields(formula=lambda f: f.replace(" ", "")),
    "GetToday": lambda r, g: r["output"] is not None and r["exception"] is None and not r["input"],
    "Dictionary": _same("output", "exception"), "Wiki": _same("output", "exception"),
    "ToolSearcher": _same("output", "exception"),
    "PlayMusic": _same("output"),
    "SearchEngine": _search_engine,
    "Translate": _fields(src=lambda s: s),
    "AppointmentRegistration": _none_output_or(lambda r, g: all(
        n(r["input"][k]) == n(g["input"][k]) for k, n in
        (("patient_name", _strip), ("date", lambda d: _date_as(d, _DAY)), ("doctor_name", _strip)))),
    "RegisterUser": _none_output_or(lambda r, g: r["input"] == g["input"]),
    "AddScene": _scene(compare_output=False), "ModifyScene": _scene(compare_output=True),
    "DeleteScene": _fields(name=_lower), "QueryScene": _fields(name=_lower),
    "CancelRegistration": _fields(appointment_id=_strip),
    "CancelTimedSwitch": _fields(name=_lower, time=lambda t: _date_as(t, _STAMP)),
    "TimedSwitch": _fields(name=_lower, time=lambda t: _date_as(t, _STAMP), on=lambda v: v),
    "DocumentQA": _fields(url=_strip, question=_strip),
    "EmergencyKnowledge": _fields(symptom=_lower), "SymptomSearch": _fields(symptom=_lower),
    "ModifyRegistration": _fields(appointment_id=lambda v: str(v).strip(),
                                  new_appointment_date=lambda d: None if d is None else _date_as(d, _DAY),
                                  new_appointment_doctor=_strip),
    "QueryBalance": _fields(token=_strip),
    "QueryHealthData": _fields(user_id=lambda u: _upper(u) or None, start_time=lambda t: _date_as(t, _STAMP),
                               end_time=lambda t: _date_as(t, _STAMP)),
    "QueryHistoryToday": _fields(date=_history_date),
    "QueryRegistration": _fields(patient_name=_strip, date=lambda d: _date_as(d, _DAY)),
    "QueryStock": _fields(stock_code=lambda c: _upper(c) or None, date=lambda d: _date_as(d, _DAY)),
    "RecordHealthData": _fields(user_id=_upper, time=lambda t: _date_as(t, _STAMP)),  # health_data not compared
    "SendEmail": _fields(receiver=_lower, subject=_strip, content=_strip),
}


def _default_rule(r: Result, g: Result) -> bool:
    return _same("input", "output", "exception")(r, g)


def call_is_correct(result: Result, truth: Result) -> bool:
    """API-Bank's verdict for an executed call: the API's rule; a missing field counts as wrong (as its KeyError)."""
    try:
        return bool(RULES.get(truth["api_name"], _default_rule)(result, truth))
    except (KeyError, TypeError, AttributeError):
        return False


# ------------------------------------------------------------------------------- executing on the virtual server
def json_value(value: Any) -> Any:
    """A value as JSON text decodes (the server's wire form); other values as they are."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def tools_of(tools_folder: str | Path) -> dict[str, str]:
    """API name -> tool name of API-Bank's level-1/2 tools in `<tools_folder>/APIBank/` (`apibank_*`; the level-3
    `apibank_lv3_*` excluded)."""
    out = {}
    for path in sorted((Path(tools_folder) / CATEGORY).glob("apibank_*.json")):
        if path.name.startswith("apibank_lv3_"):
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        out.update({api["name"]: doc["tool_name"] for api in doc["api_list"]})
    return out


def recorded_results(dialogues: list[dict]) -> dict[tuple[str, str], dict]:
    """(API, canonical arguments) -> the annotated result, first seen wins."""
    out: dict[tuple[str, str], dict] = {}
    for dialogue in dialogues:
        for turn in dialogue["turns"]:
            if turn["role"] == "API":
                out.setdefault((turn["api_name"], json.dumps(turn["param_dict"], sort_keys=True)), turn["result"])
    return out


def write_recorded_pairs(dialogues: list[dict], tools: dict[str, str], path: str | Path) -> int:
    """API-Bank's recorded calls as pairs (our JSONL schema) for `mirrorapi cache import`: an annotated call then
    gets its recorded answer from the server. ToolSearcher is left out (see the module doc). Returns the count."""
    rows = []
    for dialogue in dialogues:
        for step, turn in enumerate(t for t in dialogue["turns"] if t["role"] == "API"):
            if turn["api_name"] not in tools:
                continue
            result = turn["result"]
            output = result["output"]
            rows.append({"source": "api-bank", "episode": dialogue["file"].removesuffix(".jsonl"), "step": step,
                         "category": CATEGORY, "tool_name": tools[turn["api_name"]], "api_name": turn["api_name"],
                         "tool_input": turn["param_dict"],
                         "response": {"error": result["exception"] or "",
                                      "response": output if isinstance(output, str) else json.dumps(output)}})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def parameter_types(data: str | Path) -> dict[str, dict[str, str]]:
    """API name -> {parameter: declared type} (API-Bank's input_parameters)."""
    raw = json.loads((Path(data) / "api_descriptions.json").read_text(encoding="utf-8"))
    return {name: {k: v["type"] for k, v in info["input_parameters"].items()} for name, info in raw.items()}


def typed_arguments(arguments: dict[str, str], types: dict[str, str]) -> dict:
    """API-Bank's `ToolManager.api_call` conversion of the parsed strings: int, float and bool by the declared
    type, everything else (lists included) kept as the string; an unknown parameter or a non-number raises
    ValueError (an assertion there, a wrong call either way). So a list-typed recorded input (AddMeeting's
    attendees) never equals a parsed call's, in API-Bank as here."""
    out: dict[str, Any] = {}
    for key, value in arguments.items():
        if key not in types:
            raise ValueError(f"invalid parameter name. parameter: {key}")
        kind = types[key]
        if kind == "int":
            if not value.isdigit():
                raise ValueError(f"invalid parameter type. parameter: {value}")
            out[key] = int(value)
        elif kind == "float":
            if not value.replace(".", "", 1).isdigit():
                raise ValueError("invalid parameter type.")
            out[key] = float(value)
        elif kind == "bool":
            out[key] = value == "True"
        else:
            out[key] = value
    return out


@dataclass
class VirtualApiBank:
    """Executes a parsed call on the virtual server (ToolSearcher from the recordings) into API-Bank's result shape."""

    server: str  # the /virtual URL
    tools: dict[str, str]
    searcher: dict[tuple[str, str], dict]
    types: dict[str, dict[str, str]]
    http: httpx.AsyncClient = field(default_factory=lambda: httpx.AsyncClient(timeout=120.0))

    async def execute(self, api_name: str, arguments: dict[str, str]) -> Result:
        """The call as API-Bank records it: typed input, output, exception. The server gets the arguments as
        written (the recorded calls are all strings, so a right call is a cache hit)."""
        result: Result = {"api_name": api_name, "input": None}
        try:
            result["input"] = typed_arguments(arguments, self.types.get(api_name, {})) or None
        except ValueError as exc:
            return {**result, "input": arguments, "output": None, "exception": str(exc)}
        if api_name == TOOL_SEARCHER:
            recorded = self.searcher.get((api_name, json.dumps(arguments, sort_keys=True)))
            if recorded is None:
                return {**result, "output": None, "exception": "ToolSearcher query not in API-Bank's recordings"}
            return {**result, "output": recorded["output"], "exception": recorded["exception"]}
        if api_name not in self.tools:
            return {**result, "output": None, "exception": f"unknown API {api_name}"}
        body = {"category": CATEGORY, "tool_name": self.tools[api_name], "api_name": api_name,
                "tool_input": json.dumps(arguments)}
        answer = (await self.http.post(self.server, json=body)).raise_for_status().json()
        error = answer.get("error") or None
        return {**result, "output": None if error else json_value(answer.get("response")), "exception": error}


def truth_result(truth: dict) -> Result:
    result = dict(truth["result"])
    result["output"] = json_value(result["output"])
    return result


# ------------------------------------------------------------------------------- scoring
def rouge_l(reference: str, prediction: str) -> float:
    from rouge_score import rouge_scorer  # the eval extra's

    if not prediction.strip():
        return 0.0
    return rouge_scorer.RougeScorer(["rougeL"]).score(reference, prediction)["rougeL"].fmeasure


@dataclass
class Settings:
    data: Path
    tools_folder: Path
    server: str
    base_urls: list[str]
    model: str
    api_key: str = "EMPTY"
    levels: tuple[int, ...] = (1, 2)
    temperature: float = 0.0
    max_tokens: int = 256
    concurrency: int = 4
    limit: int | None = None  # dialogues per level


async def _score(sample: Sample, engine: EngineClient, api: VirtualApiBank, descriptions: dict[str, str],
                 settings: Settings) -> dict:
    row: dict[str, Any] = {"level": sample.level, "dialogue": sample.dialogue, "kind": sample.kind}
    try:
        output = await engine.chat(build_messages(sample, descriptions), temperature=settings.temperature,
                                   max_tokens=settings.max_tokens)
    except EngineError as exc:
        output, row["engine_error"] = "", str(exc)
    row["output"] = output
    if sample.kind == "response":
        row["reference"] = sample.truth["text"]
        row["rouge_l"] = rouge_l(sample.truth["text"], output)
        return row
    truth = sample.truth
    row["truth"] = call_text(truth["api_name"], truth["param_dict"])
    parsed = parse_call(output)
    if parsed is None:
        return {**row, "correct": False, "why": "no API call found"}
    name, arguments = parsed
    if name != truth["api_name"]:
        return {**row, "correct": False, "why": f"API name mismatch: {name} vs {truth['api_name']}"}
    result = await api.execute(name, arguments)
    return {**row, "correct": call_is_correct(result, truth_result(truth)), "result": result}


async def _evaluate(settings: Settings) -> list[dict]:
    descriptions = load_descriptions(settings.data)
    dialogues = {level: load_dialogues(settings.data, level)[:settings.limit] for level in settings.levels}
    searcher = recorded_results([d for ds in dialogues.values() for d in ds])
    engine = EngineClient(settings.base_urls, settings.model, api_key=settings.api_key)
    api = VirtualApiBank(settings.server, tools_of(settings.tools_folder), searcher, parameter_types(settings.data))
    gate = asyncio.Semaphore(settings.concurrency)

    async def one(sample: Sample) -> dict:
        async with gate:
            return await _score(sample, engine, api, descriptions, settings)
    try:
        samples = [s for level, ds in dialogues.items() for d in ds for s in samples_of(d, level)]
        return list(await asyncio.gather(*(one(s) for s in samples)))
    finally:
        await engine.aclose()
        await api.http.aclose()


def evaluate(settings: Settings) -> list[dict]:
    """One row per sample: call samples with `correct`, response samples with `rouge_l`."""
    return asyncio.run(_evaluate(settings))


def summarize(rows: list[dict]) -> dict:
    """Per level: call accuracy and mean ROUGE-L (both in %), with their counts."""
    out = {}
    for level in sorted({r["level"] for r in rows}):
        calls = [r for r in rows if r["level"] == level and r["kind"] == "call"]
        responses = [r for r in rows if r["level"] == level and r["kind"] == "response"]
        out[level] = {
            "calls": len(calls), "correct": sum(r["correct"] for r in calls),
            "accuracy": round(100.0 * sum(r["correct"] for r in calls) / len(calls), 2) if calls else None,
            "responses": len(responses),
            "rouge_l": round(100.0 * statistics.fmean(r["rouge_l"] for r in responses), 2) if responses else None,
            "dialogues": len({r["dialogue"] for r in rows if r["level"] == level}),
        }
    return out


def report_markdown(summary: dict, settings: Settings) -> str:
    """API-Bank's layout (its Table 4): API-call accuracy per level, then the response ROUGE-L."""
    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}"
    levels = sorted(summary)
    head = [f"{LEVEL_NAMES[level]} (level {level})" for level in levels]
    lines = ["# API-Bank (levels 1-2) on the virtual server", "",
             "| Model | " + " | ".join(head) + " | Response ROUGE-L |",
             "|---|" + "---|" * len(levels) + "---|"]
    responses = [summary[level] for level in levels if summary[level]["responses"]]
    total = sum(s["responses"] for s in responses)
    pooled = sum(s["rouge_l"] * s["responses"] for s in responses) / total if total else None
    lines.append(f"| {settings.model} | " + " | ".join(cell(summary[level]["accuracy"]) for level in levels)
                 + f" | {cell(pooled)} |")
    lines += ["", "Counts:", ""]
    for level in levels:
        s = summary[level]
        lines.append(f"- level {level}: {s['dialogues']} dialogues, {s['correct']}/{s['calls']} calls correct, "
                     f"{s['responses']} responses (ROUGE-L {cell(s['rouge_l'])})")
    lines += ["", f"Settings: server {settings.server}, model {settings.model} at {', '.join(settings.base_urls)}, "
              f"temperature {settings.temperature}, max_tokens {settings.max_tokens}, "
              f"dialogues per level {settings.limit or 'all'}. Accuracy: API-Bank's per-API rules on the result the "
              "virtual server returned; ROUGE-L: rouge-score rougeL F, in %."]
    return "\n".join(lines) + "\n"


def write_report(rows: list[dict], settings: Settings, out: str | Path) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    (out / "samples.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows),
                                       encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({str(k): v for k, v in summary.items()}, indent=2) + "\n",
                                      encoding="utf-8")
    (out / "report.md").write_text(report_markdown(summary, settings), encoding="utf-8")
    return summary


# ------------------------------------------------------------------------------- command line
def parser(doc: str | None = None):
    import argparse

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--data", type=Path, default=Path("data/apibank"), help="API-Bank dialogues (data/apibank).")
    p.add_argument("--tools", type=Path, default=Path("data/samples/tools"),
                   help="The tools folder the server serves; its APIBank/ category names the tools.")
    p.add_argument("--write-pairs", type=Path, metavar="FILE",
                   help="Only write API-Bank's recorded calls as pairs JSONL (for `mirrorapi cache import`), then exit.")
    p.add_argument("--server", help="The virtual server's /virtual URL, e.g. http://127.0.0.1:8080/virtual.")
    p.add_argument("--base-url", action="append", dest="base_urls", help="The model's OpenAI-compatible /v1 URL.")
    p.add_argument("--model", help="The model name the engine serves.")
    p.add_argument("--api-key", default="EMPTY")
    p.add_argument("--levels", type=int, nargs="+", choices=sorted(LEVELS), default=sorted(LEVELS))
    p.add_argument("--limit", type=int, help="Only the first N dialogues of each level.")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("runs/apibank"))
    return p


def settings_from(args) -> Settings:
    missing = [flag for flag, value in (("--server", args.server), ("--base-url", args.base_urls),
                                        ("--model", args.model)) if not value]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (or give --write-pairs FILE)")
    return Settings(data=args.data, tools_folder=args.tools, server=args.server, base_urls=args.base_urls,
                    model=args.model, api_key=args.api_key, levels=tuple(args.levels), temperature=args.temperature,
                    max_tokens=args.max_tokens, concurrency=args.concurrency, limit=args.limit)
