"""`make test-quick` (pytest -m "not slow") starts no engine and trains no model: tests/conftest.py marks
`slow` every test whose fixtures (directly or through other fixtures) do either.

Which fixtures do is read here from their source, independently of conftest.py's list: a fixture that
calls one of the engine starters or trainers below. Of the suite as this run collected it (conftest.py
records it before `-m` deselects any), no test that `-m "not slow"` keeps may use such a fixture."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"

# Calls that start an engine or train a model, as the suite's fixtures make them.
STARTS_OR_TRAINS = re.compile(
    r"transformers_serve\(|wait_until_engine_answers\(|RunningEngine\("  # an engine
    r"|run_sft_recipe\(|training/sft\.py'\)\.cli\(|\.train\("  # training in process
    r"|'launch'|demo_command\("
)  # `accelerate launch`, the whole demo


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


def test_quick_selection_uses_no_engine_or_training_fixture(collected_tests):
    # This run's own collection, as conftest.py marked it before `-m` deselected anything: what `-m "not slow"`
    # keeps of it is `make test-quick`'s selection.
    files = {node_id.split("::")[0] for node_id in collected_tests}
    if not files >= {path.relative_to(REPO).as_posix() for path in TESTS.rglob("test_*.py")}:
        pytest.skip("checks the whole suite's marks: run it with the whole suite (make test, make test-quick)")
    engine_or_training = fixtures_that_start_or_train(sorted(TESTS.rglob("*.py")))
    quick = {node_id: fixtures for node_id, (fixtures, slow) in collected_tests.items() if not slow}
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
