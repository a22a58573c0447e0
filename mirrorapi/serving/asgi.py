"""ASGI helpers of the server's front doors, on ASGI's messages only (no framework, no server internals): the API
key, the body bound, the JSON answers and refusals in StableToolBench's `{"error", "response"}` shape."""

from __future__ import annotations

import hmac
import json
import urllib.parse
from collections.abc import Callable

JSON_HEADERS = [(b"content-type", b"application/json")]
UNAUTHORIZED = (
    "Unauthorized: this server needs an API key (send `Authorization: Bearer <key>`, or "
    "StableToolBench's `toolbench_key` header)"
)
# A body over the bound is read to its end (and dropped) before the 413, up to this much: a client still
# sending when the server closes gets a connection reset instead of the answer.
DRAIN_BYTES = 16 * 1024 * 1024


def foreign_request(scope, known_host: Callable[[str], bool], loopback_only: bool) -> tuple[int, str] | None:
    """(status, message) for a request a web page made, not a client of the API, else None. A browser sends any
    page's request to a server on this machine, and a page cannot be told from a client but by its headers:
    - an `Origin` (browsers send it with every WebSocket handshake and cross-site POST; API clients send none) that
      is neither a known host (this machine, `allowed_hosts`) nor the host the request is addressed to: 403
      (cross-site requests and WebSocket hijacking; the MCP spec: servers MUST validate Origin);
    - on a server bound to this machine only, a `Host` that is not a known host (a name a DNS-rebinding page
      resolved to 127.0.0.1): 421."""
    headers = dict(scope["headers"])
    host = headers.get(b"host", b"").decode("latin-1")
    host_name = _host_name("//" + host) if host else None
    if host and host_name is None:
        return 400, f"Bad Request: the Host header {host[:80]!r} names no host"
    if loopback_only and host_name is not None and not known_host(host_name):
        return (
            421,
            f"Misdirected Request: this server answers requests addressed to this machine, not to {host[:80]!r}",
        )
    origin = headers.get(b"origin")
    if origin is not None:
        origin_host = _host_name(origin.decode("latin-1"))
        if origin_host is None or not (known_host(origin_host) or origin_host == host_name):
            return (
                403,
                f"Forbidden: requests from a web page of another origin ({origin[:80].decode('latin-1')}) are refused",
            )
    return None


def _host_name(url: str) -> str | None:
    """The host of a URL (`//host:port` for a Host header); None when it has none or cannot be read ("[::1")."""
    try:
        return urllib.parse.urlsplit(url).hostname
    except ValueError:
        return None


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
    """A body over the bound: `size` bytes or more of it came (or were declared), `limit` are taken. Its text is
    what every door says in its 413."""

    def __init__(self, size: int, limit: int):
        self.size, self.limit = size, limit
        super().__init__(f"Request body too large: {size:,} bytes or more (this server takes up to {limit:,})")


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
        raise BodyTooLarge(length, limit)
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
            raise BodyTooLarge(size, limit)
        chunks.append(chunk)
        if not more:
            return b"".join(chunks)


async def send_json(send, status: int, body: bytes, headers: list | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": JSON_HEADERS + [(b"content-length", b"%d" % len(body))] + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


def error_body(message: str) -> bytes:
    """The server's own refusals in StableToolBench's shape, `{"error", "response"}`."""
    return json.dumps({"error": message, "response": ""}, ensure_ascii=False).encode()


def header_text(value: bytes) -> str:
    """A header's text: UTF-8 when it is (what a client sends for the non-ASCII id it also writes in a JSON body,
    so that both name one session: read as Latin-1, "é" was "Ã©"), else Latin-1 (RFC 9110's obsolete text)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")
