"""What `pip install` gives a user: each extra carries what its scripts import, and the built wheel
(not the source checkout) carries the shipped models' adapters, runs `mirrorapi tools stats` and `models list`
and builds the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "data" / "samples"

# Load a script (its imports only: main() runs under __main__) where only the distributions named in
# argv[2] can be imported, as after `pip install ".[extra]"`: any other installed distribution is
# hidden, so optional imports fall back as they would and a missing requirement fails the import.
_LOAD_WITH_ONLY = r"""
import json, runpy, sys
from importlib import metadata
from packaging.utils import canonicalize_name
allowed = set(json.loads(sys.argv[2]))
owners = metadata.packages_distributions()

class NotInstalledByTheExtra:
    def find_spec(self, name, path=None, target=None):
        dists = owners.get(name) if "." not in name and name != "mirrorapi" else None
        if dists and not any(canonicalize_name(d) in allowed for d in dists):
            raise ModuleNotFoundError(f"No module named {name!r} (its distribution {dists[0]} is not installed "
                                      "by the extra)", name=name)
        return None

sys.meta_path.insert(0, NotInstalledByTheExtra())
runpy.run_path(sys.argv[1], run_name="loaded_by_test")
"""


def _declared(extras: tuple[str, ...]) -> set[str]:
    """Distributions `pip install ".[extras]"` installs: the declared ones and, recursively, their
    own unconditional requirements (read from the installed metadata)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = list(project["dependencies"]) + [r for e in extras for r in project["optional-dependencies"][e]]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        requirement = Requirement(todo.pop())
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue  # another platform's requirement
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen:
            continue
        seen.add(key)
        name = key[0]
        try:
            for sub in metadata.requires(name) or []:  # with the extras asked for (`transformers[serving]`)
                marker = Requirement(sub).marker
                if marker is None or any(marker.evaluate({"extra": e}) for e in requirement.extras | {""}):
                    todo.append(sub.split(";")[0])
        except metadata.PackageNotFoundError:
            pass
    return {name for name, _ in seen}


@pytest.mark.parametrize(
    "script, extras",
    [
        ("eval/fac.py", ("eval",)),
        ("eval/judge_agreement.py", ("eval",)),
        ("serving/main_mirrorapi.py", ("serve",)),
    ],
)
def test_each_extra_carries_what_its_scripts_import(script, extras):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", _LOAD_WITH_ONLY, str(REPO / script), json.dumps(sorted(_declared(extras)))],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f'pip install ".[{",".join(extras)}]" cannot load {script}:\n' + result.stderr[-600:]
    )


def test_requests_is_not_a_dependency():
    # Nothing of ours imports it (the engine client is aiohttp, the tests use httpx).
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    everything = project["dependencies"] + [r for rs in project["optional-dependencies"].values() for r in rs]
    assert "requests" not in {canonicalize_name(Requirement(r).name) for r in everything}


def test_the_built_wheel_runs_outside_the_checkout(tmp_path):
    """Build the wheel from a copy of the tracked files, install it (`--no-deps`) into a fresh venv
    whose dependencies come from this interpreter's site-packages (a .pth file: offline and fast),
    and run it from a folder where the source checkout cannot be imported."""
    source = tmp_path / "source"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run(
        pip + ["wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = (tmp_path / "dist").glob("mirrorapi-*.whl")
    # The library only: the harnesses of the tests, bench/ and the demo (harness/) stay in the clone.
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if ".dist-info/" not in name} == {"mirrorapi"}
    assert not [name for name in names if name.startswith("mirrorapi/testing/")]

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    purelib = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # After the venv's own site-packages, so the wheel's mirrorapi wins over the editable one.
    (purelib / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        pip + ["--python", str(python), "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=120,
    )

    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, cwd=run_dir, env=env, capture_output=True, text=True, timeout=180)

    where = run(str(python), "-c", "import mirrorapi; print(mirrorapi.__file__)")
    assert where.stdout.startswith(str(purelib)), where.stdout + where.stderr

    # The shipped models' adapters are package data: every file of theirs in the checkout is in the wheel, and the
    # installed command finds them there.
    shipped = [name for name in tracked.decode().split("\0") if name.startswith("mirrorapi/models/adapters/")]
    assert shipped and set(shipped) <= set(zipfile.ZipFile(wheel).namelist())
    listed = run(str(venv / "bin" / "mirrorapi"), "models", "list", "--models-dir", str(tmp_path / "models"))
    assert listed.returncode == 0, listed.stderr
    for name in {name.split("/")[3] for name in shipped if name.count("/") == 4}:
        line = next(line for line in listed.stdout.splitlines() if line.startswith(name + " "))
        adapter_files = {n.rsplit("/", 1)[1] for n in shipped if n.split("/")[3] == name}
        assert line.endswith(
            "not shipped yet"
            if "adapter_model.safetensors" not in adapter_files
            else "not made yet (`models get` merges it)"
        ), line

    stats = run(str(venv / "bin" / "mirrorapi"), "tools", "stats", "--json", str(SAMPLES / "tools"))
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["tools"] == len(list((SAMPLES / "tools").glob("*/*.json")))

    build = (
        "import sys; from mirrorapi.training.tiny_model import build_tiny_model; "
        "build_tiny_model(sys.argv[1], corpus=sys.argv[2:] or None, hidden_size=32, layers=1, "
        "intermediate_size=64)"
    )
    # No source checkout, no default corpus: one clear line, not a tokenizer trained on nothing.
    bare = run(str(python), "-c", build, str(tmp_path / "no-corpus"))
    assert bare.returncode != 0 and "no tokenizer corpus" in bare.stderr and "corpus=" in bare.stderr
    assert not (tmp_path / "no-corpus").exists()

    corpus = [str(SAMPLES / "pairs.jsonl"), *map(str, sorted((SAMPLES / "tools").glob("*/*.json")))]
    built = run(str(python), "-c", build, str(tmp_path / "tiny"), *corpus)
    assert built.returncode == 0, built.stderr
    vocab = json.loads((tmp_path / "tiny" / "tokenizer.json").read_text())["model"]["vocab"]
    assert len(vocab) >= 1000  # 1,024 asked for: merges were learned (an empty corpus gives ~260 byte tokens)
