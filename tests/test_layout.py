"""The layout's rules (DESIGN.md "Layout"), checked so that a change that breaks them fails CI.

- the import contracts in `.importlinter` hold (`lint-imports`, import-linter's own command);
- the library never imports one of its own modules inside a function (the way an import circle is
  dodged); only the command modules (`cli.py`, each stage's `commands.py`) defer imports, to keep
  `mirrorapi --help` fast;
- the demo lives outside the library, and the entry scripts stay thin (parse, call the library, exit).
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "mirrorapi"
ENTRY_SCRIPTS = ["training/sft.py", "training/merge_lora.py", "serving/main_mirrorapi.py", "eval/*.py", "data/*.py"]
MAX_ENTRY_LINES = 40


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed (it is in the dev extra)"
    result = subprocess.run([lint, "--config", str(REPO / ".importlinter")], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# (what is added to a copy of the library, the contract that must break, one it leaves alone): a stage importing
# another, and new modules that no hand-kept list names.
BREAKS = [
    ({"serving/handler.py": "from mirrorapi.evaluation.judge import scoring"}, "stages", "protocol"),
    ({"serving/protocol.py": "from mirrorapi import brand_new", "brand_new.py": ""}, "protocol", "stages"),
    ({"brand_new.py": "from mirrorapi.data import simulator_sft"}, "stages-on-top", "stages"),
    ({"evaluation/judge/brand_new.py": "from harness import processes"}, "harnesses", "protocol"),
]


@pytest.mark.parametrize("added, broken, kept", BREAKS, ids=[b[1] for b in BREAKS])
def test_a_broken_contract_is_reported(tmp_path, added, broken, kept):
    """The check can fail, and tells contracts apart: a copy of the library with one more import."""
    copy = tmp_path / "mirrorapi"
    shutil.copytree(LIBRARY, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "harness", tmp_path / "harness", ignore=shutil.ignore_patterns("__pycache__"))
    for name, line in added.items():
        path = copy / name
        path.write_text((path.read_text() if path.exists() else "") + f"\n{line}  # noqa\n")
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))

    def check(contract: str) -> int:
        return subprocess.run(
            [lint, "--config", str(REPO / ".importlinter"), "--contract", contract],
            cwd=tmp_path,
            capture_output=True,
            env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        ).returncode

    assert check(broken) != 0
    assert check(kept) == 0


def _deferred_own_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("mirrorapi"):
                    found.append(f"{path.relative_to(REPO)}:{inner.lineno} from {inner.module}")
    return found


def test_no_import_of_our_own_modules_inside_functions():
    found = [
        hit
        for path in sorted(LIBRARY.rglob("*.py"))
        if path.name not in ("cli.py", "commands.py")
        for hit in _deferred_own_imports(path)
    ]
    assert found == []


def test_the_demo_is_not_in_the_library():
    assert not list(LIBRARY.rglob("demo*.py"))
    assert (REPO / "scripts" / "demo_steps" / "run.py").is_file()


@pytest.mark.parametrize("pattern", ENTRY_SCRIPTS)
def test_entry_scripts_are_thin(pattern):
    scripts = sorted(REPO.glob(pattern))
    assert scripts, pattern
    long = {str(p.relative_to(REPO)): n for p in scripts if (n := len(p.read_text().splitlines())) > MAX_ENTRY_LINES}
    assert long == {}, f"entry scripts over {MAX_ENTRY_LINES} lines"
