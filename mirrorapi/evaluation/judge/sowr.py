"""SoWR: how often a candidate model's answers win against a reference model's, with an open judge.

Follows the semantics of StableToolBench's `eval_preference.py` (notes §5.4), in rounds (default 3):
1. An id the reference did not answer is a candidate win (whether or not the candidate answered it, as
   upstream); one the candidate did not answer, a reference win.
2. Pass-rate results first: each answer's SoPR verdict of that round (the `sopr-v1` judgments, in
   the same `answers.jsonl` a `eval/fac.py --metric sopr` run writes: a SoPR run in the same folder
   is reused). Exactly one Solved wins; neither Solved and exactly one Unsure wins.
3. Otherwise (both Solved, or neither decided) the judge compares the two (`sowr-v1`), the answers
   shown in a random order fixed per (query, round); two answers alike (the same final answer, or none,
   after the same tool calls) go to a side by a coin fixed per (query, round) instead of a call, as
   upstream's `select_better_answer` picks at random between identical answers.
Each round gives one vote; the query goes to whoever has more votes (equal: a tie). Win rate of a
group = 100 × candidate wins / ids of the group (ties are reported apart, not split, as upstream).
Unparseable judge outputs give no vote and are counted. Judge calls that fail are pending: the table
says so and a rerun retries them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from mirrorapi.evaluation.answers.items import (
    GROUPS,
    AnswerItem,
    AnswersError,
    build_items,
    group_order,
    load_answers,
    load_ids,
)
from mirrorapi.evaluation.judge.scoring import (
    JsonlStore,
    JudgeCall,
    JudgeSettings,
    judge_all,
    score_items,
    shown_digest,
)
from mirrorapi.evaluation.score_tables import MetricTable
from mirrorapi.prompts.judge_formats import cut_judge_text, parse_preference, preference_messages

PREFERENCES_FILE = "preferences.jsonl"
PREFERENCE_FORMAT = "sowr-v1"


def _preference_key(record: dict) -> tuple:
    return (record["reference"], record["candidate"], record["group"], str(record["query_id"]), int(record["round"]))


def _reference_first(qid: str, round_: int, reference: str, candidate: str) -> bool:
    digest = hashlib.sha256(f"{reference}|{candidate}|{qid}|{round_}".encode()).digest()
    return digest[0] % 2 == 0


def decide(reference: AnswerItem, candidate: AnswerItem, ref_verdict: str | None, cand_verdict: str | None):
    """(winner or None, how) without the preference judge; how == "compare" when it is needed, "identical" when a
    coin decides (two answers alike: no call).

    winner is "reference" or "candidate"; verdicts are the round's SoPR verdicts (None: pending)."""
    # Upstream's order (eval_preference.py): an id the reference did not answer is the candidate's, whether or not
    # the candidate answered it; then one the candidate did not answer is the reference's.
    if reference.status == "missing":
        return "candidate", "missing answer"
    if candidate.status == "missing":
        return "reference", "missing answer"
    if ref_verdict is None or cand_verdict is None:
        return None, "pending"
    solved = (ref_verdict == "Solved", cand_verdict == "Solved")
    if solved[0] != solved[1]:
        return ("reference" if solved[0] else "candidate"), "pass rate"
    if not any(solved):
        unsure = (ref_verdict == "Unsure", cand_verdict == "Unsure")
        if unsure[0] != unsure[1]:
            return ("reference" if unsure[0] else "candidate"), "pass rate"
    # rtl.py's select_better_answer: answers alike (final answer and trajectory) are a random pick, not a judge
    # call; two answers without a final answer but with other trajectories are compared like any others.
    if (reference.status, reference.answer, reference.steps) == (candidate.status, candidate.answer, candidate.steps):
        return None, "identical"
    return None, "compare"


@dataclass
class SowrRun:
    table: MetricTable
    failures: list[str]
    preference_calls: int


async def _sowr(
    reference: str,
    items: list[AnswerItem],
    ids: dict[str, list[str]],
    settings: JudgeSettings,
    out: Path,
    rounds: int,
    overwrite: bool,
    progress: bool,
) -> SowrRun:
    scoring = await score_items(
        items, ids, settings, out, metric="sopr", repeats=rounds, overwrite=overwrite, progress=progress
    )
    verdicts = {(r["model"], r["group"], r["query_id"], r["repeat"]): r["verdict"] for r in scoring.records}
    by_key = {(i.model, i.group, i.query_id): i for i in items}
    candidates = sorted({i.model for i in items} - {reference})
    store = JsonlStore(out / PREFERENCES_FILE, _preference_key)
    done = {} if overwrite else store.load()
    if overwrite:
        store.rewrite([])
    decisions: dict[tuple, dict] = {}
    calls: list[JudgeCall] = []
    for candidate in candidates:
        for group in group_order(ids):
            for qid in ids[group]:
                ref_item, cand_item = by_key[(reference, group, qid)], by_key[(candidate, group, qid)]
                for round_ in range(rounds):
                    key = (reference, candidate, group, qid, round_)
                    winner, how = decide(
                        ref_item,
                        cand_item,
                        verdicts.get((reference, group, qid, round_)),
                        verdicts.get((candidate, group, qid, round_)),
                    )
                    base = {
                        "reference": reference,
                        "candidate": candidate,
                        "group": group,
                        "query_id": qid,
                        "round": round_,
                        "judge": settings.model,
                        "prompt_format": PREFERENCE_FORMAT,
                    }
                    ref_first = _reference_first(qid, round_, reference, candidate)
                    if how == "identical":  # upstream's random.choice, as a coin fixed per (query, round)
                        winner = "reference" if ref_first else "candidate"
                    if how != "compare":
                        decisions[key] = {**base, "winner": winner, "how": how}
                        continue
                    pair = [
                        (ref_item.steps, cut_judge_text(ref_item.answer)),
                        (cand_item.steps, cut_judge_text(cand_item.answer)),
                    ]
                    in_order = pair if ref_first else pair[::-1]
                    messages = preference_messages(ref_item.query or cand_item.query, (in_order[0], in_order[1]))
                    shown = shown_digest(messages)
                    earlier = done.get(key)
                    if (
                        earlier is not None
                        and earlier.get("shown") == shown
                        and earlier.get("judge") == settings.model
                    ):
                        decisions[key] = earlier  # judged before; changed answers or steps are judged again
                        continue
                    calls.append(
                        JudgeCall(
                            key,
                            messages,
                            {
                                "base": base,
                                "ref_first": ref_first,
                                "answers": [ref_item.answer, cand_item.answer],
                                "shown": shown,
                            },
                        )
                    )

    def handle(call: JudgeCall, raw: str) -> None:
        choice, reason = parse_preference(raw)
        winner = None
        if choice is not None:
            winner = "reference" if (choice == "A") == call.payload["ref_first"] else "candidate"
        record = {
            **call.payload["base"],
            "winner": winner,
            "how": "preference" if choice else "unparseable",
            "reason": reason,
            "raw": raw,
            "answers": call.payload["answers"],
            "shown": call.payload["shown"],
        }
        decisions[call.key] = record
        store.append(record)

    failures = list(scoring.failures) + await judge_all(calls, handle, settings, "sowr judge", progress)
    compared = [r for r in decisions.values() if r["how"] in ("preference", "unparseable")]
    # Verdicts of other candidates judged into the same --out stay (a later run against another candidate once
    # dropped them, and rerunning the first judged its pairs again).
    kept = [r for key, r in done.items() if key not in decisions]
    store.rewrite(sorted(compared + kept, key=lambda r: _preference_key(r)))
    table = sowr_metric_table(sowr_table(reference, candidates, ids, decisions, rounds, settings.model))
    return SowrRun(table, failures, len(calls))


def sowr_table(
    reference: str,
    candidates: list[str],
    ids: dict[str, list[str]],
    decisions: dict[tuple, dict],
    rounds: int,
    judge: str,
) -> dict:
    groups = group_order(ids)
    rows, pending_total = [], 0
    for candidate in candidates:
        cells, rates = {}, []
        for group in groups:
            wins = ties = losses = pending = calls = unparseable = 0
            for qid in ids[group]:
                votes = {"reference": 0, "candidate": 0}
                for round_ in range(rounds):
                    record = decisions.get((reference, candidate, group, qid, round_))
                    if record is None or record["how"] == "pending":
                        pending += 1
                        continue
                    calls += record["how"] in ("preference", "unparseable")
                    unparseable += record["how"] == "unparseable"
                    if record.get("winner") in votes:
                        votes[record["winner"]] += 1
                wins += votes["candidate"] > votes["reference"]
                losses += votes["candidate"] < votes["reference"]
                ties += votes["candidate"] == votes["reference"]
            n = len(ids[group])
            rate = 100.0 * wins / n if n else 0.0
            rates.append(rate)
            pending_total += pending
            cells[group] = {
                "win_rate": rate,  # unrounded: the table rounds once
                "tie_rate": 100.0 * ties / n if n else 0.0,
                "ids": n,
                "wins": wins,
                "ties": ties,
                "losses": losses,
                "preference_calls": calls,
                "unparseable": unparseable,
                "pending": pending,
            }
        rows.append(
            {
                "model": candidate,
                "groups": cells,
                "average": {"win_rate": statistics.fmean(rates) if rates else 0.0},
            }
        )
    return {
        "metric": "sowr",
        "reference": reference,
        "judge": judge,
        "prompt_format": PREFERENCE_FORMAT,
        "pass_rate_format": "sopr-v1",
        "rounds": rounds,
        "groups": groups,
        "complete": pending_total == 0,
        "pending": pending_total,
        "rows": rows,
    }


def sowr_metric_table(table: dict) -> MetricTable:
    """The SoWR table of `sowr_table`'s document (win rates; ties and losses in the counts)."""
    groups = table["groups"]
    notes = [
        (
            f"Win rate of each model against `{table['reference']}`; judge `{table['judge']}`, pass rates "
            f"`{table['pass_rate_format']}` then preferences `{table['prompt_format']}`, majority of "
            f"{table['rounds']} round(s). Ties are not counted as wins (see Counts)."
        ),
        "",
    ]
    if not table["complete"]:
        notes += [
            (
                f"**Incomplete:** {table['pending']} vote(s) pending (failed judge calls); rerun the same "
                "command to retry them."
            ),
            "",
        ]
    rows = [
        [row["model"], *(f"{row['groups'][g]['win_rate']:.1f}" for g in groups), f"{row['average']['win_rate']:.1f}"]
        for row in table["rows"]
    ]
    details = [
        "",
        "## Counts",
        "",
        ("| Method | Group | ids | wins | ties | losses | preference calls | unparseable | pending |"),
        "|" + "---|" * 9,
    ]
    for row in table["rows"]:
        for g in groups:
            c = row["groups"][g]
            details.append(
                f"| {row['model']} | {g} | {c['ids']} | {c['wins']} | {c['ties']} | {c['losses']} | "
                f"{c['preference_calls']} | {c['unparseable']} | {c['pending']} |"
            )
    csv_rows = [
        [
            row["model"],
            *(row["groups"][g]["win_rate"] for g in groups),
            row["average"]["win_rate"],
            *(row["groups"][g]["ties"] for g in groups),
        ]
        for row in table["rows"]
    ]
    return MetricTable(
        "sowr",
        "# SoWR (solvable win rate)",
        notes,
        ["Method", *(GROUPS.get(g, g) for g in groups), "Average"],
        rows,
        details,
        ["method", *groups, "average", *(f"{g}_ties" for g in groups)],
        csv_rows,
        table,
        {row["model"]: row["average"]["win_rate"] for row in table["rows"]},
    )


def run_sowr(
    reference: str | os.PathLike,
    candidates: list[str | os.PathLike],
    ids: str | os.PathLike,
    settings: JudgeSettings,
    out: str | os.PathLike,
    rounds: int = 3,
    overwrite: bool = False,
    progress: bool = True,
) -> SowrRun:
    """Compare every candidate model with the reference model; write `sowr.{md,csv,json}` into `out`."""
    reference_answers = load_answers(reference)
    if len(reference_answers) != 1:
        raise AnswersError(
            f"--reference must hold one model's answers, found {len(reference_answers)}: "
            f"{', '.join(sorted(reference_answers))}"
        )
    reference_name = next(iter(reference_answers))
    answers = dict(reference_answers)
    for path in candidates:
        for model, groups in load_answers(path).items():
            if model in answers:
                raise AnswersError(f"model name {model!r} appears twice (reference and candidates must differ)")
            answers[model] = groups
    if len(answers) < 2:
        raise AnswersError("no candidate answers to compare with the reference")
    id_lists = load_ids(ids)
    items = build_items(answers, id_lists)
    run = asyncio.run(_sowr(reference_name, items, id_lists, settings, Path(out), rounds, overwrite, progress))
    run.table.write(Path(out))
    return run
