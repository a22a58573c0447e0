"""`logits_only_where_loss`: on the tiny model, a packed batch of the recipe's own trainer gives the same loss
and the same gradients whether TRL's fused LM head projects every position (its CPU default) or only the
positions that carry a loss; the reference loss is computed independently from the model's full logits.
The option must also really take the short path: the LM head sees only the completion's positions."""

from pathlib import Path

import pytest
import torch
import trl.trainer.utils as trl_utils

from mirrorapi.training.lm_head import logits_only_where_loss
from mirrorapi.training.recipe import parse_recipe
from mirrorapi.training.sft import build_trainer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def trainer_and_batch(tiny_model_dir, simulator_sft_dir, tmp_path_factory):
    argv = [
        "--config",
        str(REPO / "training/configs/tiny_cpu.yaml"),
        "--model_name_or_path",
        str(tiny_model_dir),
        "--dataset_path",
        str(simulator_sft_dir),
        "--output_dir",
        str(tmp_path_factory.mktemp("lm-head")),
        "--packing",
        "true",
        "--max_length",
        "2048",
        "--max_train_samples",
        "6",
        "--per_device_train_batch_size",
        "1",
        "--eval_strategy",
        "no",
        "--eval_on_start",
        "false",
        "--shuffle_dataset",
        "false",
        "--logits_only_where_loss",
        "true",
    ]
    trainer, _, _, _ = build_trainer(*parse_recipe(argv))
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer, batch


def loss_and_grads(trainer, batch):
    model = trainer.model.train()
    model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(model, dict(batch))
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def rows_projected(trainer, batch, compact: bool) -> int:
    """How many positions reach TRL's LM-head kernel in one loss computation."""
    seen = []
    original = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):
        seen.append(hidden.shape[0])
        return original(hidden, *args)

    trl_utils._ChunkedLogProbFunction.apply = spy
    try:
        with logits_only_where_loss(compact):
            trainer.compute_loss(trainer.model, dict(batch))
    finally:
        trl_utils._ChunkedLogProbFunction.apply = original
    return sum(seen)


def test_same_loss_and_gradients_as_every_position(trainer_and_batch):
    trainer, batch = trainer_and_batch
    full_loss, full_grads = loss_and_grads(trainer, batch)
    with logits_only_where_loss():
        kept_loss, kept_grads = loss_and_grads(trainer, batch)
    # Independent reference: mean cross-entropy of the model's own full logits over the labelled positions.
    with torch.no_grad():
        logits = trainer.model(
            input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False
        ).logits
    reference = torch.nn.functional.cross_entropy(logits[0, :-1], batch["labels"][0, 1:], ignore_index=-100)
    assert torch.allclose(kept_loss, reference, atol=1e-5) and torch.allclose(full_loss, reference, atol=1e-5)
    assert full_grads.keys() == kept_grads.keys() and full_grads
    for name, grad in full_grads.items():
        assert torch.allclose(grad, kept_grads[name], atol=1e-6, rtol=1e-4), name


def test_only_the_loss_positions_reach_the_lm_head(trainer_and_batch):
    trainer, batch = trainer_and_batch
    labelled = int((batch["labels"][0, 1:] != -100).sum())
    every = batch["input_ids"].shape[1] - 1
    assert 0 < labelled < every
    assert rows_projected(trainer, batch, compact=False) == every  # TRL's own choice on a CPU
    assert rows_projected(trainer, batch, compact=True) == labelled
    assert trl_utils._use_triton(torch.device("cpu")) is False  # restored after the block


def test_refused_with_liger():
    """Liger's fused cross-entropy replaces the same LM head: the two together is a mistake, said in one line."""
    from trl import ModelConfig, SFTConfig

    from mirrorapi.training.recipe import RecipeArguments, RecipeError, check_values

    with pytest.raises(RecipeError, match="logits_only_where_loss and use_liger_kernel"):
        check_values(
            RecipeArguments(logits_only_where_loss=True),
            SFTConfig(output_dir="x", use_cpu=True, use_liger_kernel=True),
            ModelConfig(),
        )
