"""A tiny Qwen2-architecture model built from scratch, for tests, the demo and CPU laptops.

No model hub is reachable here, so the tokenizer is trained locally (byte-level BPE with Qwen2's
own pre-tokenizer and NFC normaliser: `AutoTokenizer.from_pretrained` of a `qwen2` folder
rebuilds exactly those, so token ids survive a save/reload) and the weights are random. The folder
loads through the real paths: `from_pretrained(DIR)`, `transformers serve DIR`, `vllm serve DIR`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as Qwen2.5 uses it, with `{% generation %}` around the assistant's text so that TRL can
# restrict the loss to it (`assistant_only_loss=True`).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# The real sample of a source checkout (`data/samples`). It is not part of the wheel: an installed
# mirrorapi has no default corpus and says so, instead of training a tokenizer on nothing.
SAMPLES = Path(__file__).resolve().parents[2] / "data" / "samples"


class CorpusError(Exception):
    """No text to train the tokenizer on; the message says what to pass instead."""


def default_corpus() -> list[Path]:
    """The bundled real sample of a source checkout: tool docs, request/response pairs and judged answers."""
    files = sorted(SAMPLES.glob("*.jsonl")) + sorted(SAMPLES.glob("tools/*/*.json"))
    if not files:
        raise CorpusError(
            f"no tokenizer corpus: the sample data {SAMPLES} exists only in a source checkout of "
            "mirrorapi (it is not installed with the wheel); pass corpus=[files] "
            "(scripts/make_tiny_model.py --corpus FILE ...), e.g. your pairs JSONL and tool docs"
        )
    return files


def _corpus_files(corpus: Iterable[str | Path]) -> list[Path]:
    files = [Path(path) for path in corpus]
    missing = [str(path) for path in files if not path.is_file()]
    if not files or missing:
        raise CorpusError(
            "tokenizer corpus: " + (f"not a file: {', '.join(missing)}" if missing else "no files given")
        )
    return files


def _texts(files: Iterable[Path]) -> Iterator[str]:
    for path in files:
        with open(path, encoding="utf-8") as fh:
            if path.suffix == ".jsonl":
                yield from fh
            else:
                yield fh.read()


def train_tokenizer(corpus: Iterable[Path], vocab_size: int = 1024):
    """A `Qwen2Tokenizer` whose BPE was trained here on `corpus`, with the ChatML template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_texts(corpus), trainer)
    model = json.loads(bpe.to_str())["model"]
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"],
        # ChatML's <|im_start|> stays a vocabulary token, not a special one (Qwen2.5's is special): made special
        # (extra_special_tokens), the tests' 120-step memorisation answered 39 of 48 training prompts as JSON
        # instead of 46 or more, so the test model keeps the tokenizer its figures were measured with.
        merges=merges,  # it takes pairs too
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_model(
    out_dir: str | Path,
    corpus: Iterable[Path] | None = None,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 512,
    max_positions: int = 4096,
    seed: int = 0,
) -> Path:
    """Write tokenizer, config, generation config and random weights to `out_dir`; returns it."""
    files = _corpus_files(corpus) if corpus is not None else default_corpus()  # before the slow imports
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out_dir = Path(out_dir)
    tokenizer = train_tokenizer(files, vocab_size)
    im_end, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=pad,
        eos_token_id=im_end,
        pad_token_id=pad,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # Greedy by default: a simulator should answer the same way every time.
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, pad], pad_token_id=pad, bos_token_id=pad, do_sample=False
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
