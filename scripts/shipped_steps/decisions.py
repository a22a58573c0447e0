"""The simulator's failure decision as a probability (`scripts/train_shipped_models.py`'s train and decisions
stages): ROC AUC and what a threshold on it would answer."""

from __future__ import annotations

import json
import time
from pathlib import Path

from shipped_steps.answer import sampled_records
from shipped_steps.common import base_model, load_trained, log, machine
from shipped_steps.results import Results


def failure_decisions(model, tokenizer, records: list[dict], dataset_path: Path) -> dict:
    """The simulator's failure decision on `records` (`mirrorapi.evaluation.fidelity.decisions`, teacher-forced on
    each record's prompt), against each call's real outcome (its record's answer): for each prompt format (history
    twins apart), overall and per source, the ROC AUC of its probability of answering a failure and the failures a
    threshold on it would answer (a greedy answer's threshold is about 0.5). A call whose arguments equal a call
    of the server's cache (the training calls; for test_ood_shown also test_ood's other half) is left out, as the
    score stage leaves it out. Each table also splits its calls by the session's state: whether an earlier call of
    the call's episode really failed (a failed login, then calls with its token), which a session prompt shows
    and its history twin does not. Read from the SFT set alone, so that it runs where the shared data is not."""
    from datasets import load_from_disk

    from mirrorapi.evaluation.fidelity.decisions import decision_table, failure_probabilities
    from mirrorapi.evaluation.fidelity.metrics import is_error

    dataset = load_from_disk(str(dataset_path))
    keys = ["category", "tool", "api", "arguments"]
    train_calls = {tuple(r[key] for key in keys) for r in dataset["train"].select_columns(keys)}
    pools = {"train": train_calls}
    if any(r["split"] == "test_ood_shown" for r in records):  # the data stage's halves of test_ood's episodes
        asked = {(r["source"], r["episode"]) for r in dataset["test_ood_shown"].select_columns(["source", "episode"])}
        pools["test_ood_shown"] = train_calls | {
            tuple(r[key] for key in keys)
            for r in dataset["test_ood"].select_columns(["source", "episode", *keys])
            if (r["source"], r["episode"]) not in asked
        }
    # Every call of an episode is in one held-out split (episodes are never split), with its real answer.
    episodes = {(r["source"], r["episode"]) for r in records}
    failed_steps: dict[tuple, set[int]] = {}
    for name, split in dataset.items():
        if name == "train":
            continue
        for r in split.select_columns(["source", "episode", "step", "completion"]):
            if (r["source"], r["episode"]) in episodes and is_error(json.loads(r["completion"][0]["content"])):
                failed_steps.setdefault((r["source"], r["episode"]), set()).add(int(r["step"]))
    probabilities: list[dict] = []
    for start in range(0, len(records), 50):  # one forward pass a record: a few seconds each on a CPU
        probabilities += failure_probabilities(model, tokenizer, [r["prompt"] for r in records[start : start + 50]])
        log(f"failure decisions: {len(probabilities)} of {len(records)}")
    rows = []
    for record, found in zip(records, probabilities, strict=True):
        pool = pools["test_ood_shown" if record["split"] == "test_ood_shown" else "train"]
        rows.append(
            {key: record[key] for key in ("split", "source", "episode", "step", "api", "prompt_format")}
            | {
                "history_twin": bool(record.get("history_twin")),
                "failed": is_error(json.loads(record["completion"][0]["content"])),
                "cache_hit": tuple(record[key] for key in keys) in pool,
                "after_a_failure": any(
                    step < int(record["step"]) for step in failed_steps.get((record["source"], record["episode"]), ())
                ),
            }
            | {key: round(value, 6) for key, value in found.items()}
        )
    states = ("after a failure", "no failure before")
    groups: dict[str, dict[str, list[dict]]] = {}
    for row in rows:
        if not row["cache_hit"]:
            group = row["prompt_format"] + (" (history twins)" if row["history_twin"] else "")
            for part in ("overall", row["source"], states[0] if row["after_a_failure"] else states[1]):
                groups.setdefault(group, {}).setdefault(part, []).append(row)

    def part_order(part: str) -> tuple:  # overall, the sources, then the session's states
        return (part != "overall", part in states, part)

    tables = {
        group: {
            part: decision_table([r["p_failure"] for r in parts[part]], [r["failed"] for r in parts[part]])
            for part in sorted(parts, key=part_order)
        }
        for group, parts in sorted(groups.items())
    }
    return {"tables": tables, "records": rows}


def decision_lines(tables: dict) -> list[str]:
    lines = []
    for group, parts in tables.items():
        for part, table in parts.items():
            cells = ", ".join(f"{t['threshold']}: {t['answered']} ({t['right']})" for t in table["thresholds"])
            lines.append(
                f"{group}, {part}: {table['calls']} calls, {table['failures']} failures, AUC {table['roc_auc']}; "
                f"failures answered (right) above {cells}"
            )
    return lines


def decision_stage(args, work: Path) -> dict:
    """A simulator adapter's failure decision (`failure_decisions`) on the records the answer stage asks, written
    to OUT/decisions.json with each record's probabilities."""
    started = time.perf_counter()
    records = sampled_records(args, work)
    device = machine()["device"]
    tokenizer, model = load_trained(base_model(work, args.base, args.base_gguf), Path(args.adapter), device)
    found = failure_decisions(model.merge_and_unload(), tokenizer, records, work / "data" / "simulator")
    out = Path(args.out or work / "decisions")
    results = Results(out, args.pack)
    (out / "decisions.json").write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    results.landed()
    results.log_summary()
    for line in decision_lines(found["tables"]):
        log(line)
    return {
        "records": len(records),
        "out": str(out / "decisions.json"),
        "seconds": round(time.perf_counter() - started, 1),
    }
