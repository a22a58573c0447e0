"""`make demo`: the whole loop on a CPU, in six steps, on real pretrained weights (`--tiny`, `--quick`: a tiny model).

1. data: simulator and judge SFT sets from real pairs (a slice of `../shared/data`, else `data/samples`);
2. train: a tiny model built from scratch, then `accelerate launch training/sft.py` for the simulator
   (`tiny_cpu.yaml`) and the judge (`tiny_judge_cpu.yaml`); by default SmolLM2-135M-Instruct
   (`mirrorapi models get`) for the simulator (`simulator_smollm2_cpu.yaml`) and the judge
   (`judge_smollm2_cpu.yaml`), the tiny simulator beside them as a reference row of the report; and, where this
   package ships them, the project's own simulator and judge (`mirrorapi models get`: LoRA adapters trained on all
   the shared data), which then are the main rows, the fine-tunes of this run kept beside them as the pipeline's
   proof (`mirrorapi/models/adapters/`; without them the fine-tunes are the main rows, as before);
3. serve: the CPU engine (`cpu_engine_serve`: llama.cpp's server when `make engine` installed it, else
   `transformers serve`; with `--engine vllm`, vLLM for the SmolLM2 models: `serve_engine`) on the simulator,
   and the virtual server with a cache seeded from a StableToolBench cache folder of the training calls' real
   responses;
4. requests: `/virtual` hits, simulated misses written back, and agents' mistakes (`calls`);
5. score: `eval/simulator.py` on held-out calls (with a shipped simulator that names its held-out episodes: calls
   of those episodes that are not in this run's training split either) against the nearest-example baseline (through a
   second virtual server whose cache starts empty: the step-3 server has cached the calls step 4
   simulated, and would answer those from memory); with real weights also the untrained base model
   shown real examples of the same API (`few_shot`, its server's cache seeded with the training calls
   only), the tiny model and, beside a shipped simulator, this run's fine-tune; then `eval/fac.py` on
   StableToolBench's example answers and `eval/judge_agreement.py` on the judge's held-out labelled answers, with the
   main judge (beside a shipped judge, this run's fine-tuned judge on the labelled answers too);
6. report: everything started is stopped, and a report folder is written.

Whatever happens, everything the demo started is stopped: `run_demo` raises `DemoError`, naming the
step, when a step fails or the user interrupts it. What steps 1-2 build is reused by later runs
(`build`); every run writes a new report folder `<work>/<time>/`, which links what the README's
later sections use (`simulator`, `judge`, `tools`, `tool_response_cache`, `train.jsonl`,
`judge_test.jsonl`, beside its own `heldout.jsonl` and `cache.sqlite`); `<work>/latest` points at the
last run that completed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from demo_steps.build import (
    REPO,
    build_base_model,
    build_data,
    choose_data,
    code_version,
    complete,
    digest,
    fresh,
    mark_complete,
    select_heldout,
)
from demo_steps.calls import plan_calls, render_call, send_calls
from demo_steps.child_processes import StepFailed, brief, run_command, sigint_ignored, virtual_server
from demo_steps.report import (
    agent_baselines,
    constant_answer_metrics,
    counts,
    fidelity_summary,
    history_summary,
    judge_summary,
    parse_counts,
    write_report,
)
from harness.processes import cpu_engine_serve, free_port, vllm_serve
from harness.recorded_benchmark import recorded_benchmark
from mirrorapi.data.simulator_sft import SimulatorDataOptions
from mirrorapi.evaluation.judge.scoring import JudgeSettings
from mirrorapi.models.catalogue import SHIPPED_MODELS, ModelGetError, read_training_record, serving_settings
from mirrorapi.models.get import get_base_model
from mirrorapi.models.shipped import get_shipped_model
from mirrorapi.prompts.simulator_formats import session_format
from mirrorapi.records import read_pairs_jsonl
from mirrorapi.tools import ToolRegistry

logger = logging.getLogger(__name__)

STEPS = ("data", "train", "serve", "requests", "score", "report")
TITLES = {
    "data": "build the simulator and judge SFT sets from real pairs",
    "train": "get the base model, train the simulator and the judge on the CPU",
    "serve": "start the CPU engine on the simulator, and the virtual server with a seeded cache",
    "requests": "send StableToolBench-style /virtual requests",
    "score": "score the simulator on held-out calls, and final answers with the trained judge",
    "report": "stop everything started, write the report",
}
STB_EXAMPLE = REPO / "data" / "samples" / "stabletoolbench"  # StableToolBench's example answers and their ids
ACCELERATE_CONFIG = "training/accelerate/cpu.yaml"
LATEST = "latest"  # <work>/latest: the last run that completed
QUIET_TRAINING = {
    "eval_strategy": "no",
    "eval_on_start": "false",
    "save_strategy": "no",
    "logging_steps": 10,
    "disable_tqdm": "true",
}


BASE_MODEL = "smollm2-135m-instruct"  # `mirrorapi models get` (mirrorapi/models/catalogue.py)
RECIPES = {
    "tiny": {"simulator": "training/configs/tiny_cpu.yaml", "judge": "training/configs/tiny_judge_cpu.yaml"},
    "real": {
        "simulator": "training/configs/simulator_smollm2_cpu.yaml",
        "judge": "training/configs/judge_smollm2_cpu.yaml",
    },
}
RECIPE_STEPS = yaml.safe_load((REPO / RECIPES["real"]["simulator"]).read_text(encoding="utf-8"))["max_steps"]
SHIPPED = {model.kind: model.name for model in SHIPPED_MODELS.values()}  # the project's own simulator and judge
# Server settings the demo owns, whatever a shipped model's record says (where to listen, what to serve from).
DEMO_OWNED_SETTINGS = {
    "tools_folder",
    "cache_folder",
    "cache_path",
    "cache_url",
    "api_base",
    "model",
    "port",
    "host",
    "log_file",
    "mode",
    "workers",
}


@dataclass
class Sizes:
    """How much each step does (a full run, or `--quick` for the test suite)."""

    simulator: dict  # recipe overrides
    judge: dict
    real: bool = False  # SmolLM2 for the simulator and the judge; else the tiny model
    tiny_simulator: dict | None = None  # with real weights: the tiny simulator's overrides, for the report
    base_max_tokens: int = 256  # the untrained base's answers (it rambles to the limit): bounds the row's time
    trained_max_tokens: int = 512  # the answers of the simulators trained here
    # Real examples of the same API in the trained simulators' prompts (data and server alike) and their budget.
    simulator_few_shot: int = 0
    simulator_few_shot_chars: int = 2048
    simulator_few_shot_response_chars: int = 0  # each example's response shrunk to this (0: whole)
    simulator_few_shot_ties: str = "shortest"  # which of equally similar examples is shown (few_shot.FEW_SHOT_TIES)
    target_response_chars: int = 0  # training targets of long real responses shrunk to this (0: whole)
    # The held-out episodes replayed a second time, one session each, the trained simulator shown this many earlier
    # calls within this many characters (0: no session pass). 1,024 characters (~300 tokens) keep that pass's
    # prompts near the stateless ones' length, so it costs about what the stateless pass costs.
    session_history: int = 4
    session_chars: int = 1024
    hits: int = 3  # one per source
    misses: int = 2
    heldout_calls: int = 40
    agreement_limit: int | None = None  # labelled answers judged per source
    agent_queries: int = 2  # example queries per group in the recorded agent run
    # Beside a shipped simulator, this run's fine-tune is replayed call by call only (its session pass is the
    # shipped model's): the scoring passes the shipped model adds must fit the demo's 20 minutes.
    trained_sessions: bool = False


# The tiny simulator learns its answer format from a few dozen short records (many epochs): a tiny model
# that sees hundreds of records once answers nothing parseable.
TINY_SIMULATOR = {"max_train_samples": 64, "max_length": 768, "max_steps": 300, **QUIET_TRAINING}
FULL = Sizes(TINY_SIMULATOR, {"max_eval_samples": 32, **QUIET_TRAINING})
# The default run: SmolLM2-135M-Instruct for the simulator and the judge, the tiny simulator beside it.
# Retrieval-augmented simulation: each prompt shows the nearest real call of the same API (the server's own
# few-shot choice from its cache of the training calls; its response shrunk to 600 characters, JSON kept valid),
# and long real answers are trained shrunk to 1,024 characters instead of dropped, so the model learns to copy
# and adapt a real answer (measured in docs/training.md: 150 steps beat the nearest-example baseline).
# What bounds the demo's 20 minutes on 2 cores (docs/demo.md): llama.cpp answers one call at a time, ~7 s a
# call for the trained simulator (it writes whole JSON answers), and the report replays the held-out calls four
# times (shipped, shipped in sessions, this run's fine-tune, untrained base); so `make demo` scores 24 held-out
# calls (whole episodes of every source), trains the simulator 80 steps of one packed row each (the pipeline's
# proof beside the shipped model: two rows a step took 816 s of a 28-minute demo), leaves the tiny reference to
# `--full`, and caps the untrained base's rambling answers at 128 tokens. `--full` is the longer run. Tried for
# ToolBench's long docs (most of its records pass 1,024 tokens): max_length 1,536 and 60 steps (the same time)
# scored lower (docs/demo.md).
DEMO_SIMULATOR_STEPS = 80
RETRIEVAL = {
    "simulator_few_shot": 1,
    "simulator_few_shot_chars": 1024,
    "simulator_few_shot_response_chars": 600,
    # Ties to the example of median size: this fine-tune, trained and served with them, scored BLEU-4 59.1 against
    # 46.2 with the shortest (docs/training.md). The shipped simulator's record names its own (median, served).
    "simulator_few_shot_ties": "median",
    "target_response_chars": 1024,
}
REAL = Sizes(
    {"max_eval_samples": 8, "max_steps": DEMO_SIMULATOR_STEPS, "per_device_train_batch_size": 1, **QUIET_TRAINING},
    {"max_eval_samples": 16, **QUIET_TRAINING},
    real=True,
    base_max_tokens=128,
    heldout_calls=24,
    **RETRIEVAL,
)
# --full: the recipe's own steps, 40 held-out calls, longer than the demo's 20 minutes allow.
REAL_LONG = Sizes(
    {"max_eval_samples": 8, **QUIET_TRAINING}, REAL.judge, real=True, tiny_simulator=TINY_SIMULATOR, **RETRIEVAL
)
# --quick (the test suite's run): shorter records and fewer steps; the format is still learnt well
# enough that the held-out misses come back as observations.
QUICK = Sizes(
    {
        "max_train_samples": 16,
        "max_length": 512,
        "max_steps": 40,
        "warmup_steps": 5,
        "max_eval_samples": 4,
        **QUIET_TRAINING,
    },
    {"max_steps": 8, "warmup_steps": 2, "max_length": 768, "max_eval_samples": 4, **QUIET_TRAINING},
    heldout_calls=6,
    agreement_limit=3,
    agent_queries=1,
    # 40 steps teach the tiny model the answer's opening, not where it ends: most of its answers run to the limit, each
    # tried twice (the server's second try), so the limit is what the run's simulated calls take (512: 4 s a call).
    trained_max_tokens=128,
)


@dataclass
class DemoOptions:
    work_dir: Path
    shared: Path | None  # ../shared/data, or None to use data/samples
    quick: bool = False
    real: bool = False  # SmolLM2 instead of the tiny model (not with quick)
    full: bool = False  # real, with the simulator trained for the recipe's RECIPE_STEPS
    # What serves the SmolLM2 models (scripts/demo.py --engine); the tiny one: the CPU engine.
    engine: str = "llama.cpp"


class DemoError(Exception):
    def __init__(self, number: int, step: str, message: str, interrupted: bool = False, report: Path | None = None):
        super().__init__(message)
        self.number, self.step, self.interrupted, self.report = number, step, interrupted, report


def shown(path: Path | str) -> str:
    """A path as the user would type it: relative to the repository when inside it."""
    path = Path(os.path.abspath(path))  # not resolve(): the venv's python is a symlink that must stay one
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def say(text: str = "") -> None:
    for line in text.splitlines() or [""]:
        logger.info("      " + line)


@dataclass
class Demo:
    options: DemoOptions
    sizes: Sizes = field(init=False)
    report: dict = field(default_factory=dict)

    def __post_init__(self):
        self.sizes = (
            QUICK if self.options.quick else REAL_LONG if self.options.full else REAL if self.options.real else FULL
        )
        # Real weights: responses as JSON values (mirrorapi-v2): SmolLM2 writes escaped JSON inside a string badly,
        # and the engine's grammar can then enforce the inner JSON too. The tiny demo keeps mirrorapi-v1. Both are
        # trained on calls without history: trained with it (`--history 4`, 1,024 characters), SmolLM2 kept 13
        # of the 78 tau-bench training calls under max_length and did worse in sessions (docs/demo.md).
        self.prompt_format = "mirrorapi-v2" if self.sizes.real else "mirrorapi-v1"
        self.shipped: dict[str, Path] = {}  # kind -> the shipped model's folder (real weights, when shipped)
        self.tiny_simulator: Path | None = None  # the tiny reference beside real weights (`--full` only)
        work = self.options.work_dir.resolve()
        self.build, self.run_dir = work / "build", work / time.strftime("%Y%m%d-%H%M%S")
        if self.run_dir.exists():  # two runs within a second
            self.run_dir = self.run_dir.with_name(self.run_dir.name + f"-{os.getpid()}")
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True)
        self.stack = contextlib.ExitStack()  # everything started, stopped in reverse order
        self.report.update(
            status="running",
            quick=self.options.quick,
            real=self.options.real,
            full=self.options.full,
            run_dir=str(self.run_dir),
            steps=[],
            session_format=session_format(self.prompt_format),
        )

    # ---------------------------------------------------------------------------------- running
    def run(self) -> Path:
        start = time.perf_counter()
        number, name = 0, STEPS[0]
        try:
            try:
                for number, name in enumerate(STEPS, 1):
                    logger.info(f"[{number}/{len(STEPS)}] {name}: {TITLES[name]}")
                    began = time.perf_counter()
                    getattr(self, "step_" + name)()
                    seconds = round(time.perf_counter() - began, 1)
                    self.report["steps"].append({"number": number, "name": name, "seconds": seconds})
                    if name != "report":
                        say(f"done in {seconds:.1f} s")
            finally:
                with sigint_ignored():
                    self.stack.close()
        except BaseException as exc:  # noqa: BLE001 (Ctrl-C included: the report says where it stopped)
            interrupted = isinstance(exc, KeyboardInterrupt)
            message = "interrupted" if interrupted else brief(str(exc) or type(exc).__name__)
            if not interrupted and not type(exc).__module__.startswith("mirrorapi"):
                (self.logs / "traceback.txt").write_text(traceback.format_exc(), encoding="utf-8")
            self.report.update(
                status="interrupted" if interrupted else "failed",
                failed_step={"number": number, "name": name, "error": message},
                total_seconds=round(time.perf_counter() - start, 1),
            )
            with sigint_ignored():  # the partial report is written whole, a second Ctrl-C or not
                write_report(self.run_dir, self.report)
            raise DemoError(number, name, message, interrupted, self.run_dir) from None
        self.report.update(status="ok", total_seconds=round(time.perf_counter() - start, 1))
        with sigint_ignored():  # a second's work once cut by a Ctrl-C: a traceback, and a run without its report
            write_report(self.run_dir, self.report)
            latest = point_latest(self.run_dir)
        say(
            f"report: {shown(self.run_dir / 'report.md')} (with report.json and fidelity.png); "
            f"total {self.report['total_seconds']:.0f} s"
        )
        say(
            f"{shown(latest)} -> {self.run_dir.name}: the simulator, the judge, the tools, the caches and the "
            "held-out calls of this run, for the README's next sections"
        )
        return self.run_dir

    def link(self, name: str, target: Path) -> None:
        """`<run>/<name>` -> target (relative, so that a moved work folder keeps its links)."""
        (self.run_dir / name).symlink_to(os.path.relpath(target, self.run_dir))

    def train(self, kind: str, base: Path, recipe: str, dataset: Path, overrides: dict) -> tuple[Path, dict]:
        inputs = {
            "base": base.name,
            "data": dataset.parent.name,
            "recipe": digest(REPO / recipe),
            "accelerate": digest(REPO / ACCELERATE_CONFIG),
            "overrides": overrides,
            "code": self.code,
        }
        folder = self.build / f"{kind}-{digest(inputs)}"
        reused = complete(folder)
        if not reused:
            command = [
                shown(Path(sys.executable).parent / "accelerate"),
                "launch",
                "--config_file",
                ACCELERATE_CONFIG,
                "training/sft.py",
                "--config",
                recipe,
                "--model_name_or_path",
                shown(base),
                "--dataset_path",
                shown(dataset),
                "--output_dir",
                shown(fresh(folder)),
                *[str(x) for item in overrides.items() for x in ("--" + item[0], item[1])],
            ]
            say(f"{kind}: $ " + shlex.join(command))
            recipe_steps = yaml.safe_load((REPO / recipe).read_text(encoding="utf-8")).get("max_steps", 0)
            progress = self._training_progress(
                kind, overrides.get("max_steps", recipe_steps), overrides.get("logging_steps", 10)
            )
            run_command(command, self.logs / f"train-{kind}.log", progress)
            mark_complete(folder, inputs)
        else:
            say(f"{kind}: reused {shown(folder)} (built before from the same data, recipe and code)")
        metrics = json.loads((folder / "mirrorapi_training.json").read_text(encoding="utf-8"))["metrics"]
        losses = ", ".join(
            f"{k.removeprefix('eval_').removesuffix('_loss')} {v:.2f}"
            for k, v in metrics.items()
            if k.startswith("eval_")
        )
        say(
            f"{kind}: {metrics['steps']} steps on {metrics['train_records']} records in {metrics['train_seconds']} s; "
            f"train loss {metrics['train_loss']:.2f}" + (f"; eval loss {losses}" if losses else "")
        )
        self.report.setdefault("training", {})[kind] = {
            "model": str(folder),
            "reused": reused,
            "metrics": metrics,
            "recipe": recipe,
            "overrides": overrides,
        }
        return folder, metrics

    def _training_progress(self, kind: str, total: int, every: int):
        began = time.time()
        state = {"logged": 0, "shown": began}

        def on_line(line: str) -> None:
            if "records fit in" in line:
                say(f"{kind}: " + line.split(": ", 2)[-1])
            elif line.startswith("{'loss'"):
                state["logged"] += 1
                step, now = state["logged"] * every, time.time()
                if now - state["shown"] >= 10 or step >= total:
                    state["shown"] = now
                    loss = line.split("'loss': '", 1)[1].split("'", 1)[0]
                    say(f"{kind}: step {step}/{total}, loss {loss} ({now - began:.0f} s)")

        return on_line

    @property
    def trained_settings(self) -> dict:
        """The server settings the simulators trained here are served with: their data's prompt format and
        examples (few-shot count, char budget, response chars). Calls in a session see `Sizes.session_history`
        earlier calls (the server's own default without a session pass)."""
        settings = {
            "prompt_format": self.prompt_format,
            "few_shot": self.sizes.simulator_few_shot,
            "few_shot_char_budget": self.sizes.simulator_few_shot_chars,
            "few_shot_response_chars": self.sizes.simulator_few_shot_response_chars,
            "few_shot_ties": self.sizes.simulator_few_shot_ties,
            "max_tokens": self.sizes.trained_max_tokens,
        }
        if self.sizes.session_history:
            settings.update(session_history=self.sizes.session_history, session_char_budget=self.sizes.session_chars)
        return settings

    @property
    def main_settings(self) -> dict:
        """The server settings of the main simulator: a shipped one's record's (`serving_settings`: its
        `server_settings`, else those of the data it was trained on), else the trained ones'."""
        if "simulator" not in self.shipped:
            return self.trained_settings
        record = read_training_record(self.shipped["simulator"]) or {}
        settings = {"max_tokens": 512, "prompt_format": record["prompt_format"]}
        if self.sizes.session_history:
            settings.update(session_history=self.sizes.session_history, session_char_budget=self.sizes.session_chars)
        return {**settings, **{k: v for k, v in serving_settings(record).items() if k not in DEMO_OWNED_SETTINGS}}

    def server_config(self, name: str, engine, cache_path: Path, cache_folder: Path | None, settings: dict) -> Path:
        """`<run>/<name>.yml` for `serving/main_mirrorapi.py` with the model's `settings`; its request lines go to
        `logs/<name>-requests.jsonl`."""
        config = {
            "tools_folder": [str(self.data.source.tools)],
            "cache_folder": str(cache_folder) if cache_folder else None,
            "cache_path": str(cache_path),
            "api_base": engine.base_url,
            "model": engine.model,
            "port": free_port(),
            "log_file": str(self.logs / f"{Path(name).stem}-requests.jsonl"),
            "engine_timeout": 120,
            "engine_max_in_flight": engine.concurrency,
            **settings,
        }
        path = self.run_dir / name
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        return path

    def serve_engine(self, folder: Path, log_name: str):
        """The engine for `folder`, stopped when the block ends: vLLM with `--engine vllm` for the SmolLM2 models,
        else (and for the tiny model, which answers in seconds on any engine) the CPU engine."""
        log = self.logs / log_name
        if self.options.engine == "vllm" and self.sizes.real and folder != self.tiny_simulator:
            # The demo runs one engine at a time on a machine it has to itself: the worker on every core. float32:
            # its rows must not depend on the engine (bfloat16 changes a few greedy answers; docs/demo.md).
            return vllm_serve(folder, log_path=log, timeout=900, dtype="float32", all_cores=True)
        return cpu_engine_serve(folder, log_path=log, timeout=180)

    # ------------------------------------------------------------------------------------ steps
    def step_data(self) -> None:
        source = choose_data(self.options.shared)
        say(f"from {source.description}")
        self.code = code_version()
        self.data = build_data(
            self.build,
            source,
            self.code,
            SimulatorDataOptions(
                prompt_format=self.prompt_format,
                few_shot=self.sizes.simulator_few_shot,
                few_shot_char_budget=self.sizes.simulator_few_shot_chars,
                few_shot_response_chars=self.sizes.simulator_few_shot_response_chars,
                few_shot_ties=self.sizes.simulator_few_shot_ties,
                target_response_chars=self.sizes.target_response_chars,
            ),
        )
        s = self.data.summary
        say(("reused " if self.data.reused else "built ") + shown(self.data.folder))
        say(
            f"{s['pairs']} real pairs ("
            + ", ".join(f"{n} {k}" for k, n in s["by_source"].items() if k != "total")
            + f"); simulator SFT records: {counts(s['simulator_splits'])}; "
            f"judge SFT records: {counts(s['judge_splits'])}"
        )
        say(
            f"StableToolBench cache folder of the training calls' real responses: {shown(self.data.stb_cache)} "
            f"({s['stb_cache']['files']} API files, {s['stb_cache']['entries']} responses)"
        )
        self.report.update(
            data_source=source.description, data={"folder": str(self.data.folder), "reused": self.data.reused, **s}
        )
        for name, target in (
            ("tools", source.tools),
            ("tool_response_cache", self.data.stb_cache),
            ("train.jsonl", self.data.train_pairs),
            ("judge_test.jsonl", self.data.judge_test),
        ):
            self.link(name, target)

    def step_train(self) -> None:
        # The tiny model where it trains: the tiny runs, and beside real weights only with `--full` (9 s otherwise
        # spent on a model nothing used).
        if not self.sizes.real or self.sizes.tiny_simulator:
            tiny, reused = build_base_model(self.build, self.data, self.code)
            say(
                ("reused" if reused else "built") + f" the tiny base model (Qwen2 architecture, random weights, "
                f"tokenizer trained on the demo's data): {shown(tiny)}"
            )
            self.report["tiny_base_model"] = {"folder": str(tiny), "reused": reused}
            self.base = tiny
        if self.sizes.real:
            self.base = get_base_model(BASE_MODEL, progress=say)
            self.report["base_model"] = {"name": BASE_MODEL, "folder": str(self.base)}
            if self.sizes.tiny_simulator:
                recipe, overrides = RECIPES["tiny"]["simulator"], self.sizes.tiny_simulator
                self.tiny_simulator = self.train("tiny-simulator", tiny, recipe, self.data.simulator, overrides)[0]
        recipes = RECIPES["real" if self.sizes.real else "tiny"]
        self.trained = {
            kind: self.train(kind, self.base, recipes[kind], dataset, getattr(self.sizes, kind))[0]
            for kind, dataset in (("simulator", self.data.simulator), ("judge", self.data.judge))
        }
        if self.sizes.real:
            self.get_shipped()
        # The main rows' models: the shipped ones where there are, else this run's.
        self.simulator, self.judge = (self.shipped.get(kind, self.trained[kind]) for kind in ("simulator", "judge"))
        self.report["main"] = {
            kind: {"folder": str(getattr(self, kind)), "shipped": kind in self.shipped}
            for kind in ("simulator", "judge")
        }
        self.report["session_format"] = session_format(self.main_settings["prompt_format"])
        for kind in ("simulator", "judge"):
            self.link(kind, getattr(self, kind))

    def get_shipped(self) -> None:
        """The project's shipped simulator and judge (`mirrorapi models get`), where this package ships them."""
        shipped = self.report["shipped"] = {}
        for kind, name in SHIPPED.items():
            try:
                folder = get_shipped_model(name, progress=say)
            except ModelGetError as exc:
                say(f"shipped {kind}: {exc}; this run's fine-tuned {kind} gives the main rows")
                shipped[kind] = {"name": name, "absent": str(exc)}
                continue
            self.shipped[kind] = folder
            record = read_training_record(folder) or {}
            shipped[kind] = {
                "name": name,
                "folder": str(folder),
                "prompt_format": record.get("prompt_format"),
                "server_settings": serving_settings(record),
                "heldout_episodes": len(record.get("heldout_episodes") or []),
            }

    def step_serve(self) -> None:
        self.engine = self.stack.enter_context(self.serve_engine(self.simulator, "simulator-engine.log"))
        say(
            f"simulator engine: {self.engine.name} on {shown(self.simulator)} answers at {self.engine.base_url} "
            f"(pid {self.engine.process.pid})"
        )
        config = self.server_config(
            "server.yml", self.engine, self.run_dir / "cache.sqlite", self.data.stb_cache, self.main_settings
        )
        self.server = self.stack.enter_context(virtual_server(config, self.logs / "server.log"))
        health = httpx.get(self.server + "/health", timeout=10).json()
        say(
            f"virtual server: {self.server}/virtual (settings: {shown(config)}); {health['tools']['apis']} APIs of "
            f"{health['tools']['tools']} tools; cache {health['cache']['entries']} entries, imported from the "
            f"StableToolBench cache folder; engine {'answers' if health['status'] == 'ok' else 'NOT reachable'}"
        )
        self.report["serving"] = {
            "engine": self.engine.base_url,
            "engine_name": self.engine.name,
            "server": self.server,
            "config": str(config),
            "health": health,
        }

    def step_requests(self) -> None:
        train = list(read_pairs_jsonl(self.data.train_pairs))
        test = list(read_pairs_jsonl(self.data.test_pairs))
        registry = ToolRegistry.load([self.data.source.tools])
        calls = plan_calls(train, test, registry, self.sizes.hits, self.sizes.misses)
        sent = send_calls(self.server, calls, self.logs / "server-requests.jsonl")
        for number, call in enumerate(sent, 1):
            say("\n".join(render_call(number, call)))
        self.report["requests"] = [call.to_dict() for call in sent]

    def step_score(self) -> None:
        python, fidelity, fac, agreement = (
            shown(sys.executable),
            self.run_dir / "fidelity",
            self.run_dir / "fac",
            self.run_dir / "judge-agreement",
        )
        heldout = self.run_dir / "heldout.jsonl"
        candidates, self.report["heldout_from"] = self.heldout_candidates()
        chosen = select_heldout(candidates, self.sizes.heldout_calls)
        say(f"held-out calls: {len(chosen)}, {self.report['heldout_from']}")
        heldout.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in chosen), encoding="utf-8")
        self.fidelity_run(
            "fidelity",
            self.engine,
            heldout,
            self.main_settings,
            baseline=True,
            sessions=bool(self.sizes.session_history),
        )
        self.report["fidelity"] = json.loads((fidelity / "fidelity.json").read_text(encoding="utf-8"))
        # Every other row is scored on the calls the main one was: those its server did not answer from its cache
        # (a training call's recorded answer), written to `scored.jsonl`.
        answered = [json.loads(line) for line in (fidelity / "calls.jsonl").read_text(encoding="utf-8").splitlines()]
        simulated = [pair for pair, row in zip(chosen, answered, strict=True) if not row["from_cache"]]
        scored = self.run_dir / "scored.jsonl"
        scored.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in simulated), encoding="utf-8")
        self.report["fidelity_constant"] = constant_answer_metrics(simulated, self.data.source.tools)
        if self.sizes.real and simulated:
            self.stack.close()  # one engine at a time: the machine's cores go to the one being measured
            others = self.report["fidelity_others"] = {}
            # The untrained base rambles to its 128-token limit on many calls (11 of its 24 answers needed the server's
            # repair on 2026-11-28): a second try of each would add their time again for more rambling (the second
            # try is for a trained simulator's occasional loop).
            base_settings = {
                **self.main_settings,
                "max_tokens": self.sizes.base_max_tokens,
                "second_try_temperature": 0,
            }
            rows = [("base_few_shot", self.base, base_settings)]
            if self.tiny_simulator:
                rows.append(("tiny", self.tiny_simulator, self.trained_settings))
            if "simulator" in self.shipped:
                rows.insert(0, ("trained", self.trained["simulator"], self.trained_settings))
            for side, folder, settings in rows:
                with self.serve_engine(folder, f"{side}-engine.log") as engine:
                    say(f"{side.replace('_', ' ')}: {engine.name} on {shown(folder)} answers at {engine.base_url}")
                    out = self.fidelity_run(
                        f"fidelity-{side}",
                        engine,
                        scored,
                        settings,
                        sessions=side == "trained" and self.sizes.trained_sessions,
                    )
                others[side] = json.loads((out / "fidelity.json").read_text(encoding="utf-8"))
        if self.sizes.real:
            steps = self.report["training"]["simulator"]["metrics"]["steps"]
            main = f"the shipped simulator `{SHIPPED['simulator']}`, and " if "simulator" in self.shipped else ""
            self.report["figures_from"] = (
                f"These figures come from a {'`--full`' if self.options.full else '`make demo`'} run: {main}the "
                f"simulator fine-tuned here for {steps} steps"
                + (
                    " (longer than the demo's time allows)."
                    if self.options.full
                    else f"; `--full` trains it for the recipe's {RECIPE_STEPS}."
                )
            )
        say(fidelity_summary(self.report))
        if self.report["fidelity"].get("sessions"):
            say(history_summary(self.report["fidelity"]["sessions"], self.report["session_format"]))

        limit = ["--limit", str(self.sizes.agreement_limit)] if self.sizes.agreement_limit else []
        if "judge" in self.shipped:  # this run's fine-tuned judge first, on the labelled answers only (its own row)
            with self.serve_engine(self.trained["judge"], "trained-judge-engine.log") as trained:
                say(
                    f"fine-tuned judge: {trained.name} on {shown(self.trained['judge'])} answers at {trained.base_url}"
                )
                out = self.run_dir / "judge-agreement-trained"
                self._run(
                    "judge agreement (fine-tuned here)",
                    [
                        python,
                        "eval/judge_agreement.py",
                        "--labelled",
                        shown(self.data.judge_test),
                        "--base-url",
                        trained.base_url,
                        "--model",
                        trained.model,
                        "--no-progress",
                        "--out",
                        shown(out),
                        *limit,
                    ],
                    "judge-agreement-trained.log",
                )
            self.report["agreement_trained"] = json.loads((out / "agreement.json").read_text(encoding="utf-8"))
        judge = self.stack.enter_context(self.serve_engine(self.judge, "judge-engine.log"))
        say(f"judge engine: {judge.name} on {shown(self.judge)} answers at {judge.base_url}")
        engine = ["--base-url", judge.base_url, "--model", judge.model, "--no-progress", *self.judge_flags()]
        self._run(
            "FAC",
            [
                python,
                "eval/fac.py",
                "--answers",
                shown(STB_EXAMPLE / "data_example" / "model_predictions_converted"),
                "--ids",
                shown(STB_EXAMPLE / "solvable_queries_example" / "test_query_ids"),
                *engine,
                "--out",
                shown(fac),
            ],
            "fac.log",
        )
        self.report["fac"] = json.loads((fac / "fac.json").read_text(encoding="utf-8"))
        self._run(
            "judge agreement",
            [
                python,
                "eval/judge_agreement.py",
                "--labelled",
                shown(self.data.judge_test),
                *engine,
                "--out",
                shown(agreement),
                *limit,
            ],
            "judge-agreement.log",
        )
        self.report["agreement"] = json.loads((agreement / "agreement.json").read_text(encoding="utf-8"))
        say(judge_summary(self.report["fac"], self.report["agreement"], self.report.get("agreement_trained")))
        self.agent_run(judge)

    def judge_flags(self) -> list[str]:
        """The judge settings a shipped judge's record says it must be judged with (its `server_settings`:
        `max_tokens`, `temperature`), as flags of eval/fac.py and eval/judge_agreement.py."""
        if "judge" not in self.shipped:
            return []
        settings = serving_settings(read_training_record(self.shipped["judge"]) or {})
        return [
            x
            for key in ("max_tokens", "temperature")
            if key in settings
            for x in ("--" + key.replace("_", "-"), str(settings[key]))
        ]

    def heldout_candidates(self) -> tuple[list[dict], str]:
        """The calls the held-out calls are chosen from, and where they come from. A shipped simulator was trained
        on the shared data by the project's own split, not this run's: its record's `heldout_episodes` name the
        episodes it never saw, and the calls of those that this run's training split lacks too are held out from
        every model here. Without that list, this run's held-out calls, with a warning."""
        test = list(read_pairs_jsonl(self.data.test_pairs))
        if "simulator" not in self.shipped:
            return test, "whole episodes of this run's held-out split"
        named = (read_training_record(self.shipped["simulator"]) or {}).get("heldout_episodes")
        if not named:
            return test, (
                "whole episodes of this run's held-out split; WARNING: the shipped simulator's record "
                "names no held-out episodes, so some of these calls may be among its training calls"
            )
        unseen = {(str(source), str(episode)) for source, episode in named} - {
            (p["source"], str(p["episode"])) for p in read_pairs_jsonl(self.data.train_pairs)
        }
        pairs = [
            p
            for path in self.data.source.pair_files
            for p in read_pairs_jsonl(path)
            if (p["source"], str(p["episode"])) in unseen
        ]
        return pairs, (
            "whole episodes the shipped simulator's record names as held out, none of them in this "
            "run's training split"
        )

    def fidelity_run(
        self, name: str, engine, heldout: Path, settings: dict, baseline: bool = False, sessions: bool = False
    ) -> Path:
        """`eval/simulator.py` on the held-out calls through a virtual server of its own on `engine` with the model's
        server `settings`, into `<run>/<name>/`. Its cache starts empty; with few-shot examples, it holds the
        training calls' real responses (the examples the simulator is shown: a held-out call whose arguments a
        training call repeats is answered from it, and the report counts it apart). With `sessions`, `--history
        both`: the held-out episodes (whole episodes: `select_heldout`) replayed call by call, then once more one
        session per episode."""
        out = self.run_dir / name
        few_shot = settings.get("few_shot", 0)
        config = self.server_config(
            f"{name}-server.yml",
            engine,
            self.run_dir / f"{name}-cache.sqlite",
            self.data.stb_cache if few_shot else None,
            settings,
        )
        with virtual_server(config, self.logs / f"{name}-server.log") as url:
            cache = f"cache of the training calls, few_shot {few_shot}" if few_shot else "empty cache"
            say(f"a virtual server for the held-out calls ({cache}): {url}")
            baseline_args = ["--baseline-pairs", shown(self.data.train_pairs)] if baseline else []
            self._run(
                name,
                [
                    shown(sys.executable),
                    "eval/simulator.py",
                    "--pairs",
                    shown(heldout),
                    "--server",
                    url,
                    "--out",
                    shown(out),
                    *baseline_args,
                    "--tools",
                    shown(self.data.source.tools),
                    "--concurrency",
                    str(max(4, min(engine.concurrency, 16))),
                    "--no-progress",
                    *(["--history", "both"] if sessions else []),
                ],
                f"{name}.log",
            )
        side = "simulated" if baseline else name.removeprefix("fidelity-")
        log = self.logs / f"{name}-server-requests.jsonl"
        self.report.setdefault("parsing", {})[side] = parse_counts(log)
        if sessions:
            self.report["parsing"]["with_history"] = parse_counts(log, sessions=True)
        return out

    def agent_run(self, judge) -> None:
        """A small benchmark run: a recorded agent (StableToolBench's own CoT and DFS trajectories replayed as an
        OpenAI-compatible tool-calling model: a tiny model cannot call tools) against a replay-mode virtual
        server, scored for SoPR, SoWR and FAC by the trained tiny judge."""
        out = self.run_dir / "agents"
        groups = sorted(
            p.stem.removesuffix("_instruction")
            for p in (STB_EXAMPLE / "solvable_queries_example" / "test_instruction").glob("*.json")
        )
        say(
            "agent run: harness.recorded_benchmark.recorded_benchmark(...) = the recorded CoT and DFS "
            f"agents on the first {self.sizes.agent_queries} quer{'y' if self.sizes.agent_queries == 1 else 'ies'} "
            f"of each group of StableToolBench's examples ({', '.join(groups)}), scored by the judge"
        )
        flags = self.judge_flags()  # a shipped judge's own max_tokens; else the verdict line's few tokens
        max_tokens = int(flags[flags.index("--max-tokens") + 1]) if "--max-tokens" in flags else 8
        result = recorded_benchmark(
            STB_EXAMPLE,
            REPO / "data" / "samples" / "tools",
            JudgeSettings(base_urls=[judge.base_url], model=judge.model, max_tokens=max_tokens),
            out,
            repeats=1,
            limit=self.sizes.agent_queries,
        )
        if not result.complete:
            raise StepFailed(f"the agent run is incomplete: see {shown(out)}")
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
        self.report["agents"] = {
            "report": str(result.report),
            "averages": report["averages"],
            "groups": groups,
            "queries_per_group": self.sizes.agent_queries,
            "counts": report["agent_counts"],
            "solved_to_all": agent_baselines(out / "scores"),
        }
        say(f"agent run report: {shown(result.report)}")

    def _run(self, what: str, command: list[str], log: str) -> None:
        say(f"{what}: $ " + shlex.join(command))
        run_command(command, self.logs / log)

    def step_report(self) -> None:
        began = time.perf_counter()
        with sigint_ignored():
            self.stack.close()
        say(f"stopped the engines and the virtual servers in {time.perf_counter() - began:.1f} s")


def point_latest(run_dir: Path) -> Path:
    """`<work>/latest` -> `run_dir` (a relative link, replaced in one step: never missing, never half-made)."""
    latest = run_dir.parent / LATEST
    staging = latest.with_name(f".{LATEST}-{os.getpid()}")
    staging.unlink(missing_ok=True)
    staging.symlink_to(run_dir.name)
    os.replace(staging, latest)
    return latest


def run_demo(options: DemoOptions) -> Path:
    """Run the six steps; returns the report folder, or raises DemoError (after stopping everything)."""
    return Demo(options).run()
