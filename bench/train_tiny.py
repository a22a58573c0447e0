"""Training throughput of the tiny CPU recipe (training/configs/tiny_cpu.yaml) on this machine.

    python bench/train_tiny.py [--steps 60] [--runs 3] [--launcher python|accelerate]

Builds the tiny from-scratch model and the simulator SFT data of data/samples once, then runs the
recipe `--runs` times in fresh processes for `--steps` steps (no eval, no checkpoints) and reads
the per-log-line `tokens_per_second` the recipe itself logs (every 10 steps, first line skipped as
warm-up). Prints one JSON object with medians. Tokens are the input tokens without padding (prompt and
completion; mirrorapi/training/throughput.py), the figure bench/train_gpu.py also reports. (The README's
10,668 tokens/s was measured before, counting padding too.)
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from server_load import load_average

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "training/configs/tiny_cpu.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--launcher", choices=("python", "accelerate"), default="accelerate")
    args = parser.parse_args()
    # The figures are the log lines after the first (warm-up): fewer than two lines would leave none.
    logging_steps = yaml.safe_load(RECIPE.read_text())["logging_steps"]
    if args.steps < 2 * logging_steps:
        parser.error(f"--steps must be at least {2 * logging_steps} (the recipe logs every {logging_steps} steps)")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sys.path.insert(0, str(REPO))
    from harness.processes import checkout_env
    from mirrorapi.training.tiny_model import build_tiny_model
    from mirrorapi.versions import package_versions

    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        tmp = Path(tmp)
        build_tiny_model(tmp / "model")
        subprocess.run(
            [
                sys.executable,
                str(REPO / "data/build_simulator_sft.py"),
                "--pairs",
                str(REPO / "data/samples/pairs.jsonl"),
                "--tools",
                str(REPO / "data/samples/tools"),
                "--out",
                str(tmp / "data"),
            ],
            check=True,
            capture_output=True,
            env=checkout_env(),
        )
        launcher = (
            [sys.executable]
            if args.launcher == "python"
            else [
                str(Path(sys.executable).parent / "accelerate"),
                "launch",
                "--config_file",
                str(REPO / "training/accelerate/cpu.yaml"),
            ]
        )
        load_before = load_average()
        runs = []
        for run in range(args.runs):
            out = tmp / f"out{run}"
            start = time.perf_counter()
            recipe = str(RECIPE)
            subprocess.run(
                [
                    *launcher,
                    str(REPO / "training/sft.py"),
                    "--config",
                    recipe,
                    "--model_name_or_path",
                    str(tmp / "model"),
                    "--dataset_path",
                    str(tmp / "data"),
                    "--output_dir",
                    str(out),
                    "--max_steps",
                    str(args.steps),
                    "--eval_strategy",
                    "no",
                    "--eval_on_start",
                    "false",
                    "--save_strategy",
                    "no",
                    "--disable_tqdm",
                    "true",
                ],
                check=True,
                capture_output=True,
                env=checkout_env(),
            )
            wall = time.perf_counter() - start
            info = json.loads((out / "mirrorapi_training.json").read_text())
            logs = [e for e in info["log_history"] if "tokens_per_second" in e]
            runs.append(
                {
                    "tokens_per_second": statistics.median(e["tokens_per_second"] for e in logs[1:]),
                    "train_seconds": info["metrics"]["train_seconds"],
                    "wall_seconds": round(wall, 1),
                    "tokens": logs[-1]["num_tokens"] if logs else None,
                }
            )
    print(
        json.dumps(
            {
                "benchmark": "train_tiny",
                "recipe": "training/configs/tiny_cpu.yaml",
                "launcher": args.launcher,
                "steps": args.steps,
                "load_average_before": load_before,
                "load_average_after": load_average(),
                "runs": runs,
                "median_tokens_per_second": round(statistics.median(r["tokens_per_second"] for r in runs)),
                "median_seconds_per_step": round(statistics.median(r["train_seconds"] for r in runs) / args.steps, 3),
                "median_wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
                "cpu_threads": __import__("torch").get_num_threads(),
                "versions": package_versions(),
            }
        )
    )


if __name__ == "__main__":
    main()
