"""One CLI, settings declared once: a settings field is one flag, spelt and checked the same in an entry
script and in its `mirrorapi` subcommand; the model's default applies when the flag is not given."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mirrorapi.cli import STAGES
from mirrorapi.cli import main as mirrorapi_main
from mirrorapi.command_line import add_settings_arguments, settings_from_args
from mirrorapi.evaluation.agent.settings import AgentSettings
from mirrorapi.evaluation.benchmark import write_report
from mirrorapi.evaluation.commands import RUN_AGENT
from mirrorapi.evaluation.judge.scoring import JudgeSettings
from mirrorapi.evaluation.score_tables import metric_table

REPO = Path(__file__).resolve().parents[1]
JUDGE = ["--base-url", "http://127.0.0.1:9/v1", "--model", "judge"]


@pytest.mark.parametrize(
    "script, subcommand, argv, message",
    [
        (
            "eval/fac.py",
            ["eval", "fac"],
            ["--answers", "a", "--ids", "i", "--out", "o", *JUDGE, "--max-tokens", "0"],
            "--max-tokens: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            "eval/sowr.py",
            ["eval", "sowr"],
            ["--reference", "r", "--candidate", "c", "--ids", "i", "--out", "o", *JUDGE, "--timeout", "0"],
            "--timeout: Input should be greater than 0 (got 0.0)",
        ),
        (
            "eval/run_agent.py",
            ["eval", "run-agent"],
            ["--queries", "q", "--server", "http://127.0.0.1:9/virtual", "--out", "o", *JUDGE, "--method", "ReAct"],
            "unknown method 'ReAct'",
        ),
    ],
)
def test_a_script_and_its_subcommand_refuse_a_bad_setting_alike(
    entry_script, capsys, tmp_path, monkeypatch, script, subcommand, argv, message
):
    """The constraint is the model's (Field ge/gt, a validator), the flag's name in the one-line error."""
    monkeypatch.chdir(tmp_path)
    assert entry_script(script).main(argv) == 2
    from_script = capsys.readouterr().err.strip().splitlines()
    assert mirrorapi_main([*subcommand, *argv]) == 2
    from_mirrorapi = capsys.readouterr().err.strip().splitlines()
    assert len(from_script) == 1 and message in from_script[0]
    # argparse's form, `<prog>: error: <message>`, each naming itself as called
    assert from_script == [f"{Path(script).name}: error: {from_script[0].split(': error: ', 1)[1]}"]
    assert from_mirrorapi == [f"mirrorapi {' '.join(subcommand)}: error: {from_script[0].split(': error: ', 1)[1]}"]
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("name", ["apibank", "tooleyes"])
def test_a_command_with_its_own_parser_names_itself_as_called(capsys, name):
    with pytest.raises(SystemExit) as exited:
        mirrorapi_main(["eval", name, "--no-such-flag"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"usage: mirrorapi eval {name} ")
    assert err[-1].startswith(f"mirrorapi eval {name}: error: ")
    with pytest.raises(SystemExit):
        mirrorapi_main(["eval", name, "--help"])
    assert (
        "usage: mirrorapi eval" in (shown := capsys.readouterr().out)
        and {"apibank": "API-Bank", "tooleyes": "ToolEyes"}[name] in shown
    )


@pytest.mark.parametrize("command", [["cache", "stats", "--cache", "c.sqlite"], ["tools", "stats", "tools"]])
def test_an_unknown_flag_is_told_by_the_command_it_was_given_to(capsys, command):
    """It was told by the top level (`usage: mirrorapi [-h] {tools,cache,serve} ...`, `mirrorapi: error:`), whose
    usage shows none of the command's flags."""
    with pytest.raises(SystemExit) as exited:
        mirrorapi_main([*command, "--no-such-flag"])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    called = "mirrorapi " + " ".join(command[:2])
    assert err[0].startswith(f"usage: {called} ")
    assert err[-1] == f"{called}: error: unrecognized arguments: --no-such-flag"


def test_the_benchmarks_judge_flags_are_the_judge_settings_with_a_prefix(capsys, tmp_path):
    code = mirrorapi_main(
        [
            "benchmark",
            "--queries",
            "q",
            "--server",
            "http://127.0.0.1:9/virtual",
            "--agent",
            "a",
            "m",
            "http://127.0.0.1:9/v1",
            "--out",
            str(tmp_path),
            "--judge-base-url",
            "http://127.0.0.1:9/v1",
            "--judge-model",
            "j",
            "--judge-max-tokens",
            "-5",
        ]
    )
    assert code == 2
    # The flag as the user wrote it, its bound (the judge's max_tokens: Field(ge=1)) and the value given; the words
    # between are pydantic's, not asserted.
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("mirrorapi benchmark: error: --judge-max-tokens: ") and "-5" in line, line
    assert re.search(r"(?<![\w.-])1(?![\w.])", line.replace("-5", "")), line


def test_a_flag_not_given_leaves_the_models_default():
    parser = argparse.ArgumentParser(allow_abbrev=False)
    RUN_AGENT.add_arguments(parser)
    args = parser.parse_args(
        [
            "--queries",
            "q",
            "--server",
            "s",
            "--out",
            "o",
            "--base-url",
            "u1",
            "u2",
            "--model",
            "m",
            "--react-grammar",
            "--max-tokens",
            "64",
        ]
    )
    settings = settings_from_args(args, AgentSettings)
    assert settings == AgentSettings(server="s", base_urls=["u1", "u2"], model="m", react_grammar=True, max_tokens=64)
    assert settings.timeout == 300.0 and settings.method == "CoT@1"  # StableToolBench's budgets, written once


def test_help_shows_the_fields_description_and_default(capsys):
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_settings_arguments(parser, JudgeSettings, prefix="judge-")
    text = parser.format_help()
    assert "--judge-base-url URL [URL ...]" in text and "--judge-max-tokens" in text
    assert "Tokens per judge output (default 256)." in " ".join(text.split())


def test_every_documented_entry_script_is_a_mirrorapi_subcommand(capsys):
    """The scripts the docs use run the same commands as `mirrorapi <group> <command>`."""
    for group, commands in {
        "eval": ["run-agent", "fac", "sowr", "judge-agreement", "simulator"],
        "data": ["build-simulator-sft", "build-judge-sft"],
        "train": ["merge-lora"],
    }.items():
        for command in commands:
            with pytest.raises(SystemExit) as exit_:
                mirrorapi_main([group, command, "--help"])
            assert exit_.value.code == 0
            assert f"usage: mirrorapi {group} {command}" in capsys.readouterr().out


def test_the_benchmark_report_is_built_from_the_tables_not_the_files(tmp_path):
    """write_report gets the tables scoring returned; no scores/ folder needs to exist."""
    table = metric_table(
        {
            "metric": "fac",
            "judge": "j",
            "prompt_format": "fac-v1",
            "repeats": 1,
            "groups": ["G1_instruction"],
            "complete": True,
            "pending": 0,
            "rows": [
                {
                    "model": "m_cot",
                    "average": {"score": 50.0, "std": 0.0},
                    "groups": {
                        "G1_instruction": {
                            "score": 50.0,
                            "std": 0.0,
                            "ids": 2,
                            "missing": 0,
                            "empty": 0,
                            "give_up": 0,
                            "judge_calls": 2,
                            "solved": 1,
                            "unsure": 0,
                            "unsolved": 1,
                            "unparseable": 0,
                            "pending": 0,
                            "missing_ids": [],
                        }
                    },
                }
            ],
        }
    )
    agents = {"m_cot": AgentSettings(server="s", base_urls=["u"], model="m")}
    report = write_report(
        tmp_path,
        ["m_cot"],
        "m_cot",
        agents,
        JudgeSettings(["u"], "j"),
        ["G1_instruction"],
        {},
        1,
        {"fac": table, "sopr": None},
    )
    text = report.read_text(encoding="utf-8")
    assert "| Method | I1 Inst | Average |\n|---|---|---|\n| m_cot | 50.0 | 50.0 |" in text
    assert "## SoPR\n\n(not computed)" in text
    assert not (tmp_path / "scores").exists()


def top_level_commands(parser: argparse.ArgumentParser) -> set[str]:
    return set(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


def test_each_top_level_command_is_listed_under_the_stage_that_registers_it():
    """`mirrorapi X` builds only the parser of X's stage (cli.STAGES): each stage registers exactly the commands
    listed under it, and with `tools` they are every command `mirrorapi --help` shows."""
    for stage in set(STAGES.values()):
        parser = argparse.ArgumentParser(allow_abbrev=False)
        importlib.import_module(stage).register(parser.add_subparsers())
        assert top_level_commands(parser) == {name for name, module in STAGES.items() if module == stage}
    from mirrorapi.cli import make_parser

    assert top_level_commands(make_parser()) == {"tools", *STAGES}


def test_a_command_imports_its_own_stage_only():
    """`mirrorapi models list` does not import the serving, evaluation, data or training commands (what made every
    call pay for all of them); a name no stage has is still answered with every command to choose from."""
    code = (
        "import sys; from mirrorapi.cli import main; main(['models', 'list']); "
        "print(sorted(m for m in sys.modules if m.startswith('mirrorapi.') and m.endswith('.commands')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['mirrorapi.models.commands']"
    done = subprocess.run(
        [sys.executable, "-m", "mirrorapi.cli", "cach"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert done.returncode == 2 and "'cache', 'serve', 'benchmark', 'eval', 'data', 'train', 'models'" in done.stderr


ENGINE = ["--base-url", "http://127.0.0.1:9/v1", "--model", "m"]
RUN_AGENT_ARGV = ["eval", "run-agent", "--queries", "q", "--server", "http://127.0.0.1:9/virtual", "--out", "o"]
SOWR_ARGV = ["eval", "sowr", "--out", "o", "--reference", "r", "--candidate", "c", "--ids", "i"]


@pytest.mark.parametrize(
    "argv",
    [[*RUN_AGENT_ARGV, *ENGINE, "--limit", "0"], [*SOWR_ARGV, *ENGINE, "--rounds", "0"]],
    ids=["run-agent --limit 0", "sowr --rounds 0"],
)
def test_a_count_of_zero_is_refused_not_read_as_every_or_one(capsys, tmp_path, monkeypatch, argv):
    """`--limit 0` ran every query (and -1 all but each group's last); `--rounds 0` ran one round."""
    monkeypatch.chdir(tmp_path)
    assert mirrorapi_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "must be at least 1, got 0" in err[0]
    assert not list(tmp_path.iterdir())


def test_ctrl_c_and_a_closed_pipe_end_a_command_in_one_line_not_a_traceback(tmp_path):
    """Ctrl-C printed a traceback from every command (a cache import's ended in sqlite's COMMIT), and a reader that
    went away (`| head -1`) a BrokenPipeError one (audit of 2026-12-01). Now one line and the shell's status for
    SIGINT (130); a closed pipe ends the command quietly, as SIGPIPE would (141). The command interrupted: FAC
    waiting on a judge engine that never answers (a stand-in, so that the signal comes while it runs)."""
    import os
    import signal
    import time

    from harness.fake_engines import HungEngine

    mirrorapi = str(Path(sys.executable).parent / "mirrorapi")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    example = REPO / "data" / "samples" / "stabletoolbench"
    with HungEngine() as judge:
        judging = subprocess.Popen(
            [mirrorapi, "eval", "fac", "--answers", str(example / "data_example" / "model_predictions_converted"),
             "--ids", str(example / "solvable_queries_example" / "test_query_ids"), "--base-url", judge.url,
             "--model", "judge", "--out", str(tmp_path / "fac"), "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
            # A terminal's Ctrl-C: SIGINT handled by default (a run started in the background by a shell, as CI may
            # be, inherits it ignored, and Python then keeps it ignored)
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while not judge.connections and judging.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        judging.send_signal(signal.SIGINT)
        _, err = judging.communicate(timeout=60)
    assert judging.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "mirrorapi eval fac: interrupted"

    exporting = subprocess.Popen(
        [mirrorapi, "tools", "export", "--tools", str(REPO / "data" / "samples" / "tools")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )  # fmt: skip
    exporting.stdout.read(100)  # the reader takes a little of its 180 KB and goes
    exporting.stdout.close()
    assert exporting.wait(timeout=60) == 141 and exporting.stderr.read() == b""


def test_version_is_the_installed_distributions(capsys):
    """`mirrorapi --version` answered "the following arguments are required: command" (audit of 2026-12-01)."""
    from importlib import metadata

    with pytest.raises(SystemExit) as exit_:
        mirrorapi_main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"mirrorapi {metadata.version('mirrorapi')}"
