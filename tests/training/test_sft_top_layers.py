"""`train_top_layers`: full fine-tuning of the top decoder layers only, for CPU recipes on real weights."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
TINY_RECIPE = str(REPO / "training/configs/tiny_cpu.yaml")


@pytest.fixture(scope="module")
def cli(entry_script):
    return entry_script("training/sft.py").cli


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--train_top_layers", "0"], "train_top_layers must be at least 1 (got 0)"),
        (["--train_top_layers", "1", "--use_peft", "true"], "train_top_layers is full fine-tuning of the top layers"),
        (["--train_top_layers", "3"], "train_top_layers 3: the model has only 2 decoder layers"),
    ],
)
def test_mistakes_are_one_clear_line(cli, capsys, tiny_model_dir, simulator_sft_dir, tmp_path, extra, message):
    status = cli(
        [
            "--config",
            TINY_RECIPE,
            "--model_name_or_path",
            str(tiny_model_dir),
            "--dataset_path",
            str(simulator_sft_dir),
            "--output_dir",
            str(tmp_path / "out"),
            "--max_steps",
            "1",
            "--eval_strategy",
            "no",
            "--save_strategy",
            "no",
            *extra,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith("sft.py: error: ") and message in err[-1]


def test_only_the_top_layer_and_the_final_norm_change(cli, tiny_model_dir, simulator_sft_dir, tmp_path):
    """Two real training steps on the 2-layer tiny model with train_top_layers 1 and a large learning rate:
    every tensor of the top layer and the final norm moves; the embeddings and the lower layer stay."""
    out = tmp_path / "top1"
    status = cli(
        [
            "--config",
            TINY_RECIPE,
            "--model_name_or_path",
            str(tiny_model_dir),
            "--dataset_path",
            str(simulator_sft_dir),
            "--output_dir",
            str(out),
            "--max_steps",
            "2",
            "--warmup_steps",
            "0",
            "--learning_rate",
            "0.01",
            "--max_train_samples",
            "8",
            "--eval_strategy",
            "no",
            "--save_strategy",
            "no",
            "--train_top_layers",
            "1",
        ]
    )
    assert status == 0
    before, after = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    changed = {name for name in before if name in after and not torch.equal(before[name], after[name])}
    top = {name for name in before if name.startswith("model.layers.1.")} | {"model.norm.weight"}
    assert top and changed == top
