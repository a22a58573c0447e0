"""The server's MCP front door: streamable HTTP at `/mcp`, built on the official `mcp` SDK.

`tools/list` gives the APIs of a toolset (`mirrorapi.toolsets`): the URL's query string when it has
one (`/mcp?category=Data`, `/mcp?tool=APIBank/apibank_account&tool=APIBank/apibank_finance`,
`/mcp?query=<StableToolBench query_id>`), else the `mcp_toolset` setting, else every API. Each API is
an MCP tool with the input JSON schema of its doc. `tools/call` is turned into the /virtual body of
that API and answered by the same `VirtualApi.answer` (validation, cache, simulator, provenance);
it is counted in /metrics and written to the request log like a /virtual call. The text content is
the observation /virtual would give, byte for byte; `isError` is set when its `error` is not empty
(the API refused the call, a validation error, an engine failure).

The simulation session of a call is its `X-Session-Id` header, else its MCP session (the
`Mcp-Session-Id` of protocol versions with an initialize handshake); a 2026-07-28 client, which
has no MCP session, names one with the header or goes without.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from mcp import types
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from mirrorapi.toolsets import Toolset, ToolsetError, mcp_tool, parse_toolset, select_toolset

logger = logging.getLogger(__name__)

MCP_PATH = "/mcp"
PAGE_SIZE = 500  # tools per tools/list page (ToolEnv2404 has 46,803 APIs)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class McpFrontDoor:
    """The MCP server of one app: `.asgi` answers requests at /mcp, `.run()` is entered by the app's lifespan."""

    def __init__(self, state: Any):
        self.state = state  # the FastAPI app's state: settings, registry, virtual, metrics, request_log
        self._toolsets: dict[str, Toolset] = {}
        self.server = Server("mirrorapi", version="0.1.0", instructions=(
            "Simulated web APIs: each tool answers as the real API would, with a JSON object "
            '{"error": str, "response": ...}.'), on_list_tools=self.list_tools, on_call_tool=self.call_tool)
        host = state.settings.host
        security = TransportSecuritySettings(  # DNS rebinding protection when serving on loopback only
            enable_dns_rebinding_protection=True, allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]) if host in LOOPBACK else None
        self.sessions = StreamableHTTPSessionManager(app=self.server, json_response=True, security_settings=security)
        self.asgi = StreamableHTTPASGIApp(self.sessions)

    def run(self):
        return self.sessions.run()

    # ------------------------------------------------------------------------------- toolsets
    def toolset(self, ctx) -> Toolset:
        """The toolset of a request: its URL's, else the configured one; MCPError when it names nothing known."""
        request = ctx.request
        spec = request.url.query if request is not None and request.url.query else self.state.settings.mcp_toolset
        toolset = self._toolsets.get(spec)
        if toolset is None:
            try:
                toolset = select_toolset(self.state.registry, parse_toolset(spec))
            except ToolsetError as exc:
                raise MCPError(code=types.INVALID_PARAMS, message=f"toolset {spec!r}: {exc}") from None
            if len(self._toolsets) < 1024:  # a client could send endless distinct URLs
                self._toolsets[spec] = toolset
        return toolset

    async def list_tools(self, ctx, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        names = list(self.toolset(ctx).functions.items())
        cursor = params.cursor if params is not None and params.cursor else "0"
        if not cursor.isdigit():
            raise MCPError(code=types.INVALID_PARAMS, message=f"invalid cursor {cursor!r}")
        start = int(cursor)
        page = names[start:start + PAGE_SIZE]
        tools = [types.Tool.model_validate(mcp_tool(name, doc)) for name, doc in page]
        more = start + PAGE_SIZE < len(names)
        return types.ListToolsResult(tools=tools, next_cursor=str(start + PAGE_SIZE) if more else None)

    # ----------------------------------------------------------------------------------- calls
    async def call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        doc = self.toolset(ctx).functions.get(params.name)
        if doc is None:
            message = f"Unknown tool {params.name!r} in this toolset."
            return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(
                {"error": message, "response": ""}))], is_error=True)
        body = json.dumps({"category": doc.category, "tool_name": doc.tool, "api_name": doc.api,
                           "tool_input": params.arguments or {}}, ensure_ascii=False).encode()
        answer = await self.state.virtual.answer(body, self._session_id(ctx))
        self.state.metrics.record(answer)
        self.state.request_log.record(answer)
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
        return request.headers.get("x-session-id") or request.headers.get(MCP_SESSION_ID_HEADER) or None
