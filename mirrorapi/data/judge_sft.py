"""Judge SFT data: labelled final answers -> conversational prompt/completion records.

Input: the judge schema of `../shared/data/judge` (`source, id, query, final_answer, label,
label_kind`, optionally `reason`; read by `mirrorapi.records.read_labelled`). The judge is shown what FAC and judge
agreement show it: the text of the final answer (`extract_final_answer`: the inner `final_answer` of Finish JSON),
cut as `judge_messages` cuts it; targets come from `judge_completion`. Rules, each counted in `stats.json`:
- an empty final answer (or a give-up) is dropped: FAC scores it Unsolved without asking the judge;
- the same (query, answer) twice is dropped; twice with different labels, every copy is dropped (which label
  trained would depend on the files' order) and counted apart;
- all answers to one query stay on one side of the split (a query's reference answer and its
  synthetic mismatch, or the four trials of a tau-bench task, would otherwise leak); with the `grouped` split
  rule (`mirrorapi.splits`) each query's side is its own seeded draw, and a training record whose answer text a
  held-out record shows is dropped (`answer_in_test`: a mismatch record carries another query's answer, so
  joining queries by answers instead would chain most of AnyToolBench's into one group);
- the training split is balanced (`balance`, seeded): `drop`, the shipped judge's, drops records of the more
  frequent verdict across the split, before a source's repeats, so a source keeps the skew the drop leaves it
  (tau-bench's training answers on grouped seed 4: 27 of 74 Solved); `per-source` repeats the rarer verdict's
  records of each source, after its repeats, until both weigh the same there, so no answer is lost and the judge
  learns no source's share of Solved (which a held-out task need not share); `none` keeps the natural balance.
  The test split keeps its natural balance, reported in the stats.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable

from mirrorapi.data.sources import check_repeated_sources, parse_source_repeats
from mirrorapi.prompts.judge_formats import (
    DEFAULT_JUDGE_FORMAT,
    JUDGE_VERDICTS,
    extract_final_answer,
    judge_completion,
    judge_messages,
    query_group,
)
from mirrorapi.splits import SPLIT_RULES, split_groups

BALANCE_RULES = ("drop", "per-source", "none")
JUDGE_COLUMNS = ("prompt", "completion", "prompt_format", "source", "id", "label", "label_kind")
# Formats whose prompt needs only the query and the final answer (the judge schema has no tool calls).
TRAINABLE_JUDGE_FORMATS = ("fac-v1",)


def build_judge_records(
    records: Iterable[dict],
    prompt_format: str = DEFAULT_JUDGE_FORMAT,
    test_fraction: float = 0.1,
    balance: str = "drop",
    seed: int = 42,
    repeat_sources: Iterable[str] = (),
    split_rule: str = "shuffled",
) -> tuple[dict[str, list[dict]], dict]:
    if prompt_format not in TRAINABLE_JUDGE_FORMATS:
        raise ValueError(
            f"judge format {prompt_format!r} cannot be trained from the judge schema; "
            f"use one of {', '.join(TRAINABLE_JUDGE_FORMATS)}"
        )
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    if balance not in BALANCE_RULES:
        raise ValueError(f"unknown balance rule {balance!r}; known: {', '.join(BALANCE_RULES)}")
    if split_rule not in SPLIT_RULES:
        raise ValueError(f"unknown split rule {split_rule!r}; known: {', '.join(SPLIT_RULES)}")
    repeat_sources = list(repeat_sources)
    repeats = parse_source_repeats(repeat_sources)
    verdicts = JUDGE_VERDICTS[prompt_format]
    read: Counter = Counter()
    dropped: Counter = Counter()
    seen: dict[tuple[str, str], str] = {}
    conflicting: set[tuple[str, str]] = set()
    kept: list[dict] = []
    for record in records:
        read[record["source"]] += 1
        if record["label"] not in verdicts:
            dropped["unknown_label"] += 1
            continue
        status, answer = extract_final_answer(record["final_answer"])
        if status != "answer":
            dropped["empty_answer"] += 1
        elif (key := (query_group(record["query"]), answer)) in seen:
            if seen[key] == record["label"]:
                dropped["duplicate"] += 1
            else:
                dropped["duplicate_conflicting"] += 1 + (key not in conflicting)  # the first copy too
                conflicting.add(key)
        else:
            seen[key] = record["label"]
            kept.append({**record, "answer": answer})
    kept = [r for r in kept if (query_group(r["query"]), r["answer"]) not in conflicting]
    if not kept:
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(dropped.items()))
        raise ValueError(
            f"no labelled answer kept of {sum(read.values()):,} read ({reasons or 'none'}): nothing to train on"
        )

    check_repeated_sources(repeats, set(read))
    indices = split_groups([query_group(r["query"]) for r in kept], test_fraction, seed, split_rule)
    rng = random.Random(seed)
    train = [kept[i] for i in indices["train"]]
    if split_rule == "grouped":  # answer texts compared as queries are (case and spaces aside)
        held_out_answers = {query_group(kept[i]["answer"]) for i in indices["test"]}
        dropped["answer_in_test"] = sum(query_group(r["answer"]) in held_out_answers for r in train)
        train = [r for r in train if query_group(r["answer"]) not in held_out_answers]
    balanced_out = balanced_in = 0
    if balance == "drop":
        by_label = {v: [r for r in train if r["label"] == v] for v in verdicts}
        smallest = min(len(rs) for rs in by_label.values())
        if smallest:
            keep = {id(r) for rs in by_label.values() for r in rng.sample(rs, smallest)}
            balanced_out = len(train) - len(keep)
            train = [r for r in train if id(r) in keep]
    train = [r for r in train for _ in range(repeats.get(r["source"], 1))]
    if balance == "per-source":
        train, balanced_in = _repeat_rarer_verdicts(train, verdicts, rng)
    splits = {"train": train, "test": [kept[i] for i in indices["test"]]}
    rendered = {name: [_render(r, prompt_format) for r in rs] for name, rs in splits.items()}
    stats = {
        "kind": "judge",
        "prompt_format": prompt_format,
        "options": {
            "test_fraction": test_fraction,
            "balance": balance,
            "seed": seed,
            "split_rule": split_rule,
            "repeat_sources": repeat_sources,
        },
        "read": {"total": sum(read.values()), **dict(sorted(read.items()))},
        "dropped": {k: dropped[k] for k in ("unknown_label", "empty_answer", "duplicate", "duplicate_conflicting")}
        | ({"answer_in_test": dropped["answer_in_test"]} if split_rule == "grouped" else {})
        | {"balancing": balanced_out},
        "repeated_to_balance": balanced_in,
        "kept": {"total": len(kept), **Counter(r["label"] for r in kept)},
        "splits": {
            name: {
                "records": len(rs),
                "groups": len({query_group(r["query"]) for r in rs}),
                **Counter(r["label"] for r in rs),
                "by_source": dict(Counter(r["source"] for r in rs)),
            }
            for name, rs in splits.items()
        },
    }
    return rendered, stats


def _repeat_rarer_verdicts(train: list[dict], verdicts, rng: random.Random) -> tuple[list[dict], int]:
    """Within each source, repeat the rarer verdicts' records until every verdict has as many as the most
    frequent one: each record a whole number of times, a seeded draw of them once more for the remainder.
    A verdict a source lacks stays absent (nothing to repeat). Returns the records and how many were added."""
    added: list[dict] = []
    for source in sorted({r["source"] for r in train}):
        by_label = {v: [r for r in train if r["source"] == source and r["label"] == v] for v in verdicts}
        largest = max(len(rs) for rs in by_label.values())
        for rs in by_label.values():
            if rs and len(rs) < largest:
                whole, rest = divmod(largest - len(rs), len(rs))
                added += rs * whole + rng.sample(rs, rest)
    return train + added, len(added)


def _render(record: dict, prompt_format: str) -> dict:
    return {
        "prompt": judge_messages(record["query"], record["answer"], prompt_format),
        "completion": [
            {"role": "assistant", "content": judge_completion(record["label"], record.get("reason") or "")}
        ],
        "prompt_format": prompt_format,
        "source": record["source"],
        "id": record["id"],
        "label": record["label"],
        "label_kind": record.get("label_kind") or "",
    }
