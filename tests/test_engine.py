"""EngineClient against a real `transformers serve`, and against engines that are down or hang."""

import asyncio
import http.server
import socket
import threading
import time

import openai
import pytest

from mirrorapi.engine_client import EngineClient, EngineError
from mirrorapi.processes import free_port


@pytest.mark.slow
def test_tiny_engine_answers_the_openai_client(tiny_engine):
    client = openai.OpenAI(base_url=tiny_engine.base_url, api_key="EMPTY")
    completion = client.chat.completions.create(model=tiny_engine.model, temperature=0, max_tokens=8,
                                                messages=[{"role": "user", "content": "hello"}])
    assert isinstance(completion.choices[0].message.content, str)
    assert completion.usage.completion_tokens <= 8


@pytest.mark.slow
def test_engine_client_chat_and_health(tiny_engine):
    async def run():
        engine = EngineClient([tiny_engine.base_url], tiny_engine.model, timeout=60)
        try:
            first = await engine.chat([{"role": "user", "content": "hi"}], max_tokens=6)
            second = await engine.chat([{"role": "user", "content": "hi"}], max_tokens=6)
            health = await engine.health()
        finally:
            await engine.aclose()
        return first, second, health
    first, second, health = asyncio.run(run())
    assert first == second  # temperature 0: the same answer twice
    assert health[0].reachable


def test_engine_down_is_an_error_within_the_deadline():
    port = free_port()  # nothing listens there

    async def run():
        engine = EngineClient([f"http://127.0.0.1:{port}/v1"], "m", timeout=3, retries=2, backoff=0.1)
        try:
            health = await engine.health()
            start = time.monotonic()
            with pytest.raises(EngineError) as err:
                await engine.chat([{"role": "user", "content": "hi"}])
            return health, err.value, time.monotonic() - start
        finally:
            await engine.aclose()
    health, error, elapsed = asyncio.run(run())
    assert not health[0].reachable
    assert error.kind == "unreachable"
    assert elapsed < 3.5


def test_engine_that_never_answers_times_out():
    # Fake engine (a fault we cannot provoke with a real one): accepts connections, never replies.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()

    async def run():
        engine = EngineClient([f"http://127.0.0.1:{port}/v1"], "m", timeout=1.5, retries=3, backoff=0.1)
        try:
            start = time.monotonic()
            with pytest.raises(EngineError) as err:
                await engine.chat([{"role": "user", "content": "hi"}])
            return err.value, time.monotonic() - start
        finally:
            await engine.aclose()
    try:
        error, elapsed = asyncio.run(run())
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
    assert error.kind == "timeout"
    assert 1.4 < elapsed < 2.5  # one deadline for all attempts



@pytest.mark.parametrize("status, attempts", [(400, 1), (503, 3)])
def test_rejected_requests_are_not_retried_server_errors_are(status, attempts):
    # Fake engine (a fault we cannot provoke: `transformers serve` answers 500 even to a malformed
    # request): answers every chat completion with `status`, counting them.
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            seen.append(self.path)
            self.send_response(status)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    async def run():
        engine = EngineClient([f"http://127.0.0.1:{server.server_port}/v1"], "m", timeout=10, retries=2, backoff=0.05)
        try:
            with pytest.raises(EngineError) as err:
                await engine.chat([{"role": "user", "content": "hi"}])
            return err.value
        finally:
            await engine.aclose()
    try:
        error = asyncio.run(run())
    finally:
        server.shutdown()
        server.server_close()
    assert (error.kind, error.status) == ("http", status)
    assert seen == ["/v1/chat/completions"] * attempts
