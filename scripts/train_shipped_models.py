"""Train the simulator and the judge mirrorapi ships (LoRA adapters on SmolLM2-135M-Instruct) on every shared real
pair and label, in one run of a lent GPU machine; or on a tiny slice on the CPU, to check the path.

    # here, where ../shared/data is: the SFT sets (the data builders' splits: held-out APIs and episodes stay out)
    .venv/bin/python scripts/train_shipped_models.py --stage data --work runs/shipped
    # on the GPU machine (docs/training.md says how the work folder, the base GGUF and the wheels travel there)
    python scripts/train_shipped_models.py --stage train --work runs/shipped --base-gguf BASE.gguf --out "$OUT"
    # the shipped simulator's answers as a virtual server asks its engine (response_format), then scored (CPU)
    .venv/bin/python scripts/train_shipped_models.py --stage answer --work runs/shipped --engine URL \
        --engine-model NAME --max-new-tokens 1024
    .venv/bin/python scripts/train_shipped_models.py --stage score --work runs/shipped
    # a simulator adapter's failure decision as a probability on the answer stage's records (ROC AUC, thresholds)
    .venv/bin/python scripts/train_shipped_models.py --stage decisions --work runs/shipped --base BASE --adapter DIR
    # a judge adapter trained elsewhere (e.g. on the CPU), scored on the same split as the train stage scores it
    .venv/bin/python scripts/train_shipped_models.py --stage judge --work runs/shipped --base BASE --adapter DIR
    # the whole path on the CPU, on a slice, with the tiny model (what tests/training/test_train_shipped.py runs)
    .venv/bin/python scripts/train_shipped_models.py --tiny --base runs/tiny-base --work runs/shipped-tiny

`--stage all` (the default) runs both stages where it is. The data stage runs on the CPU before a GPU run because
the shared data does not travel to the GPU machine and the build is single-threaded Python: the GPU's minutes go
to what only a GPU does. The train stage:
1. the base model: `--base DIR` (a `mirrorapi models get` folder), or `--base-gguf FILE` converted as `models get`
   converts it (mirrorapi.models.from_gguf);
2. training/sft.py under `accelerate launch`, simulator and judge at once (two processes on one GPU: a 135M model
   leaves most of it idle), recipes `training/configs/{simulator,judge}_smollm2_gpu_lora.yaml`, each stopped by
   its own `max_train_seconds`;
3. offline scores of the trained weights on held-out records, with the records' own prompts: the judge's verdict
   as the likelier of the two verdict lines (and the untrained base's, beside it), the simulator's greedy
   answers to a sample of held-out calls of every source (scored on the CPU afterwards against the real answers
   and the nearest example: `--stage score`), and its failure decision on the same calls as a probability (ROC
   AUC and what a threshold on it would answer: `failure_decisions`);
4. `--out`: at most 8 files, none over 16 MiB and none deeper than 2 folders (what a lent machine hands back):
   `report.json` (throughput, MFU, eval losses, wall times, the GPU), the two adapters as tar files, the
   generations, the failure decisions, the judge's scores, the logs.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from mirrorapi.few_shot import FEW_SHOT_TIES
from mirrorapi.prompts.simulator_formats import HISTORY_RULES

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"

# The data the shipped simulator is trained on (its recipe file says why each choice).
SIMULATOR_DATA_FLAGS = [
    "--prompt-format",
    "mirrorapi-v2",
    "--history",
    "8",
    "--stateless-too",
    "--few-shot",
    "1",
    "--repeat-sources",
    "tau-bench=3",
    "api-bank=2",
    "toolbench-example=4",
]
# The data the shipped judge is trained on: tau-bench's training answers four times, so that AnyToolBench's 810 labels
# do not drown its 152 (the judge's second run, docs/training.md).
JUDGE_DATA_FLAGS = ["--repeat-sources", "tau-bench/airline=4"]
SIMULATOR_RECIPE = "training/configs/simulator_smollm2_gpu_lora.yaml"
JUDGE_RECIPE = "training/configs/judge_smollm2_gpu_lora.yaml"
# bf16 dense peak of the GPUs a run may get (NVIDIA's data sheets, SXM), for MFU.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}
VERDICT_LINES = ("Verdict: Solved", "Verdict: Unsolved")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# ----------------------------------------------------------------------------------------------- data
def build_data(
    work: Path,
    pairs: list[str],
    tools: list[str],
    labelled: list[str],
    repeat_failures: int,
    target_chars: int,
    few_shot_ties: str,
    few_shot_char_budget: int,
    few_shot_response_chars: int,
    history_rule: str,
    without_examples_share: float,
    seed: int,
    judge_test_fraction: float,
) -> dict:
    started = time.perf_counter()
    data = work / "data"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_simulator_sft.py"),
            "--pairs",
            *pairs,
            "--tools",
            *tools,
            *SIMULATOR_DATA_FLAGS,
            "--repeat-failures",
            str(repeat_failures),
            "--target-response-chars",
            str(target_chars),
            "--few-shot-ties",
            few_shot_ties,
            "--few-shot-char-budget",
            str(few_shot_char_budget),
            "--few-shot-response-chars",
            str(few_shot_response_chars),
            "--history-rule",
            history_rule,
            "--without-examples-share",
            str(without_examples_share),
            "--test-ood-shown",
            "--seed",
            str(seed),
            "--out",
            str(data / "simulator"),
        ],
        check=True,
    )
    subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_judge_sft.py"),
            "--labelled",
            *labelled,
            *JUDGE_DATA_FLAGS,
            "--seed",
            str(seed),
            "--test-fraction",
            str(judge_test_fraction),
            "--out",
            str(data / "judge"),
        ],
        check=True,
    )
    return {"seconds": round(time.perf_counter() - started, 1)}


# ----------------------------------------------------------------------------------------------- train
def base_model(work: Path, base: str | None, base_gguf: str | None) -> Path:
    if base:
        return Path(base)
    from mirrorapi.models.from_gguf import hf_folder_from_gguf

    folder = work / "base"
    if not (folder / "config.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        hf_folder_from_gguf(base_gguf, folder)
    return folder


def launch(kind: str, recipe: str, base: Path, work: Path, on_gpu: bool, extra: list[str]) -> subprocess.Popen:
    accelerate = "single_gpu" if on_gpu else "cpu"
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "-q",
        "--config_file",
        str(REPO / f"training/accelerate/{accelerate}.yaml"),
        str(REPO / "training/sft.py"),
        "--config",
        str(REPO / recipe),
        "--model_name_or_path",
        str(base),
        "--dataset_path",
        str(work / "data" / kind),
        "--output_dir",
        str(work / kind),
    ]
    if not on_gpu:  # the CPU check: float32 and the CPU's own settings
        command += ["--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--dataloader_num_workers", "0"]
    (work / "logs").mkdir(parents=True, exist_ok=True)
    log(f"{kind}: $ {' '.join(command + extra)}")
    handle = open(work / "logs" / f"{kind}.log", "w", encoding="utf-8")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        command + extra,
        stdout=handle,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
        },
    )


def training_figures(run_dir: Path, parameters: int, peak_tflops: float | None) -> dict:
    """What the run's own record says: steps, time, losses, tokens/s (the median of its log lines, the first left
    out as warm-up), MFU = 6 N tokens/s over the GPU's peak (N: the base's parameters; LoRA's frozen base does no
    weight-gradient work, so this is the usual yardstick, not the work done)."""
    record = json.loads((run_dir / "mirrorapi_training.json").read_text(encoding="utf-8"))
    speeds = [e["tokens_per_second"] for e in record["log_history"] if "tokens_per_second" in e]
    tokens_per_second = statistics.median(speeds[1:] or speeds) if speeds else None
    peak_memory = max((e.get("peak_memory_gib", 0) for e in record["log_history"]), default=None)
    return {
        "metrics": record["metrics"],
        "tokens_per_second": tokens_per_second,
        "mfu": (
            round(6 * parameters * tokens_per_second / (peak_tflops * 1e12), 4)
            if tokens_per_second and peak_tflops
            else None
        ),
        "peak_memory_gib": peak_memory or None,
        "log_lines": len(speeds),
    }


# ----------------------------------------------------------------------------------------------- offline scores
def load_trained(base: Path, adapter: Path, device: str):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(device)
    return tokenizer, PeftModel.from_pretrained(model, str(adapter)).eval()


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
    n = len(labels)
    accuracy = sum(p == y for p, y in zip(predicted, labels, strict=True)) / n
    chance = sum((predicted.count(v) / n) * (labels.count(v) / n) for v in ("Solved", "Unsolved"))
    kappa = (accuracy - chance) / (1 - chance) if chance < 1 else 0.0
    return {"n": n, "accuracy": round(100 * accuracy, 1), "kappa": round(kappa, 3)}


HELD_OUT_SPLITS = ("test_id", "test_ood")


def held_out_sample(
    dataset_path: Path, per_stratum: int, seed: int = 0, splits: tuple[str, ...] = HELD_OUT_SPLITS
) -> list[dict]:
    """Held-out records to generate for: of each (split, source, prompt format), up to `per_stratum`, taken in an
    order that visits every stratum in turn (so a run stopped by its time limit still has every source)."""
    from datasets import load_from_disk

    dataset = load_from_disk(str(dataset_path))
    strata: dict[tuple, list[dict]] = {}
    for split in splits:
        if split not in dataset:
            continue
        for record in dataset[split]:
            stratum = strata.setdefault((split, record["source"], record["prompt_format"]), [])
            stratum.append({**record, "split": split})
    rng = random.Random(seed)
    for records in strata.values():
        rng.shuffle(records)
    chosen = [records[:per_stratum] for _, records in sorted(strata.items())]
    return [r for group in zip_longest_all(chosen) for r in group]


def zip_longest_all(groups: list[list[dict]]) -> list[list[dict]]:
    rounds = max((len(g) for g in groups), default=0)
    return [[g[i] for g in groups if i < len(g)] for i in range(rounds)]


def generate(
    base: Path, adapter: Path, records: list[dict], device: str, seconds: float, max_new_tokens: int, batch_size: int
) -> list[dict]:
    """Greedy answers of the trained simulator to `records`' prompts, in batches of similar prompt lengths, until
    `seconds` have passed."""
    import torch

    tokenizer, model = load_trained(base, adapter, device)
    model = model.merge_and_unload()
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in records]
    batches = [list(range(i, min(i + batch_size, len(records)))) for i in range(0, len(records), batch_size)]
    out, started = [], time.perf_counter()
    for batch in batches:
        if time.perf_counter() - started > seconds:
            log(f"generation: time limit after {len(out)} of {len(records)} answers")
            break
        encoded = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False).to(
            device
        )
        with torch.inference_mode():
            generated = model.generate(
                **encoded,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        for i, row in zip(batch, generated[:, encoded.input_ids.shape[1] :], strict=True):
            new_tokens = int((row != tokenizer.pad_token_id).sum())
            out.append(
                answer_row(records[i], tokenizer.decode(row, skip_special_tokens=True), new_tokens, max_new_tokens)
            )
    return out


def answer_row(record: dict, text: str, new_tokens: int, max_new_tokens: int) -> dict:
    """One line of generations.jsonl.xz: the record's call, its real answer as trained, the simulator's text."""
    keys = ("split", "source", "episode", "step", "category", "tool", "api", "arguments", "prompt_format", "kind")
    return (
        {key: record[key] for key in keys}
        | {
            "target": record["completion"][0]["content"],
            "generated": text,
            "cut": new_tokens >= max_new_tokens,  # stopped by the limit, not by the model
        }
        | ({"history_twin": True} if record.get("history_twin") else {})
    )


def history_twins(dataset_path: Path, records: list[dict]) -> list[dict]:
    """For each session record of `records`, the same call asked without its history: its split's stateless record
    of that call (the data build's --stateless-too), its prompt as built, but carrying the session record's
    source, episode, step and real answer, so that the score stage scores both against the same answer. A
    session record whose call has no stateless record (a build without --stateless-too) has no twin."""
    from datasets import load_from_disk

    from mirrorapi.prompts.simulator_formats import SESSION_FORMATS

    def call(record: dict, split: str) -> tuple:
        return (split, record["category"], record["tool"], record["api"], record["arguments"])

    dataset = load_from_disk(str(dataset_path))
    stateless: dict[tuple, dict] = {}
    for split in sorted({r["split"] for r in records if r["prompt_format"] in SESSION_FORMATS}):
        for record in dataset[split]:
            if record["prompt_format"] not in SESSION_FORMATS:
                stateless.setdefault(call(record, split), record)
    twins = []
    for record in records:
        twin = stateless.get(call(record, record["split"])) if record["prompt_format"] in SESSION_FORMATS else None
        if twin is not None:
            same_answer = {key: record[key] for key in ("split", "source", "episode", "step", "completion")}
            twins.append({**twin, **same_answer, "history_twin": True})
    return twins


def with_failures_needing_a_related_call(rows: list[dict], records: list[dict]) -> list[dict]:
    """`rows` (answers to `records`, in order, history twins among them) as a server with `session_failure_rule:
    related` gives them: a session answer that is a failure, where none of the earlier calls its prompt shows is
    related to the call (`related_to_call`), replaced by its history twin's answer, the same call asked alone
    (`mirrorapi.serving.handler`). The row says `asked_alone` and keeps its own answer as `session_generated`."""
    from mirrorapi.evaluation.fidelity.metrics import is_error
    from mirrorapi.prompts.simulator_formats import SESSION_FORMATS, related_to_call, shown_history
    from mirrorapi.prompts.simulator_output import parse_simulator_output

    def call(row: dict) -> tuple:
        return row["split"], row["source"], row["episode"], row["step"]

    alone = {call(row): row for row in rows if row.get("history_twin")}
    out = []
    for record, row in zip(records, rows, strict=True):
        twin = alone.get(call(row))
        if row["prompt_format"] in SESSION_FORMATS and not row.get("history_twin") and twin is not None:
            observation, _ = parse_simulator_output(row["generated"])
            arguments = json.loads(record["arguments"])
            shown = shown_history(record["prompt"])
            if is_error(observation) and not any(related_to_call(line, record["api"], arguments) for line in shown):
                answered = {"generated": twin["generated"], "cut": twin["cut"], "session_generated": row["generated"]}
                row = row | answered | {"asked_alone": True}
        out.append(row)
    return out


def served_answers(
    engine: str, model: str, records: list[dict], tools: list[str], max_tokens: int, structured_output: bool
) -> list[dict]:
    """The answers of a simulator an OpenAI-compatible engine serves (llama.cpp, vLLM) to `records`, asked as the
    virtual server asks it: the record's own prompt (the server's, tests/data/test_few_shot_parity.py), temperature
    0, and with `structured_output` (the server's default) its `response_format` for the call's API. What a user's
    server gets; `generate` sends the prompts bare to transformers, and a grammar changes some answers.

    An answer cut at the limit is asked once more as the server asks it (`ask_engine`, the server's default
    `second_try_temperature`); the row's `second_try` says so ("kept", "cut again", "failed").

    A call that a server's default argument policy refuses (`missing_required: reject`: a call without a required
    argument) is answered as that server answers it, with the refusal and no engine call (`"answered_by":
    "server"`): a served simulator is never asked it."""
    import asyncio

    from mirrorapi.engine_client import EngineClient
    from mirrorapi.prompts.simulator_formats import stateless_format
    from mirrorapi.records import observation_json
    from mirrorapi.serving.config import ServerSettings
    from mirrorapi.serving.handler import check_arguments
    from mirrorapi.serving.protocol import ArgumentError
    from mirrorapi.serving.simulator import ask_engine, response_format
    from mirrorapi.tools import ToolRegistry

    registry = ToolRegistry.load(tools)
    policy = [ServerSettings.model_fields[key].default for key in ("missing_required", "unknown_arguments")]
    second_try_temperature = ServerSettings.model_fields["second_try_temperature"].default

    async def ask_each() -> list[dict]:
        client = EngineClient(engine, model, timeout=600, retries=0)
        out, started = [], time.perf_counter()
        try:
            for n, record in enumerate(records, 1):
                doc = registry.get(record["category"], record["tool"], record["api"])
                try:
                    check_arguments(doc, json.loads(record["arguments"]), *policy)
                except ArgumentError as refused:
                    out.append(answer_row(record, observation_json(str(refused), ""), 0, max_tokens))
                    out[-1]["answered_by"] = "server"
                    continue
                # the server's prompt_format is the stateless one; its calls in sessions get the same schema
                schema = response_format(doc, stateless_format(record["prompt_format"])) if structured_output else None
                completion, second_try = await ask_engine(
                    client,
                    record["prompt"],
                    schema,
                    temperature=0.0,
                    max_tokens=max_tokens,
                    seed=None,
                    second_try_temperature=second_try_temperature,
                )
                content = completion.message.get("content")
                text = content if isinstance(content, str) else ""
                out.append(answer_row(record, text, int(completion.usage.get("completion_tokens") or 0), max_tokens))
                if second_try:
                    out[-1]["second_try"] = second_try
                if n % 20 == 0:
                    log(f"served answers: {n} of {len(records)} ({time.perf_counter() - started:.0f} s)")
        finally:
            await client.aclose()
        return out

    return asyncio.run(ask_each())


# ----------------------------------------------------------------------------------------------- score (CPU)
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
    from mirrorapi.prompts.simulator_formats import SESSION_FORMATS
    from mirrorapi.prompts.simulator_output import parse_simulator_output
    from mirrorapi.records import canonical_json
    from mirrorapi.tools import ToolRegistry

    by_id = {(p["source"], str(p["episode"]), int(p["step"])): p for p in load_pairs(pairs)}
    dataset = load_from_disk(str(work / "data" / "simulator"))

    def pairs_of(split: str) -> list[dict]:
        ids = {
            (r["source"], r["episode"], r["step"])
            for r in dataset[split].select_columns(["source", "episode", "step"])
        }
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
            observation, how = parse_simulator_output(r["generated"])
            simulated.append({**(observation or {"error": "", "response": r["generated"]}), "read_as": how})
        report = {}
        for name, keep in (("simulated", False), ("cache_hits", True)):
            subset = [i for i in range(len(chosen)) if hit[i] == keep]
            part = compare([held[i] for i in subset], [simulated[i] for i in subset], baseline, registry)
            if name == "simulated" and simulated_rows is not None:
                simulated_rows.extend(part)
            report[name] = build_report(part, answered_by, True) if part else {"calls": 0}
            report[name].pop("per_api", None)
            report[name]["raw_json"] = sum(simulated[i]["read_as"] == "json" for i in subset)
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

    def cells(part: dict) -> str:
        sim, example = part["simulated"], part.get("baseline") or {}
        found = f"n {part['n']}: ROUGE-L {sim['rouge_l']} / {example.get('rouge_l')}, BLEU-4 {sim['bleu4']} / "
        found += f"{example.get('bleu4')}, errors answered {sim['error_precision_n']} (precision "
        found += f"{sim['error_precision']} {sim.get('error_precision_ci95')}), real {sim['error_recall_n']} "
        found += f"(recall {sim['error_recall']} {sim.get('error_recall_ci95')})"
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
    return lines


# ----------------------------------------------------------------------------------------------- the run
def write_adapters(out: Path, work: Path, kinds: list[str]) -> None:
    """Each adapter as one tar file, its weights in float16: PEFT keeps LoRA weights in float32 under a bf16 base
    (19.6 MB for r 16, over a lent machine's 16 MiB per file); float16 keeps their precision better than bfloat16
    for values this small and halves the size. Written as soon as training ends, before anything that may fail."""
    import torch
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        folder = work / kind
        weights = load_file(str(folder / "adapter_model.safetensors"))
        save_file(
            {k: v.to(torch.float16) for k, v in weights.items()},
            str(folder / "adapter_model.fp16.safetensors"),
            metadata={"format": "pt"},
        )
        with tarfile.open(out / f"{kind}-adapter.tar", "w") as tar:
            tar.add(folder / "adapter_model.fp16.safetensors", arcname=f"{kind}-adapter/adapter_model.safetensors")
            for name in ("adapter_config.json", "mirrorapi_training.json", "README.md"):
                tar.add(folder / name, arcname=f"{kind}-adapter/{name}")


def write_report(out: Path, work: Path, report: dict) -> None:
    """report.json and the logs; checked against what a lent machine hands back (8 files, 16 MiB each)."""
    with tarfile.open(out / "logs.tar.xz", "w:xz") as tar:
        tar.add(work / "logs", arcname="logs")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    files = list(out.iterdir())
    too_big = [p.name for p in files if p.stat().st_size > 16 * 2**20]
    if len(files) > 8 or too_big:
        log(f"WARNING: {len(files)} files in {out}, over 16 MiB: {too_big}: a lent machine hands back 8, under 16 MiB")


def machine() -> dict:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return {
            "device": "cuda",
            "gpu": name,
            "torch": torch.__version__,
            "peak_tflops_bf16": next((v for k, v in PEAK_TFLOPS.items() if k in name), None),
        }
    return {"device": "cpu", "gpu": None, "torch": torch.__version__, "cpus": os.cpu_count(), "peak_tflops_bf16": None}


def recipe_flags(settings: list[str]) -> list[str]:
    """KEY=VALUE entries as training/sft.py flags."""
    flags = []
    for entry in settings:
        key, sep, value = entry.partition("=")
        if not sep or not key:
            raise SystemExit(f"recipe settings are KEY=VALUE, got {entry!r}")
        flags += [f"--{key}", value]
    return flags


def train_stage(args, work: Path) -> dict:
    import transformers

    stage_start = time.perf_counter()
    where = machine()
    on_gpu = where["device"] == "cuda"
    report: dict = {"machine": where, "transformers": transformers.__version__, "argv": sys.argv[1:], "seconds": {}}
    started = time.perf_counter()
    base = base_model(work, args.base, args.base_gguf)
    report["seconds"]["base"] = round(time.perf_counter() - started, 1)
    extra = {"simulator": recipe_flags(args.simulator_set), "judge": recipe_flags(args.judge_set)}
    if args.tiny:  # a few steps on the slice: the path, not the model
        for kind in extra:
            extra[kind] = [
                "--max_steps",
                "3",
                "--max_eval_samples",
                "4",
                "--per_device_train_batch_size",
                "2",
                "--per_device_eval_batch_size",
                "2",
                "--max_length",
                "1024",
                "--dataset_num_proc",
                "1",
                "--logging_steps",
                "1",
                *extra[kind],
            ]
    started = time.perf_counter()
    recipes = {"simulator": SIMULATOR_RECIPE, "judge": JUDGE_RECIPE}
    processes = {kind: launch(kind, recipes[kind], base, work, on_gpu, extra[kind]) for kind in args.kinds}
    failed = [kind for kind, process in processes.items() if process.wait() != 0]
    report["seconds"]["train"] = round(time.perf_counter() - started, 1)
    if failed:
        tail = "\n".join((work / "logs" / f"{failed[0]}.log").read_text(encoding="utf-8").splitlines()[-30:])
        raise SystemExit(f"training failed: {', '.join(failed)}\n{tail}")
    parameters = base_parameters(base)
    report["base_parameters"] = parameters
    for kind in processes:
        report[kind] = training_figures(work / kind, parameters, where["peak_tflops_bf16"])

    out = Path(args.out or work / "out")
    write_adapters(out, work, args.kinds)
    write_report(out, work, report)
    device = where["device"]
    try:  # the adapters are out already: a failure from here on costs only these scores
        if "judge" in args.kinds:
            started = time.perf_counter()
            report["judge"]["offline_agreement"] = score_judge(base, work / "judge", work, out, device)
            report["seconds"]["judge_scores"] = round(time.perf_counter() - started, 1)
        if "simulator" in args.kinds:
            started = time.perf_counter()
            records = held_out_sample(work / "data" / "simulator", args.per_stratum)
            generations = generate(
                base, work / "simulator", records, device, args.generate_seconds, args.max_new_tokens, args.batch_size
            )
            with lzma.open(out / "generations.jsonl.xz", "wt", encoding="utf-8") as fh:
                fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in generations)
            report["simulator"]["generated"] = {
                "answers": len(generations),
                "sampled": len(records),
                "max_new_tokens": args.max_new_tokens,
            }
            report["seconds"]["generate"] = round(time.perf_counter() - started, 1)
            started = time.perf_counter()
            tokenizer, model = load_trained(base, work / "simulator", device)
            asked = records[: len(generations)]  # the records answered within the time limit
            decisions = failure_decisions(model.merge_and_unload(), tokenizer, asked, work / "data" / "simulator")
            (out / "decisions.json").write_text(json.dumps(decisions, indent=1) + "\n", encoding="utf-8")
            report["simulator"]["failure_decisions"] = {
                group: parts["overall"] for group, parts in decisions["tables"].items()
            }
            report["seconds"]["decisions"] = round(time.perf_counter() - started, 1)
    except Exception as exc:  # noqa: BLE001 (reported, and the run's weights kept)
        report["scoring_failed"] = f"{type(exc).__name__}: {exc}"
        log(f"scoring failed: {report['scoring_failed']}")
    report["seconds"]["train_stage"] = round(time.perf_counter() - stage_start, 1)
    write_report(out, work, report)
    return report


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
    out = Path(args.out or work / "out")
    base = base_model(work, args.base, args.base_gguf)
    agreement = score_judge(base, Path(args.adapter), work, out, machine()["device"])
    (out / "judge-agreement.json").write_text(json.dumps(agreement, indent=2) + "\n", encoding="utf-8")
    return {"agreement": agreement["trained"], "seconds": round(time.perf_counter() - started, 1)}


def sampled_records(args, work: Path) -> list[dict]:
    """The held-out records the answer and decisions stages ask: the sample of `--splits`, then `--sources`,
    `--answers` and `--history-twins`."""
    records = held_out_sample(work / "data" / "simulator", args.per_stratum, splits=tuple(args.splits))
    if args.sources:  # after sampling, so that each kept record is the one a run without the filter asks
        records = [r for r in records if r["source"] in args.sources]
    records = records[: args.answers]
    if not records:
        raise SystemExit(
            f"no held-out records in {', '.join(args.splits)}"
            + (f" of {', '.join(args.sources)}" if args.sources else "")
            + ": build the data again (--stage data), or name a source its data holds"
        )
    if args.history_twins:  # after the sample, so that its answers stay those of a run without twins
        records += history_twins(work / "data" / "simulator", records)
    return records


def answer_stage(args, work: Path) -> dict:
    """An adapter's greedy answers to the held-out sample, as the train stage writes them, without training: to
    compare adapters on the same records with the same generation settings."""
    started = time.perf_counter()
    records = sampled_records(args, work)
    if args.engine:
        device = f"engine {args.engine}"
        generations = served_answers(
            args.engine, args.engine_model, records, args.tools, args.max_new_tokens, args.structured_output
        )
        if args.session_failure_rule == "related":
            generations = with_failures_needing_a_related_call(generations, records)
    else:
        device = machine()["device"]
        base = base_model(work, args.base, args.base_gguf)
        generations = generate(
            base, Path(args.adapter), records, device, args.generate_seconds, args.max_new_tokens, args.batch_size
        )
    out = Path(args.out or work / "out")
    out.mkdir(parents=True, exist_ok=True)
    with lzma.open(out / "generations.jsonl.xz", "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in generations)
    return {
        "answers": len(generations),
        "sampled": len(records),
        "history_twins": sum(bool(row.get("history_twin")) for row in generations),
        "asked_alone": sum(bool(row.get("asked_alone")) for row in generations),
        "refused_by_the_server": sum(row.get("answered_by") == "server" for row in generations),
        "cut": sum(row["cut"] for row in generations),
        "second_tries": {
            kept: sum(row.get("second_try") == kept for row in generations) for kept in ("kept", "cut again", "failed")
        },
        "max_new_tokens": args.max_new_tokens,
        "device": device,
        "structured_output": bool(args.engine and args.structured_output),
        "seconds": round(time.perf_counter() - started, 1),
    }


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
    out = Path(args.out or work / "out")
    out.mkdir(parents=True, exist_ok=True)
    (out / "decisions.json").write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")
    for line in decision_lines(found["tables"]):
        log(line)
    return {
        "records": len(records),
        "out": str(out / "decisions.json"),
        "seconds": round(time.perf_counter() - started, 1),
    }


def agreement_table(rows: list[dict], column: str) -> dict:
    table = {"all": {"judge": agreement_of(rows, column), "solved_to_all": agreement_of(rows, None)}}
    for source in sorted({r["source"] for r in rows}):
        subset = [r for r in rows if r["source"] == source]
        table[source] = {"judge": agreement_of(subset, column), "solved_to_all": agreement_of(subset, None)}
    return table


def base_parameters(base: Path) -> int:
    """Parameters of the base (tied weights are stored, and counted, once)."""
    from safetensors import safe_open

    total = 0
    for path in base.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    return total


def refuse_what_cannot_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A usage error (exit 2, one line) for a stage without what it needs."""
    if args.stage == "answer" and args.engine:
        if not args.engine_model:
            parser.error("--engine needs --engine-model NAME (the model name that engine answers to)")
    elif args.stage in ("all", "train", "answer", "decisions", "judge") and not (args.base or args.base_gguf):
        parser.error(f"the {args.stage} stage needs --base DIR or --base-gguf FILE (or, to answer, --engine URL)")
    if args.stage == "answer" and not (args.adapter or args.engine):
        parser.error("the answer stage needs --adapter DIR, or --engine URL")
    if args.session_failure_rule != "any" and not (args.engine and args.history_twins):
        parser.error("--session-failure-rule related needs --engine URL and --history-twins (a call's answer alone)")
    if args.stage == "judge" and not args.adapter:
        parser.error("the judge stage needs --adapter DIR (a judge adapter)")
    if args.stage == "decisions" and not args.adapter:
        parser.error("the decisions stage needs --adapter DIR (a simulator adapter)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument(
        "--stage",
        choices=("all", "data", "train", "answer", "decisions", "score", "judge"),
        default="all",
        help="answer: an adapter's greedy answers to the held-out sample, without training (--adapter); "
        "score: the generations of a train or answer stage (--generations), on the CPU, after it; "
        "judge: a judge adapter's verdicts on the held-out answers, scored as the train stage scores them "
        "(--adapter); decisions: a simulator adapter's probability of answering a failure on the records the "
        "answer stage asks, against the real outcomes: ROC AUC and the failures a threshold would answer "
        "(--adapter).",
    )
    parser.add_argument(
        "--adapter",
        help="The simulator adapter the answer and decisions stages ask, or the judge adapter the judge stage scores.",
    )
    parser.add_argument(
        "--engine",
        help="Or the answer stage asks the simulator an OpenAI-compatible engine serves at this URL (.../v1), as the "
        "virtual server asks it: e.g. scripts/serve_engine_cpu.sh on a `models get` folder.",
    )
    parser.add_argument("--engine-model", help="The model name that engine answers to (with --engine).")
    parser.add_argument(
        "--structured-output",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="With --engine: send the server's response_format (its structured_output, on by default).",
    )
    parser.add_argument(
        "--history-twins",
        action="store_true",
        help="The answer stage also asks each sampled call in a session without its history (the same call's "
        "stateless record), and the score stage reports both on the same calls against the same real answers.",
    )
    parser.add_argument(
        "--session-failure-rule",
        choices=["any", "related"],
        default="any",
        help="With --engine and --history-twins: the server's session_failure_rule (related: a session answer that "
        "is a failure, none of whose shown calls is related to the call, is replaced by its twin's answer, as a "
        "server so set answers it; the row keeps the session's own as `session_generated`).",
    )
    parser.add_argument("--generations", help="generations.jsonl.xz of a train or answer stage (--stage score).")
    parser.add_argument("--work", required=True, help="Work folder: data/, base/, the runs, logs/.")
    parser.add_argument("--out", help="Where the results go (default WORK/out); on a lent machine, $OUT.")
    parser.add_argument("--base", help="Base model folder (mirrorapi models get smollm2-135m-instruct).")
    parser.add_argument("--base-gguf", help="Or the base's GGUF file, converted here as `models get` converts it.")
    parser.add_argument("--pairs", nargs="+", help="Pair files (default: every ../shared/data/pairs file).")
    parser.add_argument("--tools", nargs="+", help="Tool docs (default ../shared/data/toolenv/realtools).")
    parser.add_argument(
        "--labelled", nargs="+", help="Labelled answers (default ../shared/data/judge/labelled.jsonl)."
    )
    parser.add_argument(
        "--kinds",
        nargs="+",
        choices=("simulator", "judge"),
        default=["simulator", "judge"],
        help="Which models the train stage trains (e.g. only the simulator, trained further from the shipped "
        "adapter: --simulator-set init_adapter=DIR).",
    )
    parser.add_argument(
        "--repeat-failures",
        type=int,
        default=1,
        help="The data stage: the simulator's failed training calls N times (the shipped simulator's second "
        "stage: 2; docs/training.md).",
    )
    parser.add_argument(
        "--target-response-chars",
        type=int,
        default=1024,
        help="The data stage: longer training answers shrunk to about this many characters, JSON kept valid (the "
        "first two stages: 1024; the third: 2048, the server's longest answer; docs/training.md).",
    )
    parser.add_argument(
        "--few-shot-ties",
        choices=FEW_SHOT_TIES,
        default="shortest",
        help="The data stage: which of the equally similar examples a prompt shows (the shipped simulator: "
        "shortest; median scored higher for a model trained with it, docs/training.md). The trained record names "
        "it, so a server shows the model the examples it learnt from.",
    )
    parser.add_argument(
        "--few-shot-char-budget",
        type=int,
        default=1024,
        help="The data stage: most characters of examples per prompt (the shipped simulator trained on 1024).",
    )
    parser.add_argument(
        "--few-shot-response-chars",
        type=int,
        default=600,
        help="The data stage: each example's response shrunk to this many characters, 0 whole (the shipped "
        "simulator trained on 600 and is served with 2000 within 3000, the examples whole: its record's "
        "server_settings; held-out records built so are asked as it is served, docs/training.md).",
    )
    parser.add_argument(
        "--history-rule",
        choices=HISTORY_RULES,
        default="recent",
        help="The data stage: which of a session's earlier calls a prompt shows, every one (the shipped simulator's "
        "data) or those related to the call (docs/training.md). The trained record names it, so a server shows the "
        "model the history it learnt from.",
    )
    parser.add_argument(
        "--without-examples-share",
        type=float,
        default=0.0,
        help="The data stage: share of the simulator's training calls shown without their example, as a server "
        "asks a call of an API it has no example of (docs/training.md, the fifth run).",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=42,
        help="The data stage: the seed of both splits (the shipped models': 42; seed 1 holds out 32 of tau-bench's "
        "failures, seed 42 none; docs/training.md).",
    )
    parser.add_argument(
        "--judge-test-fraction",
        type=float,
        default=0.1,
        help="The data stage: share of the judge's queries held out (the shipped judge: 0.1; 0.3 holds out more of "
        "tau-bench's few).",
    )
    parser.add_argument("--tiny", action="store_true", help="A few steps on data/samples: checks the path on a CPU.")
    parser.add_argument(
        "--per-stratum",
        type=int,
        default=120,
        help="Held-out records per (split, source, prompt format) to generate for.",
    )
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=(*HELD_OUT_SPLITS, "test_ood_shown"),
        default=list(HELD_OUT_SPLITS),
        help="The answer stage's held-out splits; test_ood_shown: unseen APIs' calls shown an example of their API "
        "(the data stage's other half of test_ood's episodes), scored apart (docs/training.md).",
    )
    parser.add_argument(
        "--sources",
        nargs="+",
        help="The answer stage asks only the sampled records of these sources (e.g. tau-bench api-bank "
        "toolbench-example: with --per-stratum above their size, every held-out call of the small sources).",
    )
    parser.add_argument("--generate-seconds", type=float, default=90.0)
    parser.add_argument("--answers", type=int, help="At most this many of the sample (its first ones).")
    parser.add_argument(
        "--max-new-tokens", type=int, default=320, help="The server's max_tokens is 1024 (serving/config.py)."
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--simulator-set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="Recipe keys for the simulator's run, e.g. max_train_seconds=200.",
    )
    parser.add_argument(
        "--judge-set", nargs="+", default=[], metavar="KEY=VALUE", help="Recipe keys for the judge's run."
    )
    args = parser.parse_args(argv)
    work = Path(args.work)
    samples = REPO / "data" / "samples"
    shared = SHARED.is_dir() and not args.tiny
    args.pairs = args.pairs or (
        [str(p) for p in sorted((SHARED / "pairs").glob("*.jsonl"))] if shared else [str(samples / "pairs.jsonl")]
    )
    args.tools = args.tools or [str(SHARED / "toolenv" / "realtools" if shared else samples / "tools")]
    args.labelled = args.labelled or [str(SHARED / "judge" / "labelled.jsonl" if shared else samples / "judge.jsonl")]
    refuse_what_cannot_run(parser, args)
    if args.tiny:
        args.per_stratum, args.max_new_tokens, args.batch_size = 2, 16, 4
    if args.stage in ("all", "data"):
        built = build_data(
            work,
            args.pairs,
            args.tools,
            args.labelled,
            args.repeat_failures,
            args.target_response_chars,
            args.few_shot_ties,
            args.few_shot_char_budget,
            args.few_shot_response_chars,
            args.history_rule,
            args.without_examples_share,
            args.seed,
            args.judge_test_fraction,
        )
        log(f"data: {json.dumps(built)}")
    if args.stage in ("all", "train"):
        report = train_stage(args, work)
        log(f"done: {json.dumps({k: report[k] for k in ('seconds', 'machine')})}")
    if args.stage == "answer":
        log(f"done: {json.dumps(answer_stage(args, work))}")
    if args.stage == "judge":
        log(f"done: {json.dumps(judge_stage(args, work))}")
    if args.stage == "decisions":
        log(f"done: {json.dumps(decision_stage(args, work))}")
    if args.stage in ("all", "score"):
        generations = Path(args.generations or Path(args.out or work / "out") / "generations.jsonl.xz")
        scores = score_generations(generations, work, args.pairs, args.tools)
        (generations.parent / "fidelity-offline.json").write_text(
            json.dumps(scores, indent=2) + "\n", encoding="utf-8"
        )
        log(f"scores: {generations.parent / 'fidelity-offline.json'}")
        for line in score_lines(scores):
            log(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
