"""Judge final answers with an open judge over the engine protocol: FAC and SoPR, resumable.

Every (candidate model, group, query id, repeat) gets one record in `answers.jsonl`. Items with
nothing to judge (missing, empty or give-up answers) are Unsolved without a judge call
(`judged: false`). A judge output without a readable verdict line is recorded as Unsolved with
`parsed: false` and counted as `unparseable` in the tables: it never scores, and it is never hidden.
Records are appended as they arrive, so an interrupted run loses nothing; a rerun skips the keys
already judged (unless their answer text changed since).
Judge calls that fail (engine down, timeout) are not recorded: the tables show them as `pending`
and a rerun retries them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass
from tqdm import tqdm

from mirrorapi.command_line import Flag
from mirrorapi.engine_client import DEFAULT_CONCURRENCY, NO_API_KEY, EngineClient, EngineError, engine_concurrency
from mirrorapi.evaluation.answers.items import AnswerItem, build_items, load_answers, load_ids
from mirrorapi.evaluation.score_tables import MetricTable, metric_table, score_table
from mirrorapi.prompts.judge_formats import JUDGE_VERDICTS, judge_messages, parse_verdict
from mirrorapi.records import read_jsonl

logger = logging.getLogger(__name__)

# metric -> (judge prompt format, score of each verdict). SoPR's Unsure is half a success (notes §5.3).
JUDGE_METRICS = {
    "fac": ("fac-v1", {"Solved": 1.0, "Unsolved": 0.0}),
    "sopr": ("sopr-v1", {"Solved": 1.0, "Unsure": 0.5, "Unsolved": 0.0}),
}
ANSWERS_FILE = "answers.jsonl"
_UNJUDGED_REASON = {
    "missing": "no answer for this id",
    "empty": "empty final answer",
    "give_up": "the agent gave up (give_up_and_restart)",
}


class JudgeRunError(Exception):
    """A run that cannot start: unreachable judge, an output folder holding another judge's verdicts."""


@pydantic_dataclass
class JudgeSettings:
    """How to reach the judge and how to ask it. Each field is also a flag of every command that asks a
    judge (eval/fac.py, eval/sowr.py, eval/judge_agreement.py; `--judge-*` in `mirrorapi benchmark`)."""

    base_urls: Annotated[list[str], Flag("base-url", "URL")] = Field(
        description=("OpenAI-compatible base URL(s) of the judge engine, e.g. http://127.0.0.1:12345/v1.")
    )
    model: str = Field(description="The judge's model name on that engine.")
    api_key: str = Field(default=NO_API_KEY, description="API key of the judge engine.")
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Judge requests in flight (default: 16 on vLLM, 2 on `transformers serve` and other engines, which work "
            "on one request at a time)."
        ),
    )
    max_tokens: int = Field(default=256, ge=1, description="Tokens per judge output.")
    temperature: float = Field(default=0.0, ge=0, description="Judge temperature.")
    timeout: float = Field(default=120.0, gt=0, description="Seconds per judge call, retries included.")


@dataclass
class JudgeCall:
    key: tuple
    messages: list[dict]
    payload: dict = field(default_factory=dict)  # what the caller needs to build the record


# ------------------------------------------------------------------------------------ the store
class JsonlStore:
    """Append-only JSONL of records with a key; torn or corrupt lines are skipped (and redone)."""

    def __init__(self, path: Path, key: Callable[[dict], tuple]):
        self.path, self.key = path, key

    def load(self) -> dict[tuple, dict]:
        records: dict[tuple, dict] = {}
        if not self.path.exists():
            return records
        for number, record in read_jsonl(self.path, self._redo):
            try:
                records[self.key(record)] = record
            except (KeyError, TypeError, ValueError):
                self._redo(f"{self.path.name}:{number}: not a record")
        return records

    def _redo(self, reason: str) -> None:
        logger.warning("%s (in %s): it will be redone", reason, self.path.parent)

    def append(self, record: dict) -> None:
        line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        with open(self.path, "a+b") as fh:
            end = fh.seek(0, os.SEEK_END)
            if end and (fh.seek(end - 1), fh.read(1))[1] != b"\n":
                line = b"\n" + line  # after a line a kill cut: this record starts a line of its own
            fh.write(line)

    def rewrite(self, records: list[dict]) -> None:
        """Replace the file atomically (sorted, one record per key)."""
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(record, ensure_ascii=False) + "\n")
        os.replace(tmp, self.path)


# ------------------------------------------------------------------------------------ the calls
async def run_judge_calls(
    engine: EngineClient,
    calls: list[JudgeCall],
    handle: Callable[[JudgeCall, str], None],
    settings: JudgeSettings,
    desc: str = "judging",
    progress: bool = True,
) -> list[str]:
    """Send `calls` concurrently (at most `settings.concurrency` in flight); `handle` gets each raw answer.

    Returns one message per call that got no answer. An unreachable engine stops the run early:
    the remaining calls are not sent (they fail fast instead of each waiting out the deadline).
    """
    semaphore = asyncio.Semaphore(max(1, settings.concurrency or DEFAULT_CONCURRENCY))
    unreachable = asyncio.Event()
    failures: list[str] = []
    bar = tqdm(total=len(calls), desc=desc, unit="call", disable=None if progress else True)

    async def one(call: JudgeCall) -> None:
        async with semaphore:
            if unreachable.is_set():
                failures.append(f"{call.key}: not sent, the judge engine is unreachable")
                bar.update()
                return
            try:
                raw = await engine.chat(
                    call.messages, temperature=settings.temperature, max_tokens=settings.max_tokens
                )
            except EngineError as exc:
                failures.append(f"{call.key}: {exc}")
                if exc.kind == "unreachable":
                    unreachable.set()
                bar.update()
                return
        handle(call, raw)
        bar.update()

    try:
        await asyncio.gather(*(one(call) for call in calls))
    finally:
        bar.close()
    return failures


async def check_reachable(engine: EngineClient) -> None:
    health = await engine.health()
    if not any(h.reachable for h in health):
        details = "; ".join(f"{h.base_url}: {h.detail}" for h in health)
        raise JudgeRunError(f"the judge engine is not reachable ({details}); start it or fix --base-url")


async def judge_all(
    calls: list[JudgeCall],
    handle: Callable[[JudgeCall, str], None],
    settings: JudgeSettings,
    desc: str,
    progress: bool = True,
) -> list[str]:
    """The one engine start/stop of a judging run: open a client to the judge, check that it answers,
    send `calls` (see `run_judge_calls`), close it. No calls: no engine contact at all."""
    if not calls:
        return []
    # Streamed: a call this run gives up on (timeout) then stops costing a CPU engine (EngineClient).
    engine = EngineClient(
        settings.base_urls, settings.model, api_key=settings.api_key, timeout=settings.timeout, stream=True
    )
    try:
        await check_reachable(engine)
        if settings.concurrency is None:
            settings = dataclasses.replace(settings, concurrency=await engine_concurrency(engine))
            logger.info(
                "judge engine %s: %d requests in flight (--concurrency sets another number)",
                settings.base_urls[0],
                settings.concurrency,
            )
        return await run_judge_calls(engine, calls, handle, settings, desc, progress)
    finally:
        await engine.aclose()


# ------------------------------------------------------------------------------------ FAC / SoPR
def record_key(record: dict) -> tuple:
    return (record["metric"], record["model"], record["group"], str(record["query_id"]), int(record["repeat"]))


def _sort_key(record: dict) -> tuple:
    metric, model, group, qid, repeat = record_key(record)
    return metric, model, group, (0, int(qid), "") if qid.isdigit() else (1, 0, qid), repeat


def shown_digest(messages: list[dict]) -> str:
    """A digest of everything a judge call shows (query, answer, tool calls): an earlier verdict is reused only
    for the same; a rerun after a trajectory's steps changed asks again."""
    return hashlib.sha256(json.dumps(messages, ensure_ascii=False, sort_keys=True).encode()).hexdigest()[:16]


def _record(
    item: AnswerItem,
    metric: str,
    repeat: int,
    settings: JudgeSettings,
    verdict: str,
    *,
    judged: bool,
    parsed: bool,
    reason: str,
    raw: str,
    shown: str = "",
) -> dict:
    fmt, scores = JUDGE_METRICS[metric]
    return {
        "metric": metric,
        "model": item.model,
        "group": item.group,
        "query_id": item.query_id,
        "repeat": repeat,
        "verdict": verdict,
        "score": scores[verdict],
        "reason": reason,
        "judged": judged,
        "parsed": parsed,
        "status": item.status,
        "answer": item.answer,
        "raw": raw,
        "prompt_format": fmt,
        "judge": settings.model,
        "shown": shown,
    }


def _check_same_judge(done: dict[tuple, dict], metric: str, settings: JudgeSettings, out: Path) -> None:
    fmt = JUDGE_METRICS[metric][0]
    for record in done.values():
        if (
            record["metric"] == metric
            and record.get("judged")
            and (record.get("judge") != settings.model or record.get("prompt_format") != fmt)
        ):
            raise JudgeRunError(
                f"{out / ANSWERS_FILE} holds {metric} verdicts of judge {record.get('judge')!r} with prompt "
                f"{record.get('prompt_format')!r}, not {settings.model!r} with {fmt!r}; "
                "use another --out or --overwrite"
            )


@dataclass
class ScoringRun:
    records: list[dict]  # the records of this run's items, all repeats
    items: list[AnswerItem]
    ids: dict[str, list[str]]
    failures: list[str]  # judge calls without an answer (their items are pending)
    judge_calls: int  # calls sent in this run (0 when everything was already done)
    table: MetricTable | None = None  # the metric's table, once `run_scoring` has computed it


async def score_items(
    items: list[AnswerItem],
    ids: dict[str, list[str]],
    settings: JudgeSettings,
    out: Path,
    metric: str = "fac",
    repeats: int = 1,
    overwrite: bool = False,
    progress: bool = True,
) -> ScoringRun:
    """Judge every item `repeats` times (skipping keys already in `out/answers.jsonl`)."""
    if metric not in JUDGE_METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(JUDGE_METRICS)}")
    fmt = JUDGE_METRICS[metric][0]
    allowed = JUDGE_VERDICTS[fmt]
    if repeats > 1 and settings.temperature == 0:
        # Said, not refused: the documented commands ask for repeats at the default temperature, and an engine
        # batching requests is not exactly greedy either.
        logger.warning(
            "%d repeats at temperature 0: a greedy judge gives each answer the same verdict every time, so the "
            "± is near 0 whatever the judge's doubt; StableToolBench's judges sample at 0.2 (--temperature 0.2)",
            repeats,
        )
    out.mkdir(parents=True, exist_ok=True)
    store = JsonlStore(out / ANSWERS_FILE, record_key)
    done = store.load()
    if overwrite:
        done = {k: r for k, r in done.items() if r["metric"] != metric}
        store.rewrite(list(done.values()))
    _check_same_judge(done, metric, settings, out)

    wanted = [(item, repeat) for item in items for repeat in range(repeats)]
    calls, unjudged = [], 0
    # Verdicts of an answer that has changed since (judged again below): another answer's, so not this run's records
    # until the new one is judged; a failed call leaves the key pending. They stay in the file till then.
    superseded: set[tuple] = set()
    for item, repeat in wanted:
        key = (metric, item.model, item.group, item.query_id, repeat)
        earlier = done.get(key)
        if item.status != "answer":
            if earlier is not None and earlier.get("status") == item.status and not earlier.get("judged"):
                continue
            done[key] = _record(
                item,
                metric,
                repeat,
                settings,
                "Unsolved",
                judged=False,
                parsed=True,
                reason=_UNJUDGED_REASON[item.status],
                raw="",
            )
            store.append(done[key])
            unjudged += 1
            continue
        messages = judge_messages(item.query, item.answer, fmt, steps=item.steps)
        shown = shown_digest(messages)
        if earlier is not None and earlier.get("shown") == shown:
            continue  # judged before; a changed answer or trajectory is judged again
        if earlier is not None:
            superseded.add(key)
        calls.append(JudgeCall(key, messages, {"item": item, "repeat": repeat, "shown": shown}))
    logger.info(
        "%s: %d judgments: %d from an earlier run, %d Unsolved without a judge call, %d judge calls",
        metric,
        len(wanted),
        len(wanted) - unjudged - len(calls),
        unjudged,
        len(calls),
    )

    def handle(call: JudgeCall, raw: str) -> None:
        verdict, reason = parse_verdict(raw, allowed)
        record = _record(
            call.payload["item"],
            metric,
            call.payload["repeat"],
            settings,
            verdict or "Unsolved",
            judged=True,
            parsed=verdict is not None,
            reason=reason,
            raw=raw,
            shown=call.payload["shown"],
        )
        done[call.key] = record
        superseded.discard(call.key)
        store.append(record)

    failures = await judge_all(calls, handle, settings, f"{metric} judge", progress)
    store.rewrite(sorted(done.values(), key=_sort_key))
    keys = [(metric, item.model, item.group, item.query_id, repeat) for item, repeat in wanted]
    return ScoringRun([done[k] for k in keys if k in done and k not in superseded], items, ids, failures, len(calls))


def run_scoring(
    answers: str | os.PathLike,
    ids: str | os.PathLike,
    settings: JudgeSettings,
    out: str | os.PathLike,
    metric: str = "fac",
    repeats: int = 1,
    overwrite: bool = False,
    progress: bool = True,
) -> ScoringRun:
    """Read converted answers and id lists, judge them, and write `answers.jsonl` and the tables into `out`."""
    id_lists = load_ids(ids)
    items = build_items(load_answers(answers), id_lists)
    run = asyncio.run(score_items(items, id_lists, settings, Path(out), metric, repeats, overwrite, progress))
    run.table = metric_table(score_table(run, metric, repeats, settings.model, JUDGE_METRICS[metric][0]))
    run.table.write(Path(out))
    return run
