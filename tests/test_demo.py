"""`scripts/demo.py --quick` end to end as a real process: the six steps, the report, reuse, Ctrl-C, a failing step.

The first run builds everything into a temporary work folder with HOME pointing at an empty folder
(nothing may be written there); the later runs reuse what it built. Each run's children are found
by their command lines, which all hold the work folder's path (model folders, server configs).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from demo_steps.run import QUICK, STEPS

from mirrorapi.names import api_key_name
from mirrorapi.records import canonical_json
from mirrorapi.serving.cache import ResponseCache
from mirrorapi.tools import ToolRegistry

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def interval_text(bounds: list[float] | None) -> str:
    """A 95% interval as the report writes it; the quick demo's few held-out episodes may be one (no interval)."""
    return "[no interval: one episode]" if bounds is None else f"[{bounds[0]:+.1f}, {bounds[1]:+.1f}]"


def demo_command(work: Path) -> list[str]:
    return [sys.executable, "scripts/demo.py", "--quick", "--work-dir", str(work)]


def demo_env(home: Path) -> dict:
    return {**os.environ, "HOME": str(home)}


def processes_using(path: Path) -> list[str]:
    """Live (not zombie) processes whose command line mentions `path`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(path) in cmdline and state != "Z":
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def port_closed(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    home, work = root / "home", root / "work"
    home.mkdir()
    result = subprocess.run(
        demo_command(work), cwd=REPO, env=demo_env(home), capture_output=True, text=True, timeout=480
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report_dir = REPO / result.stdout.strip().splitlines()[-1]
    return SimpleNamespace(
        stdout=result.stdout,
        work=work,
        home=home,
        report_dir=report_dir,
        report=json.loads((report_dir / "report.json").read_text()),
    )


def test_every_step_is_shown_with_its_time_and_the_report_path_comes_last(first_run):
    shown = re.findall(r"^\[(\d)/6\] (\w+):", first_run.stdout, re.MULTILINE)
    assert shown == [(str(n), name) for n, name in enumerate(STEPS, 1)]
    assert len(re.findall(r"^ +done in \d+\.\d s$", first_run.stdout, re.MULTILINE)) == 5
    assert [s["name"] for s in first_run.report["steps"]] == list(STEPS)
    assert first_run.report["status"] == "ok"
    folder = first_run.report_dir
    assert folder.parent == first_run.work
    assert (folder / "fidelity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    markdown = (folder / "report.md").read_text()
    for section in ("## 1. Data", "## 2. Training", "## 3. Serving", "## 4. `/virtual` requests", "## 5. Scores"):
        assert section in markdown
    # The quick sizes were used, through the real recipe.
    assert first_run.report["training"]["simulator"]["metrics"]["steps"] == QUICK.simulator["max_steps"]
    assert first_run.report["training"]["judge"]["metrics"]["steps"] == QUICK.judge["max_steps"]


def test_hits_serve_the_real_answers_misses_are_simulated_and_written_back(first_run):
    data = Path(first_run.report["data"]["folder"])
    real = {}
    for line in (data / "train.jsonl").read_text().splitlines():
        pair = json.loads(line)
        real[(pair["tool_name"], pair["api_name"], canonical_json(pair["tool_input"]))] = pair["response"]
    calls = first_run.report["requests"]
    hits = [c for c in calls if c["kind"] == "hit"]
    assert hits
    for call in hits:
        body = call["body"]
        key = (body["tool_name"], body["api_name"], canonical_json(json.loads(body["tool_input"])))
        assert call["outcome"] == "hit" and call["provenance"] == "imported:tool_response_cache"
        assert call["served"] == real[key]

    miss = next(c for c in calls if c["kind"] == "miss" and c["outcome"] == "simulated")
    assert miss["provenance"].startswith("simulated:") and "@mirrorapi-v1," in miss["provenance"]
    repeat = next(c for c in calls if c["kind"] == "repeat")
    assert repeat["body"] == miss["body"]
    assert (repeat["outcome"], repeat["provenance"], repeat["served"]) == ("hit", miss["provenance"], miss["served"])
    # Written back: the server's cache database holds the simulated answer.
    registry = ToolRegistry.load([_tools_folder(first_run)])
    doc = registry.resolve(miss["body"]["category"], miss["body"]["tool_name"], miss["body"]["api_name"])
    cache = ResponseCache(first_run.report_dir / "cache.sqlite")
    try:
        stored = cache.get(
            doc.category,
            doc.tool,
            doc.api,
            canonical_json(json.loads(miss["body"]["tool_input"])),
            miss["provenance"].removeprefix("simulated:"),
            count_hit=False,
        )
    finally:
        cache.close()
    assert stored is not None and json.loads(stored[0]) == miss["served"] and stored[1] == miss["provenance"]

    for banner in (
        "cache hit:",
        "cache miss, simulated:",
        "the same call again:",
        "provenance imported:",
        "provenance simulated:",
        "| real (",
    ):
        assert banner in first_run.stdout


def _tools_folder(run) -> str:
    import yaml

    return yaml.safe_load((run.report_dir / "server.yml").read_text())["tools_folder"][0]


def test_mistakes_get_clear_error_observations(first_run):
    calls = {c["kind"]: c for c in first_run.report["requests"]}
    unknown = calls["unknown_api"]
    right_name = unknown["origin"].split(" misspelt as ")[0]  # the name the call was made from
    assert unknown["served"]["error"].startswith(f"Unknown API '{unknown['body']['api_name']}'")
    suggestions = unknown["served"]["error"].split("Closest known: ")[1].rstrip(".").split(", ")
    assert api_key_name(right_name) in suggestions
    assert calls["bad_input"]["served"]["error"].startswith("Tool input parse error")
    assert calls["missing_required"]["served"]["error"].startswith("Missing required parameter")
    assert {calls[k]["outcome"] for k in ("unknown_api", "bad_input", "missing_required")} == {"validation_error"}


def test_scores_are_written(first_run):
    report = first_run.report
    assert report["fidelity"]["calls"] > 0 and report["fidelity"]["baseline"]
    assert {row["model"] for row in report["fac"]["rows"]} == {"virtual_chatgpt_cot", "virtual_chatgpt_dfs"}
    assert report["fac"]["complete"] and report["agreement"]["overall"]["n"] > 0
    for path in ("fidelity/fidelity.md", "fac/fac.md", "judge-agreement/agreement.md"):
        assert (first_run.report_dir / path).is_file()


def test_latest_points_at_the_run_and_holds_what_the_readme_uses(first_run):
    from test_readme import readme_demo_paths

    latest = first_run.work / "latest"
    assert latest.is_symlink() and latest.resolve() == first_run.report_dir.resolve()
    used = readme_demo_paths()
    assert {
        "simulator",
        "judge",
        "tools",
        "tool_response_cache",
        "train.jsonl",
        "heldout.jsonl",
        "judge_test.jsonl",
    } <= used
    for name in used:
        assert (latest / name).exists(), name
    for kind in ("simulator", "judge"):
        # The main rows' models: the tiny run has no shipped ones, so this run's.
        assert first_run.report["main"][kind]["shipped"] is False
        assert (
            (latest / kind).resolve()
            == Path(first_run.report["main"][kind]["folder"]).resolve()
            == Path(first_run.report["training"][kind]["model"]).resolve()
        )
        assert (latest / kind / "config.json").is_file()
    assert "runs/demo/latest" not in first_run.stdout  # a --work-dir run names its own folder
    assert f"{first_run.work / 'latest'} -> {first_run.report_dir.name}" in first_run.stdout


def _real_error(pair: dict) -> bool:
    """StableToolBench's `error` field, or tau-bench's in-band "Error: ..." reply (the pairs schema's rule)."""
    response = pair["response"]
    return bool(response["error"]) or str(response["response"]).startswith("Error")


def test_scores_stand_beside_trivial_baselines(first_run):
    report, markdown = first_run.report, (first_run.report_dir / "report.md").read_text()
    heldout = [json.loads(line) for line in (first_run.report_dir / "heldout.jsonl").read_text().splitlines()]
    # A constant "no error" answer agrees on exactly the calls that did not fail.
    no_error = 100 * sum(not _real_error(p) for p in heldout) / len(heldout)
    assert report["fidelity_constant"]["error_agreement"] == pytest.approx(no_error, abs=0.01)
    header = next(line for line in markdown.splitlines() if line.startswith("| | BLEU-4 |")).split("|")
    row = next(line for line in markdown.splitlines() if line.startswith('| constant "no error" answer |')).split("|")
    assert float(row[header.index(" error agreement ")]) == pytest.approx(no_error, abs=0.06)
    assert "| n (calls scored) |" in markdown
    # Error precision and recall on every row: the constant answer never fails, so it has no precision and no recall.
    assert header[-4:-1] == [" error precision ", " error recall ", " schema conformance "]
    assert row[header.index(" error precision ")].strip() == "n/a (0)"
    failed = sum(_real_error(p) for p in heldout)
    assert row[header.index(" error recall ")].strip() == ("0.0" if failed else "n/a")
    # Its fidelity server's cache starts empty (no few-shot examples): no held-out call was answered from it.
    assert report["fidelity"]["cache_hits"]["n"] == 0 and report["fidelity"]["scored"] == len(heldout)
    # A judge saying Solved to all scores every id with an answer to judge (missing, empty, give-up: Unsolved).
    for fac_row in report["fac"]["rows"]:
        cells = fac_row["groups"].values()
        solved_all = sum(100 * (c["ids"] - c["missing"] - c["empty"] - c["give_up"]) / c["ids"] for c in cells) / len(
            cells
        )
        assert (
            f"{fac_row['model']}: {fac_row['average']['score']:.1f} (a judge saying Solved to all: "
            f"{solved_all:.1f}" in markdown
        )
    overall = report["agreement"]["overall"]
    assert f"a judge saying Solved to all: accuracy {100 * overall['labelled_solved'] / overall['n']:.1f}%" in markdown
    low, high = overall["accuracy_ci95"]  # the judge's own figure comes with its bootstrap interval
    gap = report["fidelity"]["overall"]["simulator_against_example"]["rouge_l"]  # and the simulator's lead
    assert f"ROUGE-L {gap['difference']:+.1f} {interval_text(gap['ci95'])}" in markdown
    assert f"accuracy {100 * overall['accuracy']:.1f}% [{100 * low:.1f}, {100 * high:.1f}]" in markdown
    # Per source too, beside the same constant judge.
    for source, stats in report["agreement"]["per_source"].items():
        line = next(line for line in markdown.splitlines() if line.startswith(f"| {source} | {stats['n']} |"))
        assert line.split(" | ")[-2] == f"{100 * stats['labelled_solved'] / stats['n']:.1f}"
    # The text follows the measured training time.
    seconds = round(report["training"]["simulator"]["metrics"]["train_seconds"])
    assert f"trained for {seconds} s" in markdown if seconds < 60 else f"trained for {seconds // 60} min" in markdown


def test_held_out_episodes_are_replayed_with_and_without_session_history(first_run):
    report, markdown = first_run.report, (first_run.report_dir / "report.md").read_text()
    heldout = [json.loads(line) for line in (first_run.report_dir / "heldout.jsonl").read_text().splitlines()]
    episodes = {(p["source"], str(p["episode"])) for p in heldout}
    sessions = report["fidelity"]["sessions"]
    assert (sessions["episodes"], sessions["calls"]) == (len(episodes), len(heldout))
    assert sessions["without"]["overall"] == report["fidelity"]["overall"]["simulated"]  # the table's row
    # The nearest example on the same calls, with its consistency: the row a session has to beat (issue 32).
    assert sessions["nearest_example"]["overall"] == report["fidelity"]["overall"]["baseline"]
    assert (
        sessions["nearest_example"]["consistency"]["values_carried"]
        == sessions["with"]["consistency"]["values_carried"]
    )
    # The server saw every held-out call twice: once alone, once in its episode's session (one session each).
    lines = [
        json.loads(line)
        for line in (first_run.report_dir / "logs" / "fidelity-server-requests.jsonl").read_text().splitlines()
    ]
    in_session = [line for line in lines if "session" in line]
    assert len(in_session) == len(lines) - len(in_session) == len(heldout)
    assert len({line["session"] for line in in_session}) == len(episodes)
    assert {
        line["provenance"].split(",")[0].split("@")[1] for line in in_session if line["outcome"] == "simulated"
    } <= {report["session_format"]}
    assert "### With and without session history" in markdown and "| with history |" in markdown
    assert "| nearest example |" in markdown
    gap = sessions["with_minus_without"]["rouge_l"]  # the two passes compared call by call, with the interval
    assert f"ROUGE-L {gap['difference']:+.1f} {interval_text(gap['ci95'])}" in markdown
    assert report["parsing"]["with_history"]["simulated"] + report["parsing"]["with_history"]["engine_errors"] <= len(
        heldout
    )


def test_nothing_is_written_into_home_and_nothing_is_left_running(first_run):
    assert sorted(first_run.home.rglob("*")) == []
    assert processes_using(first_run.work) == []


class Lines:
    """A child's output lines, read in a thread so that every wait is bounded."""

    def __init__(self, stream):
        self.queue: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.queue.put(line) for line in stream], daemon=True).start()

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n" + "".join(self.seen[-30:]))


def test_second_run_reuses_what_was_built_and_ctrl_c_stops_everything(first_run, tmp_path):
    with open(tmp_path / "stderr.txt", "w") as stderr:
        demo = subprocess.Popen(
            demo_command(first_run.work),
            cwd=REPO,
            env=demo_env(first_run.home),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        lines = Lines(demo.stdout)
        engine = lines.wait_for(r"simulator engine: .* answers at http://127\.0\.0\.1:(\d+)/v1", timeout=120)
        reuse = "".join(lines.seen)
        for what in (
            "reused " + str(first_run.work / "build" / "data-"),
            "reused the tiny base model",
            "simulator: reused",
            "judge: reused",
        ):
            assert what in reuse
        assert "accelerate launch" not in reuse
        demo.send_signal(signal.SIGINT)
        assert demo.wait(60) == 130
    finally:
        if demo.poll() is None:  # an assertion above failed: stopped as a user stops it, so its engine goes too
            demo.send_signal(signal.SIGINT)  # (killed outright, the demo left its engine running)
            try:
                demo.wait(60)
            except subprocess.TimeoutExpired:
                demo.kill()
    error = (tmp_path / "stderr.txt").read_text()
    step = re.search(r"demo interrupted during step (\d) \((\w+)\)", error)
    assert step and int(step.group(1)) >= 3, error
    assert processes_using(first_run.work) == []
    assert port_closed(int(engine.group(1)))
    folder = Path(error.strip().splitlines()[-1].rsplit("partial report: ", 1)[1])
    report = json.loads((folder / "report.json").read_text())
    assert report["status"] == "interrupted" and report["failed_step"]["number"] == int(step.group(1))
    assert (first_run.work / "latest").resolve() == first_run.report_dir.resolve()  # the last complete run


def test_a_failing_step_is_named_and_everything_is_stopped(first_run):
    # A corrupt model folder: its engine exits at start-up, in step 3 (the earliest step that starts
    # processes; the Ctrl-C test above stops a run with an engine and a server up).
    simulator = Path(first_run.report["training"]["simulator"]["model"])
    config = simulator / "config.json"
    original = config.read_bytes()
    config.write_text("{")
    try:
        result = subprocess.run(
            demo_command(first_run.work),
            cwd=REPO,
            env=demo_env(first_run.home),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        config.write_bytes(original)
    assert result.returncode == 1
    assert re.search(
        r"^demo failed at step 3 \(serve\): transformers serve exited with status \d+ before answering",
        result.stderr,
        re.MULTILINE,
    ), result.stderr[-2000:]
    assert "not a valid JSON file" in result.stderr
    assert processes_using(first_run.work) == []
    folder = Path(result.stderr.strip().splitlines()[-1].rsplit("partial report: ", 1)[1])
    report = json.loads((folder / "report.json").read_text())
    assert report["status"] == "failed" and [s["name"] for s in report["steps"]] == list(STEPS[:2])
    assert "training" in report  # the steps before the failure are in the report
    assert "failed at step 3 (serve)" in (folder / "report.md").read_text()
    assert (first_run.work / "latest").resolve() == first_run.report_dir.resolve()


def test_the_docs_commands_that_start_no_engine_run_against_this_demo(first_run, tmp_path):
    """The README's and docs' commands that neither train nor start an engine (tool and cache commands, data
    builders, --help), run as written in a clone whose runs/demo/latest is this demo's."""
    from test_readme import cheap_commands, run_as_in_a_clone

    commands = cheap_commands()
    assert len(commands) >= 10
    assert not (failures := run_as_in_a_clone(commands, first_run.work / "latest", tmp_path)), "\n".join(failures)


@pytest.mark.parametrize(
    "demo_args, builds_llama_cpp",
    [("", True), ("--full", True), ("--tiny", False), ("--quick", False), ("--engine vllm", False)],
)
def test_make_demo_builds_llama_cpp_only_for_the_runs_it_serves(tmp_path, demo_args, builds_llama_cpp):
    # `make -n` with a venv that does not exist: what a fresh clone's `make demo` would run, run for nothing.
    dry_run = subprocess.run(
        ["make", "-n", "demo", f"DEMO_ARGS={demo_args}", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "scripts/demo.py" in dry_run
    assert ("CMAKE_ARGS=" in dry_run) == builds_llama_cpp  # the engine's build, the only recipe that sets it


def test_the_demo_s_servers_take_their_settings_from_its_config_not_the_user_s_environment():
    """An exported MIRRORAPI_PORT (serving.md's own example) moved the demo's virtual server off the port its config
    names, where the demo waited for it 60 s and failed; the variables that are no server setting stay."""
    from demo_steps.child_processes import without_server_settings

    environ = {"MIRRORAPI_PORT": "8081", "MIRRORAPI_CONFIG": "mine.yml", "MIRRORAPI_MODELS_DIR": "/m", "PATH": "/bin"}
    assert without_server_settings(environ) == {"MIRRORAPI_MODELS_DIR": "/m", "PATH": "/bin"}


@pytest.mark.parametrize("flags", [["--full", "--quick"], ["--tiny", "--engine", "vllm"]])
def test_flags_that_cannot_go_together_are_one_line_and_make_nothing(tmp_path, flags):
    """Refused before the work folder's caches are made (they once were, in the clone with the default folder)."""
    work = tmp_path / "work"
    done = subprocess.run(
        [sys.executable, "scripts/demo.py", *flags, "--work-dir", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "error:" in done.stderr.strip().splitlines()[-1] and not work.exists()
