"""Training throughput of a recipe through the real path: `accelerate launch training/sft.py --config RECIPE`.

    python bench/train_gpu.py [--recipe training/configs/simulator_qwen2.5-7b_lora.yaml] [--shape 0.5b]
                              [--steps 30] [--peak-tflops 989] [-- --any_recipe_key VALUE ...]
    python bench/train_gpu.py --tiny     # a tiny shape on the CPU: checks the path; its figures mean nothing

The model is a random init of the recipe's architecture (`--shape`, by default read from the recipe's
model_name_or_path): Qwen2.5 shapes from their published config.json files, built here, nothing downloaded.
Its tokenizer is the tiny model's locally trained 1,024-token BPE with the ChatML template (records come
out about 600 tokens long); the vocabulary of the shape is kept, so embedding and LM head cost what they
cost. Records are real: data/build_simulator_sft.py on ../shared/data/pairs (data/samples without it, and
with --tiny). The recipe runs as written except: model, data and a temporary output_dir, --max_steps, no
eval, no checkpoints, a log line every step; on a host without CUDA (or --tiny): cpu.yaml, use_cpu, float32
(and with --tiny: max_length 1024, no gradient accumulation). Anything after `--` overrides recipe keys.

Prints one JSON object:
- tokens_per_second: median of the recipe's own per-log-line figure (mirrorapi.training.throughput: the
  non-padding input tokens, prompt and completion, of all processes), the first --warmup lines skipped;
- mfu: 6 N tokens_per_second / (peak_tflops x 1e12 x processes), N = all parameters of the base model,
  embeddings included (the 6N count: forward + backward; attention FLOPs and LoRA adapters not counted, and
  a frozen LoRA base does no weight-gradient work, so for LoRA this is the issue's yardstick, not work done);
- gpu_busy: mean nvidia-smi utilization.gpu (share of time a kernel ran) between the warm-up's last log
  line and the last one;
- peak_memory_gib: peak allocated GPU memory of the training process (CPU: peak RSS of the processes).
"""

import argparse
import json
import multiprocessing
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from server_load import load_average

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"

# From the Qwen2.5 config.json files (hidden, intermediate, layers, heads, KV heads, vocabulary, tied embeddings).
QWEN25_SHAPES = {
    "0.5b": (896, 4864, 24, 14, 2, 151936, True),
    "1.5b": (1536, 8960, 28, 12, 2, 151936, True),
    "3b": (2048, 11008, 36, 16, 2, 151936, True),
    "7b": (3584, 18944, 28, 28, 4, 152064, False),
    "14b": (5120, 13824, 48, 40, 8, 152064, False),
    "32b": (5120, 27648, 64, 40, 8, 152064, False),
    "tiny": (64, 256, 2, 4, 2, None, True),  # vocabulary: the tokenizer's
}


def build_model(out_dir: str, shape: str, on_gpu: bool) -> int:
    """Tokenizer + random-init Qwen2 of `shape` in `out_dir`; returns the parameter count. Runs in a child process
    so that this one never holds a CUDA context while the recipe trains."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(REPO))
    from mirrorapi.training.tiny_model import default_corpus, train_tokenizer

    tokenizer = train_tokenizer(default_corpus())
    hidden, intermediate, layers, heads, kv_heads, vocab, tied = QWEN25_SHAPES[shape]
    im_end, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    config = Qwen2Config(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab or len(tokenizer),
        tie_word_embeddings=tied,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        bos_token_id=pad,
        eos_token_id=im_end,
        pad_token_id=pad,
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16 if on_gpu else torch.float32)
    with torch.device("cuda" if on_gpu else "cpu"):
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters())


def build_records(out_dir: Path, tiny: bool) -> None:
    from harness.processes import checkout_env  # main put this checkout on sys.path

    pairs, tools = sorted((SHARED / "pairs").glob("*.jsonl")), SHARED / "toolenv" / "realtools"
    if tiny or not pairs:
        pairs, tools = [REPO / "data/samples/pairs.jsonl"], REPO / "data/samples/tools"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "data/build_simulator_sft.py"),
            "--pairs",
            *map(str, pairs),
            "--tools",
            str(tools),
            "--out",
            str(out_dir),
        ],
        check=True,
        capture_output=True,
        env=checkout_env(),
    )


class GpuSampler:
    """`nvidia-smi -lms` in the background: (time, utilization.gpu %) of every GPU, a few times a second."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "250"],
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            if line.strip().isdigit():
                self.samples.append((time.monotonic(), float(line)))

    def busy_share(self, start: float, end: float) -> float | None:
        window = [u for t, u in self.samples if start <= t <= end]
        return round(statistics.mean(window) / 100, 3) if window else None

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def gpu_name() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--recipe", default=str(REPO / "training/configs/simulator_qwen2.5-7b_lora.yaml"))
    parser.add_argument("--shape", choices=sorted(QWEN25_SHAPES), help="default: from the recipe's base model")
    parser.add_argument("--tiny", action="store_true", help="tiny shape on the CPU (checks the path)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3, help="log lines (steps) left out of the figures")
    parser.add_argument("--dataset", help="an SFT dataset folder to reuse (default: built here)")
    parser.add_argument("--accelerate-config", help="default: single_gpu.yaml, or cpu.yaml without CUDA")
    parser.add_argument("--peak-tflops", type=float, help="per device; default 989 (H100/H200 dense bf16) on a GPU")
    parser.add_argument("--keep", help="keep model, data and output in this folder")
    args, overrides = parser.parse_known_args()
    overrides = [o for o in overrides if o != "--"]
    sys.path.insert(0, str(REPO))
    from harness.processes import checkout_env  # the children run this checkout's library

    gpu = None if args.tiny else gpu_name()
    shape = "tiny" if args.tiny else args.shape or _shape_of(args.recipe)
    if args.steps <= args.warmup:
        parser.error("--steps must exceed --warmup")
    accelerate_config = args.accelerate_config or str(
        REPO / "training/accelerate" / ("single_gpu.yaml" if gpu else "cpu.yaml")
    )
    processes = yaml.safe_load(Path(accelerate_config).read_text()).get("num_processes", 1)
    peak_tflops = args.peak_tflops or (989.0 if gpu else None)

    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-train-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        parameters = pool.apply(build_model, (str(work / "model"), shape, bool(gpu)))
    dataset = args.dataset or str(work / "data")
    if not args.dataset:
        build_records(Path(dataset), args.tiny)
    build_seconds = time.perf_counter() - start

    cpu = [] if gpu else ["--use_cpu", "true", "--bf16", "false", "--dtype", "float32", "--dataset_num_proc", "1"]
    if args.tiny:  # a step of the GPU recipes is ~50k tokens: minutes on a CPU, where this only checks the path
        cpu += ["--max_length", "1024", "--gradient_accumulation_steps", "1"]
    command = [
        str(Path(sys.executable).parent / "accelerate"),
        "launch",
        "-q",
        "--config_file",
        accelerate_config,
        *([] if gpu else ["--num_cpu_threads_per_process", str(torch_threads())]),
        str(REPO / "training/sft.py"),
        "--config",
        args.recipe,
        "--model_name_or_path",
        str(work / "model"),
        "--dataset_path",
        dataset,
        "--output_dir",
        str(work / "out"),
        "--max_steps",
        str(args.steps),
        "--logging_steps",
        "1",
        "--eval_strategy",
        "no",
        "--eval_on_start",
        "false",
        "--save_strategy",
        "no",
        "--merge",
        "false",
        "--disable_tqdm",
        "true",
        "--report_to",
        "none",
        *cpu,
        *overrides,
    ]
    sampler = GpuSampler() if gpu else None
    log_times, tail = [], []
    load_before = load_average()
    started = time.perf_counter()
    # Log lines arrive as they are printed: their times bound gpu_busy.
    env = {**checkout_env(), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    for line in process.stdout:
        tail = (tail + [line])[-40:]
        if line.startswith("{") and "'loss'" in line:
            log_times.append(time.monotonic())
    status = process.wait()
    wall = time.perf_counter() - started
    if sampler:
        sampler.stop()
    if status != 0:
        sys.exit("bench/train_gpu.py: the recipe failed:\n" + "".join(tail))

    info = json.loads((work / "out/mirrorapi_training.json").read_text())
    logs = [e for e in info["log_history"] if "tokens_per_second" in e]
    measured = logs[args.warmup :] or logs
    tokens_per_second = statistics.median(e["tokens_per_second"] for e in measured)
    resolved = info["recipe"]["resolved"]
    peak_gib = (
        max((e.get("peak_memory_gib", 0) for e in logs), default=0)
        if gpu
        else round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2)
    )
    print(
        json.dumps(
            {
                "benchmark": "train_gpu",
                "recipe": str(Path(args.recipe).relative_to(REPO))
                if Path(args.recipe).resolve().is_relative_to(REPO)
                else args.recipe,
                "shape": shape,
                "parameters": parameters,
                "device": gpu or "cpu",
                "processes": processes,
                "accelerate_config": Path(accelerate_config).name,
                "overrides": cpu + overrides,
                **{
                    k: resolved.get(k)
                    for k in (
                        "attn_implementation",
                        "packing",
                        "per_device_train_batch_size",
                        "gradient_accumulation_steps",
                        "gradient_checkpointing",
                        "max_length",
                        "use_peft",
                        "use_liger_kernel",
                    )
                },
                "steps": args.steps,
                "warmup_steps_skipped": args.warmup,
                "train_records": info["metrics"]["train_records"],
                "tokens_per_second": round(tokens_per_second),
                "tokens_per_second_per_step": [round(e["tokens_per_second"]) for e in measured],
                "mfu": round(6 * parameters * tokens_per_second / (peak_tflops * 1e12 * processes), 4)
                if peak_tflops
                else None,
                "flop_count": "6N per token, N = all base-model parameters incl. embeddings",
                "peak_tflops": peak_tflops,
                "gpu_busy": sampler.busy_share(log_times[min(args.warmup, len(log_times) - 1)], log_times[-1])
                if sampler and log_times
                else None,
                "peak_memory_gib": peak_gib,
                "peak_memory_kind": "GPU allocated" if gpu else "CPU RSS",
                "final_loss": logs[-1].get("loss"),
                "build_seconds": round(build_seconds, 1),
                "train_seconds": info["metrics"]["train_seconds"],
                "wall_seconds": round(wall, 1),
                "load_average_before": load_before,
                "load_average_after": load_average(),
                "kept": args.keep,
                "versions": info["versions"],  # what the recipe recorded in the model card: the software that trained
            }
        )
    )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def _shape_of(recipe: str) -> str:
    name = str(yaml.safe_load(Path(recipe).read_text()).get("model_name_or_path", ""))
    match = re.search(r"-(\d+(?:\.\d+)?)b\b", name.lower())
    if not match or f"{match.group(1)}b" not in QWEN25_SHAPES:
        sys.exit(f"bench/train_gpu.py: no Qwen2.5 shape known for {name!r}; pass --shape")
    return f"{match.group(1)}b"


def torch_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)))


if __name__ == "__main__":
    main()
