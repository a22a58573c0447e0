"""The judge's offline scores (`scripts/train_shipped_models.py`'s train and judge stages): its verdict on held-out
labelled answers as the likelier of the two verdict lines, and agreement with the labels."""

from __future__ import annotations

import json
import time
from pathlib import Path

from shipped_steps.common import base_model, load_trained, machine
from shipped_steps.results import Results

VERDICT_LINES = ("Verdict: Solved", "Verdict: Unsolved")


def judge_scores(base: Path, adapter: Path, dataset_path: Path, device: str) -> list[dict]:
    """For every test record: the log-likelihood of each verdict line after its prompt, under the trained judge
    and under the untrained base (the adapter switched off)."""
    import torch
    from datasets import load_from_disk

    tokenizer, model = load_trained(base, adapter, device)
    rows = []
    for record in load_from_disk(str(dataset_path))["test"]:
        prompt = tokenizer.apply_chat_template(record["prompt"], tokenize=False, add_generation_prompt=True)
        scores = {}
        for which in ("trained", "base"):
            for line in VERDICT_LINES:
                full = tokenizer(
                    prompt + line + tokenizer.eos_token, return_tensors="pt", add_special_tokens=False
                ).input_ids.to(device)
                start = len(tokenizer(prompt, add_special_tokens=False).input_ids)
                with torch.inference_mode():
                    if which == "base":
                        with model.disable_adapter():
                            logits = model(full).logits
                    else:
                        logits = model(full).logits
                logprobs = torch.log_softmax(logits[0, start - 1 : -1].float(), dim=-1)
                target = full[0, start:]
                scores[f"{which}:{line.split()[-1]}"] = round(logprobs.gather(1, target[:, None]).sum().item(), 4)
        rows.append(
            {
                "id": record["id"],
                "source": record["source"],
                "label": record["label"],
                "label_kind": record["label_kind"],
                **scores,
                "trained": max(("Solved", "Unsolved"), key=lambda v: scores[f"trained:{v}"]),
                "base": max(("Solved", "Unsolved"), key=lambda v: scores[f"base:{v}"]),
            }
        )
    return rows


def agreement_of(rows: list[dict], column: str | None) -> dict:
    return agreement_core([r[column] if column else "Solved" for r in rows], [r["label"] for r in rows])


def agreement_core(predicted: list[str], labels: list[str]) -> dict:
    """Accuracy (%) and Cohen's kappa, judge agreement's own (None where it is undefined: one label everywhere,
    where a 0 read as a judge at chance)."""
    from mirrorapi.evaluation.judge.agreement import cohen_kappa

    accuracy = sum(p == y for p, y in zip(predicted, labels, strict=True)) / len(labels)
    kappa = cohen_kappa(list(zip(labels, predicted, strict=True)))
    return {
        "n": len(labels),
        "accuracy": round(100 * accuracy, 1),
        "kappa": None if kappa is None else round(kappa, 3),
    }


def score_judge(base: Path, adapter: Path, work: Path, out: Path, device: str) -> dict:
    """The judge adapter's verdicts on the held-out answers of WORK/data/judge (`judge_scores`), written to
    OUT/judge_scores.jsonl; returns its agreement and the untrained base's, per source, beside Solved-to-all."""
    rows = judge_scores(base, adapter, work / "data" / "judge", device)
    out.mkdir(parents=True, exist_ok=True)
    (out / "judge_scores.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return {"trained": agreement_table(rows, "trained"), "base": agreement_table(rows, "base")}


def judge_stage(args, work: Path) -> dict:
    """A judge adapter's verdicts on the held-out answers, scored as the train stage scores them, without training:
    to score an adapter trained elsewhere (on the CPU, or by an earlier call) on the data stage's split."""
    started = time.perf_counter()
    out = Path(args.out or work / "judge-scores")
    results = Results(out, args.pack)
    base = base_model(work, args.base, args.base_gguf)
    agreement = score_judge(base, Path(args.adapter), work, out, machine()["device"])
    (out / "judge-agreement.json").write_text(json.dumps(agreement, indent=2) + "\n", encoding="utf-8")
    results.landed()
    results.log_summary()
    return {"agreement": agreement["trained"], "seconds": round(time.perf_counter() - started, 1)}


def agreement_table(rows: list[dict], column: str) -> dict:
    table = {"all": {"judge": agreement_of(rows, column), "solved_to_all": agreement_of(rows, None)}}
    for source in sorted({r["source"] for r in rows}):
        subset = [r for r in rows if r["source"] == source]
        table[source] = {"judge": agreement_of(subset, column), "solved_to_all": agreement_of(subset, None)}
    return table
