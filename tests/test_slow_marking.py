"""`make test-quick` (pytest -m "not slow") starts no engine and trains no model: tests/conftest.py marks
`slow` every test whose fixtures (directly or through other fixtures) do either.

Which fixtures do is read here from their source, independently of conftest.py's list: a fixture that
calls one of the engine starters or trainers below. The suite is then collected with -m "not slow" in a
subprocess, and no test left in it may use such a fixture."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

# Calls that start an engine or train a model, as the suite's fixtures make them.
STARTS_OR_TRAINS = re.compile(
    r"transformers_serve\(|wait_until_engine_answers\(|RunningEngine\("  # an engine
    r"|run_sft_recipe\(|training/sft\.py'\)\.cli\(|\.train\("  # training in process
    r"|'launch'|demo_command\("
)  # `accelerate launch`, the whole demo

# Writes each collected test's fixture closure (after -m deselected the slow ones).
DUMP_PLUGIN = """
import json, os
def pytest_collection_finish(session):
    with open(os.environ["COLLECTED_FIXTURES"], "w") as fh:
        json.dump({item.nodeid: sorted(getattr(item, "fixturenames", [])) for item in session.items}, fh)
"""


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def fixtures_that_start_or_train(paths: list[Path]) -> dict[str, str]:
    """{fixture name: file} of the fixtures whose code (docstring and comments left out) calls one of
    STARTS_OR_TRAINS."""
    found = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(map(_is_fixture, node.decorator_list)):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                if STARTS_OR_TRAINS.search("\n".join(map(ast.unparse, body))):  # unparse: strings in '...'
                    found[node.name] = str(path.relative_to(REPO))
    return found


def test_the_scan_finds_engine_and_training_fixtures():
    found = fixtures_that_start_or_train(sorted(TESTS.rglob("*.py")))
    # The session fixtures of tests/conftest.py that start `transformers serve` or run training/sft.py.
    assert {"tiny_engine", "simulator_engine", "judge_engine", "trained_simulator_dir", "trained_judge_dir"} <= set(
        found
    )
    # And not the cheap ones: a model built without training, SFT data, a fake engine, the CLI's function.
    assert not {"tiny_model_dir", "simulator_sft_dir", "faulty_judge", "engine_stub", "cli"} & set(found)


def test_quick_selection_uses_no_engine_or_training_fixture(tmp_path):
    engine_or_training = fixtures_that_start_or_train(sorted(TESTS.rglob("*.py")))
    (tmp_path / "dump_collected_fixtures.py").write_text(DUMP_PLUGIN)
    out = tmp_path / "collected.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # this run's own options stay here
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])), COLLECTED_FIXTURES=str(out)
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "dump_collected_fixtures",
            "-m",
            "not slow",
            "tests",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    quick = json.loads(out.read_text())
    assert len(quick) > 100  # the collection ran
    offenders = {
        test: sorted(set(fixtures) & set(engine_or_training))
        for test, fixtures in quick.items()
        if set(fixtures) & set(engine_or_training)
    }
    assert offenders == {}, "tests left in `make test-quick` that start an engine or train"
    # The engine tests of issue 18, unmarked by hand, are among those left out.
    for test in (
        "tests/evaluation/test_agent.py::test_tiny_model_agent_ends_every_query",
        "tests/evaluation/test_benchmark.py::test_recorded_benchmark_writes_one_report",
    ):
        path, name = test.split("::")
        assert f"def {name}(" in (REPO / path).read_text() and test not in quick
