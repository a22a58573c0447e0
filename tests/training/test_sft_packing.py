"""Packed batches (TRL packing, bfd: padding-free, position ids restarting per record) train on exactly what
unpacked batches train on: with the tiny model, every record's per-token loss in a packed batch equals its loss
computed alone (no record attends to another), and only the completion's tokens carry a loss.

The packed batch comes from the recipe's own trainer (`build_trainer`, as `training/sft.py` builds it) and its
own data loader; the reference is each record run through the model by itself."""

from pathlib import Path

import pytest
import torch

from mirrorapi.training.recipe import parse_recipe
from mirrorapi.training.sft import build_trainer

REPO = Path(__file__).resolve().parents[2]
RECORDS = 6


def per_token_loss(logits, labels):
    """Cross-entropy of each next-token prediction; 0 where the label is -100."""
    return torch.nn.functional.cross_entropy(logits[0, :-1], labels[0, 1:], ignore_index=-100, reduction="none")


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def packed(request, tiny_model_dir, simulator_sft_dir, tmp_path_factory):
    argv = [
        "--config",
        str(REPO / "training/configs/tiny_cpu.yaml"),
        "--model_name_or_path",
        str(tiny_model_dir),
        "--dataset_path",
        str(simulator_sft_dir),
        "--output_dir",
        str(tmp_path_factory.mktemp("packed")),
        "--packing",
        "true",
        "--attn_implementation",
        request.param,
        "--max_length",
        "2048",
        "--max_train_samples",
        str(RECORDS),
        "--per_device_train_batch_size",
        "1",
        "--eval_strategy",
        "no",
        "--eval_on_start",
        "false",
        "--shuffle_dataset",
        "false",
    ]
    trainer, _, train, _ = build_trainer(*parse_recipe(argv))
    batch = next(iter(trainer.get_train_dataloader()))
    return trainer, train, batch


def test_packed_batch_holds_several_whole_records(packed):
    trainer, _, batch = packed
    positions = batch["position_ids"][0]
    starts = (positions == 0).nonzero().flatten().tolist()
    assert "attention_mask" not in batch and len(starts) >= 2  # padding-free, and really packed
    assert trainer.model.config._attn_implementation in ("sdpa", "eager")


def test_packed_loss_equals_each_record_alone(packed):
    trainer, train, batch = packed
    model = trainer.model.eval()
    input_ids, labels, positions = batch["input_ids"], batch["labels"], batch["position_ids"]
    with torch.no_grad():
        packed_logits = model(input_ids=input_ids, position_ids=positions, use_cache=False).logits
    starts = [*(positions[0] == 0).nonzero().flatten().tolist(), input_ids.shape[1]]
    tokenizer = trainer.processing_class
    completions = {r["completion"][0]["content"] for r in train}
    for start, end in zip(starts, starts[1:], strict=False):
        ids, record_labels = input_ids[:, start:end], labels[:, start:end]
        with torch.no_grad():
            alone = model(input_ids=ids, use_cache=False).logits
        packed_loss = per_token_loss(packed_logits[:, start:end], record_labels)
        assert torch.allclose(packed_loss, per_token_loss(alone, record_labels), atol=1e-4)
        # Only the completion carries a loss: in ChatML the assistant's turn after "<|im_start|>assistant\n" is
        # its content and "<|im_end|>" (and the newline that ends the turn).
        target = tokenizer.decode(ids[0][record_labels[0] != -100])
        assert target.removesuffix("\n").removesuffix("<|im_end|>") in completions
        assert (record_labels[0] != -100).sum() < len(ids[0]) / 2  # the prompt (API docs + call) is not learned


def test_unpacked_records_are_the_packed_ones(packed, tiny_model_dir, simulator_sft_dir):
    """The packed batch holds records of the dataset, whole (first token to end of turn)."""
    trainer, train, batch = packed
    tokenizer = trainer.processing_class
    positions = batch["position_ids"][0]
    starts = [*(positions == 0).nonzero().flatten().tolist(), len(positions)]
    whole = {
        tuple(
            tokenizer.apply_chat_template(r["prompt"] + r["completion"], tokenize=True, return_dict=True)["input_ids"]
        )
        for r in train
    }
    for start, end in zip(starts, starts[1:], strict=False):
        assert tuple(batch["input_ids"][0, start:end].tolist()) in whole
