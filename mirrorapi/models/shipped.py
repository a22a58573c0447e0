"""`mirrorapi models get NAME` of a model this project ships: its LoRA adapter (package data, in
`mirrorapi/models/adapters/<name>/`) merged into its base model, as one complete folder.

The folder `<models dir>/<name>/` holds what both CPU engines serve as it is: the merged safetensors, the
tokenizer and chat template, the GGUF llama.cpp serves (`model-f16.gguf`, exported with the base GGUF's metadata
and tokenizer: `mirrorapi.models.to_gguf`), the model card (the adapter's README.md: data, recipe, scores,
licence), the base model's LICENSE and the training run's record (`mirrorapi_training.json`: its prompt format
and the server settings it must be served with). Like a base model's folder it is built beside its place and
renamed into it, its card (`mirrorapi_shipped_model.json`, written last) names the adapter files' sha256 and the
base model's pin, and a second call reuses it; a new adapter (a new release of the package) builds it again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from mirrorapi.models.catalogue import (
    ADAPTERS_DIR,
    BASE_MODELS,
    SHIPPED_CARD_FILE,
    SHIPPED_MODELS,
    TRAINING_FILE,
    ModelGetError,
    adapter_digest,
    base_gguf,
    default_models_dir,
    is_shipped_complete,
    missing_adapter_files,
    read_card,
    read_training_record,
)
from mirrorapi.models.get import get_base_model, move_into_place, readable_as_the_umask_says, remove_stale_builds
from mirrorapi.models.merge import merge_adapter
from mirrorapi.models.to_gguf import SERVED_TENSOR_TYPE, export_gguf
from mirrorapi.versions import package_versions

GGUF_FILE = f"model-{SERVED_TENSOR_TYPE}.gguf"  # the name `gguf_for_serving` gives a fine-tune's export


def get_shipped_model(
    name: str,
    models_dir: str | os.PathLike | None = None,
    *,
    adapter_dir: str | os.PathLike | None = None,
    index_url: str | None = None,
    force: bool = False,
    base_dir: str | os.PathLike | None = None,
    progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr),  # noqa: T201
) -> Path:
    """The folder of shipped model `name`, made on first use. `adapter_dir` replaces the package's adapter (one
    being tried before it ships); `base_dir` a base model folder to merge into instead of getting the catalogue's
    (the tests' tiny model: a base without a GGUF gives a folder without one); `index_url` goes to the base's
    download. ModelGetError (one line) when the adapter is not there."""
    if name not in SHIPPED_MODELS:
        raise ModelGetError(f"unknown shipped model {name!r} (known: {', '.join(sorted(SHIPPED_MODELS))})")
    model = SHIPPED_MODELS[name]
    own = adapter_dir is None
    adapter = ADAPTERS_DIR / name if own else Path(adapter_dir)  # type: ignore[arg-type]
    missing = missing_adapter_files(adapter)
    if missing:
        if own:
            raise ModelGetError(
                f"{name}: the adapter is not shipped yet (mirrorapi/models/adapters/{name}/ lacks "
                f"{', '.join(missing)}; its README.md says what will be there); pass --adapter DIR "
                "to use an adapter folder of your own"
            )
        raise ModelGetError(f"{adapter} is not an adapter folder to ship: it lacks {', '.join(missing)}")
    record = read_training_record(adapter)
    if record is None or not record.get("prompt_format"):
        raise ModelGetError(f"{adapter / TRAINING_FILE}: not a training record with a prompt_format")
    if record.get("kind") not in (None, model.kind):
        raise ModelGetError(f"{adapter}: a {record.get('kind')} adapter, where {name} is a {model.kind}")
    digests = adapter_digest(adapter)
    source = BASE_MODELS[model.base]
    base_pin = source.wheel_sha256 if base_dir is None else _wheel_sha256(Path(base_dir))
    models_dir = Path(models_dir) if models_dir is not None else default_models_dir()
    target = models_dir / name

    def complete(folder: Path) -> bool:
        return is_shipped_complete(folder, digests, base_pin)

    if not force and complete(target):
        progress(f"{name}: reusing {target}")
        return target
    base = (
        Path(base_dir)
        if base_dir is not None
        else get_base_model(model.base, models_dir, index_url=index_url, progress=progress)
    )
    models_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_builds(models_dir, name)
    with tempfile.TemporaryDirectory(prefix=f".{name}.partial-", dir=models_dir) as partial:
        built = Path(partial) / "model"
        _build(name, adapter, record, base, built, progress)
        _write_card(built, name, adapter if not own else None, digests, base, base_pin)
        readable_as_the_umask_says(built)
        move_into_place(built, target, complete, replace=force)
    progress(f"{name}: ready in {target}")
    return target


def _wheel_sha256(base: Path) -> str | None:
    return ((read_card(base) or {}).get("source") or {}).get("wheel_sha256")


def _build(name: str, adapter: Path, record: dict, base: Path, built: Path, progress: Callable[[str], None]) -> None:
    progress(f"{name}: merging the adapter into {base}")
    try:
        merge_adapter(adapter, base, built)
    except (RuntimeError, OSError) as exc:  # an adapter of another base (`--adapter`): 28 lines of size mismatches
        raise ModelGetError(
            f"{name}: cannot merge {adapter} into {base}: the adapter's weights do not fit it "
            f"({str(exc).strip().splitlines()[0]}; is it an adapter of {base.name}?)"
        ) from None
    (built / "README.md").write_text(
        merged_card((adapter / "README.md").read_text(encoding="utf-8")), encoding="utf-8"
    )
    (built / TRAINING_FILE).write_text(
        json.dumps({**record, "adapter": False}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    if (base / "LICENSE").is_file():
        shutil.copyfile(base / "LICENSE", built / "LICENSE")
    base_file = base_gguf(base)
    if base_file is not None:
        progress(f"{name}: exporting {GGUF_FILE} for llama.cpp")
        export_gguf(built, built / GGUF_FILE, base_file, SERVED_TENSOR_TYPE)


def merged_card(adapter_card: str) -> str:
    """The adapter's model card (data, recipe, scores, licence) for the merged folder: the Hub's `library_name` is
    the library that loads the folder (transformers; `peft` made the Hub and PEFT look for an adapter_config.json
    it has not), and a line says what the folder is."""
    front, separator, body = adapter_card.partition("\n---\n") if adapter_card.startswith("---\n") else ("", "", "")
    if not separator:
        return adapter_card
    front = re.sub(r"^library_name:.*$", "library_name: transformers", front, flags=re.M)
    note = (
        "\n> This folder is the adapter merged into its base model by `mirrorapi models get` (whole weights, and\n"
        f"> `{GGUF_FILE}` for llama.cpp); the LoRA adapter itself ships in the `mirrorapi` package.\n"
    )
    return front + separator + note + body


def _write_card(
    built: Path, name: str, adapter: Path | None, digests: dict[str, str], base: Path, base_pin: str | None
) -> None:
    """SHIPPED_CARD_FILE, last: its presence marks the folder complete."""
    source = str(adapter) if adapter else f"the mirrorapi package (mirrorapi/models/adapters/{name})"
    card = {
        "name": name,
        "adapter": {"from": source, "sha256": digests},
        "base": {"name": SHIPPED_MODELS[name].base, "folder": str(base), "wheel_sha256": base_pin},
        "weights": {"gguf_file": GGUF_FILE if (built / GGUF_FILE).is_file() else None},
        "versions": package_versions(),
    }
    (built / SHIPPED_CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
