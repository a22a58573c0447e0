"""The model card written next to trained weights: what was trained, on what, how, and how to serve it.

Two files: `README.md` (Hugging Face model-card layout, YAML front matter) for people, and
`mirrorapi_training.json` (the same facts) for programs, e.g. to check that a model is served with
the prompt format it was trained on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mirrorapi.models.catalogue import TRAINING_FILE
from mirrorapi.versions import package_versions, versions_line


def write_model_card(out_dir: str | os.PathLike, info: dict[str, Any]) -> Path:
    """`info`: base_model, kind (simulator|judge), prompt_format, adapter (bool), dataset_path,
    dataset_stats, recipe (config file + command line + resolved keys), metrics, log_history; `versions`
    (the software that trained it) is added unless given (a merged adapter keeps its training's)."""
    out_dir = Path(out_dir)
    info = {**info, "versions": info.get("versions") or package_versions()}
    (out_dir / TRAINING_FILE).write_text(
        json.dumps(info, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8"
    )
    (out_dir / "README.md").write_text(_readme(info), encoding="utf-8")
    return out_dir / "README.md"


def _readme(info: dict) -> str:
    kind = info.get("kind") or "model"
    stats = info.get("dataset_stats") or {}
    adapter = info.get("adapter", False)
    lines = [
        "---",
        f"base_model: {info['base_model']}",
        f"library_name: {'peft' if adapter else 'transformers'}",
        "pipeline_tag: text-generation",
        "tags: [mirrorapi, " + kind + ", trl, sft" + (", lora" if adapter else "") + "]",
        "---",
        "",
        f"# mirrorapi {kind}" + (" (LoRA adapter)" if adapter else ""),
        "",
        _purpose(kind),
        "",
        "| | |",
        "|---|---|",
        f"| base model | `{info['base_model']}` |",
        f"| prompt format | `{info.get('prompt_format')}` (serve it with the same format: `mirrorapi.prompts`) |",
        f"| training data | `{info.get('dataset_path')}` |",
        "| weights | "
        + (
            "LoRA adapter (`adapter_config.json`); `merged/` holds the merged model when `--merge` was given"
            if adapter
            else "full model"
        )
        + " |",
    ]
    for key, value in (info.get("metrics") or {}).items():
        lines.append(f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |")
    lines += ["", "## Data", ""]
    if stats:
        splits = stats.get("splits", {})
        lines.append("| split | records | APIs / groups | episodes |")
        lines.append("|---|---|---|---|")
        for name, split in splits.items():
            lines.append(
                f"| {name} | {split.get('records')} | {split.get('apis', split.get('groups', ''))} | "
                f"{split.get('episodes', '')} |"
            )
        lines += [
            "",
            "Build statistics (`stats.json` of the dataset):",
            "",
            "```json",
            json.dumps({k: stats[k] for k in ("read", "dropped", "kept") if k in stats}, indent=2),
            "```",
        ]
    else:
        lines.append("No `stats.json` was found beside the dataset.")
    recipe = info.get("recipe", {})
    lines += [
        "",
        "## Recipe",
        "",
        f"Config file: `{recipe.get('config_file')}`; command line: `{' '.join(recipe.get('argv', []))}`",
        "",
        "```yaml",
    ]
    lines += [f"{k}: {json.dumps(v, default=str)}" for k, v in sorted((recipe.get("resolved") or {}).items())]
    lines += [
        "```",
        "",
        "## Software",
        "",
        versions_line(info["versions"]) + f" (`versions` in `{TRAINING_FILE}`)",
        "",
        "## Serving",
        "",
        "```",
        _serve_command(adapter, info),
        "```",
        "",
    ]
    return "\n".join(lines)


def _purpose(kind: str) -> str:
    if kind == "simulator":
        return (
            "An API simulator: given an API's documentation and one request, it answers the JSON object "
            '`{"error": ..., "response": ...}` the real API would return. Trained on real request/response '
            "pairs."
        )
    if kind == "judge":
        return "A judge: given a query and an agent's final answer, it answers `Verdict: Solved|Unsolved`."
    return "A model fine-tuned with mirrorapi's `training/sft.py`."


# vLLM serves adapters up to --max-lora-rank (16 unless told), one of these values.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def _serve_command(adapter: bool, info: dict) -> str:
    if adapter:
        rank = (info.get("recipe", {}).get("resolved") or {}).get("lora_r") or 16
        max_rank = next((r for r in VLLM_LORA_RANKS if r >= rank), rank)
        return (
            "vllm serve " + str(info["base_model"]) + " --enable-lora --lora-modules mirrorapi=THIS_FOLDER "
            f"--max-lora-rank {max_rank} --generation-config vllm\n# or merge first: python training/merge_lora.py "
            "--adapter THIS_FOLDER --out MERGED"
        )
    return (
        "transformers serve THIS_FOLDER --device cpu    # CPU\n"
        "vllm serve THIS_FOLDER --served-model-name mirrorapi --generation-config vllm    # GPU"
    )
