"""Episodes replayed with and without session history: per-step fidelity and a consistency score.

The same held-out episodes are replayed twice through one server: once call by call (no session,
each miss simulated alone) and once with one session per episode (`X-Session-Id`: the simulator
sees the episode's earlier calls and answers). Both passes are scored like any fidelity run
(`metrics.compare`), and in addition:

- **per-step fidelity**: the metrics by position in the episode (step 0, 1, 2, 3+). History can
  only matter from step 1 on; step 0 is the control.
- **consistency**: where a real answer repeats a value the episode produced earlier (an id, a
  token, a name: from an earlier request or an earlier real answer), does the simulated answer
  repeat it too (values of the `response` only: an error message is not a value)? A value from an earlier *request* is
  the same literal in the replay (requests are replayed as recorded; where one carried the simulator's value instead,
  its answers are scored with the recorded name: `carried_values`), so it counts when the simulated answer contains
  it. A value from an earlier *answer* only has a simulated counterpart (the simulator made up its own token), so each
  such value counts when the simulated answer repeats some value of the simulator's own earlier answers
  (at most as many as the real answer repeats). Consistency = values repeated / values the real
  answers repeat, over all steps. Values are the leaves of JSON answers (strings of 3+ characters,
  numbers of 2+ digits) and, in long texts, tokens with a digit; a few words that every answer
  holds (`success`, `true`, ...) do not count.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from typing import Any

from mirrorapi.evaluation.fidelity.metrics import difference_text, paired_difference, resampled_text, slice_metrics
from mirrorapi.simulator_pairs import select_pairs
from mirrorapi.tools import ToolRegistry

STEP_BUCKETS = ("0", "1", "2", "3+")
# The columns of the history tables (those of the fidelity tables a session can change).
HISTORY_METRICS = {
    "rouge_l": "ROUGE-L",
    "bleu4": "BLEU-4",
    "error_agreement": "error agreement",
    "error_precision": "error precision",
    "error_recall": "error recall",
    "valid_json": "valid JSON",
}
_COMMON = {"success", "true", "false", "null", "none", "error", "failed", "str", "int", "float", "list"}
_TOKEN = re.compile(r"[A-Za-z0-9][\w@.:/-]{3,}")


def heldout_episodes(
    pairs: list[dict], registry: ToolRegistry, max_episodes: int | None = None, history: int = 0
) -> list[dict]:
    """The pairs of the episodes `data/build_simulator_sft.py --history <history>` (default fractions
    and seed; the split depends on `--history`, through deduplication) holds out as test_id /
    test_ood, whole episodes; at most `max_episodes` of them (`some_episodes`)."""
    held = select_pairs(pairs, registry, history=history).heldout_episodes()
    return some_episodes([p for p in pairs if (p["source"], str(p["episode"])) in held], max_episodes)


def some_episodes(pairs: list[dict], max_episodes: int | None) -> list[dict]:
    """The pairs of at most `max_episodes` whole episodes, taken in turn from each source (sorted by
    episode within a source), so that a small sample still holds every source."""
    if max_episodes is None:
        return pairs
    by_source: dict[str, list] = defaultdict(list)
    for source, episode in sorted({(p["source"], str(p["episode"])) for p in pairs}):
        by_source[source].append((source, episode))
    queues = [iter(episodes) for _, episodes in sorted(by_source.items())]
    chosen: set = set()
    while queues and len(chosen) < max_episodes:
        for queue in list(queues):
            item = next(queue, None)
            if item is None:
                queues.remove(queue)
            elif len(chosen) < max_episodes:
                chosen.add(item)
    return [p for p in pairs if (p["source"], str(p["episode"])) in chosen]


def values(obj: Any) -> set[str]:
    """The values of an answer or a request that could be carried to a later call (see the module doc)."""
    found: set[str] = set()

    def walk(item: Any) -> None:
        if isinstance(item, dict):
            for value in item.values():
                walk(value)
        elif isinstance(item, list):
            for value in item:
                walk(value)
        elif isinstance(item, bool) or item is None:
            return
        elif isinstance(item, (int, float)):
            if not math.isfinite(item):  # NaN, Infinity: Python's json reads them; no value carried (int(nan) raises)
                return
            if abs(item) >= 10 or item != int(item):
                found.add(f"{item:g}" if isinstance(item, float) else str(item))
        elif isinstance(item, str):
            text = item.strip()
            if text[:1] in "[{":
                try:
                    return walk(json.loads(text))
                except ValueError:
                    pass
            if len(text) > 40:
                found.update(t for t in _TOKEN.findall(text) if any(c.isdigit() for c in t))
            elif len(text) >= 3 and text.lower() not in _COMMON:
                found.add(text)

    walk(obj)
    return found


def consistency(pairs: list[dict], observations: list[dict], scored: list[bool] | None = None) -> dict:
    """How often a side repeats what the episode produced earlier where the real answer does (module doc).
    `scored`: which steps count (a step the server answered from its cache still gives its values to the later
    ones, but is not counted itself); default every step."""
    episodes: dict[tuple, list[int]] = defaultdict(list)
    for index, pair in enumerate(pairs):
        episodes[(pair["source"], pair["episode"])].append(index)
    carried = repeated = steps = 0
    for indices in episodes.values():
        requests: set[str] = set()
        real_answers: set[str] = set()
        side_answers: set[str] = set()
        for index in sorted(indices, key=lambda i: pairs[i]["step"]):
            pair, side = pairs[index], observations[index]
            real_now, side_now = values(pair["response"]["response"]), values((side or {}).get("response"))
            from_requests = real_now & requests
            from_answers = (real_now & real_answers) - requests
            if (from_requests or from_answers) and (scored is None or scored[index]):
                steps += 1
                carried += len(from_requests) + len(from_answers)
                repeated += len(from_requests & side_now)
                repeated += min(len(from_answers), len((side_now & side_answers) - requests))
            requests |= values(pair["tool_input"])
            real_answers |= real_now
            side_answers |= side_now
    return {
        "score": round(100.0 * repeated / carried, 2) if carried else None,
        "steps": steps,
        "values_carried": carried,
        "values_repeated": repeated,
    }


def consistency_after_recorded_history(
    earlier: list[list[dict]], pairs: list[dict], observations: list[dict | None]
) -> dict:
    """Consistency of answers to calls asked after their episode's *recorded* earlier calls (`earlier[i]`: the real
    pairs before `pairs[i]`), as an offline answer stage asks its session records, whose prompts show the real
    history: there a value the real answer repeats from an earlier request or answer is the same literal the prompt
    showed, so a side repeats it only by writing that literal (no simulated counterpart, unlike `consistency`). Of
    those values, the share each answer repeats; `observations[i]` None (no answer: a nearest example missing)
    repeats none."""
    carried = repeated = steps = 0
    for before, pair, observation in zip(earlier, pairs, observations, strict=True):
        shown: set[str] = set()
        for earlier_pair in before:
            shown |= values(earlier_pair["tool_input"]) | values(earlier_pair["response"]["response"])
        from_history = values(pair["response"]["response"]) & shown
        if from_history:
            steps += 1
            carried += len(from_history)
            repeated += len(from_history & values((observation or {}).get("response")))
    return {
        "score": round(100.0 * repeated / carried, 2) if carried else None,
        "steps": steps,
        "values_carried": carried,
        "values_repeated": repeated,
    }


def step_bucket(step: int) -> str:
    return STEP_BUCKETS[min(int(step), 3)]


def per_step(rows: list[dict]) -> dict:
    by_bucket: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        by_bucket[step_bucket(row["step"])].append(row)
    return {bucket: slice_metrics(by_bucket[bucket], "simulated") for bucket in STEP_BUCKETS if by_bucket[bucket]}


def history_report(
    pairs: list[dict], passes: dict[str, tuple[list[dict], list[dict]]], include_cache_hits: bool = False
) -> dict:
    """`passes`: name ("without", "with") -> (observations, compared rows) of one replay. The calls the server
    answered from its cache in either pass (rows' `from_cache`) are left out of every pass, so that each scores the
    same calls, unless `include_cache_hits`. Usually the same calls in both (a recorded answer is served in and out
    of sessions alike), but a session request carrying a value the simulator gave can hit where the recorded one
    did not."""
    hits = [any(rows[i]["from_cache"] for _, rows in passes.values()) for i in range(len(pairs))]
    kept = [include_cache_hits or not hit for hit in hits]
    report: dict = {
        "episodes": len({(p["source"], p["episode"]) for p in pairs}),
        "calls": len(pairs),
        "cache_hits": sum(hits),
        "scored": sum(kept),
    }
    scored_rows = {}
    for name, (observations, rows) in passes.items():
        scored = scored_rows[name] = [row for row, keep in zip(rows, kept, strict=True) if keep]
        report[name] = {
            "overall": slice_metrics(scored, "simulated"),
            "per_step": per_step(scored),
            "consistency": consistency(pairs, observations, kept),
            # requests sent with the simulator's values in place of the recorded ones (`carried_values`)
            "requests_carrying_simulated_values": sum(
                bool(o.get("carried_values")) for o, keep in zip(observations, kept, strict=True) if keep
            ),
        }
    if {"with", "without"} <= set(scored_rows) and scored_rows["with"]:
        report["with_minus_without"] = paired_difference(
            scored_rows["with"], scored_rows["without"], "simulated", "simulated"
        )
    # The nearest training example of each call (the replay's baseline: the same in both passes) scored on the same
    # calls, with its own consistency: a simulator whose session helps must carry more of the episode's values than
    # an answer copied from another episode does.
    first_rows = next(iter(passes.values()))[1]
    if first_rows and "baseline" in first_rows[0]:
        report["nearest_example"] = {
            "overall": slice_metrics([row for row, keep in zip(first_rows, kept, strict=True) if keep], "baseline"),
            "consistency": consistency(pairs, [row["baseline"] for row in first_rows], kept),
        }
    return report


def _cell(value) -> str:
    return "–" if value is None else f"{value:.1f}"


def render_history_markdown(report: dict) -> str:
    lines = [
        "",
        "## With and without session history",
        "",
        f"{report['episodes']} held-out episodes ({report['calls']} calls) replayed twice: each call alone, "
        f"then one session per episode (`X-Session-Id`); {report['cache_hits']} of the calls were answered from "
        "the cache in either pass"
        + (" (scored too)" if report["cache_hits"] and report["scored"] == report["calls"] else "")
        + ".",
        "",
        "| replay | step | calls | " + " | ".join(HISTORY_METRICS.values()) + " |",
        "|---|---|---|" + "---|" * len(HISTORY_METRICS),
    ]
    for name in ("without", "with"):
        if name not in report:
            continue
        for bucket, metrics in [("all", report[name]["overall"])] + list(report[name]["per_step"].items()):
            lines.append(
                f"| {name} history | {bucket} | {metrics['n']} | "
                + " | ".join(_cell(metrics.get(key)) for key in HISTORY_METRICS)
                + " |"
            )
    if example := report.get("nearest_example"):
        metrics = example["overall"]
        lines.append(
            f"| nearest example | all | {metrics['n']} | "
            + " | ".join(_cell(metrics.get(key)) for key in HISTORY_METRICS)
            + " |"
        )
    if gap := report.get("with_minus_without"):
        lines += [
            "",
            "With history minus without, on the same calls, with a 95% bootstrap interval "
            f"({resampled_text(gap)}; an interval that holds 0 is no evidence either way): "
            f"{difference_text(gap)}.",
        ]
    if carrying := report.get("with", {}).get("requests_carrying_simulated_values"):
        lines += [
            "",
            f"With history, {carrying} of the scored requests sent a value (a token, an id) the simulator's earlier "
            "answer gave where the recorded request sent the real answer's, as an agent reading the simulated "
            "answers would; those answers are scored with the value named back (`--session-values`).",
        ]
    lines += [
        "",
        "| replay | consistency | steps that carry values | values carried | values repeated |",
        "|---|---|---|---|---|",
    ]
    for name, label in (
        ("without", "without history"),
        ("with", "with history"),
        ("nearest_example", "nearest example"),
    ):
        if name in report:
            c = report[name]["consistency"]
            lines.append(
                f"| {label} | {_cell(c['score'])} | {c['steps']} | {c['values_carried']} | {c['values_repeated']} |"
            )
    lines += [
        "",
        "Consistency: of the values (ids, tokens, names) a real answer repeats from earlier in its episode, "
        "the share the simulated answer repeats (the nearest example: the share its training answers repeat; "
        "`mirrorapi.evaluation.fidelity.session_history`).",
    ]
    return "\n".join(lines) + "\n"
