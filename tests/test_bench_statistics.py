"""The benchmarks' arithmetic (bench/): medians over runs, ratios of one run's figures, the import child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from cache_import_stall import ONE_TRANSACTION  # noqa: E402
from server_load import median_of  # noqa: E402


def test_a_status_some_runs_lack_counts_zero_there():
    runs = [{"statuses": {"ok": 5, "error": 1}}, {"statuses": {"ok": 7}}, {"statuses": {"ok": 6, "timeout": 2}}]
    assert median_of(runs) == {"statuses": {"ok": 6, "error": 0, "timeout": 0}}
    assert median_of(list(reversed(runs)))["statuses"]["error"] == 0


def test_a_ratio_is_the_median_of_the_runs_ratios():
    # Made-up runs whose own ratios are 2, 1, 1: the ratio is 1; the ratio of the two medians would be 1.2.
    runs = [{"ours": 2.0, "bare": 1.0}, {"ours": 5.0, "bare": 5.0}, {"ours": 6.0, "bare": 6.0}]
    per_run = [{"ours_over_bare": r["ours"] / r["bare"]} for r in runs]
    assert median_of(per_run) == {"ours_over_bare": 1.0}


def test_the_one_transaction_import_child_runs(tmp_path):
    samples = REPO / "data" / "samples"
    db = tmp_path / "c.sqlite"
    args = [str(samples / "pairs.jsonl"), str(db), str(samples / "tools")]
    command = [sys.executable, "-c", ONE_TRANSACTION, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert db.is_file() and "'stored': " in result.stdout and "'unreadable': []" in result.stdout


def test_the_load_generator_is_answered_by_the_real_server_and_a_refusal_is_no_measure(tmp_path):
    """The load generator's requests name this machine as their Host, which the server answers (it refuses another
    Host with 421: until 2026-11-30 the generators sent `host: bench`, and every server bench measured refusals);
    a workload the server refuses (here: a server that asks for a key the benchmark does not send, 401) stops the
    benchmark instead of giving figures."""
    import json
    import os

    from server_load import run_load

    from harness.fake_engines import unreachable_engine_url
    from harness.processes import free_port, serve_in_thread
    from mirrorapi.serving.app import create_app
    from mirrorapi.serving.cache import ResponseCache
    from mirrorapi.serving.config import ServerSettings
    from mirrorapi.tools import ToolRegistry

    body = {
        "category": "APIBank",
        "tool_name": "apibank_account",
        "api_name": "GetUserToken",
        "tool_input": json.dumps({"username": "JohnDoe", "password": "pass123"}),
        "strip": "truncate",
        "toolbench_key": "",
    }
    bodies = tmp_path / "bodies.json"
    bodies.write_text(json.dumps([json.dumps(body)]))
    registry = ToolRegistry.load([REPO / "data" / "samples" / "tools"])
    doc = registry.resolve(body["category"], body["tool_name"], body["api_name"])
    for key in (None, "secret"):  # the recorded answer each server's cache holds: a hit
        cache = ResponseCache(tmp_path / f"cache-{key}.sqlite")
        cache.put_many(
            [(doc.category, doc.tool, doc.api, json.loads(body["tool_input"]), "", '{"token": "t"}')], "real"
        )
        cache.close()
    for key, expected in ((None, None), ("secret", "refused the benchmark's requests ({'http_401': 8})")):
        port = free_port()
        settings = ServerSettings(
            api_base=unreachable_engine_url(),
            tools_folder=[REPO / "data" / "samples" / "tools"],
            cache_path=tmp_path / f"cache-{key}.sqlite",
            mode="replay",
            port=port,
            log_level="warning",
            server_api_key=key,
        )
        with serve_in_thread(create_app(settings), port, timeout=60, access_log=False):
            try:
                found = run_load(port, os.getpid(), bodies, clients=2, requests=8)
            except RuntimeError as exc:
                assert expected and expected in str(exc)
            else:
                assert expected is None, "a refused workload was measured"
                assert found["requests"] == 8 and found["statuses"] == {"ok": 8}  # answered from the cache


def _answering_server(answer):
    """A ThreadingHTTPServer on 127.0.0.1 whose POST handler is `answer(handler)`; serve_forever in a thread."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive unless the answer says `connection: close`

        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            answer(self)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _refuse_and_close(handler):
    body = b'{"detail": "Internal Server Error"}'
    handler.send_response(500)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(body)))
    handler.send_header("connection", "close")
    handler.end_headers()
    handler.wfile.write(body)


def _close_without_answering(handler):
    handler.close_connection = True


def test_a_refusal_that_closes_the_connection_or_a_dropped_one_is_no_measure(tmp_path):
    """A 500 with `connection: close` (until 2026-12 the load generator then crashed on the closed connection, and
    run_load raised a bare CalledProcessError) and a connection closed without an answer are statuses: run_load
    stops the benchmark saying so."""
    import os

    from server_load import run_load

    bodies = tmp_path / "bodies.json"
    bodies.write_text('["{}"]')
    for answer, expected in (
        (_refuse_and_close, "refused the benchmark's requests ({'http_500': 8})"),
        (_close_without_answering, "refused the benchmark's requests ({'connection_error': 8})"),
    ):
        server = _answering_server(answer)
        try:
            with pytest.raises(RuntimeError) as raised:
                run_load(server.server_address[1], os.getpid(), bodies, clients=2, requests=8)
        finally:
            server.shutdown()
            server.server_close()
        assert expected in str(raised.value)


def test_a_load_generator_that_fails_is_reported_with_its_error(tmp_path):
    import os

    from server_load import run_load

    server = _answering_server(_refuse_and_close)  # never reached: the generator fails reading its bodies
    try:
        with pytest.raises(RuntimeError, match=r"(?s)exited with status 1:.*FileNotFoundError.*missing\.json"):
            run_load(server.server_address[1], os.getpid(), tmp_path / "missing.json", clients=2, requests=8)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--steps", "5"], "--steps must be at least 20 (the recipe logs every 10 steps)"),
        (["--steps", "15"], "--steps must be at least 20"),  # one log line, the warm-up: it was the figure
        (["--runs", "0"], "--runs must be at least 1"),
    ],
)
def test_train_tiny_refuses_settings_that_give_no_figure(argv, message):
    """bench/train_tiny.py's figure is the median of the recipe's log lines after the first (every 10 steps): with
    fewer than 20 steps there is none (until 2026-12: a StatisticsError traceback after the training, or the
    warm-up line taken as the figure). Refused before anything is built."""
    command = [sys.executable, str(REPO / "bench" / "train_tiny.py"), *argv]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"train_tiny.py: error: {message}" in result.stderr and result.stdout == ""
