"""What every stage of `scripts/train_shipped_models.py` uses: where things are, the log line, the base model, a
trained adapter loaded, the machine a run had."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "data"
# bf16 dense peak of the GPUs a run may get (NVIDIA's data sheets, SXM), for MFU.
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}


class StageError(Exception):
    """A mistake in what a stage was asked (inputs that do not fit together): the script says it in one line and
    exits with status 2, without a traceback."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def base_model(work: Path, base: str | None, base_gguf: str | None) -> Path:
    if base:
        return Path(base)
    from mirrorapi.models.from_gguf import hf_folder_from_gguf

    folder = work / "base"
    if not (folder / "config.json").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        hf_folder_from_gguf(base_gguf, folder)
    return folder


def load_trained(base: Path, adapter: Path, device: str):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(device)
    return tokenizer, PeftModel.from_pretrained(model, str(adapter)).eval()


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
