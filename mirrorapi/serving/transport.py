"""What happens to a request before the /virtual handler sees it: the uvicorn configuration with a
deadline for receiving a request (slow clients), the API key, and the body-size bound.

Why a protocol subclass: uvicorn has no timeout for receiving a request. `timeout_keep_alive` covers
only the idle time between requests and is reset by every byte received, so a client that trickles
its headers or body a byte at a time holds a connection for ever (uvicorn issue #157, open); ASGI
code cannot help, as it runs only once the headers are complete. `RequestDeadlineProtocol` starts a
timer at the first byte of each request and closes the connection (HTTP 408 when no response has
begun) if the whole request has not arrived in `request_timeout` seconds.

Why the close lingers: closing a socket whose client is still sending (a trickler is, by definition)
makes the kernel answer with a reset, and a reset can make the client's kernel discard the 408 it has
not read yet. So the 408 is followed by a half-close (FIN), what the client still sends is read and
dropped, and the socket is closed once the client closes or after `LINGER_SECONDS` (nginx's
"lingering close").
"""

from __future__ import annotations

import hmac
import json
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mirrorapi.serving.config import ServerSettings

logger = logging.getLogger(__name__)

JSON_HEADERS = [(b"content-type", b"application/json")]
REQUEST_TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                            b"connection: close\r\ncontent-length: %d\r\n\r\n%s")
LINGER_SECONDS = 2.0
UNAUTHORIZED = ("Unauthorized: this server needs an API key (send `Authorization: Bearer <key>`, or "
                "StableToolBench's `toolbench_key` header)")


class RequestDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus a deadline for receiving each whole request."""

    request_timeout = 10.0  # set per server by `uvicorn_config`

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline = None
        self._lingering = None

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:  # answered 408 already: drop what a trickler still sends
            return
        if self._deadline is None and (self.cycle is None or self.cycle.response_complete):  # a new request
            self._deadline = self.loop.call_later(self.request_timeout, self._too_slow)
        super().data_received(data)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        logger.info("client %s took more than %g s to send a request: disconnected",
                    "%s:%d" % self.client if self.client else "?", self.request_timeout)
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            body = json.dumps({"error": f"Request Timeout: the request was not received within "
                                        f"{self.request_timeout:g} s", "response": ""}).encode()
            self.transport.write(REQUEST_TIMEOUT_RESPONSE % (len(body), body))
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # a handler waiting for the body gets `http.disconnect`
            self.cycle.message_event.set()
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self._lingering = self.loop.call_later(LINGER_SECONDS, self.transport.close)


def uvicorn_options(settings: ServerSettings) -> dict:
    """The one uvicorn configuration of the server: `uvicorn.run(app, **options)` (the tests use it too)."""
    protocol = type("RequestDeadlineProtocol", (RequestDeadlineProtocol,),
                    {"request_timeout": settings.request_timeout})
    # log_config=None: uvicorn's loggers go through ours; its access log is replaced by RequestLogWriter's lines.
    # No proxy-header rewriting: the server binds 127.0.0.1 by default and reports no client addresses.
    return dict(host=settings.host, port=settings.port, http=protocol, log_config=None, access_log=False,
                proxy_headers=False, log_level=settings.log_level, timeout_graceful_shutdown=5, timeout_keep_alive=5)


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


def declared_length(scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def read_body(scope, receive, limit: int) -> bytes:
    """The whole request body; BodyTooLarge past `limit` bytes (read no further), ClientGone when the
    client disconnects (or is disconnected for being too slow) before sending it all."""
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
        if size > limit:
            raise BodyTooLarge(size)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def send_json(send, status: int, body: bytes, headers: list | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": JSON_HEADERS + [(b"content-length", b"%d" % len(body))] + (headers or [])})
    await send({"type": "http.response.body", "body": body})


def error_body(message: str) -> bytes:
    """The server's own refusals in StableToolBench's shape, `{"error", "response"}`."""
    return json.dumps({"error": message, "response": ""}, ensure_ascii=False).encode()
