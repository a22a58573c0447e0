"""Hostile and oversized input on a real uvicorn (issue 11, item 7): body and argument bounds, huge
names, deep nesting, lone surrogates, clients that trickle, the API key."""

import contextlib
import json
import socket
import time

import httpx
import pytest

from harness.fake_engines import StubEngine
from harness.processes import free_port
from mirrorapi.serving.config import ServerSettings

BODY = {
    "category": "Data",
    "tool_name": "theclique",
    "api_name": "transfermarkt_search",
    "tool_input": '{"name": "Lionel Messi"}',
}


@pytest.fixture(scope="module")
def guarded(serve, tmp_path_factory):
    """No engine listens: a call that reached it would be an `unreachable` engine call."""
    db = tmp_path_factory.mktemp("db")
    with serve(
        cache_path=str(db / "c.sqlite"),
        api_base=[f"http://127.0.0.1:{free_port()}/v1"],
        engine_timeout=2,
        engine_retries=0,
        max_body_bytes=100_000,
        max_arguments_chars=1000,
        request_timeout=1.0,
    ) as server:
        yield server


def engine_calls(server) -> float:
    return server.metric("mirrorapi_engine_calls_total", result="unreachable")


def test_an_engine_answer_holding_a_lone_surrogate_is_served_and_stored(serve, tmp_path):
    # A small model writes half an emoji's escape pair ("\\ud83d"): UTF-8 (SQLite, the client's body) cannot hold
    # the character it decodes to. It once left the cache's transaction open: that call never answered, and no
    # later one was stored.
    with (
        StubEngine({"error": "", "response": "Lionel Messi \ud83d"}) as engine,
        serve(api_base=[engine.url], cache_path=str(tmp_path / "c.sqlite"), engine_retries=0) as server,
    ):
        first = server.client.post("/virtual", json=BODY, timeout=10)
        assert first.status_code == 200 and first.json() == {"error": "", "response": "Lionel Messi \ufffd"}
        asked = engine.requests
        again = server.client.post("/virtual", json=BODY, timeout=10)
        assert again.headers["x-mirrorapi-outcome"] == "hit" and again.json() == first.json()
        other = server.client.post("/virtual", json={**BODY, "tool_input": '{"name": "Pele"}'}, timeout=10)
        assert other.headers["x-mirrorapi-outcome"] == "simulated" and engine.requests == asked + 1


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_over_the_limit_is_413_in_the_error_shape(guarded, chunked):
    body = json.dumps({**BODY, "tool_input": {"text": "x" * 200_000}}).encode()
    content = iter([body[i : i + 65536] for i in range(0, len(body), 65536)]) if chunked else body
    response = guarded.client.post("/virtual", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert set(response.json()) == {"error", "response"}
    assert response.json()["error"].startswith("Request body too large: ")
    assert "100,000" in response.json()["error"]
    assert guarded.virtual(BODY).status_code == 200  # the server goes on


def test_arguments_over_the_limit_never_reach_the_engine(guarded):
    calls = engine_calls(guarded)
    answer = guarded.virtual({**BODY, "tool_input": {"name": "y" * 5000}}).json()  # {"name":"y...y"}
    assert answer["error"].startswith("tool_input is too large to simulate: 5,011 characters of JSON")
    assert engine_calls(guarded) == calls
    guarded.virtual({**BODY, "tool_input": {"name": "short"}})  # a miss of normal size is sent
    assert engine_calls(guarded) == calls + 1


@pytest.mark.parametrize("field", ["category", "tool_name", "api_name"])
def test_a_huge_name_is_answered_without_a_closest_name_search_and_echoed_short(guarded, field, monkeypatch):
    """The closest-name search once took seconds of the event loop on such a name; no known name is over
    MAX_NAME_CHARS long, so none is searched for (the server runs in this process: the search is watched)."""
    from mirrorapi import tools

    searched: list[int] = []
    search = tools._closest
    monkeypatch.setattr(tools, "_closest", lambda name, *args: searched.append(len(name)) or search(name, *args))
    name = "theclique" + "q" * 90_000
    response = guarded.virtual({**BODY, field: name})
    answer = response.json()
    assert response.status_code == 200 and answer["error"].startswith("Unknown ")
    assert "(90,009 characters)" in answer["error"] and len(answer["error"]) < 300
    assert searched == [] and "Closest known" not in answer["error"]
    guarded.virtual({**BODY, field: "theclique" + "q" * 9})  # a name of normal size is searched: the watch works
    assert searched == [18]


@pytest.mark.parametrize(
    "tool_input, reason",
    [
        ("[" * 5000 + "]" * 5000, "tool_input is nested too deeply"),
        ('{"a": ' * 150 + "1" + "}" * 150, "tool_input is nested too deeply (more than 100 levels)"),
        ('{"name": "\\ud800"}', "tool_input holds a lone surrogate '\\ud800'"),
    ],
    ids=["5000-levels", "150-levels", "lone-surrogate"],
)
def test_deep_nesting_and_lone_surrogates_are_parse_errors(guarded, tool_input, reason):
    internal = guarded.metric("mirrorapi_requests_total", outcome="internal_error")
    response = guarded.virtual({**BODY, "tool_input": tool_input})
    assert response.status_code == 200
    assert response.json() == {
        "error": "Tool input parse error...\n" + response.json()["error"].split("\n", 1)[1],
        "response": "",
    }
    assert response.json()["error"].split("\n", 1)[1].startswith(reason)
    assert guarded.metric("mirrorapi_requests_total", outcome="internal_error") == internal


def test_a_lone_surrogate_escaped_in_the_body_is_the_same_observation_not_422(guarded):
    """StableToolBench's client sends `requests.post(url, json=payload)`: a model's argument text holding half an emoji
    pair arrives as a `\\ud83d` escape in the body itself (valid JSON, RFC 8259 §8.2, read by upstream's `json.loads`),
    which pydantic's parser refused as a whole body: HTTP 422, which the client maps to "request invalid". Read as
    JSON's grammar reads it, the call gets the observation of its arguments, as the same text escaped twice does."""
    body = json.dumps({**BODY, "tool_input": '{"name": "Lionel \ud83d"}'})  # json.dumps escapes it, as requests does
    assert "\\ud83d" in body
    response = guarded.virtual(body)
    assert response.status_code == 200
    assert response.json()["error"].startswith(
        "Tool input parse error...\ntool_input holds a lone surrogate '\\ud83d'"
    )
    # In a name: the API is not known (no name holds one), an observation too; cut short, the body is still 422.
    named = guarded.virtual(json.dumps({**BODY, "api_name": "transfermarkt_search\ud83d"}))
    assert named.status_code == 200 and named.json()["error"] and named.json()["response"] == ""
    assert guarded.virtual(body[:-1]).status_code == 422


def _trickle(url: str, data: bytes, pause: float, patience: float) -> tuple[bytes, float]:
    """Send `data` a byte every `pause` s on a real socket; (what came back, when the server closed)."""
    host, port = url.removeprefix("http://").split(":")
    start = time.monotonic()
    received = b""
    with socket.create_connection((host, int(port))) as conn:
        conn.settimeout(pause)
        for byte in data:
            try:
                conn.sendall(bytes([byte]))
            except OSError:  # the server has closed
                break
            try:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                received += chunk
            except TimeoutError:
                pass
            except OSError:  # reset: what was received stays in `received`
                break
            if time.monotonic() - start > patience:
                break
        conn.settimeout(1.0)
        try:
            while chunk := conn.recv(4096):
                received += chunk
        except OSError:
            pass
    return received, time.monotonic() - start


@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_client_that_trickles_is_disconnected(guarded, part):
    body = json.dumps(BODY).encode()
    head = (
        b"POST /virtual HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    if part == "body":  # headers at once, then the body a byte at a time
        host, port = guarded.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(head)
            start = time.monotonic()
            conn.settimeout(0.2)
            received = b""
            for byte in body:
                try:
                    conn.sendall(bytes([byte]))
                    received += conn.recv(4096)
                    if received:
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
                if time.monotonic() - start > 5:
                    break
            elapsed = time.monotonic() - start
    else:
        received, elapsed = _trickle(guarded.url, head + body, 0.2, patience=5)
    assert received.startswith(b"HTTP/1.1 408 ")  # request_timeout 1 s: uvicorn alone never gave up
    assert elapsed < 2.5
    assert guarded.virtual(BODY).status_code == 200


def test_a_connection_that_never_sends_a_byte_is_closed(serve, tmp_path, monkeypatch):
    """The receive deadline starts at a request's first byte and uvicorn's keep-alive timer after an answer: a
    connection that sent nothing was held for ever (260 of them took a server's open files in the audit of
    2026-12-01, and every other client was refused). It is closed after the keep-alive time (here 0.5 s), silently,
    as uvicorn closes one idle between requests; one that sends its request in time is answered as ever."""
    from mirrorapi.serving import transport

    monkeypatch.setattr(transport, "KEEP_ALIVE_SECONDS", 0.5)
    with serve(cache_path=str(tmp_path / "c.sqlite"), api_base=["http://127.0.0.1:9/v1"]) as server:
        host, port = server.url.removeprefix("http://").split(":")
        with (
            socket.create_connection((host, int(port))) as silent,
            socket.create_connection((host, int(port))) as used,
        ):
            time.sleep(0.2)
            used.sendall(b"GET /live HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            silent.settimeout(10)
            closed = silent.recv(4096)  # b"": the server closed it (a timeout here: held)
            used.settimeout(10)
            answer = used.recv(4096)
    assert closed == b""
    assert answer.startswith(b"HTTP/1.1 200 ")


def test_each_request_on_a_connection_has_its_own_deadline(guarded):
    """A whole request, then 0.7 s later a second one on the same connection that trickles: it gets its
    full second (request_timeout 1 s) from its own first byte, not from the first request's."""
    body = json.dumps(BODY).encode()
    request = (
        b"POST /virtual HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    host, port = guarded.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as conn:
        conn.settimeout(5)
        conn.sendall(request)
        assert conn.recv(65536).startswith(b"HTTP/1.1 200 ")
        time.sleep(0.7)
        start = time.monotonic()
        conn.settimeout(0.1)
        received = b""
        for byte in request:  # a byte every 0.1 s: 20 s for the whole request
            with contextlib.suppress(TimeoutError):
                conn.sendall(bytes([byte]))
                received += conn.recv(4096)
            if received or time.monotonic() - start > 5:
                break
        elapsed = time.monotonic() - start
    assert received.startswith(b"HTTP/1.1 408 ")
    assert 0.9 < elapsed < 2.5


def test_a_header_section_that_never_ends_is_refused_with_431(guarded):
    # uvicorn keeps a request's header section in memory until it ends, with no bound: 1 GB of headers was 750 MB
    # more of the server's memory. Now at most 1 MiB is read before a request's handler starts.
    host, port = guarded.url.removeprefix("http://").split(":")
    line = b"x-pad: " + b"a" * 1000 + b"\r\n"
    received = b""
    with socket.create_connection((host, int(port))) as conn:
        conn.sendall(b"POST /virtual HTTP/1.1\r\nhost: 127.0.0.1\r\n")
        conn.settimeout(5)
        with contextlib.suppress(OSError):  # the server closes; a send after that may be reset
            for _ in range(4096):  # 4 MB, never the blank line that ends a header section
                conn.sendall(line * 64)
        with contextlib.suppress(OSError):
            while chunk := conn.recv(65536):
                received += chunk
    assert received.startswith(b"HTTP/1.1 431 ")
    body = json.loads(received.partition(b"\r\n\r\n")[2])
    assert set(body) == {"error", "response"} and body["error"].startswith("Request Header Fields Too Large")
    assert guarded.virtual(BODY).status_code == 200


def test_a_request_sent_while_the_one_before_is_answered_waits_its_turn(serve, tmp_path):
    """A whole request, answered in 2 s (a miss), then on the same connection a second whole request, or the
    stray CRLF that RFC 9112 §2.2 tells a server to ignore: both get their answers in order (request_timeout
    1 s counts a request's receiving, not the wait for the answer before it; RFC 9112 §9.3.2)."""

    def request(name: str) -> bytes:
        body = json.dumps({**BODY, "tool_input": json.dumps({"name": name})}).encode()
        head = b"POST /virtual HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        return head + b"content-length: %d\r\n\r\n%s" % (len(body), body)

    with (
        StubEngine(delay=2.0) as engine,
        serve(
            cache_path=str(tmp_path / "c.sqlite"), api_base=[engine.url], engine_timeout=10, request_timeout=1.0
        ) as server,
    ):
        host, port = server.url.removeprefix("http://").split(":")
        for first, later, answers in ((request("A"), request("B"), 2), (request("C"), b"\r\n", 1)):  # misses
            with socket.create_connection((host, int(port))) as conn:
                conn.settimeout(10)
                conn.sendall(first)
                time.sleep(0.3)
                conn.sendall(later)
                received = b""
                while received.count(b"HTTP/1.1 ") < answers or not received.endswith(b"}"):
                    chunk = conn.recv(65536)
                    if not chunk:
                        break
                    received += chunk
            assert [part.split(b" ", 1)[0] for part in received.split(b"HTTP/1.1 ")[1:]] == [b"200"] * answers


def test_api_key(serve, tmp_path):
    with serve(cache_path=str(tmp_path / "c.sqlite"), server_api_key="s3cret", mode="replay") as server:
        missing = server.virtual(BODY)
        assert missing.status_code == 401 and set(missing.json()) == {"error", "response"}
        assert missing.json()["error"].startswith("Unauthorized")
        assert server.client.post("/virtual", json=BODY, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert server.client.get("/metrics").status_code == 401
        assert server.client.get("/health").status_code == 200  # probes of orchestrators stay open
        assert server.client.get("/live").json() == {"status": "live"}
        bearer = server.client.post("/virtual", json=BODY, headers={"authorization": "Bearer s3cret"})
        assert bearer.status_code == 200 and bearer.json()["error"].startswith("No recorded response")
        # StableToolBench's agents send their key as a `toolbench_key` header: they work unchanged.
        assert server.client.post("/virtual", json=BODY, headers={"toolbench_key": "s3cret"}).status_code == 200
        assert httpx.get(server.url + "/metrics", headers={"authorization": "Bearer s3cret"}).status_code == 200


def test_requests_of_web_pages_are_refused(serve, tmp_path):
    """A browser sends any page's request to a server on this machine: a cross-site `text/plain` POST needs no
    preflight, a WebSocket no permission at all (the MCP spec: servers MUST validate Origin; OWASP: cross-site
    WebSocket hijacking), and a DNS-rebinding page addresses it by a name of its own. A page's reset once wiped an
    agent's session and its /ws drove episodes; API clients send no Origin and address 127.0.0.1."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with serve(cache_path=str(tmp_path / "c.sqlite"), mode="replay") as server:
        evil = {"origin": "http://evil.example", "content-type": "text/plain"}
        for path, body in (("/virtual", json.dumps(BODY)), ("/reset", '{"episode_id": "ep-1"}')):
            refused = server.client.post(path, content=body, headers=evil)
            assert refused.status_code == 403 and "another origin" in refused.json()["error"], refused.text
        rebound = server.client.get("/health", headers={"host": "evil.example"})
        assert rebound.status_code == 421 and "evil.example" in rebound.json()["error"]
        # Headers that name no host: a clear refusal, not a 500 with a traceback
        assert server.client.get("/health", headers={"host": "[::1"}).status_code == 400
        assert server.client.post("/virtual", json=BODY, headers={"origin": "http://[x"}).status_code == 403
        # A page of this machine (a local UI) and the clients of the API are served as before.
        local = {"origin": "http://localhost:3000"}
        assert server.client.post("/virtual", json=BODY, headers=local).status_code == 200
        assert server.virtual(BODY).status_code == 200
        ws = server.url.replace("http", "ws") + "/ws"
        with pytest.raises(InvalidStatus) as hijack:
            connect(ws, origin="http://evil.example", open_timeout=10)
        assert hijack.value.response.status_code == 403
        with connect(ws, open_timeout=10):
            pass
        # /mcp by the same rule (the SDK's own check knew three spellings of this machine only)
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        mcp_headers = {"accept": "application/json, text/event-stream", "origin": "http://evil.example"}
        assert server.client.post("/mcp", json=initialize, headers=mcp_headers).status_code == 403
        assert server.client.post("/mcp", json=initialize, headers={"host": "evil.example"}).status_code == 421
        assert server.metric("mirrorapi_requests_total", outcome="foreign_origin") == 8
    # A reverse proxy's public name, named in `allowed_hosts`, is served; others still are not.
    with serve(cache_path=str(tmp_path / "d.sqlite"), mode="replay", allowed_hosts=["Proxy.Example"]) as server:
        proxied = {"host": "proxy.example", "origin": "https://proxy.example"}
        assert server.client.post("/virtual", json=BODY, headers=proxied).status_code == 200
        assert server.client.get("/health", headers={"host": "evil.example"}).status_code == 421


@pytest.mark.parametrize(
    "host, key, warned",
    [
        ("0.0.0.0", None, True),
        ("192.0.2.10", None, True),
        ("::", None, True),
        ("myhost.example", None, True),
        ("0.0.0.0", "k", False),
        ("127.0.0.1", None, False),
        ("127.0.0.2", None, False),
        ("::1", None, False),
        ("localhost", None, False),
    ],
)
def test_warning_when_exposed_without_a_key(sample_tools, host, key, warned):
    # Only the logic: tests never bind a non-loopback address.
    settings = ServerSettings(tools_folder=[sample_tools], host=host, server_api_key=key)
    warnings = [w for w in settings.startup_warnings() if w.startswith(f"host {host} ")]
    assert bool(warnings) == warned
