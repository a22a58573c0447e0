"""LoRA path: trains, saves an adapter, reloads it, merges it (recipe `--merge` and the standalone
script), and the merged model loads as a plain model that computes what base + adapter computes."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, simulator_sft_dir, tmp_path_factory, entry_script):
    out = tmp_path_factory.mktemp("lora") / "adapter"
    assert train_lora(entry_script, tiny_model_dir, simulator_sft_dir, out, "--merge", "true") == 0
    return out


def train_lora(entry_script, tiny_model_dir, simulator_sft_dir, out, *extra) -> int:
    return entry_script("training/sft.py").cli(
        [
            "--config",
            str(REPO / "training/configs/tiny_cpu.yaml"),
            "--model_name_or_path",
            str(tiny_model_dir),
            "--dataset_path",
            str(simulator_sft_dir),
            "--output_dir",
            str(out),
            "--use_peft",
            "true",
            "--lora_r",
            "8",
            "--lora_alpha",
            "16",
            "--lora_target_modules",
            "all-linear",
            "--learning_rate",
            "1e-2",
            "--max_steps",
            "8",
            "--max_train_samples",
            "16",
            "--max_eval_samples",
            "4",
            "--eval_strategy",
            "no",
            "--eval_on_start",
            "false",
            "--save_strategy",
            "no",
            "--disable_tqdm",
            "true",
            *extra,
        ]
    )


def logits(model, input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids).logits


@pytest.mark.slow
def test_adapter_saved_reloaded_and_merged(adapter_dir, tiny_model_dir):
    assert (adapter_dir / "adapter_config.json").is_file() and (adapter_dir / "adapter_model.safetensors").is_file()
    assert not (adapter_dir / "model.safetensors").exists()  # an adapter, for `vllm serve --lora-modules`
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["r"] == 8
    info = json.loads((adapter_dir / "mirrorapi_training.json").read_text())
    assert info["adapter"] is True and "library_name: peft" in (adapter_dir / "README.md").read_text()
    # vLLM refuses an adapter above its --max-lora-rank (16 unless told): the card's command names one that fits.
    assert "--max-lora-rank 8 " in (adapter_dir / "README.md").read_text()

    input_ids = torch.tensor([[5, 17, 99, 240, 3, 8]])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    base_logits = logits(base, input_ids)
    with_adapter = PeftModel.from_pretrained(base, str(adapter_dir))
    adapter_logits = logits(with_adapter, input_ids)
    assert not torch.allclose(adapter_logits, base_logits, atol=1e-4)  # the adapter learned something

    merged = AutoModelForCausalLM.from_pretrained(adapter_dir / "merged")  # a plain model folder
    assert torch.allclose(logits(merged, input_ids), adapter_logits, atol=1e-4)
    assert json.loads((adapter_dir / "merged/mirrorapi_training.json").read_text())["adapter"] is False


@pytest.mark.slow
def test_merge_script(adapter_dir, tmp_path, capsys, entry_script):
    merge = entry_script("training/merge_lora.py").main
    assert merge(["--adapter", str(adapter_dir), "--out", str(tmp_path / "m")]) == 0
    input_ids = torch.tensor([[11, 12, 13]])
    assert torch.allclose(
        logits(AutoModelForCausalLM.from_pretrained(tmp_path / "m"), input_ids),
        logits(AutoModelForCausalLM.from_pretrained(adapter_dir / "merged"), input_ids),
    )
    assert (tmp_path / "m/README.md").is_file()
    # The folder it was merged into, for `models gguf` to find from anywhere; files readable as the umask says
    # (the safetensors writer makes 0600); a merge again into the same folder replaces it whole, nothing left aside.
    record = json.loads((tmp_path / "m/mirrorapi_training.json").read_text())
    assert Path(record["base_model"]).is_absolute() and Path(record["base_model"]).is_dir()
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "m/model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask
    assert (tmp_path / "m").stat().st_mode & 0o777 == 0o777 & ~umask  # not the staging folder's 0700
    assert merge(["--adapter", str(adapter_dir), "--out", str(tmp_path / "m")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("mine")
    capsys.readouterr()
    assert merge(["--adapter", str(adapter_dir), "--out", str(tmp_path / "notes")]) == 2  # not a model: kept
    assert "holds files but no model" in capsys.readouterr().err and (tmp_path / "notes" / "todo.txt").is_file()
    # An adapter merged into a model of other shapes: one line, not a 64-line traceback, and no folder.
    shipped = REPO / "mirrorapi" / "models" / "adapters" / "smollm2-135m-mirrorapi-judge"
    tiny = Path(record["base_model"])
    assert merge(["--adapter", str(shipped), "--base-model", str(tiny), "--out", str(tmp_path / "z")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' own loading bar
    assert last.startswith("merge_lora.py: error: ") and "do not fit" in last and not (tmp_path / "z").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # its build folder removed
    # --out naming the base model's own folder replaced the base with the merged model (and the adapter, still
    # naming that folder, merged twice after): refused, the base untouched.
    capsys.readouterr()
    before = {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()}
    assert merge(["--adapter", str(adapter_dir), "--out", str(tiny)]) == 2
    assert f"--out {tiny} is the base model's folder" in capsys.readouterr().err
    assert {p.name: p.stat().st_mtime_ns for p in tiny.iterdir()} == before
    capsys.readouterr()
    assert merge(["--adapter", str(tmp_path), "--out", str(tmp_path / "x")]) == 2
    assert (
        capsys.readouterr().err.strip() == f"merge_lora.py: error: {tmp_path} is not a LoRA adapter folder "
        "(no adapter_config.json)"
    )
    # A shipped adapter trained on SmolLM2 as `mirrorapi models get` makes it (from its GGUF): its adapter_config
    # names the hub's original, other weights, so without --base-model it is refused, in one line, at once.
    shipped = REPO / "mirrorapi" / "models" / "adapters" / "smollm2-135m-mirrorapi-judge"
    assert merge(["--adapter", str(shipped), "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip()
    assert "trained on 'smollm2-135m-instruct'" in err and "--base-model" in err and "\n" not in err
    assert not (tmp_path / "y").exists()


@pytest.mark.slow
def test_init_adapter_starts_from_the_adapters_weights(
    adapter_dir, tiny_model_dir, simulator_sft_dir, tmp_path, entry_script
):
    """With a learning rate of 0 the run saves the adapter it started from; a fresh adapter (lora_B zero) would
    differ, and so does one trained on from it."""
    from safetensors.torch import load_file

    start = load_file(adapter_dir / "adapter_model.safetensors")
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in start.items())
    # Trained on further from a copy of the base in another folder, with other LoRA settings on the command line
    # (the adapter's own apply): the saved adapter names the base it trained on, as PEFT's get_peft_model records it.
    moved_base = tmp_path / "moved-base"
    shutil.copytree(tiny_model_dir, moved_base)
    for learning_rate, same in (("0", True), ("1e-2", False)):
        out = tmp_path / f"lr{learning_rate}"
        extra = ("--init_adapter", str(adapter_dir), "--learning_rate", learning_rate, "--max_steps", "2")
        extra += ("--model_name_or_path", str(moved_base), "--lora_r", "2", "--lora_alpha", "4")
        assert train_lora(entry_script, tiny_model_dir, simulator_sft_dir, out, *extra) == 0
        trained = load_file(out / "adapter_model.safetensors")
        assert trained.keys() == start.keys()
        assert all(torch.equal(trained[k], start[k]) for k in start) is same
    info = json.loads((out / "mirrorapi_training.json").read_text())
    assert info["recipe"]["resolved"]["init_adapter"] == str(adapter_dir)
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(moved_base)
    started_from = json.loads((adapter_dir / "adapter_config.json").read_text())
    resolved = info["recipe"]["resolved"]
    assert (resolved["lora_r"], resolved["lora_alpha"]) == (started_from["r"], started_from["lora_alpha"]) == (8, 16)


@pytest.mark.slow
def test_the_same_seed_trains_the_same_adapter_to_the_bit(
    adapter_dir, tiny_model_dir, simulator_sft_dir, tmp_path, entry_script
):
    """A recipe run again on the same machine with the same seed saves the same adapter, every tensor equal to the
    bit (what lets a figure be reproduced, and tells a machine's difference from a run's); another seed draws
    other LoRA weights and another order of the records, so it differs (the comparison can fail)."""
    from safetensors.torch import load_file

    first = load_file(adapter_dir / "adapter_model.safetensors")
    for seed, same in (("42", True), ("7", False)):
        out = tmp_path / f"seed{seed}"
        assert train_lora(entry_script, tiny_model_dir, simulator_sft_dir, out, "--merge", "true", "--seed", seed) == 0
        again = load_file(out / "adapter_model.safetensors")
        assert again.keys() == first.keys()
        assert all(torch.equal(again[k], first[k]) for k in first) is same


def test_an_init_adapter_of_another_base_is_one_line(
    adapter_dir, tiny_model_dir, simulator_sft_dir, tmp_path, entry_script, capsys
):
    """An adapter whose weights do not fit the base (trained on another model: here one of its matrices cut, the
    same size mismatch torch reports) is one `error:` line and status 2, as merge-lora says it, not a traceback."""
    from safetensors.torch import load_file, save_file

    other = tmp_path / "other-base-adapter"
    shutil.copytree(adapter_dir, other, ignore=shutil.ignore_patterns("merged"))
    weights = load_file(other / "adapter_model.safetensors")
    name = next(k for k in weights if k.endswith("lora_A.weight"))
    weights[name] = weights[name][:, :-1].contiguous()
    save_file(weights, other / "adapter_model.safetensors")
    status = train_lora(
        entry_script, tiny_model_dir, simulator_sft_dir, tmp_path / "out", "--init_adapter", str(other)
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1].startswith(f"sft.py: error: init_adapter {other}: its weights do not fit")
    assert "Traceback" not in "\n".join(err)


def test_the_record_says_how_trl_batched_and_masked(tiny_model_dir, simulator_sft_dir, tmp_path, entry_script):
    """Packed with bfd, TRL trains padding-free whatever `padding_free` says (SFTConfig's own doc), and on
    prompt/completion records it computes the loss on the completions when `completion_only_loss` is unset: the
    run's record says what was done, not the unset keys (`false`, `null`)."""
    out = tmp_path / "packed"
    extra = ("--max_steps", "1", "--packing", "true", "--packing_strategy", "bfd", "--eval_strategy", "no")
    assert train_lora(entry_script, tiny_model_dir, simulator_sft_dir, out, *extra) == 0
    resolved = json.loads((out / "mirrorapi_training.json").read_text())["recipe"]["resolved"]
    assert (resolved["packing"], resolved["padding_free"], resolved["completion_only_loss"]) == (True, True, True)
