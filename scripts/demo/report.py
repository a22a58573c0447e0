"""The demo's report folder: `report.json` (everything), `report.md` (a summary of every step) and
`fidelity.png` (copied from the fidelity evaluation), beside the evaluations' own reports and the logs.
Written also when a step failed or was interrupted: what was done until then, and where it stopped."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

FIDELITY_KEYS = {"bleu4": "BLEU-4", "rouge_l": "ROUGE-L", "valid_json": "valid JSON",
                 "error_agreement": "error agreement", "schema_conformance": "schema conformance"}
SIDES = {"simulated": "simulator (tiny model)", "baseline": "nearest example"}
CAVEAT = ("The tiny model (about 0.6M parameters, trained for a minute) learns the simulator's answer format "
          "(`{\"error\", \"response\"}` JSON), not the APIs, and the tiny judge learns the verdict format: the scores "
          "show that the loop runs end to end, not what a trained 7B simulator or judge reaches.")


def _num(value) -> str:
    return "-" if value is None else f"{value:.1f}"


def fidelity_summary(fidelity: dict) -> str:
    overall = fidelity["overall"]
    lines = [f"fidelity on {fidelity['calls']} held-out real calls (%, " + ", ".join(FIDELITY_KEYS.values()) + "):"]
    for side, title in SIDES.items():
        if overall.get(side):
            lines.append(f"  {title:<24}" + "  ".join(f"{_num(overall[side].get(k)):>5}" for k in FIDELITY_KEYS))
    return "\n".join(lines)


def judge_summary(fac: dict, agreement: dict) -> str:
    lines = [f"FAC of StableToolBench's example answers, {row['model']}: {row['average']['score']:.1f}"
             for row in fac["rows"]]
    overall = agreement["overall"]
    accuracy = "n/a" if overall["accuracy"] is None else f"{100 * overall['accuracy']:.1f}%"
    kappa = "n/a" if overall["kappa"] is None else f"{overall['kappa']:.2f}"
    return "\n".join(lines + [f"judge agreement on {overall['n']} held-out labelled answers: accuracy {accuracy}, "
                              f"Cohen's kappa {kappa}, {overall['unparseable']} unparseable"])


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
             f"- mode: {'quick (reduced)' if report['quick'] else 'full'}; total {report.get('total_seconds')} s",
             f"- data: {report.get('data_source', '-')}", "", "## Steps", "",
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
        lines += ["", "## 3. Serving", "", f"Engine `transformers serve` at {s['engine']}; virtual server "
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
        overall = report["fidelity"]["overall"]
        lines += ["", "## 5. Scores", "",
                  f"### Simulator fidelity on {report['fidelity']['calls']} held-out real calls", "",
                  "| | " + " | ".join(FIDELITY_KEYS.values()) + " |", "|---|" + "---|" * len(FIDELITY_KEYS)]
        lines += [f"| {title} | " + " | ".join(_num(overall[side].get(k)) for k in FIDELITY_KEYS) + " |"
                  for side, title in SIDES.items() if overall.get(side)]
        lines += ["", "All in %; definitions in [fidelity/fidelity.md](fidelity/fidelity.md).", "",
                  "![fidelity per source](fidelity.png)"]
    if "fac" in report and "agreement" in report:
        lines += ["", "### FAC and judge agreement with the trained judge", "",
                  *("- " + line for line in judge_summary(report["fac"], report["agreement"]).splitlines()),
                  "", "Tables: [fac/fac.md](fac/fac.md), "
                  "[judge-agreement/agreement.md](judge-agreement/agreement.md)."]
    lines += ["", "## Files", "", "`report.json` (everything above, in full), `logs/` (every command's output), "
              "`server.yml` (the virtual server's settings), `heldout.jsonl` (the calls scored).", "", CAVEAT, ""]
    return "\n".join(lines)


def write_report(folder: Path, report: dict) -> None:
    png = folder / "fidelity" / "fidelity.png"
    if png.is_file():
        shutil.copyfile(png, folder / "fidelity.png")
    (folder / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n",
                                        encoding="utf-8")
    (folder / "report.md").write_text(render_markdown(report), encoding="utf-8")
