"""The models' commands: `mirrorapi models get | gguf | list`, for base models and the shipped ones."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mirrorapi.command_line import Command, add_group
from mirrorapi.models.catalogue import BASE_MODELS, SHIPPED_MODELS

DIR_HELP = (
    "Where models are kept (default: $MIRRORAPI_MODELS_DIR, else ~/.cache/mirrorapi/models; "
    "XDG_CACHE_HOME is honoured)."
)


def models_get_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name",
        choices=sorted(BASE_MODELS) + sorted(SHIPPED_MODELS),
        help="A base model, or a model this project ships (`mirrorapi models list`).",
    )
    parser.add_argument("--models-dir", metavar="DIR", help=DIR_HELP)
    parser.add_argument("--index-url", metavar="URL", help="Package index to download from (default: pip's own).")
    parser.add_argument("--force", action="store_true", help="Download and convert again even if the folder exists.")
    parser.add_argument(
        "--adapter",
        metavar="DIR",
        help="A shipped model only: merge this adapter folder (adapter_config.json, "
        "adapter_model.safetensors, README.md, mirrorapi_training.json) instead of the one the "
        "package ships, e.g. one being tried before it ships.",
    )


def models_gguf_arguments(parser: argparse.ArgumentParser) -> None:
    from mirrorapi.models.to_gguf import SERVED_TENSOR_TYPE, TENSOR_TYPES

    parser.add_argument(
        "model_dir", help="A folder `models get` made, or a fine-tune of one (README.md's base_model)."
    )
    parser.add_argument(
        "--type",
        choices=TENSOR_TYPES,
        default=SERVED_TENSOR_TYPE,
        help=f"Tensor type of the matrices (default {SERVED_TENSOR_TYPE}).",
    )
    parser.add_argument("--out", metavar="FILE", help="Export to FILE instead (with --base-gguf).")
    parser.add_argument("--base-gguf", metavar="FILE", help="The base model's GGUF, for --out.")


def models_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-dir", metavar="DIR", help=DIR_HELP)


def models_get(args: argparse.Namespace) -> int:
    from mirrorapi.models.catalogue import ModelGetError
    from mirrorapi.models.get import get_base_model
    from mirrorapi.models.shipped import get_shipped_model

    try:
        if args.name in SHIPPED_MODELS:
            folder = get_shipped_model(
                args.name, args.models_dir, adapter_dir=args.adapter, index_url=args.index_url, force=args.force
            )
        elif args.adapter:
            raise ModelGetError(
                f"--adapter is for the shipped models ({', '.join(sorted(SHIPPED_MODELS))}), not the "
                f"base model {args.name}"
            )
        else:
            folder = get_base_model(args.name, args.models_dir, index_url=args.index_url, force=args.force)
    except ModelGetError as exc:
        print(f"mirrorapi models get: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a models folder that cannot be made or written (a file in its way, no permission)
        print(f"mirrorapi models get: error: {exc}", file=sys.stderr)
        return 1
    print(folder)  # the one line on standard output: `MODEL=$(mirrorapi models get NAME)`
    return 0


def models_gguf(args: argparse.Namespace) -> int:
    from mirrorapi.models.to_gguf import GGUFExportError, export_gguf, gguf_for_serving

    try:
        if args.out:
            if not args.base_gguf:
                raise GGUFExportError("--out needs --base-gguf (the base model's GGUF: metadata and tokenizer)")
            path = export_gguf(args.model_dir, args.out, args.base_gguf, args.type)
        else:
            path = gguf_for_serving(args.model_dir, args.type)
    except (GGUFExportError, OSError) as exc:  # a folder that is not a model, or one this user cannot write
        print(f"mirrorapi models gguf: error: {exc}", file=sys.stderr)
        return 2
    print(path)  # the one line on standard output: `GGUF=$(mirrorapi models gguf DIR)`
    return 0


def models_list(args: argparse.Namespace) -> int:
    from mirrorapi.models.catalogue import (
        ADAPTERS_DIR,
        adapter_digest,
        default_models_dir,
        is_complete,
        is_shipped_complete,
        missing_adapter_files,
    )

    models_dir = Path(args.models_dir or default_models_dir())
    for name, source in BASE_MODELS.items():
        state = "downloaded" if is_complete(models_dir / name, source) else "not downloaded"
        print(f"{name}  {source.requirement} ({source.licence}, {source.quantisation} dequantised)  {state}")
    for name, model in SHIPPED_MODELS.items():
        adapter = ADAPTERS_DIR / name
        if missing_adapter_files(adapter):
            state = "not shipped yet"
        else:
            made = is_shipped_complete(
                models_dir / name, adapter_digest(adapter), BASE_MODELS[model.base].wheel_sha256
            )
            state = "made" if made else "not made yet (`models get` merges it)"
        print(f"{name}  {model.kind}, a LoRA adapter on {model.base} shipped in this package  {state}")
    return 0


MODELS_COMMANDS = [
    Command(
        "get",
        "Download (pinned package, sha256 checked) and convert a base model, or merge a shipped model's "
        "adapter into its base model; print its folder. A second call reuses the folder.",
        models_get_arguments,
        models_get,
    ),
    Command(
        "gguf",
        "The GGUF file llama.cpp serves for a model folder; print its path. A base model's own; a "
        "fine-tune of one exported (once) into its folder.",
        models_gguf_arguments,
        models_gguf,
    ),
    Command(
        "list",
        "The models `get` knows (base and shipped), and which are in the models folder.",
        models_list_arguments,
        models_list,
    ),
]


def register(sub) -> None:
    """The models' subcommands of `mirrorapi`."""
    add_group(
        sub, "models", "Get pretrained base models and the shipped models as Hugging Face folders.", MODELS_COMMANDS
    )
