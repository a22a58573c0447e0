"""Every command-line parser the project builds refuses abbreviated flags: with argparse's default, a
mistyped `--answer` is silently taken as `--answers` (or `--dataset_pat` as `--dataset_path`), so a
documented command that drifts would still "work" with whatever flag it happened to prefix."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARSER_CALLS = {"ArgumentParser", "add_parser", "TrlParser", "HfArgumentParser"}
SKIPPED = {".venv", ".venv-openenv", ".git", ".cache", "runs", "node_modules"}


def parser_calls():
    """(file, line) of every call in the project's Python that builds an argument parser or subcommand."""
    for path in sorted(REPO.rglob("*.py")):
        if SKIPPED & set(path.relative_to(REPO).parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in PARSER_CALLS:
                    yield path.relative_to(REPO), node


def test_every_parser_turns_abbreviations_off():
    calls = list(parser_calls())
    assert len(calls) >= 25  # the scan sees the project's parsers (entry scripts, the mirrorapi subcommands)
    missing = [
        f"{path}:{node.lineno}"
        for path, node in calls
        if not any(
            k.arg == "allow_abbrev" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in node.keywords
        )
    ]
    assert not missing, "parsers that take abbreviated flags (pass allow_abbrev=False): " + ", ".join(missing)


@pytest.mark.parametrize(
    "script, function, argv, message",
    [
        # Taken as `--answers` before; now the flag the user meant is missing.
        (
            "eval/fac.py",
            "main",
            ["--answer", "x", "--ids", "y", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--out", "z"],
            "the following arguments are required: --answers",
        ),
        (
            "eval/simulator.py",
            "main",
            ["--pair", "x", "--server", "http://127.0.0.1:9", "--out", "z"],
            "the following arguments are required: --pairs",
        ),
        ("serving/main_mirrorapi.py", "main", ["--confi", "x.yml"], "--confi"),
        (
            "training/sft.py",
            "cli",
            ["--config", "training/configs/tiny_cpu.yaml", "--dataset_pat", "x"],
            "not used by the HfArgumentParser: ['--dataset_pat', 'x']",
        ),
    ],
)
def test_an_abbreviated_flag_is_refused(entry_script, capsys, monkeypatch, script, function, argv, message):
    """As a user types them: the entry script exits with status 2 and says what it did not take."""
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as exit_:
        raise SystemExit(getattr(entry_script(script), function)(argv))
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_an_abbreviated_subcommand_flag_is_refused(capsys):
    from mirrorapi.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["tools", "stats", str(REPO / "data/samples/tools"), "--js"])
    assert exit_.value.code == 2 and "unrecognized arguments: --js" in capsys.readouterr().err
