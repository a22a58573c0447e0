"""What happens to a request before the /virtual handler sees it: the uvicorn configuration, a deadline
for receiving each request (slow clients), the API key, and the body-size bound.

Why a deadline of our own: uvicorn has no timeout for receiving a request. `timeout_keep_alive` covers
only the idle time between requests and is reset by every byte received, so a client that trickles
its headers or body a byte at a time holds a connection for ever (uvicorn issue #157); ASGI code
cannot help alone, as it runs only once the headers are complete. Built on public interfaces only:
`ReceiveDeadline` is an `asyncio.Protocol` that wraps, by composition, the HTTP protocol uvicorn itself
picks (`http="auto"`; uvicorn's `http` option takes a protocol class). It notes the time of the first
byte of each request; the ASGI side notes when the whole request is in (`RequestDeadlineMiddleware`
for every route, `guard(scope).received()` on /virtual). If a request is still coming in
`request_timeout` seconds after its first byte, the client gets HTTP 408 (nothing has been answered
yet) and the connection is closed. One timer per connection checks that: it is armed by a request's
first byte when none is, and when it fires it either answers 408, or is armed again for the request
now coming in, or (an idle connection) stops. A timer per request (armed, then cancelled, for requests
that arrive whole within microseconds) took 1-2% of a cache hit's server CPU in py-spy's profile. A
connection on a Unix socket has no peer address to find its guard by, and no deadline.

Why the close lingers: closing a socket whose client is still sending (a trickler is, by definition)
makes the kernel answer with a reset, and a reset can make the client's kernel discard the 408 it has
not read yet. So the 408 is followed by a half-close (FIN), what the client still sends is read and
dropped, and the socket is closed once the client closes or after `LINGER_SECONDS` (nginx's
"lingering close").

Why writes are gathered (`GatheredWrites`): uvicorn writes a response's head and its body with one
`transport.write` each, and the event loop sends each at once, one `send()` system call apiece. On
loopback, a send also delivers the segment and wakes the client inside the call: measured with `perf`
on the server under bench/server.py's 64-client hits, the two sends were 22% of the server's CPU. So
uvicorn's protocol writes to a stand-in for the transport that keeps what one turn of the event loop
writes on a connection and hands it to the real transport once, right after that turn: one send per
response, usually, and none of the answer's bytes later than the turn that produced them. Sending each
/virtual answer at once instead, as soon as it was whole, cost more: 118-133 against 83-103 us of server
CPU per hit in side-by-side runs (bench/server.py's 64-client hits; likely because answers that leave
together bring the clients' next requests back together, so each wake-up of the loop serves more).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from typing import cast

import uvicorn.config
import uvicorn.importer

from mirrorapi.serving.config import ServerSettings

logger = logging.getLogger(__name__)

JSON_HEADERS = [(b"content-type", b"application/json")]
REQUEST_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                            b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
LINGER_SECONDS = 2.0
UNAUTHORIZED = ("Unauthorized: this server needs an API key (send `Authorization: Bearer <key>`, or "
                "StableToolBench's `toolbench_key` header)")
# A body over the bound is read to its end (and dropped) before the 413, up to this much: a client still
# sending when the server closes gets a connection reset instead of the answer.
DRAIN_BYTES = 16 * 1024 * 1024


class GatheredWrites:
    """The transport as uvicorn's protocol sees it: writes of one event-loop turn go out together, in one
    `write` of the real transport right after the turn (see the module doc); everything else is the real
    transport's. Closing (or a half-close) sends what is gathered first; an abort drops it."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, upgraded=None):
        self._transport, self._loop = transport, loop
        self._gathered: list[bytes] = []
        self._upgraded = upgraded  # called when the connection is handed to another protocol (a WebSocket)

    def __getattr__(self, name: str):  # get_extra_info, is_closing, pause_reading, ...: the real transport's
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._gathered:
            self._loop.call_soon(self.flush)
        self._gathered.append(data)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        if self._upgraded is not None:
            self._upgraded()
        self._transport.set_protocol(protocol)

    def writelines(self, lines) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        if self._gathered:
            data = self._gathered[0] if len(self._gathered) == 1 else b"".join(self._gathered)
            self._gathered = []
            if not self._transport.is_closing():
                self._transport.write(data)

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._gathered)) + self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._gathered = []
        self._transport.abort()


class ReceiveDeadline(asyncio.Protocol):
    """uvicorn's own HTTP protocol, plus a deadline for receiving each whole request (see the module doc)."""

    request_timeout = 10.0  # set per server by `uvicorn_options`
    open: dict[tuple[str, int], ReceiveDeadline] = {}  # by peer address (ASGI's scope["client"])

    def __init__(self, **kwargs):
        inner = uvicorn.importer.import_from_string(uvicorn.config.HTTP_PROTOCOLS["auto"])
        self._inner: asyncio.Protocol = inner(**kwargs)  # whatever uvicorn passes its protocols
        self._loop = kwargs.get("_loop") or asyncio.get_event_loop()
        self._transport: asyncio.Transport | None = None
        self._writes: GatheredWrites | None = None
        self._peer: tuple[str, int] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._receiving = False
        self._since = 0.0  # loop time of the first byte of the request coming in
        self._lingering: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream (uvloop's is no asyncio subclass)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, (tuple, list)) and len(peer) >= 2:
            self._peer = (str(peer[0]), int(peer[1]))
            self.open[self._peer] = self
        self._writes = GatheredWrites(self._transport, self._loop, self._upgraded)
        self._inner.connection_made(cast(asyncio.Transport, self._writes))  # the real one's, bar the writes

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:  # answered 408 already: drop what a trickler still sends
            return
        if not self._receiving and self._peer is not None:  # the first byte of a request
            self._receiving, self._since = True, self._loop.time()
            if self._timer is None:
                self._timer = self._loop.call_at(self._since + self.request_timeout, self._check)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        if self._lingering is not None:  # the client has closed too: the transport closes (a falsy return)
            return None
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._upgraded()  # no deadline any more, as for a connection that became a WebSocket
        if self._lingering is not None:  # the inner protocol was told at the 408
            self._lingering.cancel()
            return
        self._inner.connection_lost(exc)

    def _upgraded(self) -> None:
        """The connection became a WebSocket, or ended: no receive deadline from now on."""
        self._receiving = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._peer is not None and self.open.get(self._peer) is self:
            del self.open[self._peer]

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def received(self) -> None:
        """The whole request is in (or an answer has begun); the next byte starts the next one."""
        self._receiving = False

    def _check(self) -> None:
        self._timer = None
        if not self._receiving or self._transport is None or self._transport.is_closing():
            return  # idle: the next request's first byte arms the timer again
        due = self._since + self.request_timeout
        if self._loop.time() < due:  # a later request than the one that armed the timer: its own deadline
            self._timer = self._loop.call_at(due, self._check)
            return
        logger.info("client %s took more than %g s to send a request: disconnected", self._peer, self.request_timeout)
        body = json.dumps({"error": f"Request Timeout: the request was not received within "
                                    f"{self.request_timeout:g} s", "response": ""}).encode()
        if self._writes is not None:  # an answer of the same turn goes first
            self._writes.flush()
        self._transport.write(REQUEST_TIMEOUT_RESPONSE % (len(body), body))
        # Counted and logged by the app uvicorn gave its protocol (`VirtualEndpoint.refused`), when it has that.
        refused = getattr(getattr(self._inner, "app", None), "refused", None)
        if callable(refused):
            refused(408, "request_timeout", f"client {self._peer[0] if self._peer else '?'}")
        if not self._transport.can_write_eof():
            self._transport.close()  # a handler waiting for the body gets `http.disconnect`
            return
        self._transport.write_eof()
        self._lingering = self._loop.call_later(LINGER_SECONDS, self._transport.close)
        # The inner protocol hears of the end now (a handler waiting for the body gets `http.disconnect`);
        # given an exception, it leaves the transport open for the linger.
        self._inner.connection_lost(ConnectionAbortedError("request timeout"))


class _NoDeadline:
    @staticmethod
    def received() -> None:
        pass


NO_DEADLINE = _NoDeadline()


def guard(scope) -> ReceiveDeadline | _NoDeadline:
    """The receive deadline of this request's connection (one that does nothing when it has none)."""
    return ReceiveDeadline.open.get(scope.get("client")) or NO_DEADLINE


class RequestDeadlineMiddleware:
    """ASGI middleware: stops the request's receive deadline once its body is in, or its answer begins."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        deadline = guard(scope) if scope["type"] == "http" else NO_DEADLINE
        if deadline is NO_DEADLINE:
            return await self.app(scope, receive, send)
        if not has_body(scope):
            deadline.received()
            return await self.app(scope, receive, send)

        async def receive_until_whole():
            message = await receive()
            if not message.get("more_body", False):
                deadline.received()
            return message

        async def send_stopping(message):
            if message["type"] == "http.response.start":
                deadline.received()
            await send(message)
        await self.app(scope, receive_until_whole, send_stopping)


def uvicorn_options(settings: ServerSettings) -> dict:
    """The one uvicorn configuration of the server: `uvicorn.run(app, **options)` (the tests use it too)."""
    protocol = type("ReceiveDeadline", (ReceiveDeadline,), {"request_timeout": settings.request_timeout})
    # log_config=None: uvicorn's loggers go through ours; its access log is replaced by RequestLogWriter's lines.
    # No proxy-header rewriting: the server binds 127.0.0.1 by default and reports no client addresses.
    # WebSockets (OpenEnv's /ws): websockets' sans-I/O protocol (timers, no task per connection beyond the app's);
    # no per-message compression (a zlib context per connection: gigabytes at 16,384 episodes).
    return dict(host=settings.host, port=settings.port, http=protocol, ws="websockets-sansio",
                ws_per_message_deflate=False, ws_max_size=settings.max_body_bytes, ws_ping_interval=30.0,
                ws_ping_timeout=30.0, log_config=None, access_log=False, proxy_headers=False,
                log_level=settings.log_level, timeout_graceful_shutdown=5, timeout_keep_alive=5)


def raise_open_file_limit() -> tuple[int, int]:
    """(before, after): the soft limit of open files raised to the hard limit. Every connection is a file
    descriptor (16,384 OpenEnv episodes are 16,384 sockets), and the usual soft limit is 1,024 however high the
    hard one; a process may raise its own soft limit up to the hard one, so the server does, at start."""
    try:
        import resource
    except ImportError:  # not a Unix: nothing to raise
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # e.g. above the kernel's nr_open
            logger.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
            return soft, soft
    return soft, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --------------------------------------------------------------------------------- ASGI helpers
def authorized(scope, key: bytes) -> bool:
    """Whether the request carries `key` as a bearer token or as StableToolBench's `toolbench_key` header."""
    for name, value in scope["headers"]:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            value = value[7:].strip()
        elif name != b"toolbench_key":
            continue
        if hmac.compare_digest(value, key):
            return True
    return False


class BodyTooLarge(Exception):
    pass


class ClientGone(Exception):
    pass


def has_body(scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or name == b"content-length" and value != b"0":
            return True
    return False


def declared_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def read_body(scope, receive, limit: int) -> bytes:
    """The whole request body; BodyTooLarge past `limit` bytes, ClientGone when the client disconnects (or is
    disconnected for being too slow) before sending it all. A body announced larger is not read; one that
    turns out larger (chunked) is read to its end and dropped (up to DRAIN_BYTES), so that the client, which
    is still sending, gets the answer rather than a reset connection."""
    length = declared_length(scope)
    if length is not None and length > limit:
        raise BodyTooLarge(length)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        more = message.get("more_body", False)
        if size > limit:
            while more and size <= DRAIN_BYTES:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientGone
                size += len(message.get("body", b""))
                more = message.get("more_body", False)
            raise BodyTooLarge(size)
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


async def send_json(send, status: int, body: bytes, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": JSON_HEADERS + [(b"content-length", b"%d" % len(body))] + (headers or [])})
    await send({"type": "http.response.body", "body": body})


def error_body(message: str) -> bytes:
    """The server's own refusals in StableToolBench's shape, `{"error", "response"}`."""
    return json.dumps({"error": message, "response": ""}, ensure_ascii=False).encode()
