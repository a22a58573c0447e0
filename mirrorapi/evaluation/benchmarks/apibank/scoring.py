"""Scoring a model on API-Bank's samples through the virtual server, and the report in API-Bank's layout."""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass
from tqdm import tqdm

from mirrorapi.command_line import Flag, add_settings_arguments, settings_fields, settings_from_args, settings_values
from mirrorapi.engine_client import NO_API_KEY, EngineClient, EngineError
from mirrorapi.evaluation.benchmarks.apibank.execution import (
    VirtualApiBank,
    recorded_results,
    tools_of,
    truth_result,
    write_recorded_pairs,
)
from mirrorapi.evaluation.benchmarks.apibank.rules import call_is_correct, parse_call
from mirrorapi.evaluation.benchmarks.apibank.samples import (
    LEVEL_NAMES,
    LEVELS,
    Sample,
    build_messages,
    call_text,
    check_described,
    load_descriptions,
    load_dialogues,
    parameter_types,
    samples_of,
)
from mirrorapi.records import read_jsonl


def rouge_l(reference: str, prediction: str) -> float:
    from rouge_score import rouge_scorer  # the eval extra's

    if not prediction.strip():
        return 0.0
    return rouge_scorer.RougeScorer(["rougeL"]).score(reference, prediction)["rougeL"].fmeasure


@pydantic_dataclass
class Settings:
    """An API-Bank run; each field but `progress` is also a flag of eval/apibank.py (`--<field>`)."""

    server: str = Field(description="The virtual server's /virtual URL, e.g. http://127.0.0.1:8080/virtual.")
    base_urls: Annotated[list[str], Flag("base-url", "URL")] = Field(
        description="The model's OpenAI-compatible /v1 URL(s)."
    )
    model: str = Field(description="The model name the engine serves.")
    data: Path = Field(default=Path("data/apibank"), description="API-Bank dialogues (data/apibank).")
    tools_folder: Annotated[Path, Flag("tools")] = Field(
        default=Path("data/samples/tools"),
        description=("The tools folder the server serves; its APIBank/ category names the tools."),
    )
    api_key: str = Field(default=NO_API_KEY, description="API key of the model's engine.")
    levels: Annotated[tuple[int, ...], Flag(choices=tuple(sorted(LEVELS)))] = Field(
        default=tuple(sorted(LEVELS)), description="API-Bank levels: 1 (Call), 2 (Retrieve+Call)."
    )
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature of the model.")
    max_tokens: int = Field(default=256, ge=1, description="Tokens per model output.")
    concurrency: int = Field(
        default=4, ge=1, description=("Model calls in flight (a CPU engine answers one at a time: 1 there).")
    )
    limit: int | None = Field(default=None, ge=1, description="Only the first N dialogues of each level.")
    timeout: float = Field(
        default=600.0,
        gt=0,
        description=(
            "Seconds per model call (queueing included: a CPU engine answers one at a time, the others wait)."
        ),
    )
    out: Annotated[Path | None, Flag(metavar="FOLDER")] = Field(
        default=None,
        description=(
            "Report folder; samples.jsonl there grows as samples are scored, and a rerun resumes (in code, None: no "
            "file)."
        ),
    )
    progress: bool = True

    def signature(self) -> dict:
        """What a row's answer depends on besides its sample: a rerun reuses only rows of the same."""
        return {
            "model": self.model,
            "server": self.server,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }


def _asked(sample: Sample, descriptions: dict[str, str]) -> str:
    """A digest of a sample's prompt and truth: a rerun reuses a row only for the same (samples renumbered by a
    change of their rules are asked again, not scored against another sample's truth)."""
    asked = [build_messages(sample, descriptions), sample.kind, sample.truth]
    return hashlib.sha256(json.dumps(asked, sort_keys=True, default=str).encode()).hexdigest()[:16]


async def _score(
    sample: Sample, engine: EngineClient, api: VirtualApiBank, descriptions: dict[str, str], settings: Settings
) -> dict:
    row: dict[str, Any] = {
        "level": sample.level,
        "dialogue": sample.dialogue,
        "sample": sample.number,
        "kind": sample.kind,
        "asked": _asked(sample, descriptions),
        **settings.signature(),
    }
    try:
        output = await engine.chat(
            build_messages(sample, descriptions), temperature=settings.temperature, max_tokens=settings.max_tokens
        )
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
    dialogues = {level: load_dialogues(settings.data, level)[: settings.limit] for level in settings.levels}
    check_described([d for ds in dialogues.values() for d in ds], descriptions)
    searcher = recorded_results([d for ds in dialogues.values() for d in ds])
    samples = [s for level, ds in dialogues.items() for d in ds for s in samples_of(d, level)]
    done = _done_rows(settings)
    engine = EngineClient(settings.base_urls, settings.model, api_key=settings.api_key, timeout=settings.timeout)
    api = VirtualApiBank(settings.server, tools_of(settings.tools_folder), searcher, parameter_types(settings.data))
    gate = asyncio.Semaphore(settings.concurrency)
    # A dialogue's call samples one after another, then its response samples: each shares the previous one's
    # prompt up to its last turns (same instruction, descriptions, history), which llama.cpp's server does not
    # compute again (its prefix match); alternating the two instructions would start every prompt afresh.
    todo = sorted(
        (
            s
            for s in samples
            if done.get(_key(s.level, s.dialogue, s.number), {}).get("asked") != _asked(s, descriptions)
        ),
        key=lambda s: (s.level, s.dialogue, s.kind, s.number),
    )
    bar = tqdm(total=len(todo), desc="API-Bank samples", unit="sample", disable=None if settings.progress else True)
    samples_file = settings.out / "samples.jsonl" if settings.out else None
    log = samples_file.open("a", encoding="utf-8") if samples_file else None
    if samples_file and log and log.tell() and not samples_file.read_bytes().endswith(b"\n"):
        log.write("\n")  # after a line cut by a kill: the next row starts a line of its own

    async def one(sample: Sample) -> dict:
        async with gate:
            row = await _score(sample, engine, api, descriptions, settings)
        if log is not None and "engine_error" not in row:  # a failed call is asked again by the next run
            log.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
            log.flush()
        bar.update()
        return row

    try:
        new = {
            _key(s.level, s.dialogue, s.number): row
            for s, row in zip(todo, await asyncio.gather(*(one(s) for s in todo)), strict=True)
        }
    finally:
        bar.close()
        if log is not None:
            log.close()
        await engine.aclose()
        await api.http.close()
    return [
        new.get(_key(s.level, s.dialogue, s.number)) or _rescored(done[_key(s.level, s.dialogue, s.number)], s)
        for s in samples
    ]


def _rescored(row: dict, sample: Sample) -> dict:
    """An earlier run's row with its executed call judged by today's rules (a fixed rule changes no model answer)."""
    if sample.kind != "call" or "result" not in row:
        return row
    return {**row, "correct": call_is_correct(row["result"], truth_result(sample.truth))}


def _key(level: int, dialogue: str, number: int) -> tuple[int, str, int]:
    return level, dialogue, number


def _row_id(row: dict) -> str:
    """A row's sample and signature: the rows of one sample by one model and decoding share it."""
    return json.dumps(
        [row.get(k) for k in ("level", "dialogue", "sample", "model", "server", "temperature", "max_tokens")]
    )


def _file_rows(path: Path) -> list[dict]:
    """The whole rows of a samples file, without failed model calls ([] when there is no file)."""
    # A line cut by an interrupted run (inside a character, too) is skipped: its sample is asked again.
    if not path.is_file():
        return []
    rows = (row for _, row in read_jsonl(path))
    return [row for row in rows if isinstance(row, dict) and "sample" in row and "engine_error" not in row]


def _done_rows(settings: Settings) -> dict[tuple[int, str, int], dict]:
    """Rows of an earlier run in `settings.out` with the same signature (creates the folder)."""
    if settings.out is None:
        return {}
    settings.out.mkdir(parents=True, exist_ok=True)
    signature = settings.signature()
    return {
        _key(r["level"], r["dialogue"], r["sample"]): r
        for r in _file_rows(settings.out / "samples.jsonl")
        if all(r.get(k) == v for k, v in signature.items())
    }


def evaluate(settings: Settings) -> list[dict]:
    """One row per sample: call samples with `correct`, response samples with `rouge_l`; a row whose model call
    failed has `engine_error` (and counts as wrong / ROUGE-L 0). With `settings.out`, resumable."""
    return asyncio.run(_evaluate(settings))


def summarize(rows: list[dict]) -> dict:
    """Per level: call accuracy and mean ROUGE-L (both in %), with their counts."""
    out = {}
    for level in sorted({r["level"] for r in rows}):
        calls = [r for r in rows if r["level"] == level and r["kind"] == "call"]
        responses = [r for r in rows if r["level"] == level and r["kind"] == "response"]
        out[level] = {
            "calls": len(calls),
            "correct": sum(r["correct"] for r in calls),
            "accuracy": round(100.0 * sum(r["correct"] for r in calls) / len(calls), 2) if calls else None,
            "responses": len(responses),
            "rouge_l": round(100.0 * statistics.fmean(r["rouge_l"] for r in responses), 2) if responses else None,
            "dialogues": len({r["dialogue"] for r in rows if r["level"] == level}),
            "engine_errors": sum("engine_error" in r for r in rows if r["level"] == level),
        }
    return out


def report_data(summary: dict, settings: Settings) -> dict:
    """What the report shows, as data (`report.json`): per level the summary with the whole level's dialogue and
    call-sample counts, and the settings."""
    levels = {}
    for level, counts in sorted(summary.items()):
        dialogues = load_dialogues(settings.data, level)
        levels[str(level)] = {
            **counts,
            "level_dialogues": len(dialogues),
            "level_calls": sum(x.kind == "call" for d in dialogues for x in samples_of(d, level)),
        }
    return {
        "levels": levels,
        "settings": {
            "model": settings.model,
            "base_urls": settings.base_urls,
            "server": settings.server,
            "temperature": settings.temperature,
            "max_tokens": settings.max_tokens,
            "limit": settings.limit,
        },
    }


def report_lines(data: dict, heading: str = "#") -> list[str]:
    """API-Bank's layout (its Table 4): API-call accuracy per level, then the response ROUGE-L; counts, settings."""

    def cell(value: float | None) -> str:
        return "—" if value is None else f"{value:.2f}"

    levels, run = data["levels"], data["settings"]
    lines = [
        f"{heading} API-Bank (levels 1-2) on the virtual server",
        "",
        "| Model | "
        + " | ".join(f"{LEVEL_NAMES[int(level)]} (level {level})" for level in levels)
        + " | Response ROUGE-L |",
        "|---|" + "---|" * len(levels) + "---|",
    ]
    answered = [s for s in levels.values() if s["responses"]]
    total = sum(s["responses"] for s in answered)
    pooled = sum(s["rouge_l"] * s["responses"] for s in answered) / total if total else None
    lines.append(
        f"| {run['model']} | " + " | ".join(cell(s["accuracy"]) for s in levels.values()) + f" | {cell(pooled)} |"
    )
    lines += ["", "Counts:", ""]
    for level, s in levels.items():
        lines.append(
            f"- level {level}: {s['dialogues']} of {s['level_dialogues']} dialogues, "
            f"{s['correct']}/{s['calls']} calls correct ({s['level_calls']} call samples in the whole level), "
            f"{s['responses']} responses (ROUGE-L {cell(s['rouge_l'])}), "
            f"{s['engine_errors']} model calls failed (counted as wrong; rerun to ask them again)"
        )
    lines += [
        "",
        f"Settings: server {run['server']}, model {run['model']} at {', '.join(run['base_urls'])}, "
        f"temperature {run['temperature']}, max_tokens {run['max_tokens']}, "
        f"dialogues per level {run['limit'] or 'all'}. Accuracy: API-Bank's per-API rules on the result the "
        "virtual server returned; ROUGE-L: rouge-score rougeL F, in %.",
    ]
    return lines


def report_markdown(summary: dict, settings: Settings) -> str:
    return "\n".join(report_lines(report_data(summary, settings))) + "\n"


def write_report(rows: list[dict], settings: Settings, out: str | Path) -> dict:
    """`samples.jsonl`, `summary.json`, `report.json` (report_data) and `report.md` in `out`; the summary."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(rows)
    # The report's rows in sample order, then the file's other rows (a larger --limit's, another model's), which
    # a later run may still reuse.
    mine = {_row_id(r) for r in rows}
    kept = [r for r in _file_rows(out / "samples.jsonl") if _row_id(r) not in mine]
    (out / "samples.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in [*rows, *kept]), encoding="utf-8"
    )
    (out / "summary.json").write_text(
        json.dumps({str(k): v for k, v in summary.items()}, indent=2) + "\n", encoding="utf-8"
    )
    data = report_data(summary, settings)
    (out / "report.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text("\n".join(report_lines(data)) + "\n", encoding="utf-8")
    return summary


def report_section(run: str | Path) -> list[str]:
    """A finished run's report (`report.json` in `run`) as a section of a larger report, from its data (`mirrorapi
    benchmark` includes `<out>/apibank/`); [] when there is none."""
    path = Path(run) / "report.json"
    if not path.is_file():
        return []
    return [*report_lines(json.loads(path.read_text(encoding="utf-8")), heading="##"), ""]


# The command line (eval/apibank.py).
def parser(doc: str | None = None, prog: str | None = None):
    import argparse

    p = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument(
        "--write-pairs",
        type=Path,
        metavar="FILE",
        help="Only write API-Bank's recorded calls as pairs JSONL (for `mirrorapi cache import`), then exit.",
    )
    add_settings_arguments(p, Settings, required=False, exclude=("progress",), defaults={"out": Path("runs/apibank")})
    return p


def write_pairs_from(args) -> int:
    """`--write-pairs FILE`: API-Bank's recorded calls of the chosen levels as pairs JSONL; how many."""
    given = settings_values(args, Settings)
    defaults = {name: field.default for name, field in settings_fields(Settings).items() if not field.is_required()}
    data, tools, levels = (given.get(name, defaults[name]) for name in ("data", "tools_folder", "levels"))
    dialogues = [d for level in levels for d in load_dialogues(Path(data), level)]
    return write_recorded_pairs(dialogues, tools_of(Path(tools)), args.write_pairs)


def settings_from(args) -> Settings:
    """The run of the command line; ValueError (SettingsError: one line naming the flag) if unusable."""
    missing = [
        flag
        for flag, value in (("--server", args.server), ("--base-url", args.base_urls), ("--model", args.model))
        if not value
    ]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (or give --write-pairs FILE)")
    return settings_from_args(args, Settings)
