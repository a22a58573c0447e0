"""Fixtures shared by the whole suite: data locations, the tiny model, and a real CPU engine.

- `shared_data`: `../shared/data`; tests that need it skip with a reason when it is absent.
- `samples`: the bundled `data/samples` (always present).
- `tiny_model_dir`: a tiny Qwen2 model built from scratch once per run (~5 s).
- `tiny_engine`: `transformers serve` on that model on a free 127.0.0.1 port, ready to answer
  chat completions; stopped after the session.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
SAMPLES = REPO / "data" / "samples"

# Nothing may reach a model hub: everything is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data package at {SHARED_DATA} (not present beside this clone)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from mirrorapi.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-model") / "model")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir, tmp_path_factory):
    from mirrorapi.launch import transformers_serve

    log = tmp_path_factory.mktemp("engine") / "transformers-serve.log"
    with transformers_serve(tiny_model_dir, log_path=log, timeout=180) as engine:
        yield engine
