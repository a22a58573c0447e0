"""The score stage of `scripts/train_shipped_models.py` (CPU): the answers against the real ones and the nearest
example."""

from __future__ import annotations

import json
import lzma
from collections import defaultdict
from pathlib import Path

from shipped_steps.common import StageError


def served_observation(text: str) -> tuple[dict, str]:
    """A model's text as a virtual server serves it, and how it was read: the observation it holds, else the server's
    failure observation (the simulator refuses empty text and text that is no observation; the server words the
    refusal). Scored so, an answer the server could not serve counts as the failure the agent would get, not as a
    success holding the raw text."""
    from mirrorapi.engine_client import EngineError
    from mirrorapi.prompts.simulator_formats import truncate_response
    from mirrorapi.prompts.simulator_output import parse_simulator_output
    from mirrorapi.serving.handler import to_failure
    from mirrorapi.serving.simulator import unusable_output

    observation, how = parse_simulator_output(text)
    if observation is not None:
        return {**observation, "response": truncate_response(observation["response"])}, how  # cut as served
    refused = EngineError("garbage", unusable_output(text)) if text else EngineError("empty", "no text")
    return json.loads(to_failure(refused).body), how


def score_generations(generations_path: Path, work: Path, pairs: list[str], tools: list[str]) -> dict:
    """A train or answer stage's answers scored as eval/simulator.py scores served ones
    (mirrorapi.evaluation.fidelity.metrics: ROUGE-L, BLEU-4, valid JSON, error agreement, error precision and
    recall) against the real answers (the pairs as read, whole) and the nearest example (the most similar training
    call of the same API); a held-out call whose arguments equal a training call's is a cache hit on a server and
    is reported apart. One report per prompt format: alone (mirrorapi-v2) and in its session
    (mirrorapi-session-v2); with an answer stage's history twins, also "history": the session calls that have a
    twin, with their history and without it, and the first minus the second (`with_minus_without`, overall and per
    source, each with its 95% bootstrap interval). Answers to `test_ood_shown` (unseen APIs' calls shown an
    example) are reported apart, per prompt format, against the examples such a server holds: the training calls
    and the calls of test_ood's other half of episodes."""
    from datasets import load_from_disk

    from mirrorapi.evaluation.fidelity.metrics import api_id, build_report, compare, paired_difference
    from mirrorapi.evaluation.fidelity.replay import NearestExample, load_pairs
    from mirrorapi.evaluation.fidelity.session_history import consistency_after_recorded_history
    from mirrorapi.prompts.simulator_formats import SESSION_FORMATS
    from mirrorapi.records import canonical_json
    from mirrorapi.tools import ToolRegistry

    by_id = {(p["source"], str(p["episode"]), int(p["step"])): p for p in load_pairs(pairs)}
    episodes: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for pair in by_id.values():
        episodes[(pair["source"], str(pair["episode"]))].append(pair)
    dataset = load_from_disk(str(work / "data" / "simulator"))

    def pairs_of(split: str) -> list[dict]:
        ids = {
            (r["source"], r["episode"], r["step"])
            for r in dataset[split].select_columns(["source", "episode", "step"])
        }
        missing = sorted(ids - by_id.keys())
        if missing:  # the data stage read other pairs than these
            raise StageError(
                f"{len(missing)} of the {len(ids)} {split} calls of {work / 'data' / 'simulator'} are in none of the "
                f"pairs read ({' '.join(pairs)}), e.g. {missing[0]}: score with the --pairs the data stage built from "
                "(without ../shared, name them; --tiny only with data built with --tiny)"
            )
        return [by_id[i] for i in sorted(ids)]

    train_pairs = pairs_of("train")
    with lzma.open(generations_path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    registry = ToolRegistry.load(tools)
    answered_by = f"offline: the greedy answers in {generations_path} (a train or answer stage's)"

    def report_of(chosen: list[dict], pool: list[dict], simulated_rows: list | None = None) -> dict:
        """`chosen` scored against the nearest example of `pool` (what the server's cache holds); a call whose
        arguments equal a pool call's is a cache hit. `simulated_rows` gets the compared rows of the calls that
        are not."""
        cached = {(api_id(p), canonical_json(p["tool_input"])) for p in pool}
        held = [by_id[(r["source"], r["episode"], r["step"])] for r in chosen]
        baseline = NearestExample(pool, held)
        hit = [(api_id(p), canonical_json(p["tool_input"])) in cached for p in held]
        simulated = []
        for r in chosen:
            observation, how = served_observation(r["generated"])
            simulated.append({**observation, "read_as": how})
        report = {}
        for name, keep in (("simulated", False), ("cache_hits", True)):
            subset = [i for i in range(len(chosen)) if hit[i] == keep]
            part = compare([held[i] for i in subset], [simulated[i] for i in subset], baseline, registry)
            if name == "simulated" and simulated_rows is not None:
                simulated_rows.extend(part)
            report[name] = build_report(part, answered_by, True) if part else {"calls": 0}
            report[name].pop("per_api", None)
            report[name]["raw_json"] = sum(simulated[i]["read_as"] == "json" for i in subset)
            report[name]["unservable"] = sum(simulated[i]["read_as"] == "failed" for i in subset)  # scored as failures
        return report

    def reports_of(rows: list[dict], pool: list[dict]) -> dict:
        asked = [r for r in rows if not r.get("history_twin")]
        reports = {
            fmt: report_of([r for r in asked if r["prompt_format"] == fmt], pool)
            for fmt in sorted({r["prompt_format"] for r in asked})
        }
        twins = {(r["source"], r["episode"], r["step"]): r for r in rows if r.get("history_twin")}
        if twins:  # an answer stage's --history-twins: the same session calls with and without their history
            in_session = [
                r
                for r in asked
                if r["prompt_format"] in SESSION_FORMATS and (r["source"], r["episode"], r["step"]) in twins
            ]  # an alone record of the sample may be the same step: its call's first occurrence
            with_rows: list[dict] = []
            without_rows: list[dict] = []
            reports["history"] = {
                "with_history": report_of(in_session, pool, with_rows),
                "without_history": report_of(
                    [twins[(r["source"], r["episode"], r["step"])] for r in in_session], pool, without_rows
                ),
            }
            if with_rows:  # the values the recorded history showed, repeated by each side (issue 32's consistency)
                earlier = [
                    sorted(
                        (p for p in episodes[(r["source"], str(r["episode"]))] if p["step"] < r["step"]),
                        key=lambda p: p["step"],
                    )
                    for r in with_rows
                ]
                held = [by_id[(r["source"], str(r["episode"]), int(r["step"]))] for r in with_rows]
                reports["history"]["consistency"] = {
                    side: consistency_after_recorded_history(earlier, held, [r[column] for r in side_rows])
                    for side, side_rows, column in (
                        ("with_history", with_rows, "simulated"),
                        ("without_history", without_rows, "simulated"),
                        ("nearest_example", with_rows, "baseline"),
                    )
                }
            if with_rows:  # the same calls in the same order (a twin is its call again): a paired comparison
                reports["history"]["with_minus_without"] = {
                    source: paired_difference(
                        [r for r in with_rows if source in ("overall", r["source"])],
                        [r for r in without_rows if source in ("overall", r["source"])],
                        "simulated",
                        "simulated",
                    )
                    for source in ["overall", *sorted({r["source"] for r in with_rows})]
                }
        return reports

    shown = [r for r in rows if r["split"] == "test_ood_shown"]
    reports = reports_of([r for r in rows if r["split"] != "test_ood_shown"], train_pairs)
    if shown:  # the pool: the training calls and the calls of test_ood's other half (the data stage's halves)
        asked_episodes = {(r["source"], r["episode"]) for r in dataset["test_ood_shown"]}
        pool = train_pairs + [
            p for p in pairs_of("test_ood") if (p["source"], str(p["episode"])) not in asked_episodes
        ]
        reports["test_ood_shown"] = reports_of(shown, pool)
    return reports


def score_lines(scores: dict) -> list[str]:
    """The score stage's figures, one line per (prompt format, source): what docs/training.md's tables hold, so that
    a run is read without opening the JSON. Differences are simulator minus nearest example, intervals 95%."""
    from mirrorapi.evaluation.fidelity.metrics import difference_text

    def one(value: float | None) -> str:  # rounded once, here (the JSON keeps the figures whole)
        return "n/a" if value is None else f"{value:.1f}"

    def interval(bounds: list[float] | None) -> str:
        return "n/a" if bounds is None else f"[{bounds[0]:.1f}, {bounds[1]:.1f}]"

    def cells(part: dict) -> str:
        sim, example = part["simulated"], part.get("baseline") or {}
        found = f"n {part['n']}: ROUGE-L {one(sim['rouge_l'])} / {one(example.get('rouge_l'))}, BLEU-4 "
        found += f"{one(sim['bleu4'])} / {one(example.get('bleu4'))}, errors answered {sim['error_precision_n']} "
        found += f"(precision {one(sim['error_precision'])} {interval(sim.get('error_precision_ci95'))}), real "
        found += (
            f"{sim['error_recall_n']} (recall {one(sim['error_recall'])} {interval(sim.get('error_recall_ci95'))})"
        )
        gap = part.get("simulator_against_example")
        return found + (f"; simulator minus example {difference_text(gap)}" if gap else "")

    lines = []
    sections = [(name, part) for name, part in scores.items() if name not in ("history", "test_ood_shown")]
    sections += [(f"test_ood_shown {name}", part) for name, part in scores.get("test_ood_shown", {}).items()]
    for name, section in sections:
        report = section.get("simulated", {})
        if not report.get("calls"):
            continue
        lines.append(f"{name}, all sources, {cells(report['overall'])}")
        lines += [f"{name}, {source}, {cells(part)}" for source, part in report["per_source"].items()]
    for source, gap in scores.get("history", {}).get("with_minus_without", {}).items():
        lines.append(f"history, {source}: with minus without {difference_text(gap)}")
    if consistency := scores.get("history", {}).get("consistency"):
        lines.append(
            "history, consistency (values of the recorded history the real answer repeats, repeated): "
            + ", ".join(
                f"{side.replace('_', ' ')} {one(c['score'])} ({c['values_repeated']} of {c['values_carried']})"
                for side, c in consistency.items()
            )
        )
    return lines
