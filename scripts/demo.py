"""The whole loop on a CPU: data -> train the simulator and the judge -> serve -> /virtual -> score -> report.

    python scripts/demo.py              # what `make demo` runs: SmolLM2-135M-Instruct as simulator and judge
    python scripts/demo.py --full       # the same with the simulator trained for its recipe's steps (longer)
    python scripts/demo.py --tiny       # a tiny model trained from scratch instead: offline, a few minutes
    python scripts/demo.py --quick      # the tiny model, fewer steps and requests (the test suite's version)
    python scripts/demo.py --engine vllm    # SmolLM2 served by vLLM (`make vllm`) instead of llama.cpp

Uses ../shared/data when it is beside the clone (a slice of it), else data/samples. Everything goes
to --work-dir (default runs/demo): what is built is reused by the next run, and every run writes a
report folder whose path is the last line of output. Exit status: 0 done, 1 a step failed, 2 bad
arguments, 130 interrupted; in every case the engines and servers it started are stopped.
"""

import argparse
import logging
import os
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(
    0, str(REPO)
)  # the harnesses (`harness/`: child processes, the recorded benchmark) sit beside the library


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
        allow_abbrev=False,
    )
    parser.add_argument("--quick", action="store_true", help="Fewer training steps and requests (about 1-2 minutes).")
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="A tiny model trained from scratch as the simulator and the judge, instead of "
        "SmolLM2-135M-Instruct (needs no package index; learns the format, not the APIs).",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="The simulator trained for its recipe's steps, longer than the demo's time allows (the "
        "run behind the documented SmolLM2 simulator figures).",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=REPO / "runs" / "demo",
        help="Where to build, keep and report (default runs/demo).",
    )
    parser.add_argument(
        "--shared",
        type=Path,
        default=REPO.parent / "shared" / "data",
        help="The shared data package (default ../shared/data; data/samples when it is absent).",
    )
    parser.add_argument("--samples", action="store_true", help="Use data/samples even when --shared exists.")
    parser.add_argument(
        "--engine",
        choices=("llama.cpp", "vllm"),
        default="llama.cpp",
        help="What serves the SmolLM2 simulator, base model and judge: llama.cpp's server (`make "
        "engine`; default) or vLLM (`make vllm`). The tiny model is served by the CPU engine.",
    )
    return parser


def _interrupt(signum, frame):
    os.kill(os.getpid(), signal.SIGINT)  # `kill PID` stops the demo as Ctrl-C does: everything started is stopped


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    # Flags that cannot go together are refused before anything is made (the work folder's caches once were)
    if args.full and (args.quick or args.tiny):
        make_parser().error("--full and --quick/--tiny: choose one (--quick is the tiny model's short run)")
    if args.engine == "vllm":
        from harness.processes import vllm_available

        if args.quick or args.tiny:
            make_parser().error("--engine vllm serves SmolLM2: not with --quick/--tiny (the tiny model)")
        if (missing := vllm_available()) is not None:
            make_parser().error(f"--engine vllm: {missing}")
    from demo_steps.child_processes import child_environment

    try:
        os.environ.update(child_environment(args.work_dir))  # before any Hugging Face library is imported
    except OSError as exc:
        print(f"demo.py: error: cannot use --work-dir {args.work_dir}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    from demo_steps.run import DemoError, DemoOptions, run_demo

    # Ctrl-C and `kill` stop the demo, even when it was started with SIGINT ignored (a background job).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    progress = logging.getLogger("demo_steps")  # the demo_steps.* loggers
    progress.addHandler(handler)
    progress.setLevel(logging.INFO)
    progress.propagate = False
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    real = not (args.quick or args.tiny)
    shared = None if args.samples or not args.shared.is_dir() else args.shared
    model = "SmolLM2-135M-Instruct" if real else "a tiny model"
    print(
        f"mirrorapi demo{' (quick)' if args.quick else ''}: the whole loop on a CPU with {model}; "
        f"work folder {args.work_dir}",
        flush=True,
    )
    try:
        report = run_demo(DemoOptions(args.work_dir, shared, args.quick, real, args.full, args.engine))
    except DemoError as exc:
        what = "interrupted during" if exc.interrupted else "failed at"
        print(f"demo {what} step {exc.number} ({exc.step})" + ("" if exc.interrupted else f": {exc}"), file=sys.stderr)
        print(f"everything the demo started was stopped; partial report: {exc.report}", file=sys.stderr)
        return 130 if exc.interrupted else 1
    print(os.path.relpath(report) if report.is_relative_to(Path.cwd()) else report)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C while the demo's modules load, before it started anything: nothing to stop
        print("demo interrupted before it started anything", file=sys.stderr)
        sys.exit(130)
