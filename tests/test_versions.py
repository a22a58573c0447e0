"""Runs record the software they ran with: the model card (README.md and mirrorapi_training.json) names the
installed versions of Python, mirrorapi (with its git commit in a checkout) and the training libraries.
(The evaluation reports: tests/evaluation/test_report_versions.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from mirrorapi.training.model_card import TRAINING_FILE, write_model_card

REPO = Path(__file__).resolve().parents[1]
TRAINING_PACKAGES = ("torch", "transformers", "tokenizers", "trl", "peft", "accelerate", "datasets")
INFO = {
    "base_model": "tiny",
    "kind": "simulator",
    "prompt_format": "mirrorapi-v1",
    "adapter": False,
    "dataset_path": "data",
    "dataset_stats": {},
    "recipe": {"argv": []},
    "metrics": {},
}


def installed(*names: str) -> dict[str, str]:
    return {name: metadata.version(name) for name in names}


def test_the_model_card_names_the_installed_versions(tmp_path):
    write_model_card(tmp_path, INFO)
    versions = json.loads((tmp_path / TRAINING_FILE).read_text())["versions"]
    assert {k: versions.get(k) for k in TRAINING_PACKAGES} == installed(*TRAINING_PACKAGES)
    assert versions["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert versions["mirrorapi"] == metadata.version("mirrorapi")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout (CI's fresh clone is one)
        assert versions["mirrorapi_commit"].removesuffix("-dirty") == head.stdout.strip()
    readme = (tmp_path / "README.md").read_text()
    for name, version in installed("torch", "transformers", "trl", "peft").items():
        assert f"{name} {version}" in readme


def test_a_merged_model_keeps_the_versions_that_trained_it(tmp_path):
    trained_with = {"python": "3.11.7", "mirrorapi": "0.1.0", "transformers": "5.0.0"}
    write_model_card(tmp_path, {**INFO, "versions": trained_with})
    assert json.loads((tmp_path / TRAINING_FILE).read_text())["versions"] == trained_with


def test_a_checkout_run_without_installing_it_records_source_and_its_commit():
    """A lent GPU machine runs the checkout from PYTHONPATH (nothing can be installed there): the record says
    "source" and the commit instead of failing the run after training (it did: PackageNotFoundError)."""
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from mirrorapi.versions import package_versions; "
        "print(json.dumps(package_versions()))"
    )
    # -S: no site-packages, so no installed mirrorapi distribution is visible (versions.py needs only the stdlib)
    result = subprocess.run([sys.executable, "-S", "-c", code, str(REPO)], capture_output=True, text=True, check=True)
    versions = json.loads(result.stdout)
    assert versions["mirrorapi"] == "source" and versions["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert versions["mirrorapi_commit"].removesuffix("-dirty") == head.stdout.strip()
