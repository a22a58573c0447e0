"""The servers the benchmarks start (bench/): each variant serves what the benchmark measures."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import server_floors  # noqa: E402
import server_workloads  # noqa: E402

from harness.processes import free_port  # noqa: E402

SAMPLE_TOOLS = REPO / "data" / "samples" / "tools"


def test_hit_parts_endpoint_variant_answers_the_constant(tmp_path):
    """bench/hit_parts.py's `endpoint` variant swaps `VirtualApi.answer` for a constant answer: the server calls it
    with the arguments the real one takes (until 2026-12 the constant lacked `client_gone`: every request was a
    500, and the bench measured refusals)."""
    port = free_port()
    engine_port = free_port()  # an engine that is down: every call is answered by the constant
    command = server_workloads.mirrorapi_command(
        SimpleNamespace(tools=str(SAMPLE_TOOLS)),
        port,
        engine_port,
        tmp_path / "cache.sqlite",
        None,
        tmp_path / "requests.jsonl",
        extra=["--variant", "endpoint"],
        script=REPO / "bench" / "hit_parts.py",
    )
    body = {"category": "APIBank", "tool_name": "apibank_account", "api_name": "GetUserToken", "tool_input": "{}"}
    with server_workloads.started(command, tmp_path, "endpoint", f"http://127.0.0.1:{port}/live"):
        answer = httpx.post(f"http://127.0.0.1:{port}/virtual", json=body, timeout=30)
    assert answer.status_code == 200, answer.text[:300]
    assert answer.content == server_floors.BARE_BODY
    assert json.loads(answer.content)["error"] == ""


def test_sessions_memory_sends_only_calls_the_cache_holds(tmp_path):
    """bench/sessions_memory.py measures the session path on cache hits: its bodies are the calls the import
    stored (until 2026-12 they were every distinct call of the pairs, 19 of them recorded transport failures the
    import leaves out, sent to an engine that is down and counted as answered), and a run whose calls are not all
    hits fails."""
    import sessions_memory

    from mirrorapi.transport_failures import transport_failure

    calls = sessions_memory.bodies(tmp_path)
    pairs = [json.loads(line) for line in sessions_memory.PAIRS.read_text(encoding="utf-8").splitlines()]

    def call(tool: str, api: str, arguments: dict) -> tuple:  # the body's names are the registry's spelling
        return tool.lower(), api.lower(), json.dumps(arguments, sort_keys=True)

    answered = {}  # call -> whether one of its recorded answers is no transport failure
    for p in pairs:
        key = call(p["tool_name"], p["api_name"], p["tool_input"])
        genuine = not transport_failure(p["response"]["error"], p["response"]["response"])
        answered[key] = answered.get(key, False) or genuine
    failed = {key for key, genuine in answered.items() if not genuine}
    sent = {call(b["tool_name"], b["api_name"], json.loads(b["tool_input"])) for b in map(json.loads, calls)}
    assert len(calls) == len(sent) and failed and not failed & sent
    store = ["--cache-path", str(tmp_path / "sqlite.sqlite")]
    result = sessions_memory.run_variant("sqlite", REPO, store, tmp_path, SimpleNamespace(sessions=8, calls=4), calls)
    assert result["answered"] == 32
    assert {outcome for outcome, n in result["outcomes"].items() if n} == {"hit"}  # the warm-up sent every call


PROBE = """
import http.server, json, sys
import mirrorapi

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"mirrorapi": mirrorapi.__file__}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def test_a_server_a_bench_starts_imports_this_checkout(tmp_path, monkeypatch):
    """A script run as `python serving/main_mirrorapi.py` has its own folder on sys.path, not the clone's: without
    the clone on PYTHONPATH its `import mirrorapi` is whatever the venv's editable install points at (another clone
    sharing the venv; until 2026-12 the benches measured that one's server). `started` gives the child this clone."""
    from harness.processes import checkout_env

    monkeypatch.delenv("PYTHONPATH", raising=False)  # as a bench is run: `python bench/server.py`
    script = tmp_path / "probe.py"  # a script outside the clone, as serving/main_mirrorapi.py is outside bench/
    script.write_text(PROBE)
    port = free_port()
    url = f"http://127.0.0.1:{port}/live"
    with server_workloads.started([sys.executable, str(script), str(port)], tmp_path, "probe", url, cwd=tmp_path):
        imported = Path(httpx.get(url, timeout=30).json()["mirrorapi"])
    assert imported.is_relative_to(REPO / "mirrorapi"), imported
    # Prepended to what the environment had; a bench of another checkout (server_commits) names its root.
    env = checkout_env(tmp_path, {"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert env == {"PYTHONPATH": f"{tmp_path}{os.pathsep}/elsewhere", "HOME": "/h"}
    assert checkout_env(env={})["PYTHONPATH"] == str(REPO)
