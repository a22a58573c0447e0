"""One command for StableToolBench's tables: agents × methods -> answers -> SoPR, SoWR, FAC -> one report.

    <out>/answers/<agent>_<cot|dfs>/   raw (answer/<group>/) and converted (<group>.json) answers
    <out>/scores/                      answers.jsonl (FAC and SoPR verdicts), preferences.jsonl,
                                       fac.*, sopr.*, sowr.* tables (md, csv, json)
    <out>/report.md, report.json, report.png   built from the tables scoring returns (MetricTable), not re-read

Every step resumes: a rerun skips finished queries and judgments. SoWR reuses the SoPR verdicts
(same judge, same number of rounds). The reference of SoWR is one of the rows (default: the first
agent's first method), as StableToolBench compares everything with ChatGPT-CoT.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from mirrorapi.evaluation.agent.environment import GAVE_UP
from mirrorapi.evaluation.agent.files import ANSWER_DIR, load_queries
from mirrorapi.evaluation.agent.run import AgentRun, run_agent
from mirrorapi.evaluation.agent.settings import AgentRunError, AgentSettings
from mirrorapi.evaluation.answers.items import GROUPS, AnswersError, group_order, load_ids
from mirrorapi.evaluation.benchmarks import apibank, tooleyes
from mirrorapi.evaluation.judge.scoring import JudgeSettings, run_scoring
from mirrorapi.evaluation.judge.sowr import run_sowr
from mirrorapi.evaluation.score_tables import MetricTable
from mirrorapi.prompts.agent_formats import AGENT_FORMATS, TEXT_AGENT_FORMATS
from mirrorapi.versions import package_versions

logger = logging.getLogger(__name__)
_SHORT = {"CoT@1": "cot", "DFS_woFilter_w2": "dfs"}


@dataclass
class AgentSpec:
    label: str  # row name prefix, e.g. qwen7b
    model: str
    base_urls: list[str]
    methods: list[str] | None = None  # this agent's methods, when not the benchmark's
    prompt_format: str | None = None  # this agent's prompt format, when not the benchmark's


def parse_agent(values: list[str]) -> AgentSpec:
    """`LABEL MODEL BASE_URL [BASE_URL ...]` -> AgentSpec."""
    if len(values) < 3:
        raise ValueError("--agent takes LABEL MODEL BASE_URL [BASE_URL ...]")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", values[0]):
        raise ValueError(f"--agent label {values[0]!r}: use letters, digits, '.', '_' or '-'")
    return AgentSpec(values[0], values[1], values[2:])


def parse_agents(agent_values: list[list[str]], formats: Sequence[list[str]] = ()) -> list[AgentSpec]:
    """The `--agent` entries, with the prompt formats of `--agent-format LABEL FORMAT`."""
    agents = [parse_agent(values) for values in agent_values]
    labels = {agent.label: agent for agent in agents}
    for label, fmt in formats:
        if label not in labels:
            raise ValueError(f"--agent-format {label}: no --agent has that label ({', '.join(labels)})")
        if fmt not in AGENT_FORMATS:
            raise ValueError(f"--agent-format {label} {fmt}: unknown prompt format; known: {', '.join(AGENT_FORMATS)}")
        labels[label].prompt_format = fmt
    return agents


def row_name(agent: AgentSpec, method: str) -> str:
    return f"{agent.label}_{_SHORT.get(method, re.sub(r'[^A-Za-z0-9]+', '_', method).strip('_'))}"


@dataclass
class BenchmarkResult:
    report: Path
    agent_runs: dict[str, AgentRun]
    judge_failures: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.judge_failures and all(run.complete for run in self.agent_runs.values())


def run_counts(answers: Path, groups: list[str]) -> dict[str, dict]:
    """Per group: what the agent runs produced (from the raw files)."""
    counts = {}
    for group in groups:
        files = (
            sorted((answers / ANSWER_DIR / group).glob("*.json")) if (answers / ANSWER_DIR / group).is_dir() else []
        )
        c = {"answered": 0, "give_answer": 0, "give_up": 0, "no_finish": 0, "model_calls": 0, "tokens": 0}
        for file in files:
            try:
                answer = json.loads(file.read_bytes())
                generation = answer["answer_generation"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            c["answered"] += 1
            c[_outcome(answer, generation)] += 1
            c["model_calls"] += int(generation.get("query_count") or 0)
            c["tokens"] += int(generation.get("total_tokens") or 0)
        counts[group] = c
    return counts


def _outcome(answer: dict, generation: dict) -> str:
    """give_answer, give_up or no_finish. A DFS give-up carries its `Finish` arguments in `final_answer`; a CoT
    give-up, as StableToolBench's single_chain writes it, is `valid_data` false with an empty `final_answer`, its
    chain ending in the `Finish` call whose observation code is 4 (give up and restart)."""
    if "give_up_and_restart" in (generation.get("final_answer") or ""):
        return "give_up"
    if generation.get("valid_data"):
        return "give_answer"
    tries = answer.get("trys")
    chain = tries[-1].get("chain") if isinstance(tries, list) and tries and isinstance(tries[-1], dict) else None
    last = chain[-1] if isinstance(chain, list) and chain and isinstance(chain[-1], dict) else {}
    return "give_up" if last.get("observation_code") == GAVE_UP else "no_finish"


def tooleyes_table(result: tooleyes.ToolEyesResult) -> MetricTable:
    """ToolEyes' rule-based capability rows (its Table 3 layout) as a MetricTable, for the report."""
    columns = (*tooleyes.CAPABILITIES, "overall", "tool_reality")
    rows = [
        [model, scenario, str(c["n"]), *("—" if c[k] is None else f"{c[k]:.2f}" for k in columns)]
        for model, scenarios in tooleyes.table(result.rows).items()
        for scenario, c in scenarios.items()
    ]
    return MetricTable(
        "tooleyes",
        "# ToolEyes capability scores",
        [],
        ["Model", "Scenario", "n", "s_FA", "s_IC", "s_BP", "s_TS", "s_AO", "Overall", "tool reality"],
        rows,
        [],
        [],
        [],
        {},
    )


def plot(averages: dict[str, dict[str, float]], rows: list[str], path: Path) -> Path | None:
    """Grouped bars: one group per row (agent × method), one bar per metric's Average."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [m for m in ("sopr", "sowr", "fac") if m in averages]
    if not metrics or not rows:
        return None
    width = 0.8 / len(metrics)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(rows)), 3.6))
    for i, metric in enumerate(metrics):
        present = [x for x, row in enumerate(rows) if row in averages[metric]]  # no SoWR bar for the reference
        bars = ax.bar(
            [x + i * width for x in present],
            [averages[metric][rows[x]] for x in present],
            width,
            label={"sopr": "SoPR", "sowr": "SoWR", "fac": "FAC"}[metric],
        )
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    ax.set_xticks([x + width * (len(metrics) - 1) / 2 for x in range(len(rows))], rows, rotation=15)
    ax.set_ylabel("Average (%)")
    ax.set_ylim(0, 105)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(
    out: Path,
    rows: list[str],
    reference: str,
    agents: dict[str, AgentSettings],
    judge: JudgeSettings,
    groups: list[str],
    agent_runs: dict[str, AgentRun],
    repeats: int,
    tables: dict[str, MetricTable | None],
) -> Path:
    """report.md, report.json and report.png from the tables scoring computed (sopr, sowr, fac, tooleyes)."""

    def table_lines(metric: str) -> list[str]:
        table = tables.get(metric)
        return table.table_lines() if table is not None else ["(not computed)"]

    averages = {
        metric: table.averages
        for metric, table in tables.items()
        if table is not None and metric in ("sopr", "sowr", "fac")
    }
    image = plot(averages, rows, out / "report.png")
    lines = [
        "# Benchmark report",
        "",
        (
            f"Judge `{judge.model}` ({', '.join(judge.base_urls)}); {repeats} round(s) for SoPR and SoWR; "
            f"SoWR reference `{reference}`."
        ),
        "",
        "## SoPR",
        "",
        *table_lines("sopr"),
        "",
        "## SoWR",
        "",
        *table_lines("sowr"),
        "",
        "## FAC",
        "",
        *table_lines("fac"),
        "",
    ]
    lines += [
        "## ToolEyes (rule-based parts)",
        "",
        "s_FA and tool reality by rule, from the same trajectories; the judged capabilities (s_IC, s_BP, "
        "s_TS, s_AO): `eval/tooleyes.py --answers <out>/answers` with a judge.",
        "",
        *table_lines("tooleyes"),
        "",
    ]
    lines += apibank.report_section(out / "apibank")  # a finished `eval/apibank.py --out <out>/apibank`
    if image is not None:
        lines += [f"![Averages]({image.name})", ""]
    lines += [
        "## Agent runs",
        "",
        "| Method | Group | answered | final answer | gave up | no Finish | failed | model calls / query |",
        "|" + "---|" * 8,
    ]
    counts = {}
    for row in rows:
        counts[row] = run_counts(out / "answers" / row, groups)
        failed = agent_runs[row].failures if row in agent_runs else []
        for group in groups:
            c = counts[row][group]
            n_failed = sum(f" {group}/" in line for line in failed)
            per_query = c["model_calls"] / c["answered"] if c["answered"] else 0.0
            lines.append(
                f"| {row} | {GROUPS.get(group, group)} | {c['answered']} | {c['give_answer']} | "
                f"{c['give_up']} | {c['no_finish']} | {n_failed} | {per_query:.1f} |"
            )
    not_run = [
        line
        for row in rows
        for line in (agent_runs[row].failures if row in agent_runs else [])
        if line.startswith(f"{row}: not run")
    ]
    if not_run:
        lines += ["", *(f"- {line}" for line in not_run)]
    lines += ["", "## Settings", ""]
    for row in rows:
        record = agents[row].record()
        lines.append(
            f"- `{row}`: model `{record['model']}` at {', '.join(record['base_urls'])}, method "
            f"`{record['method']}`, temperature {record['temperature']}, depth "
            f"{record['single_chain_max_step']}, {record['max_query_count']} calls, observations "
            f"cut at {record['max_observation_length']}, prompt `{record['prompt_format']}`"
            + (" with its reply grammar" if record.get("react_grammar") else "")
        )
    (out / "report.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (out / "report.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "reference": reference,
                "judge": {"model": judge.model, "base_urls": judge.base_urls},
                "repeats": repeats,
                "averages": averages,
                "agent_counts": counts,
                "agents": {row: agents[row].record() for row in rows},
                "failures": {row: run.failures for row, run in agent_runs.items()},
                "versions": package_versions(),
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return out / "report.md"


def run_benchmark(
    queries: str | os.PathLike,
    agents: list[AgentSpec],
    methods: list[str],
    template: AgentSettings,
    judge: JudgeSettings,
    out: str | os.PathLike,
    ids: str | os.PathLike | None = None,
    tools: Sequence[str | os.PathLike] = (),
    reference: str | None = None,
    repeats: int = 3,
    progress: bool = True,
    limit: int | None = None,
) -> BenchmarkResult:
    """Run every agent with every method, then score (SoPR, SoWR, FAC) and write the report."""
    out = Path(out)
    runs = [(agent, method) for agent in agents for method in agent.methods or methods]
    rows = [row_name(agent, method) for agent, method in runs]
    if len(set(rows)) != len(rows):
        raise ValueError("two --agent entries share a label (rows: " + ", ".join(rows) + ")")
    reference = reference or rows[0]
    if reference not in rows:
        raise ValueError(f"--reference {reference!r} is not one of the rows: {', '.join(rows)}")
    load_queries(queries)  # bad queries stop everything here (AgentRunError), not once per row
    settings, agent_runs = {}, {}
    for (agent, method), row in zip(runs, rows, strict=True):
        fmt = agent.prompt_format or template.prompt_format
        settings[row] = replace(
            template,
            base_urls=agent.base_urls,
            model=agent.model,
            method=method,
            prompt_format=fmt,
            react_grammar=template.react_grammar and fmt in TEXT_AGENT_FORMATS,
        )
        try:
            agent_runs[row] = run_agent(
                queries, settings[row], out / "answers" / row, tools=tools, progress=progress, limit=limit
            )
        except AgentRunError as exc:  # this agent's engine is down: the other rows still run
            line = f"{row}: not run: {exc}"
            logger.error(line)
            agent_runs[row] = AgentRun(0, 0, [line], {})
    ids = ids or queries
    id_lists = load_ids(ids)
    if limit:  # score what was run: the first `limit` ids of each group
        id_lists = {group: values[:limit] for group, values in id_lists.items()}
        ids = out / "ids"
        ids.mkdir(parents=True, exist_ok=True)
        for group, values in id_lists.items():
            (ids / f"{group}.json").write_text(json.dumps({qid: 0 for qid in values}), encoding="utf-8")
    scores, failures = out / "scores", []
    answers = out / "answers"
    tables: dict[str, MetricTable | None] = {}
    for metric in ("sopr", "fac"):
        run = run_scoring(
            answers, ids, judge, scores, metric=metric, repeats=repeats if metric == "sopr" else 1, progress=progress
        )
        failures += run.failures
        tables[metric] = run.table
    answered = [row for row in rows if list((answers / row).glob("*.json"))]
    if reference in answered and len(answered) > 1:
        sowr = run_sowr(
            answers / reference,
            [answers / row for row in answered if row != reference],
            ids,
            judge,
            scores,
            rounds=repeats,
            progress=progress,
        )
        failures += sowr.failures
        tables["sowr"] = sowr.table
    elif len(rows) > 1:
        logger.error("SoWR not computed: the reference %s or every candidate has no answers", reference)
    try:  # ToolEyes' rule-based parts cost no judge call
        result = tooleyes.score(answers)
        tooleyes.write_report(result, None, scores)
        tables["tooleyes"] = tooleyes_table(result)
    except AnswersError as exc:
        logger.error("ToolEyes not computed: %s", exc)
    report = write_report(out, rows, reference, settings, judge, group_order(id_lists), agent_runs, repeats, tables)
    return BenchmarkResult(report, agent_runs, failures)
