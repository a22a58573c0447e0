"""The servers the benchmarks start (bench/): each variant serves what the benchmark measures."""

from __future__ import annotations

import json
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
