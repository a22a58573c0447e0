"""How often a judge agrees with labelled final answers: accuracy, Cohen's kappa, confusion matrix.

Labelled answers use the judge schema of `shared/data/judge` (`source`, `id`, `query`,
`final_answer`, `label` Solved|Unsolved, `label_kind`). The judge sees them exactly as FAC does
(same prompt format, same answer extraction; an empty answer is Unsolved without a call). An
output without a readable verdict counts as Unsolved in accuracy and kappa, as in FAC, and has its
own column in the confusion matrix. Predictions go to `predictions.jsonl` (a rerun resumes).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from pathlib import Path

from mirrorapi.evaluation.answers.items import AnswersError
from mirrorapi.evaluation.bootstrap import BOOTSTRAP_RESAMPLES, interval_of
from mirrorapi.evaluation.judge.scoring import (
    JsonlStore,
    JudgeCall,
    JudgeRunError,
    JudgeSettings,
    judge_all,
)
from mirrorapi.prompts.judge_formats import (
    DEFAULT_JUDGE_FORMAT,
    JUDGE_VERDICTS,
    extract_final_answer,
    judge_messages,
    parse_verdict,
    query_group,
)
from mirrorapi.records import JUDGE_KEYS, SourceError, read_labelled
from mirrorapi.versions import package_versions

LABELS = ("Solved", "Unsolved")
UNPARSEABLE = "unparseable"


def load_labelled(paths: list[str | Path], limit: int | None = None) -> list[dict]:
    """Records of the judge schema; `limit` keeps the first N of each source. A bad line is an error here
    (the SFT builder skips them instead): agreement over silently thinned data would mislead."""

    def bad(reason: str) -> None:
        raise AnswersError(f"labelled answers: {reason} (the judge schema: {', '.join(JUDGE_KEYS)})")

    records: list = []
    per_source: Counter = Counter()
    seen: dict[tuple[str, str], str | Path] = {}
    for path in paths:
        try:
            for record in read_labelled(path, on_bad=bad, labels=LABELS):
                key = (record["source"], str(record["id"]))
                if key in seen:  # one answer, one verdict: a second copy would be counted twice
                    bad(f"{path}: source {key[0]!r}, id {key[1]!r} again (first in {seen[key]})")
                seen[key] = path
                if limit is None or per_source[record["source"]] < limit:
                    per_source[record["source"]] += 1
                    records.append(record)
        except SourceError as exc:
            raise AnswersError(str(exc)) from exc
    if not records:
        raise AnswersError("no labelled answers in " + ", ".join(map(str, paths)))
    return records


def cohen_kappa(pairs: list[tuple[str, str]]) -> float | None:
    """Cohen's kappa of (label, prediction) pairs; None when chance agreement is 1 (kappa undefined).

    Written out (10 lines) rather than adding scikit-learn for one function.
    """
    n = len(pairs)
    if not n:
        return None
    observed = sum(a == b for a, b in pairs) / n
    first, second = Counter(a for a, _ in pairs), Counter(b for _, b in pairs)
    chance = sum(first[k] * second[k] for k in set(first) | set(second)) / (n * n)
    return None if chance >= 1.0 else (observed - chance) / (1.0 - chance)


def agreement_stats(rows: list[dict]) -> dict:
    """accuracy and kappa with their 95% bootstrap intervals (`accuracy_ci95`, `kappa_ci95`; resampled are the rows'
    queries, each with all its answers, where rows say their `group` (`query_group`: a tau-bench task's trials are no
    independent draws), else the answers; `mirrorapi.evaluation.bootstrap`), the confusion matrix (label ->
    prediction counts) of prediction rows, and `solved_to_all`: the accuracy and kappa of a judge that says Solved to
    every answer, on the same rows (the trivial judge to beat: its accuracy is the share of Solved labels, its kappa
    0, or None where every label is Solved), and the judge's accuracy minus that judge's on the same answers with its
    interval (`over_solved_to_all`: whether the judge is worth its verdicts beyond the draw of answers)."""
    scored = [(r["label"], r["prediction"] if r["prediction"] in LABELS else "Unsolved") for r in rows]
    groups = [r["group"] for r in rows] if all("group" in r for r in rows) else None
    confusion = {label: {p: 0 for p in (*LABELS, UNPARSEABLE)} for label in LABELS}
    for r in rows:
        confusion[r["label"]][r["prediction"]] += 1
    return {
        "n": len(rows),
        **_accuracy_and_kappa(scored),
        "accuracy_ci95": interval_of(scored, _accuracy, digits=4, groups=groups),
        "kappa_ci95": interval_of(scored, cohen_kappa, digits=4, groups=groups),
        "unparseable": sum(r["prediction"] == UNPARSEABLE for r in rows),
        "labelled_solved": sum(r["label"] == "Solved" for r in rows),
        "predicted_solved": sum(r["prediction"] == "Solved" for r in rows),
        "confusion": confusion,
        "solved_to_all": _accuracy_and_kappa([(label, "Solved") for label, _ in scored]),
        "over_solved_to_all": {
            "difference": round(_lead_over_solved_to_all(scored), 4) if scored else None,
            "ci95": interval_of(scored, _lead_over_solved_to_all, digits=4, groups=groups),
        },
    }


def _accuracy(scored: list[tuple[str, str]]) -> float:
    return sum(a == b for a, b in scored) / len(scored)


def _lead_over_solved_to_all(scored: list[tuple[str, str]]) -> float:
    """Accuracy minus a Solved-to-all judge's: the answers the judge gets right that it does not, less the converse
    (Unsolved labels it calls Unsolved, less Solved labels it calls Unsolved), over all answers."""
    return sum(
        (label == "Unsolved") - (label == "Solved") for label, verdict in scored if verdict == "Unsolved"
    ) / len(scored)


def _accuracy_and_kappa(scored: list[tuple[str, str]]) -> dict:
    kappa = cohen_kappa(scored)
    return {
        "accuracy": round(sum(a == b for a, b in scored) / len(scored), 4) if scored else None,
        "kappa": None if kappa is None else round(kappa, 4),
    }


def _prediction_key(record: dict) -> tuple:
    return (record["judge"], record["prompt_format"], record["source"], str(record["id"]))


def _judged_text(record: dict) -> str:
    """A digest of what the judge is shown (query and final answer): an earlier verdict is reused only for the same."""
    return hashlib.sha256(f"{record['query']}\0{record['final_answer']}".encode()).hexdigest()[:16]


async def predict(
    records: list[dict], settings: JudgeSettings, out: Path, fmt: str = DEFAULT_JUDGE_FORMAT, progress: bool = True
) -> tuple[list[dict], list[str]]:
    """One prediction per labelled record (judged, or taken from an earlier run in `out` that judged the same query
    and answer). Each row's label is the record's: a corrected label in the labelled file counts at once."""
    out.mkdir(parents=True, exist_ok=True)
    store = JsonlStore(out / "predictions.jsonl", _prediction_key)
    done = store.load()
    calls = []
    for record in records:
        key = (settings.model, fmt, record["source"], str(record["id"]))
        if done.get(key, {}).get("judged_text") == _judged_text(record):
            continue  # judged before; a changed query or answer is judged again
        status, answer = extract_final_answer(record["final_answer"])
        base = {
            "judge": settings.model,
            "prompt_format": fmt,
            "source": record["source"],
            "id": str(record["id"]),
            "label_kind": record.get("label_kind", ""),
            "label": record["label"],
            "judged_text": _judged_text(record),
        }
        if status != "answer":
            done[key] = {**base, "prediction": "Unsolved", "judged": False, "reason": f"{status} answer", "raw": ""}
            store.append(done[key])
            continue
        messages = judge_messages(record["query"], answer, fmt)
        calls.append(JudgeCall(key, messages, base))

    def handle(call: JudgeCall, raw: str) -> None:
        verdict, reason = parse_verdict(raw, JUDGE_VERDICTS[fmt])
        done[call.key] = {
            **call.payload,
            "prediction": verdict or UNPARSEABLE,
            "judged": True,
            "reason": reason,
            "raw": raw,
        }
        store.append(done[call.key])

    failures = await judge_all(calls, handle, settings, "judge agreement", progress)
    store.rewrite(sorted(done.values(), key=_prediction_key))
    rows = []
    for record in records:
        key = (settings.model, fmt, record["source"], str(record["id"]))
        if done.get(key, {}).get("judged_text") == _judged_text(record):  # else its judge call failed: pending
            rows.append(
                {
                    **done[key],
                    "label": record["label"],
                    "label_kind": record.get("label_kind", ""),
                    "group": query_group(record["query"]),
                }
            )
    return rows, failures


def agreement_report(rows: list[dict], judge: str, fmt: str, pending: int) -> dict:
    by_source: dict[str, list[dict]] = {}
    by_kind: dict[str, list[dict]] = {}
    for row in rows:
        by_source.setdefault(row["source"], []).append(row)
        by_kind.setdefault(f"{row['source']} / {row['label_kind']}", []).append(row)
    return {
        "judge": judge,
        "prompt_format": fmt,
        "pending": pending,
        "overall": agreement_stats(rows),
        "per_source": {s: agreement_stats(r) for s, r in sorted(by_source.items())},
        "per_label_kind": {k: agreement_stats(r) for k, r in sorted(by_kind.items())},
    }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _with_interval(value: float | None, interval: list[float] | None) -> str:
    return _fmt(value) + ("" if value is None or interval is None else f" [{interval[0]:.3f}, {interval[1]:.3f}]")


def render_markdown(report: dict) -> str:
    lines = [
        "# Judge agreement",
        "",
        f"Judge `{report['judge']}`, prompt `{report['prompt_format']}`. "
        "Unparseable outputs count as Unsolved in accuracy and kappa (kappa is n/a when chance "
        "agreement is 1).",
        "",
    ]
    if report["pending"]:
        lines += [f"**Incomplete:** {report['pending']} judge call(s) failed and are left out; rerun to retry.", ""]
    lines += [
        "Beside each slice, a judge that says Solved to every answer (its accuracy is the share of Solved "
        "labels, its kappa 0): the judge is worth its verdicts where it beats that. In brackets, the 95% bootstrap "
        f"interval (the slice's queries resampled {BOOTSTRAP_RESAMPLES:,} times, each with all its answers, a fixed "
        "seed): on a few dozen queries, a figure can move that far by the draw of queries alone.",
        "",
        "| Slice | n | accuracy | Cohen's kappa | Solved-to-all accuracy | Solved-to-all kappa "
        "| accuracy minus Solved-to-all's | labelled Solved | predicted Solved | unparseable |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    slices = [("overall", report["overall"]), *report["per_source"].items(), *report["per_label_kind"].items()]
    for name, s in slices:
        constant = s["solved_to_all"]
        lines.append(
            f"| {name} | {s['n']} | {_with_interval(s['accuracy'], s['accuracy_ci95'])} "
            f"| {_with_interval(s['kappa'], s['kappa_ci95'])} "
            f"| {_fmt(constant['accuracy'])} | {_fmt(constant['kappa'])} "
            f"| {_with_interval(s['over_solved_to_all']['difference'], s['over_solved_to_all']['ci95'])} "
            f"| {s['labelled_solved']} "
            f"| {s['predicted_solved']} | {s['unparseable']} |"
        )
    lines += ["", "## Confusion matrices (rows: label, columns: judge)", ""]
    for name, s in [("overall", report["overall"]), *report["per_source"].items()]:
        lines += [f"**{name}**", "", "| label \\ judge | Solved | Unsolved | unparseable |", "|---|---|---|---|"]
        lines += [
            f"| {label} | " + " | ".join(str(v) for v in s["confusion"][label].values()) + " |" for label in LABELS
        ]
        lines.append("")
    return "\n".join(lines)


def run_agreement(
    labelled: list[str | Path],
    settings: JudgeSettings,
    out: str | Path,
    limit: int | None = None,
    fmt: str = DEFAULT_JUDGE_FORMAT,
    progress: bool = True,
) -> tuple[dict, list[str]]:
    """Judge the labelled answers and write `agreement.md` / `agreement.json` into `out`."""
    if fmt not in JUDGE_VERDICTS or JUDGE_VERDICTS[fmt] != LABELS:
        raise JudgeRunError(f"judge agreement needs a Solved/Unsolved prompt format, not {fmt!r}")
    out = Path(out)
    records = load_labelled(labelled, limit)
    rows, failures = asyncio.run(predict(records, settings, out, fmt, progress))
    report = agreement_report(rows, settings.model, fmt, pending=len(records) - len(rows))
    (out / "agreement.json").write_text(
        json.dumps({**report, "versions": package_versions()}, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    (out / "agreement.md").write_text(render_markdown(report), encoding="utf-8")
    return report, failures
