"""The recipe behind `training/sft.py`: its arguments (ours + TRL's `SFTConfig` and `ModelConfig`), the
checks of their values, the inputs it reads (base model, tokenizer, dataset splits) and the keyword
arguments the model is loaded with.

Every check that can fail on a user's mistake runs before a model is loaded (`parse_recipe`, then
`check_inputs`), so a bad recipe costs seconds and ends in one `RecipeError` line, not a traceback
after the model load (or a minute of model-hub retries for a mistyped local path).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from mirrorapi.records import STATS_FILE
from mirrorapi.training.lm_head import compact_lm_head_supported

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("prompt", "completion")

# Attention implementations that keep packed records apart in the pinned transformers (5.x). TRL's padding-free
# batches (packing_strategy bfd) carry no attention mask, only position ids restarting at 0 for every record and
# the records' boundaries (cu_seq_lens):
# - eager, sdpa, flex_attention: `masking_utils.create_causal_mask` finds the restarts in the position ids
#   (`find_packed_sequence_indices`) and builds a block-diagonal causal mask (a BlockMask for flex). sdpa then
#   computes the whole packed row densely under that mask (correct, but its work grows with the square of the row);
# - flash_attention_2 / flash_attention_3: the varlen kernels get the boundaries from cu_seq_lens (or the
#   position ids) and never compute across records.
# The mask is only derived without a KV cache; TRL passes use_cache=False in training and evaluation.
# tests/training/test_sft_packing.py checks eager and sdpa on the CPU (flex compiles for minutes there).
PACKING_ATTENTION = ("flash_attention_3", "flash_attention_2", "flex_attention", "sdpa", "eager")
# Picked, in this order, when a packed recipe names none. flex_attention is left to an explicit choice: it compiles
# on first use (minutes on a CPU) and has not been measured here.
PACKING_ATTENTION_DEFAULTS = ("flash_attention_3", "flash_attention_2", "sdpa")


# A dataset's kind (its stats.json, as the data builders write it) -> the recipes of training/configs/ for it and
# the held-out splits its builder writes.
KIND_RECIPES = {
    "simulator": ("training/configs/tiny_cpu.yaml or simulator_*.yaml", ("test_id", "test_ood")),
    "judge": ("training/configs/tiny_judge_cpu.yaml or judge_*.yaml", ("test",)),
}


class RecipeError(Exception):
    """A recipe that cannot run as given (bad key, path, dataset or tokenizer); the message says what to fix."""


@dataclass
class RecipeArguments:
    """mirrorapi's own recipe keys; the rest are TRL's `SFTConfig` and `ModelConfig` keys."""

    dataset_path: str | None = field(
        default=None, metadata={"help": "Folder written by data/build_simulator_sft.py or data/build_judge_sft.py."}
    )
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    eval_splits: list[str] = field(
        default_factory=lambda: ["test_id", "test_ood"],
        metadata={
            "help": "Splits to report eval loss on (simulator: test_id test_ood; judge: test; none: no split, with "
            "--eval_strategy no)."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Train on the first N records (of those that fit in max_length)."}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "Evaluate on the first N records of each eval split (of those that fit)."}
    )
    drop_overlong: bool = field(
        default=True,
        metadata={
            "help": "Drop records longer than max_length instead of truncating them: a cut completion teaches the "
            "simulator never to close its JSON."
        },
    )
    train_top_layers: int | None = field(
        default=None,
        metadata={
            "help": "Full fine-tuning of the top N decoder layers and the final norm only; the embeddings (tied to "
            "the output layer in small models) and the layers below stay frozen, so the backward pass stops at layer "
            "N from the top: about 2x fewer FLOPs per token on a CPU. Not with LoRA."
        },
    )
    logits_only_where_loss: bool = field(
        default=False,
        metadata={
            "help": "Project the hidden states through the LM head only at the positions whose next token carries a "
            "loss (the completion), on any device; TRL does so on GPUs only, and on a CPU computes the "
            "vocabulary logits of every prompt token too. Same loss; about 2x faster on a CPU for the simulator "
            "(mirrorapi/training/lm_head.py)."
        },
    )
    max_train_seconds: float | None = field(
        default=None,
        metadata={
            "help": "Stop training at the first step that ends past this many seconds, then save and evaluate as "
            "usual (a run that must fit a lent machine's time; mirrorapi/training/time_limit.py)."
        },
    )
    resume: bool = field(default=False, metadata={"help": "Resume from the last checkpoint in output_dir."})
    init_adapter: str | None = field(
        default=None,
        metadata={
            "help": "LoRA only: start from this adapter folder's weights instead of a fresh adapter (train a shipped "
            "adapter further, with a schedule and data of this run's own); its r, alpha and target modules are the "
            "adapter's, not the recipe's."
        },
    )
    merge: bool = field(
        default=False,
        metadata={"help": "LoRA only: also write the base model with the adapter merged in, to output_dir/merged."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Replace the model and checkpoints an earlier run left in output_dir (refused otherwise: give a "
            "new folder, or --resume true to go on with that run)."
        },
    )

    def __post_init__(self):
        if isinstance(self.eval_splits, str):  # `eval_splits: test_id` in a recipe file: one split, not its letters
            self.eval_splits = [self.eval_splits]
        # A recipe file says `eval_splits: []`; a command line cannot give an empty list, so it says `none`.
        if self.eval_splits == ["none"]:
            self.eval_splits = []


def freeze_below_top_layers(model, top: int) -> tuple[int, int]:
    """Leave only the top `top` decoder layers and the final norm trainable; (trainable, total) parameters.
    Raises RecipeError for a model without `model.layers` or with fewer layers than asked."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise RecipeError(f"train_top_layers: {type(model).__name__} has no model.layers to choose from")
    if top > len(layers):
        raise RecipeError(f"train_top_layers {top}: the model has only {len(layers)} decoder layers")
    model.requires_grad_(False)
    for layer in list(layers)[len(layers) - top :]:
        layer.requires_grad_(True)
    norm = getattr(model.model, "norm", None)
    if norm is not None:
        norm.requires_grad_(True)
    parameters = list(model.parameters())
    return sum(p.numel() for p in parameters if p.requires_grad), sum(p.numel() for p in parameters)


def make_parser(prog: str | None = None):
    """TRL's parser of the recipe's keys; `prog` names the command in its usage line (argparse's default is the
    program's file name: `mirrorapi`, not `mirrorapi train sft`)."""
    from trl import ModelConfig, SFTConfig, TrlParser

    return TrlParser((RecipeArguments, SFTConfig, ModelConfig), prog=prog, allow_abbrev=False)


def config_file(argv: list[str]) -> str | None:
    return argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None


def parse_recipe(argv: list[str], prog: str | None = None):
    """`training/sft.py ARGV` -> (RecipeArguments, SFTConfig, ModelConfig), every key known and every value valid
    for this host; `--help` prints the keys and exits."""
    parser = make_parser(prog)
    check_recipe_file(config_file(argv), parser)
    try:
        with warnings.catch_warnings():
            # transformers 5.x renamed it activation_checkpointing and maps the old name until v6 (pyproject: <6);
            # the recipes keep their documented key, so its deprecation notice is noise in every run.
            warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning)
            recipe, training_args, model_args = parser.parse_args_and_config(argv)
    except ValueError as exc:  # SFTConfig's own checks of the keys together (e.g. bf16 on a CPU)
        raise RecipeError(str(exc).splitlines()[0]) from None
    check_values(recipe, training_args, model_args)
    return recipe, training_args, model_args


def check_recipe_file(config_file: str | None, parser) -> None:
    """A recipe YAML that exists, is a mapping, uses only known keys (TRL would only say "unused"), and gives each
    key a value of its type: TRL sets the file's values as argparse defaults, which argparse converts only when
    they are strings, so a YAML number or list of the wrong kind (`max_steps: 1.5`) would fail deep in a run."""
    import dataclasses

    import yaml

    if config_file is None:
        return
    try:
        config = yaml.safe_load(Path(config_file).read_text(encoding="utf-8"))
    except OSError:
        raise RecipeError(f"recipe file not found: {config_file}") from None
    except yaml.YAMLError as exc:
        raise RecipeError(f"{config_file} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise RecipeError(f"{config_file} must be a YAML mapping of recipe keys")
    known = {f.name for cls in parser.dataclass_types for f in dataclasses.fields(cls)} | {"env"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise RecipeError(
            f"unknown key(s) in {config_file}: {', '.join(unknown)} (`training/sft.py --help` lists the keys)"
        )
    actions = {action.dest: action for action in parser._actions}
    for key, value in config.items():
        if key in actions and (problem := _value_problem(actions[key], value)):
            raise RecipeError(f"{config_file}: {key}: {problem}")


def _value_problem(action, value) -> str | None:
    """What makes a recipe file's value unfit for its key (None: fit, or left to the key's own checks)."""
    convert = action.type if callable(action.type) else str
    many = action.nargs in ("+", "*")
    if isinstance(value, str) or value is None or isinstance(value, dict):
        return None  # a string is argparse's to convert; one for a list key is one item (`all-linear`)
    if isinstance(value, list):
        if not many and convert is not str:
            return f"expected one value, got the list {value!r}"
        items = value
    elif many:
        return f"expected a list, got {value!r}"
    else:
        items = [value]
    for item in items:
        try:
            convert(str(item))
        except (TypeError, ValueError, argparse.ArgumentTypeError):  # the last: TRL's string_to_bool (`use_peft: 2`)
            return f"{item!r} is not a valid value here (e.g. a whole number for a count)"
    return None


def check_values(recipe: RecipeArguments, training_args, model_args) -> None:
    """The keys together, and what this host must have for them; picks the attention for packed batches."""
    if recipe.max_train_seconds is not None and recipe.max_train_seconds <= 0:
        raise RecipeError(f"max_train_seconds must be positive (got {recipe.max_train_seconds})")
    check_ranges(training_args, model_args)
    if recipe.merge and not model_args.use_peft:
        raise RecipeError("--merge applies to LoRA training only (set use_peft: true)")
    if recipe.train_top_layers is not None:
        if recipe.train_top_layers < 1:
            raise RecipeError(f"train_top_layers must be at least 1 (got {recipe.train_top_layers})")
        if model_args.use_peft:
            raise RecipeError(
                "train_top_layers is full fine-tuning of the top layers; with use_peft, choose the "
                "layers with lora_target_modules instead"
            )
        if training_args.gradient_checkpointing:
            # transformers then makes the embeddings' output require grad (enable_input_require_grads), so the
            # backward pass runs through every frozen layer and the top layers' saving is gone.
            raise RecipeError(
                "train_top_layers stops the backward pass at the top layers, and gradient_checkpointing would run it "
                "through every frozen layer again; set gradient_checkpointing: false"
            )
    if recipe.logits_only_where_loss:
        if not compact_lm_head_supported():
            raise RecipeError(
                "logits_only_where_loss steers TRL's fused LM head (trl>=1.0, add_fused_lm_head), "
                "which the installed TRL lacks; set it to false"
            )
        if training_args.use_liger_kernel:
            raise RecipeError(
                "logits_only_where_loss and use_liger_kernel both replace the LM head's loss; choose one"
            )
    check_packing(training_args, model_args)
    check_quantization(training_args, model_args)
    check_cpu_precision(training_args, model_args)
    if training_args.use_liger_kernel and importlib.util.find_spec("liger_kernel") is None:
        raise RecipeError("use_liger_kernel needs the liger-kernel package: pip install '.[gpu]' (GPU hosts)")


def check_ranges(training_args, model_args) -> None:
    """Numbers out of their range, which transformers, torch or PEFT refuse only inside `trainer.train()`, after the
    model is loaded, with a traceback (or take silently: `max_steps 0` trained one step and saved the model)."""
    if training_args.max_steps == 0 or training_args.max_steps < -1:
        raise RecipeError(
            f"max_steps must be positive, or -1 for num_train_epochs (got {training_args.max_steps}): "
            "transformers trains one step for 0 and epochs for any negative"
        )
    counts = {
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "per_device_eval_batch_size": training_args.per_device_eval_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "max_length": training_args.max_length,
    }
    if model_args.use_peft:
        counts["lora_r"] = model_args.lora_r
    for key, value in counts.items():
        if value is not None and value < 1:
            raise RecipeError(f"{key} must be at least 1 (got {value})")
    if training_args.learning_rate < 0:
        raise RecipeError(f"learning_rate must not be negative (got {training_args.learning_rate})")
    if model_args.use_peft and not 0 <= model_args.lora_dropout < 1:
        raise RecipeError(f"lora_dropout is a probability below 1 (got {model_args.lora_dropout})")


def check_output_dir(recipe: RecipeArguments, training_args, model_args) -> None:
    """An output_dir that holds no earlier run's model: training wrote over it without a word (transformers'
    checkpoint rotation deleting that run's checkpoints too), or over the base model it starts from."""
    out = Path(training_args.output_dir).resolve()
    for name, folder in (("the base model", model_args.model_name_or_path), ("init_adapter", recipe.init_adapter)):
        if folder and Path(folder).is_dir() and Path(folder).resolve() == out:
            raise RecipeError(
                f"output_dir {training_args.output_dir} is {name}'s folder: training would write over the model it "
                "starts from; give another folder"
            )
    checkpoint = training_args.resume_from_checkpoint
    if checkpoint and not recipe.resume and not Path(checkpoint).is_dir():
        raise RecipeError(f"resume_from_checkpoint: no checkpoint folder at {checkpoint}")
    if recipe.resume or checkpoint or recipe.overwrite_output_dir or not out.is_dir():
        return
    held = [name for name in ("config.json", "adapter_config.json") if (out / name).is_file()]
    held += sorted(path.name for path in out.glob("checkpoint-*") if path.is_dir())[:2]
    if held:
        raise RecipeError(
            f"output_dir {training_args.output_dir} holds an earlier run's model or checkpoints "
            f"({', '.join(held)}): give a new folder, --resume true to go on with that run, or "
            "--overwrite_output_dir true to replace it"
        )


def check_packing(training_args, model_args) -> None:
    """Packed batches only with whole records kept apart: bfd packing and an attention that honours the record
    boundaries (PACKING_ATTENTION); with none set, the fastest one installed."""
    if training_args.padding_free and not training_args.packing:
        raise RecipeError(
            "padding_free without packing does not enforce max_length; use --packing true "
            "(packing_strategy bfd is padding-free)"
        )
    if not training_args.packing:
        return
    if training_args.packing_strategy != "bfd":
        raise RecipeError(
            f"packing_strategy {training_args.packing_strategy!r} cuts records or lets them attend to "
            "each other; use bfd (whole records, kept apart by their position ids)"
        )
    attention = model_args.attn_implementation
    if attention is None:
        model_args.attn_implementation = next(a for a in PACKING_ATTENTION_DEFAULTS if attention_available(a))
        logger.info("packed batches: attn_implementation %s", model_args.attn_implementation)
    elif attention not in PACKING_ATTENTION:
        raise RecipeError(
            f"attn_implementation {attention!r} is not known to keep packed records apart; use one "
            f"of {', '.join(PACKING_ATTENTION)} (or --packing false)"
        )
    elif not attention_available(attention):
        package = "flash-attn" if attention == "flash_attention_2" else "flash-attn-3 (flash_attn_interface)"
        raise RecipeError(
            f"attn_implementation {attention} needs a CUDA GPU and the {package} package; use "
            "flex_attention or sdpa, or leave it unset to take the best one installed"
        )


def attention_available(attention: str) -> bool:
    from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

    return {"flash_attention_3": is_flash_attn_3_available, "flash_attention_2": is_flash_attn_2_available}.get(
        attention, lambda: True
    )()


def check_quantization(training_args, model_args) -> None:
    """QLoRA (--load_in_4bit / --load_in_8bit): a LoRA adapter on a bitsandbytes-quantized base, on a CUDA GPU."""
    import torch

    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return
    flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit"
    if not model_args.use_peft:
        raise RecipeError(f"{flag} trains a LoRA adapter on a quantized base (QLoRA): set use_peft: true")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RecipeError(f"{flag} needs the bitsandbytes package: pip install '.[gpu]' (GPU hosts)")
    if training_args.use_cpu or not torch.cuda.is_available():
        raise RecipeError(f"{flag} needs a CUDA GPU (bitsandbytes quantization); this run has none")


def cpu_has_bfloat16() -> bool:
    """Whether torch multiplies bfloat16 on this CPU with oneDNN (`torch.ops.mkldnn._is_mkldnn_bf16_supported`, the
    test torch's own compiler makes: AVX-512 cores, AVX2-VNNI-2 or AMX on x86-64, BF16 on Arm) rather than with its
    fallback kernels, 10-30x slower than float32 (measured on AVX2, docs/training.md). True where torch has no such
    probe: `check_cpu_precision` refuses only what it knows torch would run slowly."""
    import torch

    probe = getattr(getattr(torch.ops, "mkldnn", None), "_is_mkldnn_bf16_supported", None)
    if probe is None:
        return True
    return bool(probe())


def check_cpu_precision(training_args, model_args) -> None:
    """The GPU recipes' bfloat16 (`bf16: true`, `dtype: bfloat16`, or `dtype: auto` on a bfloat16 checkpoint) in a
    run on a CPU where torch has no fast bfloat16 path (`cpu_has_bfloat16`): 10-30x slower than float32 there
    (SmolLM2-135M's steps, bench/train_cpu.py on a 2-core AMD EPYC with AVX2, docs/training.md), so a recipe of an
    hour would take a day. Refused before the model loads, with the keys that train in float32."""
    import torch

    if torch.cuda.is_available() and not training_args.use_cpu:
        return
    dtype = model_args.dtype
    if dtype == "auto":  # from_pretrained then loads the checkpoint's own dtype: bfloat16 for most released models
        dtype = f"auto (the checkpoint's {checkpoint_dtype(model_args.model_name_or_path)})"
    asked = {"bf16": training_args.bf16, f"dtype {dtype}": "bfloat16" in str(dtype)}
    keys = [key for key, on in asked.items() if on]
    if keys and not cpu_has_bfloat16():
        raise RecipeError(
            f"{' and '.join(keys)} on a CPU without oneDNN's bfloat16 (AVX-512, AMX or Arm BF16; this one has "
            f"{torch.backends.cpu.get_cpu_capability()}): torch's fallback is 10-30x slower than float32; "
            "pass --bf16 false --dtype float32"
        )


def checkpoint_dtype(model_name_or_path: str | None) -> str | None:
    """The dtype a local model folder's config.json was saved in, as transformers reads it (None where the folder
    does not say, or is not a local folder: a hub id is not fetched for this check)."""
    from transformers import AutoConfig

    if not model_name_or_path or not (Path(model_name_or_path).expanduser() / "config.json").is_file():
        return None
    try:
        dtype = AutoConfig.from_pretrained(Path(model_name_or_path).expanduser()).dtype
    except (OSError, ValueError):  # an unreadable config: check_model_source and from_pretrained say why
        return None
    return None if dtype is None else str(dtype).removeprefix("torch.")


def model_init_kwargs(training_args, model_args) -> dict:
    """`from_pretrained` keyword arguments from TRL's ModelConfig, as TRL's own scripts/sft.py builds them, plus
    the bitsandbytes config and device map of QLoRA; the recipe's `model_init_kwargs` win."""
    from accelerate import PartialState
    from trl import get_quantization_config

    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": training_args.trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    quantization = get_quantization_config(model_args)
    if quantization is not None:  # each process loads its quantized copy onto its own GPU
        kwargs.update(quantization_config=quantization, device_map={"": PartialState().local_process_index})
    return {**kwargs, **(training_args.model_init_kwargs or {})}


def check_model_source(model_name_or_path: str | None) -> None:
    """A local folder with a config.json, or a hub id (ORG/NAME). A path that names an existing local folder
    (`runs/tiny-bse` while `runs/` exists) is local: a typo there fails here instead of going to the hub."""
    if not model_name_or_path:
        raise RecipeError("no base model: set model_name_or_path in the recipe or pass --model_name_or_path DIR")
    path = Path(model_name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise RecipeError(f"{model_name_or_path} is not a model folder (no config.json)")
        return
    looks_local = (
        model_name_or_path.startswith(("/", ".", "~")) or model_name_or_path.count("/") != 1 or path.parent.is_dir()
    )
    if looks_local:
        raise RecipeError(f"base model folder not found: {model_name_or_path}")


def load_tokenizer(model_name_or_path: str, chat_template_path: str | None, **load_kwargs):
    """The base model's tokenizer, checked for a chat template (the records are chat messages)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, **load_kwargs)
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot load the tokenizer of {model_name_or_path}: {str(exc).splitlines()[0]}") from None
    if chat_template_path:
        # TRL reads a .jinja or .j2 file as the template and any other path as a tokenizer to copy one from (with
        # tokens added to the model); the records' lengths are counted with the template read here, so only a file.
        if Path(chat_template_path).suffix not in (".jinja", ".j2"):
            raise RecipeError(f"--chat_template_path {chat_template_path}: a template file named *.jinja or *.j2")
        if not Path(chat_template_path).is_file():
            raise RecipeError(f"chat template file not found: {chat_template_path}")
        tokenizer.chat_template = Path(chat_template_path).read_text(encoding="utf-8")
    if not tokenizer.chat_template:
        raise RecipeError(
            f"the tokenizer of {model_name_or_path} has no chat template; the training records are "
            "chat messages, so use a chat/instruct model or pass --chat_template_path FILE"
        )
    return tokenizer


def load_splits(recipe: RecipeArguments):
    """The dataset folder, checked for the splits and the conversational prompt/completion columns."""
    from datasets import DatasetDict, load_from_disk

    if not recipe.dataset_path:
        raise RecipeError("no dataset: set dataset_path in the recipe or pass --dataset_path DIR")
    path = Path(recipe.dataset_path)
    if not path.is_dir():
        raise RecipeError(f"dataset folder not found: {path} (build one with data/build_simulator_sft.py)")
    try:
        dataset = load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise RecipeError(f"{path} is not a dataset folder written by the data builders ({exc})") from None
    if not isinstance(dataset, DatasetDict):
        raise RecipeError(f"{path} holds a single dataset; expected splits ({recipe.train_split}, ...)")
    for split in [recipe.train_split, *recipe.eval_splits]:
        if split not in dataset:
            kind = dataset_stats(str(path)).get("kind")
            if kind in KIND_RECIPES and split not in KIND_RECIPES[kind][1]:  # the other kind's recipe, no typo
                raise RecipeError(
                    f"{path} is a {kind} dataset (its splits: {', '.join(dataset)}), and this recipe asks for the "
                    f"split {split!r} of the other kind's: use a {kind} recipe ({KIND_RECIPES[kind][0]}, whose "
                    f"eval_splits are {' '.join(KIND_RECIPES[kind][1])})"
                )
            raise RecipeError(
                f"{path} has no split {split!r} (it has: {', '.join(dataset)}); set --train_split / --eval_splits"
            )
    for split in [recipe.train_split, *recipe.eval_splits]:
        columns = dataset[split].column_names
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise RecipeError(
                f"split {split!r} of {path} lacks the column(s) {', '.join(missing)} "
                f"(it has: {', '.join(columns)}); expected conversational prompt/completion records"
            )
        for column in REQUIRED_COLUMNS:
            feature = dataset[split].features[column]
            inner = getattr(feature, "feature", None)
            if not isinstance(inner, dict) or not {"role", "content"} <= set(inner):
                raise RecipeError(
                    f"column {column!r} of split {split!r} in {path} is not a list of chat messages "
                    "({role, content})"
                )
    if len(dataset[recipe.train_split]) == 0:
        raise RecipeError(f"split {recipe.train_split!r} of {path} is empty")
    return dataset


def check_inputs(recipe: RecipeArguments, training_args, model_args):
    """Every check that needs no model weights; returns (tokenizer, DatasetDict)."""
    check_model_source(model_args.model_name_or_path)
    check_output_dir(recipe, training_args, model_args)
    dataset = load_splits(recipe)
    tokenizer = load_tokenizer(
        model_args.model_name_or_path,
        training_args.chat_template_path,
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
    )
    if recipe.resume:
        from transformers.trainer_utils import get_last_checkpoint

        if not Path(training_args.output_dir).is_dir() or get_last_checkpoint(training_args.output_dir) is None:
            raise RecipeError(f"--resume: no checkpoint in {training_args.output_dir}")
    if recipe.init_adapter:
        if not model_args.use_peft:
            raise RecipeError("init_adapter continues a LoRA adapter: it needs use_peft true")
        if not (Path(recipe.init_adapter) / "adapter_config.json").is_file():
            raise RecipeError(
                f"init_adapter: {recipe.init_adapter} is not a LoRA adapter folder (no adapter_config.json)"
            )
    return tokenizer, dataset


def training_splits(dataset, recipe: RecipeArguments, tokenizer, max_length: int | None, num_proc: int | None):
    """(train, {name: eval}) with only the prompt/completion columns, subsampled and length-filtered."""

    def prepare(split: str, limit: int | None):
        data = dataset[split]
        if split != recipe.train_split and "call_in_train" in data.column_names:
            # A held-out record whose call (API and arguments) the training split has is a cache hit on a server,
            # and rendered alike it may be a training record itself: the eval loss is about the calls it is not.
            before = len(data)
            data = data.filter(lambda r: not r["call_in_train"], desc=f"leaving out {split}'s training calls")
            logger.info("%s: %d of %d records are training calls, left out", split, before - len(data), before)
        data = data.select_columns(list(REQUIRED_COLUMNS))
        if recipe.drop_overlong and max_length:
            before = len(data)
            data = data.filter(
                lambda r: _length(tokenizer, r) <= max_length,
                num_proc=num_proc,
                desc=f"dropping {split} records over {max_length} tokens",
            )
            logger.info("%s: %d of %d records fit in %d tokens", split, len(data), before, max_length)
        if limit is not None:  # the first N records that fit
            data = data.select(range(min(limit, len(data))))
        return data

    train = prepare(recipe.train_split, recipe.max_train_samples)
    if len(train) == 0:
        raise RecipeError(f"no training record fits in max_length={max_length}; raise --max_length")
    evals = {name: prepare(name, recipe.max_eval_samples) for name in recipe.eval_splits}
    return train, {name: data for name, data in evals.items() if len(data)}


def _length(tokenizer, record: dict) -> int:
    # Tokenised here as well as in TRL: TRL truncates, and once truncated a record's length is lost.
    return len(
        tokenizer.apply_chat_template(record["prompt"] + record["completion"], tokenize=True, return_dict=True)[
            "input_ids"
        ]
    )


def dataset_stats(dataset_path: str) -> dict:
    import json

    stats_file = Path(dataset_path) / STATS_FILE
    return json.loads(stats_file.read_text(encoding="utf-8")) if stats_file.is_file() else {}
