"""Readers of real request -> response pairs, in the three shapes users have.

Every reader yields pair dicts in the schema of `../shared/data/pairs` (`source, episode, step,
category, tool_name, api_name, tool_input, response: {error, response}`); a pair may carry a `doc`
(`ApiDoc`) when its source embeds the documentation. A record that cannot be read is reported to
`on_bad(reason)` and skipped, never fatal; a file that does not exist raises `SourceError`.

- pairs JSONL: our own schema, one pair per line;
- a StableToolBench cache folder `<cat>/<tool>_for_<cat>/<api>.json`, each file mapping the Python
  repr of an argument dict to an observation (notes §3); every entry is its own episode;
- MirrorAPI-style alpaca files (`system`/`instruction`/`output`, a JSON list or JSONL): the
  instruction is StableToolBench's `API doc:` + repr + `Request:` + repr layout, the output the
  model's JSON answer (`mechanism_of_the_api` is dropped).
"""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator

from mirrorapi.cache import parse_repr_key
from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.prompts import parse_simulator_output
from mirrorapi.tools import ApiDoc

PAIR_KEYS = ("source", "episode", "step", "category", "tool_name", "api_name", "tool_input", "response")

OnBad = Callable[[str], None]


class SourceError(Exception):
    """An input that cannot be used at all (missing file or folder, wrong kind of file)."""


def _ignore(reason: str) -> None:
    pass


def read_pairs_jsonl(path: str | os.PathLike, on_bad: OnBad = _ignore) -> Iterator[dict]:
    """Pairs of one JSONL file, checked for the keys and types the builder relies on."""
    path = Path(path)
    if not path.is_file():  # checked now, not when the first pair is pulled
        raise SourceError(f"pairs file not found: {path}")
    return _pairs_jsonl(path, on_bad)


def _pairs_jsonl(path: Path, on_bad: OnBad) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                pair = json.loads(line)
            except ValueError:
                on_bad(f"{path.name}:{number}: not JSON")
                continue
            problem = _pair_problem(pair)
            if problem:
                on_bad(f"{path.name}:{number}: {problem}")
                continue
            yield pair


def _pair_problem(pair: Any) -> str | None:
    if not isinstance(pair, dict):
        return "not a JSON object"
    missing = [k for k in PAIR_KEYS if k not in pair]
    if missing:
        return "missing " + ", ".join(missing)
    if not isinstance(pair["tool_input"], dict):
        return "tool_input is not an object"
    response = pair["response"]
    if not isinstance(response, dict) or "response" not in response or not isinstance(response.get("error"), str):
        return "response is not {error: str, response: ...}"
    return None


def read_stabletoolbench_cache(folder: str | os.PathLike, on_bad: OnBad = _ignore) -> Iterator[dict]:
    """Pairs from a StableToolBench `tool_response_cache` folder (keys are Python reprs of the arguments)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SourceError(f"StableToolBench cache folder not found: {folder}")
    return _cache_folder(folder, on_bad)


def _cache_folder(folder: Path, on_bad: OnBad) -> Iterator[dict]:
    for cat_entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if not cat_entry.is_dir():
            continue
        category = standardize_category(cat_entry.name)
        suffix = "_for_" + category
        for tool_entry in sorted(os.scandir(cat_entry.path), key=lambda e: e.name):
            if not tool_entry.is_dir():
                continue
            # Exact suffix removal: tools like `usa_jobs_for_it` contain `_for_` themselves.
            tool = tool_entry.name[: -len(suffix)] if tool_entry.name.endswith(suffix) else tool_entry.name
            for api_entry in sorted(os.scandir(tool_entry.path), key=lambda e: e.name):
                if api_entry.name.endswith(".json") and api_entry.is_file():
                    yield from _cache_file(api_entry.path, category, tool, api_entry.name[: -len(".json")], on_bad)


def _cache_file(path: str, category: str, tool: str, api: str, on_bad: OnBad) -> Iterator[dict]:
    where = f"{category}/{tool}/{api}"
    try:
        with open(path, "rb") as fh:
            entries = json.loads(fh.read())
    except (OSError, ValueError) as exc:
        on_bad(f"{where}.json: unreadable ({type(exc).__name__})")
        return
    if not isinstance(entries, dict):
        on_bad(f"{where}.json: not a JSON object")
        return
    for number, (key, observation) in enumerate(entries.items()):
        try:
            arguments = parse_repr_key(key)
        except ValueError:
            on_bad(f"{where}: unreadable key {key[:60]!r}")
            continue
        if not isinstance(arguments, dict):
            on_bad(f"{where}: key {key[:60]!r} is not an argument dict")
            continue
        if not isinstance(observation, dict) or "response" not in observation:
            on_bad(f"{where}: value of {key[:60]!r} is not {{error, response}}")
            continue
        error = observation.get("error") or ""
        yield {"source": "stabletoolbench-cache", "episode": f"stb-cache:{where}#{number}", "step": 0,
               "category": category, "tool_name": tool, "api_name": api, "tool_input": arguments,
               "response": {"error": error if isinstance(error, str) else str(error),
                            "response": observation["response"]}}


def read_alpaca(path: str | os.PathLike, on_bad: OnBad = _ignore) -> Iterator[dict]:
    """Pairs (each with its embedded `doc`) from a MirrorAPI-style alpaca file (JSON list or JSONL)."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"alpaca file not found: {path}")
    return _alpaca(path, on_bad)


def _alpaca(path: Path, on_bad: OnBad) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        records = json.loads(text)
        records = records if isinstance(records, list) else [records]  # a one-line JSONL file
    except ValueError:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            try:
                records.append(json.loads(line)) if line.strip() else None
            except ValueError:
                on_bad(f"{path.name}:{number}: not JSON")
    for number, record in enumerate(records):
        where = f"{path.name}#{number}"
        if not isinstance(record, dict) or not isinstance(record.get("instruction"), str) \
                or not isinstance(record.get("output"), str):
            on_bad(f"{where}: not an alpaca record with instruction and output")
            continue
        # Alpaca's optional `input` follows the instruction (LLaMA-Factory joins them with a newline).
        instruction = record["instruction"] + ("\n" + record["input"] if record.get("input") else "")
        parsed = _parse_instruction(instruction)
        if parsed is None:
            on_bad(f"{where}: instruction is not `API doc: ... Request: ...`")
            continue
        doc, arguments = parsed
        observation, how = parse_simulator_output(record["output"])
        if observation is None:
            on_bad(f"{where}: output is not an {{error, response}} answer")
            continue
        yield {"source": "alpaca", "episode": f"alpaca:{where}", "step": 0, "category": doc.category,
               "tool_name": doc.tool, "api_name": doc.api, "tool_input": arguments, "response": observation,
               "doc": doc}


def _parse_instruction(instruction: str) -> tuple[ApiDoc, dict] | None:
    head, sep, request = instruction.partition("\n\nRequest:\n")
    if not sep or not head.startswith("API doc:\n"):
        return None
    try:
        raw = ast.literal_eval(head[len("API doc:\n"):].strip())
        arguments = ast.literal_eval(request.strip()) if request.strip() else {}
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(raw, dict) or not isinstance(arguments, dict) or not raw.get("api_name"):
        return None
    tool_title = str(raw.get("tool_name") or "")
    api_title = str(raw["api_name"])
    params = [p for p in raw.get("required_parameters") or [] if isinstance(p, dict) and p.get("name")]
    optional = [p for p in raw.get("optional_parameters") or [] if isinstance(p, dict) and p.get("name")]
    doc = ApiDoc(category=standardize_category(str(raw.get("tool_category") or "Unknown")),
                 tool=standardize(tool_title), api=api_key_name(api_title), tool_title=tool_title,
                 api_title=api_title, tool_description=str(raw.get("tool_description") or ""),
                 description=str(raw.get("api_description") or ""), required_parameters=params,
                 optional_parameters=optional, source="alpaca")
    return doc, arguments
