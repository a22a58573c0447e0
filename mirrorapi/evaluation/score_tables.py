"""FAC / SoPR tables in the shape of StableToolBench's: one row per candidate model, a column per group, Average,
and the one writer of every metric table (`MetricTable.write`: Markdown, CSV and JSON), which SoWR uses too.

Score of a group in one repeat = 100 × Σ scores / number of ids in the group's id list: ids without
an answer, empty or give-up answers and unparseable judge outputs all count 0 in that denominator.
The table shows the mean over repeats ± the population standard deviation (StableToolBench's ±);
Average is the mean of the group columns (their macro average), per repeat, then over repeats.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from mirrorapi.evaluation.answers.items import GROUPS, group_order
from mirrorapi.versions import package_versions

_VERDICT_COUNTS = ("Solved", "Unsure", "Unsolved")
_LISTED = 40  # missing ids listed per group in the Markdown (the JSON has them all)


def _mean_std(values: list[float]) -> tuple[float, float]:
    return (statistics.fmean(values), statistics.pstdev(values)) if values else (0.0, 0.0)


def score_table(run, metric: str, repeats: int, judge: str, prompt_format: str) -> dict:
    """The table of a `ScoringRun` as a JSON-ready dict (what `fac.json` holds)."""
    groups = group_order(run.ids)
    models = sorted({item.model for item in run.items})
    statuses = {(i.model, i.group, i.query_id): i.status for i in run.items}
    by_cell: dict[tuple[str, str], list[dict]] = {}
    for record in run.records:
        by_cell.setdefault((record["model"], record["group"]), []).append(record)
    rows = []
    for model in models:
        cells: dict = {}
        per_repeat_scores: dict[int, list] = {r: [] for r in range(repeats)}
        for group in groups:
            n = len(run.ids[group])
            records = by_cell.get((model, group), [])
            scores = [
                100.0 * sum(r["score"] for r in records if r["repeat"] == rep) / n if n else 0.0
                for rep in range(repeats)
            ]
            for rep, score in enumerate(scores):
                per_repeat_scores[rep].append(score)
            mean, std = _mean_std(scores)
            ids_status = [statuses[(model, group, qid)] for qid in run.ids[group]]
            missing_ids = [qid for qid in run.ids[group] if statuses[(model, group, qid)] == "missing"]
            cells[group] = {
                # Unrounded: the tables round once, as StableToolBench prints its rates (6.748 is 6.7, not 6.75's 6.8).
                "score": mean,
                "std": std,
                "per_repeat": scores,
                "ids": n,
                "missing": len(missing_ids),
                "empty": ids_status.count("empty"),
                "give_up": ids_status.count("give_up"),
                "judgments": len(records),
                "judge_calls": sum(r["judged"] for r in records),
                **{
                    v.lower(): sum(r["judged"] and r["parsed"] and r["verdict"] == v for r in records)
                    for v in _VERDICT_COUNTS
                },
                "unparseable": sum(not r["parsed"] for r in records),
                "pending": n * repeats - len(records),
                "missing_ids": missing_ids,
            }
        averages = [statistics.fmean(per_repeat_scores[rep]) if groups else 0.0 for rep in range(repeats)]
        mean, std = _mean_std(averages)
        rows.append({"model": model, "groups": cells, "average": {"score": mean, "std": std}})
    pending = sum(cell["pending"] for row in rows for cell in row["groups"].values())
    return {
        "metric": metric,
        "judge": judge,
        "prompt_format": prompt_format,
        "repeats": repeats,
        "groups": groups,
        "complete": pending == 0,
        "pending": pending,
        "rows": rows,
    }


def _title(group: str) -> str:
    return GROUPS.get(group, group)


def _cell(score: float, std: float, repeats: int) -> str:
    return f"{score:.1f}±{std:.1f}" if repeats > 1 else f"{score:.1f}"


@dataclass
class MetricTable:
    """One metric's results as scoring computed them: the main table (a row per model, a column per group,
    Average: StableToolBench's layout), what goes around it in Markdown, its CSV rows and its JSON document.
    `MetricTable.write` renders the three files; `mirrorapi benchmark` puts `table_lines` into its report."""

    name: str  # the files' stem: fac, sopr, sowr
    heading: str  # "# FAC score"
    notes: list[str]  # Markdown lines between the heading and the table
    header: list[str]  # Method, the group columns, Average
    rows: list[list[str]]  # the rendered cells of each model's row
    details: list[str]  # Markdown lines after the table (counts, ids without an answer)
    csv_header: list[str]
    csv_rows: list[list]
    document: dict  # what <name>.json holds (with the package versions)
    averages: dict[str, float] = field(default_factory=dict)  # row -> Average (the report's chart)

    def table_lines(self) -> list[str]:
        return [
            "| " + " | ".join(self.header) + " |",
            "|" + "---|" * len(self.header),
            *("| " + " | ".join(row) + " |" for row in self.rows),
        ]

    def markdown(self) -> str:
        return "\n".join([self.heading, "", *self.notes, *self.table_lines(), *self.details]) + "\n"

    def write(self, out: Path) -> dict[str, Path]:
        """Write `<name>.md`, `<name>.csv` and `<name>.json` into `out`; returns their paths."""
        out.mkdir(parents=True, exist_ok=True)
        paths = {ext: out / f"{self.name}.{ext}" for ext in ("md", "csv", "json")}
        paths["md"].write_text(self.markdown(), encoding="utf-8")
        paths["json"].write_text(
            json.dumps({**self.document, "versions": package_versions()}, ensure_ascii=False, indent=2) + "\n",
            encoding="utf-8",
        )
        with open(paths["csv"], "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(self.csv_header)
            writer.writerows(self.csv_rows)
        return paths


def metric_table(table: dict) -> MetricTable:
    """The FAC or SoPR table of `score_table`'s document."""
    name = table["metric"].upper() if table["metric"] == "fac" else "SoPR"
    groups, repeats = table["groups"], table["repeats"]
    notes = [
        f"Judge `{table['judge']}`, prompt `{table['prompt_format']}`, {repeats} repeat(s)"
        + ("; ± is the standard deviation over repeats." if repeats > 1 else "."),
        "Every id of the id lists is in the denominator: missing, empty and give-up answers and "
        "unparseable judge outputs count as Unsolved."
        + (" SoPR scores Solved 1, Unsure 0.5, Unsolved 0." if table["metric"] == "sopr" else ""),
        "",
    ]
    if not table["complete"]:
        notes += [
            f"**Incomplete:** {table['pending']} judgment(s) failed and count 0 here; rerun the same "
            "command to retry them.",
            "",
        ]
    rows = [
        [
            row["model"],
            *(_cell(row["groups"][g]["score"], row["groups"][g]["std"], repeats) for g in groups),
            _cell(row["average"]["score"], row["average"]["std"], repeats),
        ]
        for row in table["rows"]
    ]
    details = [
        "",
        "## Counts",
        "",
        "Ids per group; judgments are ids × repeats.",
        "",
        "| Method | Group | ids | missing | empty | give up | judge calls | Solved | Unsure | Unsolved "
        "| unparseable | pending |",
        "|" + "---|" * 12,
    ]
    for row in table["rows"]:
        for g in groups:
            c = row["groups"][g]
            details.append(
                f"| {row['model']} | {g} | {c['ids']} | {c['missing']} | {c['empty']} | {c['give_up']} "
                f"| {c['judge_calls']} | {c['solved']} | {c['unsure']} | {c['unsolved']} "
                f"| {c['unparseable']} | {c['pending']} |"
            )
    if any(row["groups"][g]["missing_ids"] for row in table["rows"] for g in groups):
        details += ["", "## Ids without an answer (counted Unsolved)", ""]
        for row in table["rows"]:
            for g in groups:
                qids, n = row["groups"][g]["missing_ids"], row["groups"][g]["ids"]
                if len(qids) == n:
                    details.append(f"- {row['model']} / {g}: all {n} ids (no answers for this group)")
                elif qids:
                    more = (
                        f" and {len(qids) - _LISTED} more ({table['metric']}.json lists all)"
                        if len(qids) > _LISTED
                        else ""
                    )
                    details.append(f"- {row['model']} / {g} ({len(qids)}): {', '.join(qids[:_LISTED])}{more}")
    csv_rows = [
        [
            row["model"],
            *(row["groups"][g]["score"] for g in groups),
            row["average"]["score"],
            *(row["groups"][g]["std"] for g in groups),
            row["average"]["std"],
        ]
        for row in table["rows"]
    ]
    return MetricTable(
        table["metric"],
        f"# {name} score",
        notes,
        ["Method", *(_title(g) for g in groups), "Average"],
        rows,
        details,
        ["method", *groups, "average", *(f"{g}_std" for g in groups), "average_std"],
        csv_rows,
        table,
        {row["model"]: row["average"]["score"] for row in table["rows"]},
    )


def render_markdown(table: dict) -> str:
    return metric_table(table).markdown()
