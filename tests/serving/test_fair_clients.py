"""Nothing one client does starves the others (issue 34 §3), tried as a hostile client would on a real
uvicorn: MCP sessions bounded per client and in total and closed when idle, /mcp's body bound and its
refusals as JSON-RPC errors, tools/list cursors that int() cannot read, /virtual session ids and the history
a session keeps, a huge argument beside small calls, and the refusals the server answers before any handler
(401, 405, 408, 413) counted in /metrics and the request log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from harness.fake_engines import HungEngine, StubEngine, seconds_until_it_fails
from mirrorapi.engine_client import EngineClient

BODY = {
    "category": "Data",
    "tool_name": "theclique",
    "api_name": "transfermarkt_search",
    "tool_input": '{"name": "Lionel Messi"}',
}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "hostile", "version": "1"}},
}
MCP_HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}


def client_from(url: str, address: str) -> httpx.Client:
    """An HTTP client whose connections come from `address` (127.0.0.1 and 127.0.0.2 are two clients)."""
    return httpx.Client(base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address=address))


def initialize(client: httpx.Client) -> httpx.Response:
    return client.post("/mcp", json=INITIALIZE, headers=MCP_HEADERS)


def is_json_rpc_error(response: httpx.Response) -> str:
    """The message of a JSON-RPC error answer with a JSON content type (asserted)."""
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert body["jsonrpc"] == "2.0" and isinstance(body["error"]["code"], int), body
    return body["error"]["message"]


# ------------------------------------------------------------------------------------------------- MCP
def test_one_client_cannot_take_every_mcp_session(serve, engine_down, tmp_path):
    with (
        serve(
            cache_path=str(tmp_path / "c.sqlite"),
            api_base=[engine_down],
            mcp_sessions_per_client=3,
            mcp_max_sessions=5,
        ) as server,
        client_from(server.url, "127.0.0.1") as first,
        client_from(server.url, "127.0.0.2") as second,
    ):
        opened = [initialize(first) for _ in range(3)]
        assert [r.status_code for r in opened] == [200, 200, 200]
        refused = initialize(first)
        assert refused.status_code == 503
        message = is_json_rpc_error(refused)
        assert "127.0.0.1" in message and "3 of the 3" in message and "mcp_sessions_per_client" in message
        assert "DELETE" in message
        assert initialize(second).status_code == 200  # another client still gets in
        # Ending one of its sessions gives the first client room again.
        ended = first.delete("/mcp", headers={**MCP_HEADERS, "mcp-session-id": opened[0].headers["mcp-session-id"]})
        assert ended.status_code < 400
        assert initialize(first).status_code == 200
        # In total: 5 sessions open (3 + 1 + ... ), the next client is told the server's bound.
        assert initialize(second).status_code == 200
        with client_from(server.url, "127.0.0.3") as third:
            total = initialize(third)
        assert total.status_code == 503 and "mcp_max_sessions" in is_json_rpc_error(total)


def test_an_idle_mcp_session_is_closed_in_seconds_not_half_an_hour(serve, engine_down, tmp_path):
    with (
        serve(
            cache_path=str(tmp_path / "c.sqlite"),
            api_base=[engine_down],
            mcp_sessions_per_client=1,
            mcp_session_idle_timeout=1.0,
        ) as server,
        client_from(server.url, "127.0.0.1") as client,
    ):
        session = initialize(client).headers["mcp-session-id"]
        assert initialize(client).status_code == 503
        time.sleep(1.6)
        ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
        gone = client.post("/mcp", json=ping, headers={**MCP_HEADERS, "mcp-session-id": session})
        assert gone.status_code == 404
        assert initialize(client).status_code == 200


def test_mcp_honours_max_body_bytes_and_answers_json(serve, engine_down, tmp_path):
    with serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine_down], max_body_bytes=100_000) as server:
        big = {**INITIALIZE, "params": {**INITIALIZE["params"], "padding": "x" * 500_000}}
        response = server.client.post("/mcp", json=big, headers=MCP_HEADERS)
        assert response.status_code == 413
        assert "100,000" in is_json_rpc_error(response)
        # The SDK's own refusals (a wrong content type here) are JSON-RPC errors with a JSON content type too.
        wrong = server.client.post(
            "/mcp", content=json.dumps(INITIALIZE), headers={**MCP_HEADERS, "content-type": "text/plain"}
        )
        assert wrong.status_code == 400
        assert "Content-Type" in is_json_rpc_error(wrong)
        # A 2026-07-28 GET (the SDK answers 405 with no body): the method's refusal keeps its Allow header, which
        # RFC 9110 §15.5.6 says a 405 MUST carry, and says what it is.
        modern_get = server.client.get("/mcp", headers={**MCP_HEADERS, "mcp-protocol-version": "2026-07-28"})
        assert modern_get.status_code == 405 and modern_get.headers["allow"] == "POST"
        assert is_json_rpc_error(modern_get) == "Method Not Allowed"
        assert initialize(server.client).status_code == 200


@pytest.mark.parametrize("cursor", ["9" * 4301, "\u00b2", "-1"], ids=["4301-digits", "superscript-two", "negative"])
def test_a_cursor_int_cannot_read_is_invalid_params(serve, engine_down, tmp_path, cursor):
    with serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine_down]) as server:

        async def main():
            transport = streamable_http_client(
                server.url + "/mcp?tool=APIBank/apibank_account", http_client=create_mcp_http_client()
            )
            async with Client(transport, mode="legacy") as client:
                with pytest.raises(MCPError) as raised:
                    await client.list_tools(cursor=cursor)
                return raised.value

        error = asyncio.run(main())
        assert error.error.code == -32602  # JSON-RPC's invalid params
        assert "invalid cursor" in error.error.message
        assert server.metric("mirrorapi_requests_total", outcome="internal_error") == 0


# -------------------------------------------------------------------------------------- /virtual sessions
def test_a_session_id_of_any_length_is_refused_clearly(serve, engine_down, tmp_path):
    with serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine_down]) as server:
        long_id = "s" * 900_000
        for response in (
            server.virtual({**BODY, "session_id": long_id}),
            server.client.post("/virtual", json=BODY, headers={"x-session-id": long_id[:60_000]}),
        ):
            assert response.status_code == 422
            assert "session id" in response.json()["error"] and "256" in response.json()["error"]
        assert server.virtual({**BODY, "session_id": "s" * 256}).status_code == 200


def test_a_session_keeps_only_the_history_a_prompt_can_show(serve, engine_stub, tmp_path):
    """Big calls in a session: the stored row stays within the history budget (the prompt never shows more)."""
    cache = tmp_path / "c.sqlite"
    with serve(cache_path=str(cache), api_base=[engine_stub()], session_char_budget=2000) as server:
        for i in range(8):
            answer = server.virtual({**BODY, "session_id": "big", "tool_input": {"name": f"{i}" + "x" * 15_000}})
            assert answer.status_code == 200
    import sqlite3

    with sqlite3.connect(cache) as db:
        steps, lines = db.execute("SELECT steps, lines FROM sessions WHERE id = 'big'").fetchone()
    assert steps == 8
    assert len(lines) < 2_100  # on main: 8 lines of 15,000 characters each


def test_the_sqlite_wal_stays_bounded_after_a_burst_of_writes(tmp_path, monkeypatch):
    """10 MB of session writes: once checkpointed, the WAL file is back within its bound (it kept its
    largest size for ever)."""
    from mirrorapi.serving.cache import sqlite as sqlite_store

    monkeypatch.setattr(sqlite_store, "WAL_LIMIT_BYTES", 1 << 20, raising=False)
    path = tmp_path / "c.sqlite"

    async def burst() -> int:
        cache = sqlite_store.ResponseCache(path, autocheckpoint=False)
        try:
            for i in range(300):
                await cache.update_session(f"s{i}", 3600, lambda state, i=i: (f"d{i}", 1, [str(i) * 32_000]))
            await cache.maintain(3600)
            return (tmp_path / "c.sqlite-wal").stat().st_size
        finally:
            await cache.aclose()

    assert asyncio.run(burst()) <= 1 << 20


# ------------------------------------------------------------------------------------------------ the loop
def test_a_huge_argument_does_not_stall_other_clients(serve, engine_down, tmp_path):
    """A 3 MB argument (`[[1]] * 600,000`) beside small calls, with the body bound raised above it: the small
    calls are answered while it is worked on (on main they waited 2-3 s)."""
    with serve(
        cache_path=str(tmp_path / "c.sqlite"), api_base=[engine_down], engine_retries=0, max_body_bytes=4_000_000
    ) as server:
        huge = json.dumps({**BODY, "tool_input": {"name": "Messi", "rows": [[1]] * 600_000}}).encode()
        server.virtual(BODY)  # the engine-down answer of the small call is the same every time
        waits: list[float] = []
        statuses: list[int | str] = []  # asserted in the test's thread: an assert in another one only warns

        def small_calls(stop: threading.Event) -> None:
            try:
                with httpx.Client(base_url=server.url, timeout=30) as client:
                    while not stop.is_set():
                        start = time.perf_counter()
                        statuses.append(client.post("/virtual", json=BODY).status_code)
                        waits.append(time.perf_counter() - start)
                        time.sleep(0.01)
            except Exception as exc:  # noqa: BLE001 - told in the test's thread
                statuses.append(f"{type(exc).__name__}: {exc}")

        stop = threading.Event()
        thread = threading.Thread(target=small_calls, args=(stop,))
        thread.start()
        time.sleep(0.3)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            answer = client.post("/virtual", content=huge, headers={"content-type": "application/json"})
        time.sleep(0.3)
        stop.set()
        thread.join(30)
        assert not thread.is_alive()
        assert answer.status_code == 200 and "too large" in answer.json()["error"]
        assert statuses and set(statuses) == {200}, statuses
        assert len(waits) > 5
        assert max(waits) < 0.5, f"a small call waited {max(waits):.2f} s"


# ------------------------------------------------------------------------------------------------ refusals
def _log_lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_refusals_are_counted_and_logged(serve, engine_down, tmp_path):
    log = tmp_path / "requests.jsonl"
    with serve(
        cache_path=str(tmp_path / "c.sqlite"),
        api_base=[engine_down],
        server_api_key="sesame",
        log_file=str(log),
        max_body_bytes=1000,
        request_timeout=0.5,
    ) as server:
        key = {"authorization": "Bearer sesame"}
        assert server.client.post("/virtual", json=BODY).status_code == 401
        assert server.client.get("/virtual", headers=key).status_code == 405
        assert server.client.post("/virtual", json={**BODY, "tool_input": "x" * 5000}, headers=key).status_code == 413
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as trickler:
            trickler.sendall(b"POST /virtual HTTP/1.1\r\nhost: x\r\n")
            trickler.settimeout(5)
            assert trickler.recv(100).startswith(b"HTTP/1.1 408")
        with socket.create_connection(("127.0.0.1", port)) as flooder:  # a header section that never ends
            flooder.sendall(b"POST /virtual HTTP/1.1\r\nhost: x\r\n")
            with contextlib.suppress(OSError):
                for _ in range(64):
                    flooder.sendall(b"x-pad: " + b"a" * 65_536 + b"\r\n")
            flooder.settimeout(5)
            assert flooder.recv(100).startswith(b"HTTP/1.1 431")
        metrics = httpx.get(server.url + "/metrics", headers=key).text
        for outcome in (
            "unauthorized",
            "method_not_allowed",
            "body_too_large",
            "request_timeout",
            "headers_too_large",
        ):
            assert f'mirrorapi_requests_total{{outcome="{outcome}"}} 1.0' in metrics, outcome
    statuses = {line["outcome"]: line["status"] for line in _log_lines(log)}
    assert statuses == {
        "unauthorized": 401,
        "method_not_allowed": 405,
        "body_too_large": 413,
        "request_timeout": 408,
        "headers_too_large": 431,
    }


def test_a_bodys_extra_fields_are_logged_within_bounds(serve, engine_down, tmp_path):
    # The names of fields StableToolBench does not define are logged, as the other names are, cut: a 1 MB name or
    # 60,000 fields made a log line of their own size.
    log = tmp_path / "requests.jsonl"
    extra = {f"field_{i}_" + "x" * 5000: i for i in range(50)}
    with serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine_down], log_file=str(log)) as server:
        assert server.client.post("/virtual", json={**BODY, "api_name": "nowhere", **extra}).status_code == 200
    [line] = _log_lines(log)
    assert len(line["extra_fields"]) == 21 and line["extra_fields"][-1] == "... 30 more"
    assert all(len(name) <= 200 for name in line["extra_fields"]) and line["extra_fields"][0].startswith("field_0_")


def test_health_without_the_key_tells_no_paths_or_engine_urls(serve, engine_down, tmp_path):
    cache = tmp_path / "secret-folder" / "c.sqlite"
    with serve(cache_path=str(cache), api_base=[engine_down], server_api_key="sesame") as server:
        anonymous = server.client.get("/health")
        assert anonymous.status_code == 503  # the engine is down: the status is still told
        assert anonymous.json()["status"] == "unavailable"
        text = anonymous.text
        assert "secret-folder" not in text and engine_down.split("/v1")[0] not in text
        full = server.client.get("/health", headers={"authorization": "Bearer sesame"}).json()
        assert "secret-folder" in full["cache"]["location"] and full["engine"][0]["base_url"] == engine_down


# ------------------------------------------------------------------------------------------------- engines
def test_a_replica_that_lists_its_model_but_hangs_completions_stays_out(serve, tmp_path):
    """It is skipped after its first timeout and not let back in by its model list after every cool-down;
    /health says degraded."""
    with StubEngine() as good, StubEngine(delay=3600, model="mirrorapi") as hung:

        async def calls() -> tuple[list[float], list[bool]]:
            engine = EngineClient(
                [hung.url, good.url], "mirrorapi", timeout=5, attempt_timeout=0.4, retries=1, cooldown=0.2
            )
            slow = []
            try:
                deadline = time.monotonic() + 3.0
                while time.monotonic() < deadline:
                    start = time.monotonic()
                    await engine.chat([{"role": "user", "content": "hi"}])
                    slow.append(time.monotonic() - start)
                    await asyncio.sleep(0.05)
                return slow, [replica.ok for replica in await engine.health(timeout=0.5)]
            finally:
                await engine.aclose()

        latencies, healthy = asyncio.run(calls())
        slowed = [t for t in latencies if t > 0.35]
        assert len(slowed) <= 1, f"{len(slowed)} calls waited for the hung replica: {slowed}"
        assert healthy == [False, True]
        with serve(
            cache_path=str(tmp_path / "c.sqlite"),
            api_base=[hung.url, good.url],
            engine_attempt_timeout=0.4,
            engine_cooldown=0.2,
        ) as server:
            server.virtual({**BODY, "tool_input": {"name": "a miss"}})  # fails over from the hung replica
            health = server.client.get("/health").json()
            assert health["status"] == "degraded", health


def test_engine_deadlines_end_when_set_not_at_the_next_whole_second():
    """Four calls to a hung engine with a 5.2 s deadline, started a quarter second apart: aiohttp's rounding up
    made at least three of them end 0.25-1 s late."""
    with HungEngine() as hung:

        async def one(offset: float) -> float:
            await asyncio.sleep(offset)
            return await seconds_until_it_fails(EngineClient(hung.url, "m", timeout=5.2, retries=0))

        async def main() -> list[float]:
            return list(await asyncio.gather(*(one(i / 4) for i in range(4))))

        durations = asyncio.run(main())
    assert all(5.2 <= d < 5.45 for d in durations), durations


def test_the_large_body_worker_ends_with_its_server(sample_tools, tmp_path):
    """The worker process that parses large bodies is gone soon after its server is killed (kill -9)."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from harness.processes import free_port, poll_until, wait_until_ready

    port, log = free_port(), tmp_path / "server.log"
    with open(log, "wb") as out:
        command = [
            sys.executable,
            "serving/main_mirrorapi.py",
            "--tools-folder",
            str(sample_tools),
            "--cache-path",
            str(tmp_path / "c.sqlite"),
            "--port",
            str(port),
            "--mode",
            "replay",
        ]
        repo = Path(__file__).resolve().parents[2]
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=repo)
    try:
        wait_until_ready(f"http://127.0.0.1:{port}/live", 120, process=server, log_path=log)

        def worker() -> int | None:
            for task in Path(f"/proc/{server.pid}/task").iterdir():
                for child in (task / "children").read_text().split():
                    command = Path(f"/proc/{child}/cmdline").read_bytes()
                    if b"spawn_main" in command:
                        return int(child)
            return None

        pid = poll_until(worker, 60, "the large-body worker")
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(10)

    def gone() -> bool | None:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z" or None
        except OSError:
            return True

    try:
        poll_until(gone, 15, f"the large-body worker {pid} outlived its server")
    finally:
        if not gone():
            os.kill(pid, signal.SIGKILL)


def test_initialize_requests_sent_at_once_cannot_pass_the_per_client_bound(serve, engine_down, tmp_path):
    """Each request's slot is taken as it passes the bound, not when the SDK's answer opens the session: twelve
    `initialize` requests sent at once by one client got twelve sessions with a bound of 2."""
    import concurrent.futures

    with (
        serve(cache_path=str(tmp_path / "c.sqlite"), api_base=[engine_down], mcp_sessions_per_client=2) as server,
        client_from(server.url, "127.0.0.1") as client,
        concurrent.futures.ThreadPoolExecutor(12) as pool,
    ):
        statuses = sorted(r.status_code for r in pool.map(lambda _: initialize(client), range(12)))
    assert statuses == [200, 200] + [503] * 10


def test_a_session_in_use_by_the_sdk_client_stays_counted_past_the_idle_timeout(serve, engine_down, tmp_path):
    """The SDK's client keeps a GET stream open for its session, and the SDK keeps a session with a request in
    flight open however long since its last POST: the bound counted such a session only until `idle_seconds` after
    its last POST, so one client could open every session. A 2026-07-28 client opens no session: it is not refused
    for the sessions others hold."""

    async def main(url: str):
        async with Client(streamable_http_client(url + "/mcp"), mode="legacy") as client:
            await client.list_tools()
            await asyncio.sleep(2.5)  # past the idle timeout: the GET stream is still open
            with client_from(url, "127.0.0.1") as raw:
                second = initialize(raw)
            async with Client(streamable_http_client(url + "/mcp"), mode="2026-07-28") as stateless:
                tools = await stateless.list_tools()  # from the same address, while its one session is held
            listed = await client.list_tools()  # the session is still the client's
        return second, listed, tools

    with serve(
        cache_path=str(tmp_path / "c.sqlite"),
        api_base=[engine_down],
        mcp_sessions_per_client=1,
        mcp_session_idle_timeout=1.0,
        mcp_toolset="tool=APIBank/apibank_account",
    ) as server:
        second, listed, tools = asyncio.run(main(server.url))
    assert second.status_code == 503 and "mcp_sessions_per_client" in is_json_rpc_error(second)
    assert listed.tools and tools.tools
