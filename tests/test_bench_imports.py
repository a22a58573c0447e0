"""Every import the benchmarks make (bench/*.py, the ones inside functions too) names a module that imports and
names in it that exist: a bench imports most of what it uses inside main(), where no lint and no other test reaches
(until 2026-12 bench/episodes.py imported `raise_open_file_limit` from a module it had left, and failed at start)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"

# Run in a child: importing the benches' modules (torch, transformers, the benches themselves) is no business of the
# test process. It reads [[file, line, module, [names]]] on stdin, and prints the failures as JSON.
CHECK_IMPORTS = """
import importlib, json, sys
failures = []
for file, line, module, names in json.load(sys.stdin):
    where = f"{file}:{line}"
    try:
        imported = importlib.import_module(module)
    except Exception as error:
        failures.append(f"{where}: import {module}: {type(error).__name__}: {error}")
        continue
    for name in names:
        if hasattr(imported, name):
            continue
        try:  # `from package import submodule`
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            failures.append(f"{where}: {module} has no {name}")
print(json.dumps(failures))
"""


def bench_imports() -> list[tuple[str, int, str, list[str]]]:
    """(file, line, module, names) of every import statement of bench/*.py: names is empty for `import X`."""
    found = []
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found += [(path.name, node.lineno, alias.name, []) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path.name}:{node.lineno}: a relative import in bench/"
                if node.module != "__future__":
                    found.append((path.name, node.lineno, node.module, [alias.name for alias in node.names]))
    return found


def test_the_walk_sees_imports_inside_functions_and_sibling_modules():
    imports = bench_imports()
    assert ("episodes.py", "harness.processes", ["poll_until"]) in [(f, m, n) for f, _, m, n in imports]
    assert any(module == "server_load" for _, _, module, _ in imports)  # bench/server_load.py, a sibling


def test_every_bench_import_resolves():
    imports = bench_imports()
    # Sibling modules (`from server_load import ...`) resolve against bench/, the rest against the checkout.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), str(REPO), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", CHECK_IMPORTS],
        input=json.dumps(imports),
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.splitlines()[-1]) == []
