"""The server's MCP front door: streamable HTTP at `/mcp`, built on the official `mcp` SDK.

`tools/list` gives the APIs of a toolset (`mirrorapi.toolsets`): the URL's query string when it has
one (`/mcp?category=Data`, `/mcp?tool=APIBank/apibank_account&tool=APIBank/apibank_finance`,
`/mcp?query=<StableToolBench query_id>`), else the `mcp_toolset` setting, else every API. Each API is
an MCP tool with the input JSON schema of its doc. `tools/call` is answered as the /virtual call of
that API with those arguments is (`VirtualApi.answer_call`: validation, cache, simulator, provenance);
it is counted in /metrics and written to the request log like a /virtual call. The text content is
the observation /virtual would give, byte for byte; `isError` is set when its `error` is not empty
(the API refused the call, a validation error, an engine failure).

The simulation session of a call is its `X-Session-Id` header, else its MCP session (the
`Mcp-Session-Id` of protocol versions with an initialize handshake); a 2026-07-28 client, which
has no MCP session, names one with the header or goes without.

What one client may hold (`McpSessionBounds`): MCP sessions are bounded in total (`mcp_max_sessions`, the SDK's
`max_sessions`) and per client address (`mcp_sessions_per_client`), and one with no request in flight for
`mcp_session_idle_timeout` seconds is closed (the SDK's 30 minutes let 10,050 `initialize` requests in 20 s
lock every other client out for half an hour). A refusal says which bound and how to get room. Bodies are
bounded by `max_body_bytes` like /virtual's, and every refusal, the SDK's own included, is a JSON-RPC error
object with a JSON content type.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from http import HTTPStatus
from typing import Any

from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from mirrorapi.serving.asgi import BodyTooLarge, ClientGone, header_text, read_body
from mirrorapi.serving.protocol import SESSION_HEADER
from mirrorapi.serving.server import VirtualServer
from mirrorapi.toolsets import Toolset, ToolsetError, mcp_tool
from mirrorapi.versions import mirrorapi_version

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
PAGE_SIZE = 500  # tools per tools/list page (ToolEnv2404 has 46,803 APIs)
MAX_CURSOR_DIGITS = 9  # a tools/list cursor is an offset into at most a few hundred thousand tools
_SESSION_HEADER = MCP_SESSION_ID_HEADER.lower().encode()
_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.encode()


def json_rpc_error(status: int, message: str) -> bytes:
    """A JSON-RPC error object without a request id: the body of an HTTP refusal at /mcp."""
    code = types.INVALID_REQUEST if status < 500 else types.INTERNAL_ERROR
    return json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": message}}).encode()


async def send_refusal(send, status: int, message: str, headers: list | None = None) -> None:
    body = json_rpc_error(status, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


class McpSessionBounds:
    """The MCP sessions each client address holds (the SDK counts only the total). A session is counted from the
    request that opens it (its slot is taken as the request passes the bounds, so that `initialize` requests sent
    at once cannot all pass) until it is deleted, found gone (404), or has had no request in flight for
    `idle_seconds` (the SDK closes it then; a GET stream held open is a request in flight, as the SDK's client keeps
    one: such a session is in use, however long since its last POST)."""

    def __init__(self, total: int, per_client: int, idle_seconds: float):
        self.total, self.per_client, self.idle_seconds = total, per_client, idle_seconds
        # session id -> [client address, requests in flight, when the last one ended]
        self._sessions: dict[str, list] = {}
        self._opening: Counter[str] = Counter()  # slots of requests that may open a session, not answered yet
        self._by_client: Counter[str] = Counter()  # sessions and slots being opened, per client

    def _held(self) -> int:
        return len(self._sessions) + self._opening.total()

    def refusal(self, client: str) -> str | None:
        """Why `client` may not open one more session now, or None; None takes a slot for it (`opened` or
        `not_opened` gives it back once the request is answered)."""
        if self._held() >= self.total or self._by_client[client] >= self.per_client:
            self._forget_idle()
        idle = f"a session with no request for {self.idle_seconds:g} s is closed"
        if self._by_client[client] >= self.per_client:
            return (
                f"Too many open MCP sessions from {client}: {self._by_client[client]:,} of the "
                f"{self.per_client:,} one client may hold (mcp_sessions_per_client). End one (HTTP DELETE with "
                f"its Mcp-Session-Id) or reuse one; {idle}."
            )
        if self._held() >= self.total:
            return (
                f"Too many open MCP sessions: {self._held():,} of {self.total:,} (mcp_max_sessions). Try "
                f"again shortly; {idle}."
            )
        self._opening[client] += 1
        self._by_client[client] += 1
        return None

    def opened(self, session_id: str, client: str) -> None:
        """The request that took a slot for `client` opened `session_id` (it is in flight until it ends)."""
        self._opening[client] -= 1
        if session_id in self._sessions:  # not a new one after all: the slot goes back
            self._by_client[client] -= 1
        else:
            self._sessions[session_id] = [client, 1, time.monotonic()]
        self._opening += Counter()  # drops the client's zero count

    def not_opened(self, client: str) -> None:
        self._opening[client] -= 1
        self._by_client[client] -= 1
        self._opening += Counter()
        self._by_client += Counter()

    def started(self, session_id: str) -> None:
        held = self._sessions.get(session_id)
        if held is not None:
            held[1] += 1

    def finished(self, session_id: str) -> None:
        held = self._sessions.get(session_id)
        if held is not None:
            held[1] -= 1
            held[2] = time.monotonic()

    def ended(self, session_id: str) -> None:
        held = self._sessions.pop(session_id, None)
        if held is not None:
            self._by_client[held[0]] -= 1
            if not self._by_client[held[0]]:
                del self._by_client[held[0]]

    def _forget_idle(self) -> None:
        stale = time.monotonic() - self.idle_seconds
        for session_id in [s for s, (_, in_flight, last) in self._sessions.items() if not in_flight and last < stale]:
            self.ended(session_id)


class BoundedRequest:
    """One request at /mcp as the session bounds see it: the slot it takes when it may open a session (a POST
    without `Mcp-Session-Id` of a protocol version with the initialize handshake: a 2026-07-28 request opens none,
    and the SDK answers it apart), and the session it is in flight for."""

    def __init__(self, bounds: McpSessionBounds, scope: dict):
        headers = scope["headers"]
        self.bounds, self.method = bounds, scope["method"]
        self.client = scope["client"][0] if scope.get("client") else "unknown"
        self.session_id = next((v.decode("latin-1") for k, v in headers if k == _SESSION_HEADER), None)
        version = next((v.decode("latin-1") for k, v in headers if k == _VERSION_HEADER), None)
        handshake = version is None or version in HANDSHAKE_PROTOCOL_VERSIONS
        self.opening = self.session_id is None and self.method == "POST" and handshake
        self.opened: str | None = None

    def refusal(self) -> str | None:
        """Why the request may not go on (a session it may open would pass a bound), or None."""
        if self.opening:
            return self.bounds.refusal(self.client)
        if self.session_id is not None:
            self.bounds.started(self.session_id)
        return None

    def answered(self, status: int, new_session: str | None) -> None:
        if self.opening:
            self.opening = False
            if new_session is not None and status < 400:
                self.bounds.opened(new_session, self.client)
                self.opened = new_session
            else:
                self.bounds.not_opened(self.client)
        elif self.session_id is not None and (status == 404 or self.method == "DELETE" and status < 400):
            self.bounds.ended(self.session_id)

    def done(self) -> None:
        if self.opening:  # no answer was sent (the client went away)
            self.bounds.not_opened(self.client)
        for session_id in (self.session_id, self.opened):
            if session_id is not None:
                self.bounds.finished(session_id)


class McpFrontDoor:
    """The MCP server of one app: `.asgi` answers requests at /mcp, `.run()` is entered by the app's lifespan."""

    def __init__(self, server: VirtualServer):
        self.virtual_server = server
        self.toolsets = server.toolsets
        self.sdk_server = Server(
            "mirrorapi",
            version=mirrorapi_version(),  # the serverInfo an initialize answers
            instructions=(
                "Simulated web APIs: each tool answers as the real API would, with a JSON object "
                '{"error": str, "response": ...}.'
            ),
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            # No tool declares an `x-mcp-header` parameter, so a 2026-07-28 call's `Mcp-Param-*` headers have nothing
            # to be checked against: without this the SDK walks `tools/list` page by page for the called tool's
            # schema on every call (94 pages of 500 for ToolEnv2404's every API: seconds, the event loop held).
            get_tool_input_schema=lambda name: None,
        )
        settings = server.settings
        self.max_body = settings.max_body_bytes
        self.sessions = StreamableHTTPSessionManager(
            app=self.sdk_server,
            json_response=True,
            # No SDK check of Host and Origin: the server's front door (app.VirtualEndpoint) checks them on every
            # path and transport, /mcp included, by one rule (`allowed_hosts`).
            security_settings=None,
            max_request_body_size=self.max_body,
            session_idle_timeout=settings.mcp_session_idle_timeout,
            max_sessions=settings.mcp_max_sessions,
        )
        self.bounds = McpSessionBounds(
            settings.mcp_max_sessions, settings.mcp_sessions_per_client, settings.mcp_session_idle_timeout
        )
        self._sdk = StreamableHTTPASGIApp(self.sessions)

    def run(self):
        return self.sessions.run()

    async def asgi(self, scope, receive, send) -> None:
        """A request at /mcp: the body read here within `max_body_bytes`, the session bounds applied, then the
        SDK; an answer of the SDK that is not JSON (its refusals are plain text) is sent as a JSON-RPC error."""
        if scope["type"] != "http":
            return await self._sdk(scope, receive, send)
        try:
            body = await read_body(scope, receive, self.max_body)
        except BodyTooLarge as exc:
            return await send_refusal(send, 413, str(exc), [(b"connection", b"close")])
        except ClientGone:
            return
        tracked = BoundedRequest(self.bounds, scope)
        refusal = tracked.refusal()
        if refusal is not None:
            logger.warning("MCP session refused: %s", refusal)
            return await send_refusal(send, 503, refusal, [(b"retry-after", b"5")])

        delivered = False

        async def replay() -> Any:
            nonlocal delivered
            if delivered:  # the SDK listens for a disconnect while it answers: there is none to tell
                return await receive()
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}

        held: dict | None = None  # a refusal's head, held until its body is seen

        async def answer(message: Any) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = message.get("headers", [])
                tracked.answered(
                    status, next((v.decode("latin-1") for k, v in headers if k.lower() == _SESSION_HEADER), None)
                )
                if status >= 400 and not any(
                    k.lower() == b"content-type" and v.startswith(b"application/json") for k, v in headers
                ):
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                status, kept = held["status"], [(k, v) for k, v in held.get("headers", []) if k.lower() == b"allow"]
                text = message.get("body", b"").decode("utf-8", "replace").strip() or HTTPStatus(status).phrase
                held = None
                return await send_refusal(send, status, text, kept)  # a 405's Allow stays (RFC 9110 §15.5.6)
            await send(message)

        try:
            await self._sdk(scope, replay, answer)
        finally:
            tracked.done()

    # ------------------------------------------------------------------------------- toolsets
    def toolset(self, ctx) -> Toolset:
        """The toolset of a request: its URL's, else the configured one; MCPError when it names nothing known."""
        request = ctx.request
        spec = (
            request.url.query
            if request is not None and request.url.query
            else self.virtual_server.settings.mcp_toolset
        )
        try:
            return self.toolsets.get(spec)
        except ToolsetError as exc:
            raise MCPError(code=types.INVALID_PARAMS, message=f"toolset {spec!r}: {exc}") from None

    async def list_tools(self, ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        names = list(self.toolset(ctx).functions.items())
        cursor = params.cursor if params is not None and params.cursor else "0"
        # ASCII digits only (str.isdigit takes "²", which int() refuses), few enough for int() to read.
        if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= MAX_CURSOR_DIGITS):
            raise MCPError(
                code=types.INVALID_PARAMS,
                message=f"invalid cursor {cursor[:40]!r}: give the nextCursor of the previous page",
            )
        start = int(cursor)
        page = names[start : start + PAGE_SIZE]
        tools = [types.Tool.model_validate(mcp_tool(name, doc)) for name, doc in page]
        more = start + PAGE_SIZE < len(names)
        return types.ListToolsResult(tools=tools, next_cursor=str(start + PAGE_SIZE) if more else None)

    # ----------------------------------------------------------------------------------- calls
    async def call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        doc = self.toolset(ctx).functions.get(params.name)
        if doc is None:  # MCP's schema: an error in finding the tool is a protocol error, not the tool's (isError)
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool {params.name[:100]!r} in this toolset.")
        # The function's API is known: answered as /virtual answers the same call, without writing and parsing its body
        answer = await self.virtual_server.answer_call(doc, params.arguments or {}, self._session_id(ctx))
        text = answer.body.decode()
        try:
            failed = bool(json.loads(text).get("error"))
        except (ValueError, AttributeError):
            failed = True
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=failed)

    @staticmethod
    def _session_id(ctx) -> str | None:
        request = ctx.request
        if request is None:
            return None
        # the raw header read as /virtual reads it (header_text: UTF-8 first), so that a non-ASCII X-Session-Id names
        # one session on both doors (Starlette's `headers` decode Latin-1: "é" was "Ã©" here)
        headers = dict(request.scope["headers"])
        value = headers.get(SESSION_HEADER) or headers.get(_SESSION_HEADER)
        return header_text(value) if value else None
