"""A fine-tuned Hugging Face folder back into GGUF, so that llama.cpp can serve it.

llama.cpp's own converter (`convert_hf_to_gguf.py`) lives in its source tree, not in an installed package. The
`gguf` package (llama.cpp's, on PyPI) has what a converter needs: the writer, llama.cpp's tensor names
(`TensorNameMap`) and the Q8_0 quantiser. What we write by hand is the glue for the one case we need: a
fine-tune of a base model whose GGUF we hold (`mirrorapi models get` keeps it). The base GGUF gives every
metadata key and the tokenizer unchanged, so nothing about the vocabulary is re-derived; the fine-tune gives the
tensors (and its chat template). Checked before writing: same architecture, sizes and vocabulary.

One conversion matters: llama.cpp applies rotary embeddings to interleaved pairs of a head's dimensions,
transformers to its two halves, so the rows of q and k are permuted in GGUF (transformers undoes this when it
loads a llama GGUF; we redo it).

Tensor types: norms stay F32 (as llama.cpp writes them); matrices in `tensor_type`: f16 (default: the same
greedy tokens as transformers, half the size of f32), q8_0 (a quarter, ~1.4x faster on 2 cores, logits move a
little) or f32 (bench/engines.py measured all three).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from mirrorapi.models.catalogue import BASE_MODELS, base_gguf, default_models_dir, shipped_gguf

if TYPE_CHECKING:
    import numpy as np

TENSOR_TYPES = ("f16", "q8_0", "f32")
SERVED_TENSOR_TYPE = "f16"  # what `gguf_for_serving` writes (bench/engines.py: speed and fidelity of each)


class GGUFExportError(ValueError):
    """The folder cannot be exported against this base GGUF (other architecture, sizes or vocabulary)."""


def permute_for_gguf(weight: np.ndarray, n_head: int) -> np.ndarray:
    """q or k rows from transformers' order (each head: first half, then second half of the rotary
    dimensions) to llama.cpp's (each head: the two halves interleaved)."""
    half = weight.shape[0] // n_head // 2
    return weight.reshape(n_head, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def export_gguf(
    model_dir: str | os.PathLike, out_path: str | os.PathLike, base_gguf: str | os.PathLike, tensor_type: str = "f16"
) -> Path:
    """Write `out_path` (atomically: a temporary file renamed at the end) from the safetensors of `model_dir`,
    with the metadata and tokenizer of `base_gguf`."""
    import gguf  # here, not at the top: the command line imports this module; the train extra has gguf

    if tensor_type not in TENSOR_TYPES:
        raise GGUFExportError(f"tensor type {tensor_type!r}: one of {', '.join(TENSOR_TYPES)}")
    model_dir, out_path = Path(model_dir), Path(out_path)
    config = _read_config(model_dir)
    reader = read_base_gguf(base_gguf)
    arch = reader.fields["general.architecture"].contents()
    _check_compatible(config, reader, arch, model_dir)
    n_blocks, n_head, n_kv = config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks)
    tied = bool(config.get("tie_word_embeddings", False))
    quant = {
        "f16": gguf.GGMLQuantizationType.F16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "f32": gguf.GGMLQuantizationType.F32,
    }[tensor_type]

    tmp_path = out_path.with_name(out_path.name + ".partial")
    writer = gguf.GGUFWriter(tmp_path, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in (
            "general.architecture",
            "general.file_type",
            "tokenizer.chat_template",
        ):
            continue
        main_type = field.types[0]
        sub_type = field.types[-1] if main_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), main_type, sub_type=sub_type)
    writer.add_file_type(
        {
            "f16": gguf.LlamaFileType.MOSTLY_F16,
            "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
            "f32": gguf.LlamaFileType.ALL_F32,
        }[tensor_type]
    )
    base_template = reader.fields.get("tokenizer.chat_template")
    template = _chat_template(model_dir) or (base_template.contents() if base_template is not None else None)
    if template:
        writer.add_chat_template(template)

    written = set()
    for hf_name, tensor in _tensors(model_dir):
        if hf_name == "lm_head.weight" and tied:
            continue  # llama.cpp reuses token_embd when there is no output.weight
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise GGUFExportError(f"{model_dir}: tensor {hf_name} has no llama.cpp name")
        if ".attn_q." in gguf_name:
            tensor = permute_for_gguf(tensor, n_head)
        elif ".attn_k." in gguf_name:
            tensor = permute_for_gguf(tensor, n_kv)
        _add_tensor(writer, gguf, gguf_name, tensor, quant)
        written.add(gguf_name)
    expected = {t.name for t in reader.tensors}
    if written != expected:
        raise GGUFExportError(
            f"{model_dir}: tensors differ from the base GGUF's: missing "
            f"{sorted(expected - written)[:5]}, extra {sorted(written - expected)[:5]}"
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp_path, out_path)
    return out_path


def read_base_gguf(path: str | os.PathLike):
    """`gguf.GGUFReader(path)`, parsed once per version of the file (its inode, size and modification time: a file
    replaced or rewritten is read again). Reading a base's metadata takes ~5 s on a 2-core machine (gguf-py reads each
    of the tokenizer's ~100,000 strings through a numpy memmap view), and one process exports several fine-tunes of
    one base: `make demo` four."""
    stat = os.stat(path)
    return _read_gguf(os.path.realpath(path), (stat.st_ino, stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=2)
def _read_gguf(path: str, version: tuple[int, int, int]):
    import gguf  # here, not at the top (export_gguf says why)

    return gguf.GGUFReader(path)  # read-only ("r"): the readers handed out cannot change it


def gguf_for_serving(model_dir: str | os.PathLike, tensor_type: str = SERVED_TENSOR_TYPE) -> Path:
    """The GGUF llama.cpp serves for the folder `model_dir`:
    - a base model `mirrorapi models get` made: its original GGUF, kept in the folder;
    - a shipped model `mirrorapi models get` made: the GGUF it exported into the folder;
    - a fine-tune of one (its README's `base_model`, the Hugging Face model-card field our training cards
      write, names that folder): `model-<tensor_type>.gguf` in `model_dir`, exported on first use and again
      when the weights are newer than it.
    GGUFExportError (one line) for any other folder: a model with no base GGUF to take the tokenizer from."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise GGUFExportError(f"{model_dir}: not a model folder")
    own = base_gguf(model_dir) or shipped_gguf(model_dir)
    if own is not None:
        return own
    _refuse_an_adapter(model_dir)
    named, base = _base_model_of(model_dir)
    base_file = base_gguf(base) if base is not None else None
    if base_file is None:
        what = (
            "its README.md names no base_model"
            if named is None
            else f"its base model {named} is not a folder made by `mirrorapi models get`"
        )
        raise GGUFExportError(f"{model_dir}: {what}, so there is no GGUF to take the tokenizer from")
    out = model_dir / f"model-{tensor_type}.gguf"
    weights = list(model_dir.glob("*.safetensors")) + [model_dir / "config.json"]
    if out.is_file() and all(out.stat().st_mtime >= w.stat().st_mtime for w in weights if w.exists()):
        return out
    return export_gguf(model_dir, out, base_file, tensor_type)


def _base_model_of(model_dir: Path) -> tuple[str | None, Path | None]:
    """(what `base_model:` in the front matter of the folder's README.md says, the local folder it names), each
    None when there is none."""
    try:
        text = (model_dir / "README.md").read_text(encoding="utf-8")
    except OSError:
        return None, None
    front = text.split("---", 2)[1] if text.startswith("---") and text.count("---") >= 2 else ""
    found = re.search(r"^base_model:\s*(.+?)\s*$", front, re.M)
    if not found:
        return None, None
    name = found.group(1).strip("'\"")
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = (model_dir / path) if (model_dir / path).is_dir() else path
    if not path.is_dir() and name in BASE_MODELS:  # a catalogue name: the folder `models get` made of it
        path = default_models_dir() / name
    return name, (path if path.is_dir() else None)


def _add_tensor(writer, gguf, name: str, tensor: np.ndarray, quant) -> None:
    import numpy as np  # here: the command line reads this module's constants without the train extra

    if tensor.ndim == 1 or quant == gguf.GGMLQuantizationType.F32:
        writer.add_tensor(name, np.ascontiguousarray(tensor, dtype=np.float32))
    elif quant == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, np.ascontiguousarray(tensor, dtype=np.float16))
    else:  # rows must be whole Q8_0 blocks (32 values); SmolLM2's 576 and 1536 are
        data = gguf.quants.quantize(np.ascontiguousarray(tensor, dtype=np.float32), quant)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=quant)


def _refuse_an_adapter(model_dir: Path) -> None:
    if (model_dir / "adapter_config.json").is_file() and not (model_dir / "config.json").is_file():
        raise GGUFExportError(
            f"{model_dir} is a LoRA adapter: merge it first (training/merge_lora.py) and export the merged folder"
        )


def _read_config(model_dir: Path) -> dict:
    _refuse_an_adapter(model_dir)
    try:
        return json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GGUFExportError(f"{model_dir}: no readable config.json ({exc})") from None


def _check_compatible(config: dict, reader, arch: str, model_dir: Path) -> None:
    def meta(key: str):
        field = reader.fields.get(f"{arch}.{key}")
        return field.contents() if field is not None else None

    if arch != "llama" or config.get("model_type") != "llama":
        raise GGUFExportError(
            f"{model_dir}: model_type {config.get('model_type')!r} with a base GGUF of "
            f"architecture {arch!r}: only llama fine-tunes of a llama GGUF are exported"
        )
    pairs = {
        "num_hidden_layers": "block_count",
        "hidden_size": "embedding_length",
        "intermediate_size": "feed_forward_length",
        "num_attention_heads": "attention.head_count",
        "num_key_value_heads": "attention.head_count_kv",
    }
    for hf_key, gguf_key in pairs.items():
        if config.get(hf_key) != meta(gguf_key):
            raise GGUFExportError(
                f"{model_dir}: {hf_key} {config.get(hf_key)} differs from the base GGUF's "
                f"{arch}.{gguf_key} {meta(gguf_key)}: not a fine-tune of that model"
            )
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    vocab = _vocabulary(model_dir)
    if config.get("vocab_size") != len(tokens) or (vocab is not None and vocab != tokens[: len(vocab)]):
        raise GGUFExportError(
            f"{model_dir}: its tokenizer differs from the base GGUF's ({len(tokens)} tokens); "
            "a changed vocabulary cannot reuse the base's tokenizer"
        )


def _vocabulary(model_dir: Path) -> list[str | None] | None:
    """The tokens by id from tokenizer.json (base vocabulary and added tokens; None for an id no token has),
    or None without one."""
    try:
        data = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    except OSError:
        return None
    by_id = {index: token for token, index in data["model"]["vocab"].items()}
    by_id.update({added["id"]: added["content"] for added in data.get("added_tokens", [])})
    return [by_id.get(i) for i in range(max(by_id) + 1)]


def _chat_template(model_dir: Path) -> str | None:
    """The folder's chat template without TRL's `{% generation %}` markers: they only mark the assistant's
    tokens for training, render nothing, and are not Jinja that llama.cpp's template engine knows."""
    path = model_dir / "chat_template.jinja"
    template: object
    if path.is_file():
        template = path.read_text(encoding="utf-8")
    else:
        # transformers 4.x and many hub folders keep it in tokenizer_config.json, which transformers reads too:
        # without it the export took the base's template, and llama.cpp built other prompts than transformers
        config = model_dir / "tokenizer_config.json"
        template = json.loads(config.read_text(encoding="utf-8")).get("chat_template") if config.is_file() else None
        if not isinstance(template, str):
            return None
    return re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", template)


def _tensors(model_dir: Path):
    """(name, float32 array) for every tensor of the folder's safetensors files (one or several shards)."""
    import torch  # safetensors' numpy reader cannot read bfloat16 (what GPU fine-tunes save)
    from safetensors import safe_open

    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise GGUFExportError(f"{model_dir}: no .safetensors files")
    from safetensors import SafetensorError

    for file in files:
        try:
            handle = safe_open(file, framework="pt")
        except SafetensorError as exc:  # a file cut short (a copy or a save interrupted): one line, not a traceback
            raise GGUFExportError(f"{file}: not a whole safetensors file ({exc})") from None
        with handle:
            for name in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                yield name, handle.get_tensor(name).to(torch.float32).numpy()
