"""What `training/sft.py` needs beyond TRL: recipe arguments, input checks, data loading, throughput
logging and LoRA merging.

Every check that can fail on a user's mistake runs before a model is loaded (`check_inputs`), so
a bad recipe costs seconds and ends in one `RecipeError` line, not a traceback after the model load.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from mirrorapi.data.simulator_sft import STATS_FILE

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("prompt", "completion")


class RecipeError(Exception):
    """A recipe that cannot run as given (bad key, path, dataset or tokenizer); the message says what to fix."""


@dataclass
class RecipeArguments:
    """mirrorapi's own recipe keys; the rest are TRL's `SFTConfig` and `ModelConfig` keys."""

    dataset_path: str | None = field(default=None, metadata={
        "help": "Folder written by data/build_simulator_sft.py or data/build_judge_sft.py."})
    train_split: str = field(default="train", metadata={"help": "Split to train on."})
    eval_splits: list[str] = field(default_factory=lambda: ["test_id", "test_ood"], metadata={
        "help": "Splits to report eval loss on (simulator: test_id test_ood; judge: test)."})
    max_train_samples: int | None = field(default=None, metadata={
        "help": "Train on the first N records (of those that fit in max_length)."})
    max_eval_samples: int | None = field(default=None, metadata={
        "help": "Evaluate on the first N records of each eval split (of those that fit)."})
    drop_overlong: bool = field(default=True, metadata={
        "help": "Drop records longer than max_length instead of truncating them: a cut completion teaches the "
                "simulator never to close its JSON."})
    resume: bool = field(default=False, metadata={"help": "Resume from the last checkpoint in output_dir."})
    merge: bool = field(default=False, metadata={
        "help": "LoRA only: also write the base model with the adapter merged in, to output_dir/merged."})


def check_recipe_file(config_file: str | None, dataclass_types) -> None:
    """A recipe YAML that exists, is a mapping, and uses only known keys (TRL would only say "unused")."""
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
    known = {f.name for cls in dataclass_types for f in dataclasses.fields(cls)} | {"env"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise RecipeError(f"unknown key(s) in {config_file}: {', '.join(unknown)} (`training/sft.py --help` "
                          "lists the keys)")


def check_model_source(model_name_or_path: str | None) -> None:
    if not model_name_or_path:
        raise RecipeError("no base model: set model_name_or_path in the recipe or pass --model_name_or_path DIR")
    path = Path(model_name_or_path).expanduser()
    looks_local = model_name_or_path.startswith(("/", ".", "~")) or model_name_or_path.count("/") != 1
    if looks_local and not path.is_dir():
        raise RecipeError(f"base model folder not found: {model_name_or_path}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise RecipeError(f"{model_name_or_path} is not a model folder (no config.json)")


def load_tokenizer(model_name_or_path: str, chat_template_path: str | None):
    """The base model's tokenizer, checked for a chat template (the records are chat messages)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    except (OSError, ValueError) as exc:
        raise RecipeError(f"cannot load the tokenizer of {model_name_or_path}: {str(exc).splitlines()[0]}") from None
    if chat_template_path:
        if not Path(chat_template_path).is_file():
            raise RecipeError(f"chat template file not found: {chat_template_path}")
        tokenizer.chat_template = Path(chat_template_path).read_text(encoding="utf-8")
    if not tokenizer.chat_template:
        raise RecipeError(f"the tokenizer of {model_name_or_path} has no chat template; the training records are "
                          "chat messages, so use a chat/instruct model or pass --chat_template_path FILE")
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
            raise RecipeError(f"{path} has no split {split!r} (it has: {', '.join(dataset)}); "
                              "set --train_split / --eval_splits")
    for split in [recipe.train_split, *recipe.eval_splits]:
        columns = dataset[split].column_names
        missing = [c for c in REQUIRED_COLUMNS if c not in columns]
        if missing:
            raise RecipeError(f"split {split!r} of {path} lacks the column(s) {', '.join(missing)} "
                              f"(it has: {', '.join(columns)}); expected conversational prompt/completion records")
        for column in REQUIRED_COLUMNS:
            feature = dataset[split].features[column]
            inner = getattr(feature, "feature", None)
            if not isinstance(inner, dict) or not {"role", "content"} <= set(inner):
                raise RecipeError(f"column {column!r} of split {split!r} in {path} is not a list of chat messages "
                                  "({role, content})")
    if len(dataset[recipe.train_split]) == 0:
        raise RecipeError(f"split {recipe.train_split!r} of {path} is empty")
    return dataset


def check_inputs(recipe: RecipeArguments, training_args, model_args):
    """Every check that needs no model weights; returns (tokenizer, DatasetDict)."""
    check_model_source(model_args.model_name_or_path)
    dataset = load_splits(recipe)
    tokenizer = load_tokenizer(model_args.model_name_or_path, training_args.chat_template_path)
    if recipe.resume:
        from transformers.trainer_utils import get_last_checkpoint

        if not Path(training_args.output_dir).is_dir() or get_last_checkpoint(training_args.output_dir) is None:
            raise RecipeError(f"--resume: no checkpoint in {training_args.output_dir}")
    if recipe.merge and not model_args.use_peft:
        raise RecipeError("--merge applies to LoRA training only (set use_peft: true)")
    return tokenizer, dataset


def training_splits(dataset, recipe: RecipeArguments, tokenizer, max_length: int | None, num_proc: int | None):
    """(train, {name: eval}) with only the prompt/completion columns, subsampled and length-filtered."""
    def prepare(split: str, limit: int | None):
        data = dataset[split].select_columns(list(REQUIRED_COLUMNS))
        if recipe.drop_overlong and max_length:
            before = len(data)
            data = data.filter(lambda r: _length(tokenizer, r) <= max_length, num_proc=num_proc,
                               desc=f"dropping {split} records over {max_length} tokens")
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
    return len(tokenizer.apply_chat_template(record["prompt"] + record["completion"], tokenize=True,
                                             return_dict=True)["input_ids"])


def throughput_trainer_class():
    """`SFTTrainer` that adds `tokens_per_second` (since the previous log line) to every training log."""
    from trl import SFTTrainer

    class ThroughputSFTTrainer(SFTTrainer):
        _last_tokens, _last_time = 0, None

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            tokens = self._metrics["train"].get("num_tokens")
            if self.model.training and tokens and "loss" in logs:
                now = time.perf_counter()
                if self._last_time is not None and now > self._last_time:
                    logs["tokens_per_second"] = round((tokens[-1] - self._last_tokens) / (now - self._last_time), 1)
                self._last_tokens, self._last_time = tokens[-1], now
            super().log(logs, start_time)

        def train(self, *args, **kwargs):
            self._last_time = time.perf_counter()
            return super().train(*args, **kwargs)

    return ThroughputSFTTrainer


def final_eval_losses(trainer) -> dict[str, float]:
    """Eval losses of the final weights: those logged at the last step, else a fresh evaluation."""
    step = trainer.state.global_step
    logged = {k: v for entry in trainer.state.log_history if entry.get("step") == step
              for k, v in entry.items() if k.startswith("eval_") and k.endswith("_loss")}
    return logged or {k: v for k, v in trainer.evaluate().items() if k.endswith("_loss")}


def merge_lora(adapter_dir: str | os.PathLike, out_dir: str | os.PathLike, base_model: str | None = None) -> Path:
    """Base model + LoRA adapter -> one plain model folder (`transformers serve` / `vllm serve` load it as is)."""
    from peft import PeftConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    if not (adapter_dir / "adapter_config.json").is_file():
        raise RecipeError(f"{adapter_dir} is not a LoRA adapter folder (no adapter_config.json)")
    base_model = base_model or PeftConfig.from_pretrained(str(adapter_dir)).base_model_name_or_path
    check_model_source(base_model)
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype="auto")
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(str(adapter_dir)).save_pretrained(out_dir)
    logger.info("merged %s into %s -> %s", adapter_dir, base_model, out_dir)
    return out_dir


def dataset_stats(dataset_path: str) -> dict:
    import json

    stats_file = Path(dataset_path) / STATS_FILE
    return json.loads(stats_file.read_text(encoding="utf-8")) if stats_file.is_file() else {}
