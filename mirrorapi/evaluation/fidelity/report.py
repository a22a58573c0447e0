"""The fidelity report: `fidelity.md`, `fidelity.json`, `fidelity.png` (bars per source), `calls.jsonl` and, for a
replay with and without history, `session_calls.jsonl`."""

from __future__ import annotations

import json
import math
from pathlib import Path

from mirrorapi.evaluation.bootstrap import BOOTSTRAP_RESAMPLES
from mirrorapi.evaluation.fidelity.metrics import difference_text, resampled_text
from mirrorapi.versions import package_versions

METRIC_TITLES = {
    "bleu4": "BLEU-4",
    "rouge_l": "ROUGE-L",
    "valid_json": "valid JSON",
    "error_agreement": "error agreement",
    "error_precision": "error precision",
    "error_recall": "error recall",
    "schema_conformance": "schema conformance",
    "embedding_cosine": "embedding cosine",
}
SIDE_TITLES = {"simulated": "simulator", "baseline": "nearest example"}

DEFINITIONS = f"""\
## How to read this

All figures are percentages. Text metrics compare the payload an agent sees (the error and the
response; structured responses as compact JSON) with the real one.
- **BLEU-4**: sacrebleu corpus BLEU; **ROUGE-L**: mean ROUGE-L F1 (rouge-score). BLEU-4 is the n-gram
  precisions' geometric mean times a brevity penalty: below the tables, a side's length (its tokens over the
  real answers') and that penalty (100 at a length of 100 or more), which tell a gap in what is written from
  one in how much is written.
- **valid JSON**: of the calls whose real response is a JSON object or array, the share where this
  side's response is one too.
- **error agreement**: the share of calls where this side is an error exactly when the real call is
  (an `error` string, or an in-band error reply such as tau-bench's `Error: ...`).
- **error precision**: of the calls this side answered with an error, the share whose real call erred;
  **error recall**: of the calls whose real call erred, the share this side answered with an error
  (n/a without such calls; the counts are under the overall table).
- **answered from the cache**: a call whose arguments the server's cache already held (a recorded or
  imported real answer, e.g. a training call: the server's `x-mirrorapi-outcome` is `hit`, its provenance
  not the simulator's) is answered from it, not simulated; such calls are counted apart and left out of
  every figure, the nearest example's included (unless `--include-cache-hits`).
- **schema conformance**: of the successful real calls whose doc has a response schema (ToolEnv2404
  `schema`, or the `template_response` skeleton as a schema), the share where this side's response
  conforms; the real responses' own share is the ceiling (needs `--tools`).
- **embedding cosine**: mean cosine similarity × 100 of mean-pooled embeddings (needs `--embedding-model`).
- **nearest example**: the real response of the most similar training call of the same API
  (Jaccard of the arguments); a call whose API has no training call counts as wrong on every check (on the
  error measures as no answer: a miss of a failure, never an error answer for precision).
- **simulator minus nearest example**: ROUGE-L's and BLEU-4's difference on the same calls, with a 95%
  percentile bootstrap interval (the episodes resampled {BOOTSTRAP_RESAMPLES:,} times, each with all its calls, a
  fixed seed: calls of one episode are no independent draws): with few episodes, a gap whose interval holds 0 may
  be chance.
"""


def _num(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def _interval(bounds: list[float] | None) -> str:
    return "" if bounds is None else f"[{bounds[0]:.1f}, {bounds[1]:.1f}]"


def _metric_cells(metrics: dict) -> list[str]:
    return [_num(metrics.get(key)) for key in METRIC_TITLES]


def render_markdown(report: dict) -> str:
    sides = [s for s in SIDE_TITLES if s == "simulated" or report["baseline"]]
    overall = report["overall"]
    lines = [
        "# Simulator fidelity",
        "",
        f"Server `{report['server']}`: {report['calls']} held-out real calls replayed in episode order. "
        f"{overall['simulator_failures']} answer(s) were the server's simulator failure (`Failed to generate "
        f"fake response`: the model's output was not an observation) and {overall['request_failures']} "
        "request(s) failed: neither is an answer, so on the error measures each is a miss where the call failed and "
        "wrong where it succeeded, never an error answer, and its text is scored as it is.",
    ]
    if report.get("cache_entries_at_start"):
        lines.append(
            f"**Warning:** the server's cache held {report['cache_entries_at_start']} entries before the "
            "replay; calls it had seen were answered from the cache, not simulated."
        )
    hits = report["cache_hits"]
    outcomes = ", ".join(f"{name} {n}" for name, n in report["outcomes"].items())
    where = ", ".join(f"{source} {n}" for source, n in hits["per_source"].items())
    lines.append(
        f"How the server answered the {report['calls']} calls: {outcomes}. **{hits['n']} answered from the "
        "cache** (a recorded answer of the same call"
        + (f": {where}" if where else "")
        + "): "
        + (
            "scored with the rest (`--include-cache-hits`)."
            if hits["scored"]
            else f"left out; the figures below are over the other {report['scored']} calls."
        )
    )
    if report["baseline"]:
        lines.append(
            f"Baseline: nearest example; {_num(overall['baseline_coverage'])}% of calls have a training "
            "call of the same API."
        )
    header = "| " + " | ".join(METRIC_TITLES.values()) + " |"
    lines += ["", "## Overall", "", "| | calls " + header, "|" + "---|" * (len(METRIC_TITLES) + 2)]
    for side in sides:
        lines.append(f"| {SIDE_TITLES[side]} | {overall['n']} | " + " | ".join(_metric_cells(overall[side])) + " |")
    real_schema = overall["simulated"].get("schema_conformance_real")
    if real_schema is not None:
        lines.append(
            f"| real responses | {overall['simulated']['schema_n']} | – | – | – | – | – | – "
            f"| {_num(real_schema)} | – |"
        )
    if overall["n"]:
        lines += [
            "",
            "Error precision over the calls each side answered with an error, recall over the "
            f"{overall['simulated']['error_recall_n']} calls whose real answer was an error (in brackets, "
            "95% bootstrap intervals): "
            + "; ".join(
                f"{SIDE_TITLES[side]} {overall[side]['error_precision_n']} errors answered"
                + "".join(
                    f", {name} {_num(overall[side][key])} {_interval(overall[side].get(key + '_ci95'))}"
                    for key, name in (("error_precision", "precision"), ("error_recall", "recall"))
                    if overall[side][key] is not None
                )
                for side in sides
            )
            + ".",
        ]
    lines += ["", "## Per source", "", "| source | side | calls " + header, "|" + "---|" * (len(METRIC_TITLES) + 3)]
    for source, block in report["per_source"].items():
        for side in sides:
            lines.append(
                f"| {source} | {SIDE_TITLES[side]} | {block['n']} | " + " | ".join(_metric_cells(block[side])) + " |"
            )
    if report["per_source"]:
        lengths = "; ".join(
            f"{source} "
            + ", ".join(
                f"{SIDE_TITLES[side]} {_num(block[side].get('bleu4_length'))} / "
                f"{_num(block[side].get('bleu4_brevity_penalty'))}"
                for side in sides
            )
            for source, block in report["per_source"].items()
        )
        lines += ["", f"BLEU-4's length (tokens written over the real answers') and brevity penalty: {lengths}."]
    if report["baseline"] and overall.get("simulator_against_example"):
        blocks = [("overall", overall), *report["per_source"].items()]
        gaps = "; ".join(
            f"{name} {difference_text(block['simulator_against_example'])}"
            for name, block in blocks
            if block.get("simulator_against_example")
        )
        lines += [
            "",
            "Simulator minus nearest example, with a 95% bootstrap interval "
            f"({resampled_text(overall['simulator_against_example'])}; an interval that holds 0 is no evidence "
            f"either way): {gaps}.",
        ]
    cell_title = "simulator / nearest example" if report["baseline"] else "simulator"
    lines += ["", f"## Per API ({cell_title})", "", "| API | calls " + header, "|" + "---|" * (len(METRIC_TITLES) + 2)]
    for api, block in report["per_api"].items():
        cells = [" / ".join(_num(block[side].get(key)) for side in sides) for key in METRIC_TITLES]
        lines.append(f"| {api} | {block['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + DEFINITIONS


def plot(report: dict, path: Path) -> None:
    """`figure(report)` written to `path`."""
    import matplotlib.pyplot as plt

    fig = figure(report)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(report: dict):
    """One panel per source (and overall): a bar per metric for the simulator and the baseline."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    panels = [("overall", report["overall"]), *report["per_source"].items()]
    sides = [s for s in SIDE_TITLES if s == "simulated" or report["baseline"]]
    keys = [k for k in METRIC_TITLES if any(block[s].get(k) is not None for _, block in panels for s in sides)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(6.0, 1.3 * len(keys) + 2), 2.8 * len(panels)), squeeze=False)
    width = 0.8 / len(sides)
    for ax, (name, block) in zip(axes[:, 0], panels, strict=True):
        for i, side in enumerate(sides):
            values = [block[side].get(k) for k in keys]
            positions = [x + (i - (len(sides) - 1) / 2) * width for x in range(len(keys))]
            ax.bar(positions, [math.nan if v is None else v for v in values], width, label=SIDE_TITLES[side])
            # A metric that does not apply (no call of that kind) has no bar; say so, or it reads as 0.
            for x, value in zip(positions, values, strict=True):
                if value is None:
                    ax.text(x, 2, "n/a", ha="center", va="bottom", rotation=90, fontsize=8, color="0.4")
        ax.set_title(f"{name} ({block['n']} calls)")
        ax.set_xticks(range(len(keys)), [METRIC_TITLES[k] for k in keys])
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
    axes[0, 0].legend(loc="upper right")
    fig.tight_layout()
    return fig


def write_report(out: Path, report: dict, rows: list[dict], session_rows: list[dict] | None = None) -> dict[str, Path]:
    """Write the four report files into `out`, and `session_calls.jsonl` when `session_rows` (the replay in sessions
    of a `--history both` run, whose `calls.jsonl` is the call-by-call pass) are given; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "md": out / "fidelity.md",
        "json": out / "fidelity.json",
        "png": out / "fidelity.png",
        "calls": out / "calls.jsonl",
    }
    paths["json"].write_text(
        json.dumps({**report, "versions": package_versions()}, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )
    paths["md"].write_text(render_markdown(report), encoding="utf-8")
    if session_rows is not None:
        paths["session_calls"] = out / "session_calls.jsonl"
    for name, written in (("calls", rows), ("session_calls", session_rows)):
        if written is not None:
            with open(paths[name], "w", encoding="utf-8") as fh:
                for row in written:
                    fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    plot(report, paths["png"])
    return paths
