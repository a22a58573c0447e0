"""Step 4 of the demo: StableToolBench-style `/virtual` calls, shown side by side with the real answers.

- cache hits: training calls, answered with the real responses imported from the StableToolBench
  cache folder;
- misses: held-out calls (never in the cache) that the simulator answers; the answer is written
  back, so the same call sent again is a hit with provenance `simulated:<model>@<format>,<decoding settings>`;
- mistakes agents make: an unknown API (the answer names the closest ones), a `tool_input` that
  is not JSON, a missing required argument.
The outcome and provenance of every answer are read from the server's own request log
(`log_file`): what the demo shows is what the server says it did.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from harness.processes import poll_until
from mirrorapi.evaluation.fidelity.replay import request_body
from mirrorapi.records import canonical_json, observation_json
from mirrorapi.tools import ArgumentError, ToolRegistry, UnknownName, check_arguments

KIND_TITLES = {
    "hit": "cache hit",
    "miss": "cache miss, simulated",
    "repeat": "the same call again",
    "unknown_api": "mistake: unknown API",
    "bad_input": "mistake: tool_input is not JSON",
    "missing_required": "mistake: a required argument is missing",
}


@dataclass
class Call:
    kind: str  # a key of KIND_TITLES
    body: dict  # the /virtual request, as StableToolBench's agents send it
    origin: str  # where the call comes from
    real: dict | None = None  # the real {"error", "response"}, when there is one
    served: dict | None = None
    outcome: str | None = None  # the server's own label (hit, simulated, validation_error, engine_error)
    provenance: str | None = None
    note: str = ""  # what the answer shows

    def to_dict(self) -> dict:
        return asdict(self)


def _origin(pair: dict) -> str:
    return f"{pair['source']} {pair['episode']} step {pair['step']}"


def _short(pair: dict) -> bool:
    return not pair["response"]["error"] and len(str(pair["response"]["response"])) <= 300


def _accepted(registry: ToolRegistry, pair: dict) -> bool:
    """A call the server passes to the simulator: known API, required arguments present."""
    try:
        check_arguments(
            registry.resolve(pair["category"], pair["tool_name"], pair["api_name"]),
            pair["tool_input"],
            "reject",
            "simulate",
        )
    except (UnknownName, ArgumentError):
        return False
    return True


def _misspelt(registry: ToolRegistry, pair: dict) -> str:
    """The API's name with a typo that is no other API's name."""
    name = pair["api_name"]
    for typo in (name[:-1], name + "x", name + "_v0"):
        try:
            registry.resolve(pair["category"], pair["tool_name"], typo)
        except UnknownName as exc:
            if exc.kind == "API":
                return typo
    raise ValueError(f"no misspelling of {name} is unknown to the registry")


def plan_calls(train: list[dict], test: list[dict], registry: ToolRegistry, hits: int, misses: int) -> list[Call]:
    """Hits from different sources, misses from held-out calls (out-of-distribution APIs first), three mistakes."""
    chosen_hits: list[dict] = []
    for pair in train:  # one per source, short successful answers (they are shown whole)
        if len(chosen_hits) < hits and _short(pair) and pair["source"] not in {p["source"] for p in chosen_hits}:
            chosen_hits.append(pair)
    calls = [Call("hit", request_body(p), _origin(p), p["response"]) for p in chosen_hits]
    held_out = sorted((p for p in test if _accepted(registry, p)), key=lambda p: p.get("split") != "test_ood")
    chosen_misses: list[dict] = []
    for pair in held_out:  # different sources when there are
        if len(chosen_misses) < misses and pair["source"] not in {p["source"] for p in chosen_misses}:
            chosen_misses.append(pair)
    chosen_misses += [p for p in held_out if p not in chosen_misses][: misses - len(chosen_misses)]
    calls += [Call("miss", request_body(p), _origin(p) + f", {p.get('split')}", p["response"]) for p in chosen_misses]

    base = chosen_hits[0] if chosen_hits else train[0]
    typo = _misspelt(registry, base)
    calls.append(
        Call("unknown_api", {**request_body(base), "api_name": typo}, f"{base['api_name']} misspelt as {typo}")
    )
    calls.append(
        Call(
            "bad_input",
            {**request_body(base), "tool_input": json.dumps(base["tool_input"])[:-1]},
            "the arguments' JSON cut short, as a truncated model output would be",
        )
    )
    recorded = {(p["category"], p["tool_name"], p["api_name"], canonical_json(p["tool_input"])) for p in train}
    for pair in train + test:
        try:
            doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        except UnknownName:
            continue
        required = [name for name in doc.parameter_names()[0] if name in pair["tool_input"]]
        if not required:
            continue
        arguments = {k: v for k, v in pair["tool_input"].items() if k != required[0]}
        if (pair["category"], pair["tool_name"], pair["api_name"], canonical_json(arguments)) in recorded:
            continue  # a recorded answer would win over the validation policy
        calls.append(
            Call(
                "missing_required",
                {**request_body(pair), "tool_input": json.dumps(arguments)},
                f"{_origin(pair)} without '{required[0]}'",
            )
        )
        break
    return calls


class RequestLogReader:
    """Reads the lines the server's `RequestLogWriter` appends to its `log_file` (one JSON object per
    /virtual request), each once, from where the file ended when the reader was made."""

    def __init__(self, path: Path):
        self.path, self.offset = path, path.stat().st_size if path.exists() else 0

    def next(self, timeout: float = 5.0) -> dict:
        """The next line ({} when none comes within `timeout` seconds)."""
        try:
            return poll_until(self._read_line, timeout, "no request log line", interval=0.02)
        except TimeoutError:
            return {}

    def _read_line(self) -> dict | None:
        if not self.path.exists():
            return None
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            line = fh.readline()
        if not line.endswith(b"\n"):  # not there yet, or still being written
            return None
        self.offset += len(line)
        return json.loads(line)


def send_calls(url: str, calls: list[Call], request_log: Path, timeout: float = 120.0) -> list[Call]:
    """Send every call (and the first simulated miss once more); fills in what the server answered."""
    log = RequestLogReader(request_log)
    sent: list[Call] = []
    with httpx.Client(base_url=url, timeout=timeout) as client:
        queue = list(calls)
        while queue:
            call = queue.pop(0)
            call.served = client.post("/virtual", json=call.body).json()
            line = log.next()
            call.outcome, call.provenance = line.get("outcome"), line.get("provenance")
            call.note = _note(call, sent)
            sent.append(call)
            repeated = any(c.kind == "repeat" for c in sent + queue)
            if call.kind == "miss" and call.outcome == "simulated" and not repeated:
                queue.insert(0, Call("repeat", call.body, call.origin, call.real))
    return sent


def _note(call: Call, before: list[Call]) -> str:
    if call.kind == "hit":
        return "identical to the real answer" if call.served == call.real else "differs from the real answer"
    if call.kind == "miss":
        return (
            "simulated and written back to the cache"
            if call.outcome == "simulated"
            else "the simulator failed; nothing was stored"
        )
    if call.kind == "repeat":
        first = next(c for c in before if c.kind == "miss" and c.body == call.body)
        return (
            "answered from the cache: the same answer as the simulation above"
            if call.served == first.served
            else "a different answer than the simulation above"
        )
    if call.outcome == "validation_error":
        return "an error observation for the agent; the engine was not called"
    return f"answered ({call.outcome}): the server did not refuse it"


def _columns(left: str, right: str, width: int, lines: int) -> list[str]:
    def wrap(text: str) -> list[str]:
        rows = textwrap.wrap(text, width, break_long_words=True, replace_whitespace=False) or [""]
        rows = rows[: lines - 1] + ["..."] if len(rows) > lines else rows
        return rows + [""] * (lines - len(rows))

    rows = [f"{x:<{width}} | {y}".rstrip() for x, y in zip(wrap(left), wrap(right), strict=True)]
    while rows and rows[-1].strip() == "|":
        rows.pop()
    return rows


def render_call(number: int, call: Call, width: int = 56, lines: int = 3) -> list[str]:
    """The call, the server's answer and (when known) the real one, side by side."""
    body = call.body
    arguments = body["tool_input"] if isinstance(body["tool_input"], str) else json.dumps(body["tool_input"])
    served = json.dumps(call.served, ensure_ascii=False, separators=(",", ":"))
    out = [
        f"[{number}] {KIND_TITLES[call.kind]}: {body['category']} / {body['tool_name']} / {body['api_name']} "
        f"{textwrap.shorten(arguments, 70, placeholder=' ...')}",
        f"    outcome {call.outcome}" + (f", provenance {call.provenance}" if call.provenance else ""),
    ]
    if call.real is None:
        answer = textwrap.wrap(f"served: {served}", 2 * width + 3)
        return out + [f"    ({call.origin})", *("    " + line for line in answer[:lines]), f"    -> {call.note}"]
    real = observation_json(call.real["error"], call.real["response"])
    out += ["    " + row for row in _columns("served", f"real ({call.origin})", width, 2)]
    out += ["    " + row for row in _columns(served, real, width, lines)]
    return out + [f"    -> {call.note}"]
