"""The lint and type gate: ruff (pyflakes, import order, bugbear, pyupgrade, no print in the library, line
length, complexity) and ruff's formatter over the repository and mypy over the library and the harnesses (bodies
of unannotated functions included), with the versions the lock pins and the settings in pyproject.toml."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN))
    assert path, f"{name} is not installed (it is in the dev extra: make venv)"
    return path


def test_ruff_finds_nothing():
    result = subprocess.run([tool("ruff"), "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_file_is_formatted():
    """`ruff format` leaves every file as it is: one layout, so a diff shows what changed, not who wrote it."""
    result = subprocess.run(
        [tool("ruff"), "format", "--check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_formatter_can_fail(tmp_path):
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "crooked.py").write_text("x = {'a':1,\n  'b':2}\n")
    result = subprocess.run(
        [tool("ruff"), "format", "--check", "--no-cache", "."], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 1 and "crooked.py" in result.stdout


def test_the_library_type_checks():
    result = subprocess.run(
        [tool("mypy"), "--cache-dir", str(REPO / ".mypy_cache")], cwd=REPO, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


BRANCHY = "def f(x):\n" + "".join(f"    if x == {i}:\n        return {i}\n" for i in range(16)) + "    return -1\n"


@pytest.mark.parametrize(
    "checker, bad",
    [
        ("ruff", "import os\n\n\ndef f():\n    print('x')\n"),  # an unused import and a print in the library
        ("ruff", "X = 1  # " + "x" * 120 + "\n"),  # a line over line-length
        ("ruff", BRANCHY),  # a function of more than 15 branches
        ("mypy", "def f() -> int:\n    return 'x'\n"),
        (
            "mypy",
            "def f():\n    n: int = 'x'\n    return n\n",
        ),  # in a function without annotations (check_untyped_defs)
    ],
)
def test_the_gate_can_fail(tmp_path, checker, bad):
    """Each checker, with the project's settings, rejects a library module with a plain mistake."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for package in ("mirrorapi", "harness"):  # the folders mypy checks (pyproject.toml)
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "mirrorapi" / "broken.py").write_text(bad)
    command = [tool("ruff"), "check", "--no-cache", "."] if checker == "ruff" else [tool("mypy"), "--no-incremental"]
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 1 and "broken.py" in result.stdout
