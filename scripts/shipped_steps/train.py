"""The train stage of `scripts/train_shipped_models.py`: `training/sft.py` under `accelerate launch` for the
simulator and the judge at once, then their offline scores, and what a lent machine hands back (`--out`)."""

from __future__ import annotations

import contextlib
import json
import lzma
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from shipped_steps.answer import generate, sampled_records
from shipped_steps.common import REPO, base_model, load_trained, log, machine
from shipped_steps.decisions import failure_decisions
from shipped_steps.judge import score_judge
from shipped_steps.results import Results

SIMULATOR_RECIPE = "training/configs/simulator_smollm2_gpu_lora.yaml"
JUDGE_RECIPE = "training/configs/judge_smollm2_gpu_lora.yaml"
LOG_REFRESH_SECONDS = 30.0  # how often the train stage refreshes logs.tar.xz and report.json in `out`


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
        process_group=0,  # its own group (not session): stopped whole with the launcher's children (`stop`)
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
    """report.json and the child processes' logs so far (logs.tar.xz), into `out`."""
    (work / "logs").mkdir(parents=True, exist_ok=True)
    with tarfile.open(work / "logs.tar.xz", "w:xz") as tar:
        tar.add(work / "logs", arcname="logs")
    shutil.move(work / "logs.tar.xz", out / "logs.tar.xz")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def stop(process: subprocess.Popen) -> None:
    """A training's whole process group: `accelerate launch` leaves its training process running when it is
    stopped alone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)


class Terminated(SystemExit):
    """SIGTERM (a lent machine's time limit, `timeout`), raised in the stage so that what it has is written out."""


def raise_terminated(signum, frame) -> None:
    raise Terminated(f"terminated by signal {signum}")


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
    """Both trainings, then their scores. Everything reaches `out` as it lands, so that a failed or killed run
    still hands back what it had: report.json (its `status`, and `failed` saying what failed) and logs.tar.xz at
    once and every LOG_REFRESH_SECONDS, each adapter as soon as its training ends, each score when done."""
    import transformers

    where = machine()
    report: dict = {
        "status": "started",
        "machine": where,
        "transformers": transformers.__version__,
        "argv": sys.argv[1:],
        "seconds": {},
    }
    out = Path(args.out or work / "out")
    results = Results(out, args.pack)
    names = {"report.json", "logs.tar.xz", *(f"{kind}-adapter.tar" for kind in args.kinds)}
    names |= {"judge_scores.jsonl"} if "judge" in args.kinds else set()
    names |= {"generations.jsonl.xz", "decisions.json"} if "simulator" in args.kinds else set()

    def publish(status: str | None = None) -> None:
        if status:
            report["status"] = status
        write_report(out, work, report)
        results.landed(planned=len(names - {p.name for p in out.iterdir()}))

    publish()
    processes: dict[str, subprocess.Popen] = {}
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        report = train_and_score(args, work, out, report, publish, processes)
        results.log_summary()
        return report
    except BaseException as exc:  # a kill, an interrupt, a failed training: said, with what there is
        for process in processes.values():
            stop(process)
        report.setdefault("failed", f"{type(exc).__name__}: {exc}")
        publish("failed")
        results.log_summary()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def train_and_score(args, work: Path, out: Path, report: dict, publish, processes: dict) -> dict:
    stage_start = time.perf_counter()
    where = report["machine"]
    on_gpu = where["device"] == "cuda"
    # the held-out records the simulator answers: the answer stage's sample (--splits, --sources, --answers,
    # --history-twins), drawn before anything trains so that a source it lacks is said at once
    records = sampled_records(args, work) if "simulator" in args.kinds else []
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
    parameters = base_parameters(base)
    report["base_parameters"] = parameters
    recipes = {"simulator": SIMULATOR_RECIPE, "judge": JUDGE_RECIPE}
    started = time.perf_counter()
    for kind in args.kinds:
        processes[kind] = launch(kind, recipes[kind], base, work, on_gpu, extra[kind])
    publish("training")
    failed: list[str] = []
    ended: set[str] = set()
    refreshed = time.monotonic()
    while len(ended) < len(processes):
        for kind, process in processes.items():
            if kind in ended or process.poll() is None:
                continue
            ended.add(kind)
            try:
                if process.returncode != 0:
                    raise RuntimeError(f"exit status {process.returncode}")
                write_adapters(out, work, [kind])
                report[kind] = training_figures(work / kind, parameters, where["peak_tflops_bf16"])
                log(f"{kind}: trained, in {out / f'{kind}-adapter.tar'}")
            except Exception as exc:  # noqa: BLE001 (said in the report; the other kind trains on)
                failed.append(kind)
                report[kind] = {"failed": f"{type(exc).__name__}: {exc}"}
                log(f"{kind}: training failed ({exc}), its log: {work / 'logs' / f'{kind}.log'}")
            publish()
        if time.monotonic() - refreshed > LOG_REFRESH_SECONDS:
            publish()
            refreshed = time.monotonic()
        time.sleep(0.5)
    report["seconds"]["train"] = round(time.perf_counter() - started, 1)
    if failed:  # what trained is out already, and is scored below
        logs = {kind: (work / "logs" / f"{kind}.log").read_text(encoding="utf-8") for kind in failed}
        tails = {kind: text.splitlines()[-30:] for kind, text in logs.items()}
        report["failed"] = {"training": failed, "log_tails": tails}

    device = where["device"]
    publish("scoring")
    try:  # the adapters are out already: a failure from here on costs only these scores
        if "judge" in args.kinds and "judge" not in failed:
            started = time.perf_counter()
            report["judge"]["offline_agreement"] = score_judge(base, work / "judge", work, out, device)
            report["seconds"]["judge_scores"] = round(time.perf_counter() - started, 1)
            publish()
        if "simulator" in args.kinds and "simulator" not in failed:
            started = time.perf_counter()
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
            publish()
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
    if failed:
        tail = "\n".join(report["failed"]["log_tails"][failed[0]])
        raise SystemExit(f"training failed: {', '.join(failed)} (what there is: {out})\n{tail}")
    publish("done")
    return report


def base_parameters(base: Path) -> int:
    """Parameters of the base (tied weights are stored, and counted, once)."""
    from safetensors import safe_open

    total = 0
    for path in base.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118
    return total
