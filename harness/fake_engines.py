"""Fake OpenAI-compatible engines, shared by the tests and `bench/` (one copy of each).

Each stands in for what a real engine cannot be made to show on demand:
- `StubEngine`: a valid chat completion for *every* call, after a chosen delay (no real model answers
  every call validly, nor takes a chosen time). Raw asyncio on a keep-alive socket, so that as a
  benchmark instrument it costs the machine little CPU.
- `HungEngine`: accepts connections and never answers (a stalled replica), until `heal(url)` makes
  it relay new connections to a real engine (the replica coming back).
- `StatusEngine`: answers every request with one HTTP status (an engine that rejects or fails).
- `LoopingEngine`: a greedy answer that loops until `max_tokens` cuts it, and a sampled one that ends (a small
  model's loop, which a real model shows on some calls only, never on a call chosen beforehand).
- `SessionFailingEngine`: a failure to every call asked with earlier calls of its session, a success to every call
  asked alone (a real model answers a failure by chance, never on a call chosen beforehand).
- `TokenSessionEngine`: a token of its own making, accepted later in the session only (a trained simulator keeps its
  session consistent on some calls, never on a call chosen beforehand).
- `FixedReplyEngine`: the same text to every chat completion (a judge whose verdict is known beforehand, which
  no real judge's is).
- `unreachable_engine_url()`: a port nobody listens on (an engine that is down).

In a thread: `with StubEngine(delay=0.05) as engine: engine.url`. As a process (benchmarks that keep
the load off their own interpreter): `python -m harness.fake_engines stub --port N --delay 0.05`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import json
import socket
import subprocess
import sys
import threading
import time
from typing import Self

from harness.processes import checkout_env, free_port
from mirrorapi.prompts.simulator_formats import HISTORY_HEADING, shown_history

# The observation a stub engine answers with unless told otherwise: a StableToolBench-shaped answer.
STUB_OBSERVATION = {"error": "", "response": {"answered_by": "stub engine"}}


async def seconds_until_it_fails(engine) -> float:
    """Seconds an `EngineClient` takes to give up on one chat call that must fail (EngineError); it is closed."""
    from mirrorapi.engine_client import EngineError

    start = time.monotonic()
    try:
        await engine.chat([{"role": "user", "content": "hi"}])
    except EngineError:
        return time.monotonic() - start
    finally:
        await engine.aclose()
    raise AssertionError("the engine call did not fail")


def chat_completion_reply(content: str) -> bytes:
    """A whole HTTP/1.1 response carrying one chat completion whose message is `content`."""
    body = json.dumps(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "stub",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    ).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


def unreachable_engine_url() -> str:
    """The /v1 URL of an engine that is down: a free 127.0.0.1 port nobody listens on."""
    return f"http://127.0.0.1:{free_port()}/v1"


class StubEngine:
    """Answers every POST to .../chat/completions with a chat completion carrying `observation`
    (JSON-encoded) after `delay` seconds; GETs (health probes) at once with the same body, or with a model
    list naming `model` when given; any other POST at once with 404 (StableToolBench's server posts its
    real-API call to such a path first). `requests` counts the chat completions received, `most_at_once` the most
    it answered at the same time."""

    def __init__(
        self, observation: dict = STUB_OBSERVATION, delay: float = 0.0, port: int = 0, model: str | None = None
    ):
        self.reply = chat_completion_reply(json.dumps(observation))
        self.listing = self.reply
        if model is not None:
            body = json.dumps({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "stub"}]})
            self.listing = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
                len(body),
                body.encode(),
            )
        self.not_found = b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        self.delay, self.port, self.requests = delay, port, 0
        self.answering = self.most_at_once = 0  # chat completions being answered now, and the most at once
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                if head.startswith(b"GET"):
                    writer.write(self.listing)
                    continue
                if b"/chat/completions " not in head.split(b"\r\n", 1)[0]:
                    writer.write(self.not_found)
                    continue
                self.requests += 1
                self.answering += 1
                self.most_at_once = max(self.most_at_once, self.answering)
                try:
                    await asyncio.sleep(self.delay)
                finally:
                    self.answering -= 1
                writer.write(self.reply)
        writer.close()

    async def _start(self) -> asyncio.Server:
        server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=1024)
        self.port = server.sockets[0].getsockname()[1]
        return server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def serve_forever(self) -> None:
        """Serve in this thread until killed (the benchmarks' engine process)."""

        async def main() -> None:
            async with await self._start():
                await asyncio.Event().wait()

        try:
            import uvloop  # cheaper per request where installed: this is a benchmark instrument

            uvloop.run(main())
        except ImportError:
            asyncio.run(main())

    def __enter__(self) -> StubEngine:
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(self._start())
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self._loop is not None and self._thread is not None, "not entered"
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._server.close()


def stub_engine_process(port: int, delay: float) -> subprocess.Popen:
    """A StubEngine in its own process (a benchmark's engine must not share the measured interpreter)."""
    return subprocess.Popen(
        [sys.executable, "-m", "harness.fake_engines", "stub", "--port", str(port), "--delay", str(delay)],
        env=checkout_env(),
    )


class HungEngine:
    """Accepts connections and never answers, until `heal(url)`: from then on new connections are
    relayed byte for byte to the real engine at `url`. `connections` counts those accepted while hung,
    `relayed` those accepted once healed, `relayed_posts` the chat completions relayed (connections
    are kept alive and reused, so this is counted in the byte stream)."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.listener.settimeout(0.1)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.target: tuple[str, int] | None = None
        self.connections = self.relayed = self.relayed_posts = 0
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def heal(self, url: str) -> None:
        host, port = url.split("//")[1].split("/")[0].split(":")
        self.target = (host, int(port))

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn = self.listener.accept()[0]
            except OSError:
                continue
            self.held.append(conn)
            if self.target is None:
                self.connections += 1
                continue
            self.relayed += 1
            upstream = socket.create_connection(self.target)
            self.held.append(upstream)
            for source, sink in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(source, sink, source is conn), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if from_client:
                    self.relayed_posts += data.count(b"POST /v1/chat/completions")
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.held:
            conn.close()
        self.listener.close()

    def __enter__(self) -> HungEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def completion_json(request: dict, content: str, finish_reason: str, tokens: int) -> bytes:
    """The body of one chat completion answering `request` with `content`, ended by `finish_reason`."""
    choice = {"index": 0, "finish_reason": finish_reason, "message": {"role": "assistant", "content": content}}
    usage = {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1}
    completion = {"id": "c", "object": "chat.completion", "created": 0, "model": request["model"]}
    return json.dumps(completion | {"choices": [choice], "usage": usage}).encode()


class _QuietServer(http.server.ThreadingHTTPServer):
    request_queue_size = 1024  # listen()'s backlog: hundreds of calls connect at once in some tests (5 by default)

    def handle_error(self, request, client_address):
        # a client that gave up before the answer (a test of timeouts) is no error of the engine's
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class _ThreadedEngine:
    """An HTTP server on a free 127.0.0.1 port, in a thread, whose every POST `answer(path, body)` answers with
    (status, JSON bytes). Subclasses set what `answer` reads before calling this `__init__`."""

    headers: dict[str, str] = {}  # more headers of every answer (e.g. Retry-After)

    def __init__(self):
        answer, headers = self.answer, self.headers

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                status, reply = answer(self.path, self.rfile.read(int(self.headers["content-length"])))
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class StatusEngine(_ThreadedEngine):
    """Answers every POST with HTTP `status` and an empty JSON object; `paths` lists the paths posted to."""

    def __init__(self, status: int, headers: dict[str, str] | None = None):
        self.status, self.headers = status, headers or {}
        self.paths: list[str] = []
        super().__init__()

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.paths.append(path)
        return self.status, b"{}"


class _ChatEngine(_ThreadedEngine):
    """A `_ThreadedEngine` answering chat completions: `requests` keeps every request body, and `chat(request)`
    answers it."""

    def __init__(self):
        self.requests: list[dict] = []
        super().__init__()

    def answer(self, path: str, body: bytes) -> tuple[int, bytes]:
        request = json.loads(body)
        self.requests.append(request)
        return self.chat(request)

    def chat(self, request: dict) -> tuple[int, bytes]:
        raise NotImplementedError


class FixedReplyEngine(_ChatEngine):
    """Chat completions that all answer `content`. `requests` keeps every request body."""

    def __init__(self, content: str):
        self.content = content
        super().__init__()

    def chat(self, request: dict) -> tuple[int, bytes]:
        return 200, completion_json(request, self.content, "stop", 4)


class LoopingEngine(_ChatEngine):
    """Chat completions as a greedy small model that loops answers them: at temperature 0 an observation whose list
    repeats one item until `max_tokens` cuts it (finish_reason "length"); sampled (temperature > 0), `sampled`,
    whole (finish_reason "stop"), as `when_sampled` says: "answer" so, "loop" again, or "fail" (HTTP 500). `requests`
    keeps every request body."""

    LOOP_ITEM = '"NZX999", '

    def __init__(self, sampled: dict, when_sampled: str = "answer"):
        self.sampled, self.when_sampled = sampled, when_sampled
        super().__init__()

    def chat(self, request: dict) -> tuple[int, bytes]:
        sampled = bool(request.get("temperature"))
        if sampled and self.when_sampled == "fail":
            return 500, b"{}"
        if sampled and self.when_sampled == "answer":
            content, finish, tokens = json.dumps(self.sampled), "stop", 12
        else:  # one token per item: the loop fills max_tokens exactly
            tokens = request["max_tokens"]
            content, finish = '{"error": "", "response": {"reservations": [' + self.LOOP_ITEM * tokens, "length"
        return 200, completion_json(request, content, finish, tokens)


class SessionFailingEngine(_ChatEngine):
    """Chat completions that answer `failure` when the prompt shows earlier calls of a session (the session prompt's
    list of them, `SESSION_MARK`), else `alone` (None: HTTP 500, an engine that fails). `requests` keeps every
    request body."""

    SESSION_MARK = HISTORY_HEADING  # what our session formats write before the calls they show

    def __init__(self, failure: dict, alone: dict | None):
        self.failure, self.alone = failure, alone
        super().__init__()

    def chat(self, request: dict) -> tuple[int, bytes]:
        shown = any(self.SESSION_MARK in str(message.get("content")) for message in request["messages"])
        if not shown and self.alone is None:
            return 500, b"{}"
        return 200, completion_json(request, json.dumps(self.failure if shown else self.alone), "stop", 8)


class TokenSessionEngine(_ChatEngine):
    """Chat completions as a simulator that keeps its session consistent answers them, for an API that issues a
    token and APIs that take one (API-Bank's `GetUserToken`, `QueryBalance`): a request without a `token` argument
    gets {"token": `issued`}, a token of its own making; one whose token an earlier call of the prompt's session
    shows gets `accepted`; any other token "The token is incorrect." (API-Bank's message). `requests` keeps every
    request body."""

    def __init__(self, issued: str, accepted: object):
        self.issued, self.accepted = issued, accepted
        super().__init__()

    def chat(self, request: dict) -> tuple[int, bytes]:
        arguments = json.loads(request["messages"][-1]["content"].rsplit("Request:\n", 1)[1])
        observation: dict[str, object]
        if "token" not in arguments:
            observation = {"error": "", "response": {"token": self.issued}}
        elif any(arguments["token"] in line for line in shown_history(request["messages"])):
            observation = {"error": "", "response": self.accepted}
        else:
            observation = {"error": "The token is incorrect.", "response": ""}
        return 200, completion_json(request, json.dumps(observation), "stop", 8)


class RecordedAnswerEngine(_ChatEngine):
    """Chat completions as a perfectly trained simulator writes them: `answers` maps a call's arguments (JSON, keys
    sorted) to the answer text its training record teaches; a request is answered by the arguments its prompt holds.
    A stand-in for a simulator when only the prompts it is sent matter. `requests` keeps every request body."""

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        super().__init__()

    def chat(self, request: dict) -> tuple[int, bytes]:
        arguments = json.loads(request["messages"][-1]["content"].rsplit("Request:\n", 1)[1])
        return 200, completion_json(request, self.answers[json.dumps(arguments, sort_keys=True)], "stop", 8)


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a stub engine on 127.0.0.1 until killed.", allow_abbrev=False)
    parser.add_argument("kind", choices=["stub"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=0.0, help="Seconds before each chat completion is answered.")
    parser.add_argument(
        "--observation", default=json.dumps(STUB_OBSERVATION), help="The JSON observation every completion carries."
    )
    args = parser.parse_args()
    StubEngine(json.loads(args.observation), args.delay, args.port).serve_forever()


if __name__ == "__main__":
    main()
