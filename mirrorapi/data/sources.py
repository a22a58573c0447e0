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
  model's JSON answer. MirrorAPI's `train_cot.json` layout (the CoT system prompt, whose own example holds an
  `API doc:`, before the real one; the doc and request possibly in `input`) is read from the last `API doc:`;
  a CoT answer's `mechanism_of_the_api` is kept as the pair's `rationale` (the CoT SFT target), else dropped.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterator
from pathlib import Path

from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.prompts.simulator_output import cot_rationale, parse_simulator_output
from mirrorapi.records import OnBad, SourceError, ignore_bad, read_jsonl
from mirrorapi.tools import ApiDoc


def read_alpaca(path: str | os.PathLike, on_bad: OnBad = ignore_bad) -> Iterator[dict]:
    """Pairs (each with its embedded `doc`) from a MirrorAPI-style alpaca file (JSON list or JSONL)."""
    path = Path(path)
    if not path.is_file():
        raise SourceError(f"alpaca file not found: {path}")
    return _alpaca(path, on_bad)


def _alpaca(path: Path, on_bad: OnBad) -> Iterator[dict]:
    with open(path, encoding="utf-8-sig") as fh:  # a byte-order mark, as a JSONL file's (`read_jsonl`)
        text = fh.read()
    try:
        records = json.loads(text)
        records = records if isinstance(records, list) else [records]  # a one-line JSONL file
    except ValueError:
        records = [record for _, record in read_jsonl(path, on_bad)]  # JSONL
    for number, record in enumerate(records):
        where = f"{path.name}#{number}"
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("instruction"), str)
            or not isinstance(record.get("output"), str)
        ):
            on_bad(f"{where}: not an alpaca record with instruction and output")
            continue
        # Alpaca's optional `input` follows the instruction (LLaMA-Factory joins them with a newline).
        instruction = record["instruction"] + ("\n" + record["input"] if record.get("input") else "")
        parsed = _parse_instruction(instruction[max(instruction.rfind("API doc:\n"), 0) :])
        if parsed is None:
            on_bad(f"{where}: instruction is not `API doc: ... Request: ...`")
            continue
        doc, arguments = parsed
        observation, how = parse_simulator_output(record["output"])
        if observation is None:
            on_bad(f"{where}: output is not an {{error, response}} answer")
            continue
        yield {
            "source": "alpaca",
            "episode": f"alpaca:{where}",
            "step": 0,
            "category": doc.category,
            "tool_name": doc.tool,
            "api_name": doc.api,
            "tool_input": arguments,
            "response": observation,
            "doc": doc,
            **({"rationale": rationale} if (rationale := cot_rationale(record["output"])) else {}),
        }


def _parse_instruction(instruction: str) -> tuple[ApiDoc, dict] | None:
    head, sep, request = instruction.partition("\n\nRequest:\n")
    if not sep or not head.startswith("API doc:\n"):
        return None
    try:
        raw = ast.literal_eval(head[len("API doc:\n") :].strip())
        arguments = ast.literal_eval(request.strip()) if request.strip() else {}
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(raw, dict) or not isinstance(arguments, dict) or not raw.get("api_name"):
        return None
    tool_title = str(raw.get("tool_name") or "")
    api_title = str(raw["api_name"])
    params = [p for p in raw.get("required_parameters") or [] if isinstance(p, dict) and p.get("name")]
    optional = [p for p in raw.get("optional_parameters") or [] if isinstance(p, dict) and p.get("name")]
    doc = ApiDoc(
        category=standardize_category(str(raw.get("tool_category") or "Unknown")),
        tool=standardize(tool_title),
        api=api_key_name(api_title),
        tool_title=tool_title,
        api_title=api_title,
        tool_description=str(raw.get("tool_description") or ""),
        description=str(raw.get("api_description") or ""),
        required_parameters=params,
        optional_parameters=optional,
        source="alpaca",
    )
    return doc, arguments


def parse_source_repeats(entries: list[str]) -> dict[str, int]:
    """`SOURCE=N` entries (a `--repeat-sources` flag) as {source: N}; ValueError for one that is not, or N < 1."""
    repeats = {}
    for entry in entries:
        source, _, count = entry.rpartition("=")
        if not source or not count.isdecimal() or int(count) < 1:
            raise ValueError(f"repeat_sources entries are SOURCE=N with N >= 1, got {entry!r}")
        repeats[source] = int(count)
    return repeats


def check_repeated_sources(repeats: dict[str, int], sources: set[str]) -> None:
    """ValueError for a `--repeat-sources` source no record has (a misspelt one once repeated nothing, silently)."""
    if unknown := sorted(set(repeats) - sources):
        raise ValueError(
            f"repeat_sources: no record has the source {', '.join(map(repr, unknown))} "
            f"(the sources read: {', '.join(sorted(sources)) or 'none'})"
        )
