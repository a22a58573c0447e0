"""The software a run used: Python, mirrorapi (and its git commit in a checkout) and the key libraries.

Recorded in everything a run writes (model cards, evaluation reports, the demo report, `bench/` JSON), so
that a figure can be traced to, and reproduced with, the same software later (`make venv` installs the
versions of `requirements-cpu.lock`; a GPU host's may differ).
"""

from __future__ import annotations

import functools
import platform
import subprocess
from importlib import metadata
from pathlib import Path

# The distributions whose versions change results or speed; those not installed (an extra left out, vLLM
# on a CPU host) are left out of the record.
KEY_PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "numpy",
    "fastapi",
    "uvicorn",
    "openai",
    "mcp",
    "sacrebleu",
    "rouge-score",
    "vllm",
    "llama-cpp-python",
    "gguf",
    "liger-kernel",
    "bitsandbytes",
)
_CHECKOUT = Path(__file__).resolve().parents[1]


def package_versions() -> dict[str, str]:
    """{"python": "3.11.7", "mirrorapi": "0.1.0", "mirrorapi_commit": "<sha>[-dirty]", "torch": ..., ...}:
    `mirrorapi_commit` only when mirrorapi runs from a git checkout (suffix `-dirty`: tracked files changed)."""
    return dict(_read_versions())


@functools.cache  # read once per process: the installed software does not change under a run
def _read_versions() -> dict[str, str]:
    versions = {"python": platform.python_version(), "mirrorapi": mirrorapi_version()}
    commit = _git_commit()
    if commit:
        versions["mirrorapi_commit"] = commit
    for name in KEY_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def mirrorapi_version() -> str:
    """The installed distribution's version; a source checkout put on PYTHONPATH without installing it (a lent GPU
    machine, where nothing can be installed from the index) has none: "source" then, the commit says which."""
    try:
        return metadata.version("mirrorapi")
    except metadata.PackageNotFoundError:
        return "source"


def versions_line(versions: dict[str, str]) -> str:
    """One line for a Markdown report: "python 3.11.7, mirrorapi 0.1.0 (abc1234), torch 2.13.0+cpu, ..."."""
    parts = []
    for name, version in versions.items():
        if name == "mirrorapi" and "mirrorapi_commit" in versions:
            commit = versions["mirrorapi_commit"]
            version += f" ({commit[:7]}{'-dirty' if commit.endswith('-dirty') else ''})"
        if name != "mirrorapi_commit":
            parts.append(f"{name} {version}")
    return ", ".join(parts)


def _git_commit() -> str | None:
    if not (_CHECKOUT / ".git").exists():  # an installed wheel: no checkout to name
        return None
    try:

        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(_CHECKOUT), *args], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()

        commit = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):  # no git, not a repository, or not ours to read
        return None
    return commit + ("-dirty" if dirty else "")
