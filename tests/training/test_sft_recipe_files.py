"""Every recipe file passes training/sft.py's checks on the CPU (keys known, values valid, the keys together);
the GPU recipes pack; packing, attention, QLoRA and liger settings that cannot work are refused in one line;
the model is loaded with TRL's ModelConfig forwarded as TRL's own scripts/sft.py forwards it; bfloat16 on a CPU
that would emulate it is refused."""

import importlib.util
import os
import platform
from pathlib import Path

import pytest
import torch
from transformers import BitsAndBytesConfig, LlamaConfig

from mirrorapi.training import recipe as recipe_module
from mirrorapi.training.recipe import (
    PACKING_ATTENTION,
    RecipeError,
    cpu_has_bfloat16,
    make_parser,
    model_init_kwargs,
    parse_recipe,
)

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "training/configs").glob("*.yaml"))
TINY = str(REPO / "training/configs/tiny_cpu.yaml")


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_recipe_file_passes_the_checks(recipe, monkeypatch):
    # --use_cpu: the GPU recipes' bf16 is refused by transformers on a host without a GPU unless told so. Their keys
    # are checked here, not this host's bfloat16 path (the tests of check_cpu_precision below do that).
    monkeypatch.setattr(recipe_module, "cpu_has_bfloat16", lambda: True)
    _, training_args, model_args = parse_recipe(["--config", str(recipe), "--use_cpu", "true"])
    if "qwen" in recipe.name:  # the GPU recipes pack whole records (issue 14)
        assert (training_args.packing, training_args.packing_strategy) == (True, "bfd")
        assert model_args.attn_implementation in PACKING_ATTENTION
        assert training_args.completion_only_loss in (None, True)  # None: TRL's prompt/completion default, on


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--packing", "true", "--packing_strategy", "wrapped"], "packing_strategy 'wrapped' cuts records"),
        (["--packing", "true", "--attn_implementation", "paged|sdpa"], "'paged|sdpa' is not known to keep packed"),
        (["--packing", "true", "--attn_implementation", "flash_attention_2"], "needs a CUDA GPU and the flash-attn"),
        (["--padding_free", "true"], "padding_free without packing does not enforce max_length"),
        (["--load_in_4bit", "true"], "--load_in_4bit trains a LoRA adapter on a quantized base (QLoRA): set use_peft"),
        (
            ["--load_in_8bit", "true", "--load_in_4bit", "true", "--use_peft", "true"],
            "can't use 8 bit and 4 bit precision at the same time",
        ),  # TRL's ModelConfig says it
        (["--merge", "true"], "--merge applies to LoRA training only"),
    ],
)
def test_settings_that_cannot_work_are_refused(extra, message):
    with pytest.raises(RecipeError) as error:
        parse_recipe(["--config", TINY, *extra])
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.skipif(
    platform.system() != "Linux"
    or platform.machine() != "x86_64"
    or bool({"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"} & set(os.environ)),
    reason="reads Linux's x86-64 CPU flags; oneDNN's ISA left to the CPU",
)
def test_the_bfloat16_probe_says_what_the_kernel_and_onednn_say():
    """The kernel's CPU flags (/proc/cpuinfo: what the CPU or the hypervisor reports) against oneDNN's documented rule,
    not our code: oneDNN computes bfloat16 from its `avx512_core` ISA (AVX-512 F, BW, VL, DQ) and on `avx2_vnni_2`
    (AVX-VNNI, AVX-VNNI-INT8, AVX-NE-CONVERT); AMX CPUs have AVX-512."""
    flags = set(
        next(
            line.split(":", 1)[1].split()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )
    )
    onednn_bf16 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags or {
        "avx_vnni",
        "avx_vnni_int8",
        "avx_ne_convert",
    } <= flags
    assert cpu_has_bfloat16() is onednn_bf16


@pytest.mark.parametrize(
    "extra, keys",
    [
        (["--bf16", "true"], "bf16"),
        (["--dtype", "bfloat16"], "dtype bfloat16"),
        (["--bf16", "true", "--dtype", "bfloat16"], "bf16 and dtype bfloat16"),
    ],
)
def test_bfloat16_on_a_cpu_that_would_emulate_it_is_refused(monkeypatch, extra, keys):
    # A stand-in for the hardware (named as such): a CPU without oneDNN's bfloat16 cannot be had on one with it.
    monkeypatch.setattr(recipe_module, "cpu_has_bfloat16", lambda: False)
    with pytest.raises(RecipeError) as error:
        parse_recipe(["--config", TINY, "--use_cpu", "true", *extra])
    message = str(error.value)
    assert message.startswith(f"{keys} on a CPU without oneDNN's bfloat16 (AVX-512, AMX or Arm BF16; this one has ")
    assert message.endswith("pass --bf16 false --dtype float32") and "\n" not in message
    # float32, what the message says to pass, is this CPU's precision
    _, training_args, model_args = parse_recipe(
        ["--config", TINY, "--use_cpu", "true", *extra, "--bf16", "false", "--dtype", "float32"]
    )
    assert (training_args.bf16, model_args.dtype) == (False, "float32")
    # where the CPU has the instructions, bfloat16 stays the recipe's choice
    monkeypatch.setattr(recipe_module, "cpu_has_bfloat16", lambda: True)
    parse_recipe(["--config", TINY, "--use_cpu", "true", *extra])


@pytest.mark.parametrize("saved_dtype, refused", [("bfloat16", True), ("float32", False)])
def test_dtype_auto_is_refused_where_the_checkpoint_is_bfloat16(monkeypatch, tmp_path, saved_dtype, refused):
    """`dtype: auto` loads the checkpoint's own dtype: the folder's config as transformers saves it decides, as it
    decides for from_pretrained. A stand-in for the hardware, as above."""
    monkeypatch.setattr(recipe_module, "cpu_has_bfloat16", lambda: False)
    LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, dtype=saved_dtype
    ).save_pretrained(tmp_path)
    argv = ["--config", TINY, "--use_cpu", "true", "--model_name_or_path", str(tmp_path), "--dtype", "auto"]
    if not refused:
        assert parse_recipe(argv)[2].dtype == "auto"
        return
    with pytest.raises(RecipeError) as error:
        parse_recipe(argv)
    assert str(error.value).startswith("dtype auto (the checkpoint's bfloat16) on a CPU without oneDNN's bfloat16")


def test_packing_without_an_attention_takes_one_that_keeps_records_apart():
    _, _, model_args = parse_recipe(["--config", TINY, "--packing", "true"])
    assert model_args.attn_implementation == "sdpa"  # no flash-attn on this CPU host


@pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is not None and torch.cuda.is_available(),
    reason="this host can run QLoRA",
)
def test_qlora_without_bitsandbytes_or_cuda_is_one_clear_line():
    with pytest.raises(RecipeError) as error:
        parse_recipe(["--config", TINY, "--use_peft", "true", "--load_in_4bit", "true"])
    assert str(error.value) in (
        "--load_in_4bit needs the bitsandbytes package: pip install '.[gpu]' (GPU hosts)",
        "--load_in_4bit needs a CUDA GPU (bitsandbytes quantization); this run has none",
    )


@pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is not None, reason="liger-kernel is installed")
def test_liger_without_the_package_is_one_clear_line():
    with pytest.raises(RecipeError, match=r"use_liger_kernel needs the liger-kernel package: pip install '\.\[gpu\]'"):
        # (the tiny recipe's own LM head option replaces the same loss: turned off, as a liger run must)
        parse_recipe(["--config", TINY, "--use_liger_kernel", "true", "--logits_only_where_loss", "false"])


def test_model_config_is_forwarded_as_trl_does():
    """The keys of trl/scripts/sft.py's model_init_kwargs, and QLoRA's BitsAndBytesConfig (built, not loaded: no GPU
    here) with the device map that puts each process's quantized copy on its own GPU."""
    parser = make_parser()
    _, training_args, model_args = parser.parse_args_and_config(
        [
            "--config",
            TINY,
            "--model_revision",
            "v1.1",
            "--trust_remote_code",
            "true",
            "--attn_implementation",
            "eager",
            "--dtype",
            "bfloat16",
            "--use_peft",
            "true",
            "--load_in_4bit",
            "true",
            "--use_bnb_nested_quant",
            "true",
        ]
    )
    kwargs = model_init_kwargs(training_args, model_args)
    quantization = kwargs.pop("quantization_config")
    assert kwargs == {
        "revision": "v1.1",
        "trust_remote_code": True,
        "attn_implementation": "eager",
        "dtype": "bfloat16",
        "device_map": {"": 0},
    }
    assert isinstance(quantization, BitsAndBytesConfig)
    assert (
        quantization.load_in_4bit,
        quantization.bnb_4bit_quant_type,
        quantization.bnb_4bit_use_double_quant,
        quantization.bnb_4bit_compute_dtype,
    ) == (True, "nf4", True, torch.bfloat16)
    _, training_args, model_args = parser.parse_args_and_config(["--config", TINY, "--load_in_8bit", "true"])
    assert model_init_kwargs(training_args, model_args)["quantization_config"].load_in_8bit
    _, training_args, model_args = parser.parse_args_and_config(["--config", TINY])
    assert "quantization_config" not in model_init_kwargs(training_args, model_args)


def test_an_eval_split_leaves_out_the_held_out_records_whose_call_is_a_training_call():
    # The data builder marks them (`call_in_train`): a server answers such a call from its cache, and rendered
    # alike the record may be a training record itself, so the eval loss would reward remembering it.
    from datasets import Dataset, DatasetDict

    from mirrorapi.training.recipe import RecipeArguments, training_splits

    def record(text: str, in_train: bool) -> dict:
        return {
            "prompt": [{"role": "user", "content": text}],
            "completion": [{"role": "assistant", "content": "{}"}],
            "call_in_train": in_train,
        }

    data = DatasetDict(
        train=Dataset.from_list([record("a", True), record("b", True)]),
        test_id=Dataset.from_list([record("a", True), record("c", False)]),
    )
    recipe = RecipeArguments(dataset_path="unused", eval_splits=["test_id"])
    train, evals = training_splits(data, recipe, None, None, None)
    assert len(train) == 2 and [r["prompt"][0]["content"] for r in evals["test_id"]] == ["c"]
