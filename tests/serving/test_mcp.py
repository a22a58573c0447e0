"""MCP at /mcp (issue 13): the official `mcp` client over streamable HTTP on 127.0.0.1 lists a toolset
and calls its tools; the answers are /virtual's, through the same handler (cache, validation,
simulator, metrics), and the MCP session is the simulation session."""

import asyncio
import json
import sqlite3
from importlib import metadata

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

# Real API-Bank calls of data/samples/pairs.jsonl (episode gen-00133).
LOGIN_ARGS = {"username": "JaneSmith", "password": "password"}
LOGIN_ANSWER = {"error": "", "response": '{"token": "o8i7u6y5t4r3e2w1q0"}'}
ACCOUNT_TOOLS = {"checktoken", "deleteaccount", "forgotpassword", "getusertoken", "modifypassword", "registeruser"}


def call(url: str, steps, mode: str = "auto", headers: dict | None = None):
    """Run `steps(client)` against the MCP server at `url` with the official client."""

    async def main():
        transport = streamable_http_client(url, http_client=create_mcp_http_client(headers=headers))
        async with Client(transport, mode=mode) as client:
            return await steps(client)

    return asyncio.run(main())


def test_toolset_by_url_lists_schemas_from_the_docs(serve, recorded_cache, engine_down, samples):
    query_file = samples / "stabletoolbench/solvable_queries_example/test_instruction/G1_instruction.json"
    with serve(
        tools_folder=[str(samples / "tools"), str(query_file)],
        api_base=[engine_down],
        cache_path=str(recorded_cache),
        mcp_toolset="tool=APIBank/apibank_account",
    ) as server:
        tools = call(server.url + "/mcp", lambda c: c.list_tools()).tools
        assert {t.name for t in tools} == ACCOUNT_TOOLS  # the configured toolset
        login = next(t for t in tools if t.name == "getusertoken")
        # data/samples/tools/APIBank/apibank_account.json: GetUserToken(username, password), both required strings
        assert login.input_schema["required"] == ["username", "password"]
        assert login.input_schema["properties"]["username"]["type"] == "string"
        assert login.input_schema["properties"]["username"]["description"]

        tools = call(
            server.url + "/mcp?category=Sports&api=APIBank/apibank_finance/QueryBalance", lambda c: c.list_tools()
        ).tools
        assert {t.name for t in tools} == {
            "v4_sports",
            "v4_sports_sport_odds",
            "v4_sports_sport_scores",
            "querybalance",
        }
        odds = next(t for t in tools if t.name == "v4_sports_sport_odds").input_schema
        # data/samples/tools/Sports/live_sports_odds.json: `regions` required, `oddsFormat` optional default "decimal"
        assert "regions" in odds["required"] and odds["properties"]["oddsformat"]["default"] == "decimal"

        # A StableToolBench query's api_list (query 588 of the sample query file: TheClique's APIs)
        tools = call(server.url + "/mcp?query=588", lambda c: c.list_tools()).tools
        assert "transfermarkt_search" in {t.name for t in tools}

        async def unknown(client):
            try:
                await client.list_tools()
            except MCPError as exc:
                return exc

        error = call(server.url + "/mcp?category=NoSuchCategory", unknown)
        assert isinstance(error, MCPError) and "Unknown category 'NoSuchCategory'" in str(error)

        async def server_info(client):
            return client.server_info

        info = call(server.url + "/mcp", server_info, mode="legacy")
    # the installed package's version (a literal "0.1.0" before, which a release would have left behind)
    assert info.name == "mirrorapi" and info.version == metadata.version("mirrorapi")


def test_calls_are_answered_like_virtual(serve, recorded_cache, engine_down, samples):
    with serve(
        api_base=[engine_down],
        cache_path=str(recorded_cache),
        engine_retries=0,
        mcp_toolset="tool=APIBank/apibank_account",
    ) as server:

        async def steps(client):
            hit = await client.call_tool("getusertoken", LOGIN_ARGS)
            invalid = await client.call_tool("getusertoken", {"username": "JaneSmith"})
            try:
                await client.call_tool("no_such_tool", {})
            except MCPError as exc:
                return hit, invalid, exc.error
            return hit, invalid, None

        hit, invalid, unknown = call(server.url + "/mcp", steps)
        virtual = server.virtual(
            {
                "category": "APIBank",
                "tool_name": "apibank_account",
                "api_name": "GetUserToken",
                "tool_input": json.dumps(LOGIN_ARGS),
            }
        )
        assert not hit.is_error and json.loads(hit.content[0].text) == LOGIN_ANSWER
        assert hit.content[0].text == virtual.text
        # A call without a required argument: the /virtual validation error, as an MCP tool error.
        assert invalid.is_error and json.loads(invalid.content[0].text)["error"].startswith(
            "Missing required parameter 'password'"
        )
        # An unknown tool is a protocol error (MCP's schema, CallToolResult: "errors in finding the tool ... should
        # be reported as an MCP error response"), as the OpenEnv door's JSON-RPC answers it, not an isError result.
        assert unknown is not None and unknown.code == -32602 and "Unknown tool 'no_such_tool'" in unknown.message
        assert server.metric("mirrorapi_requests_total", outcome="hit") == 2  # MCP's and /virtual's
        assert server.metric("mirrorapi_requests_total", outcome="validation_error") == 1


@pytest.mark.slow
def test_uncached_call_is_simulated_in_the_mcp_session(serve, simulator_engine, samples, tmp_path):
    cache_path = tmp_path / "c.sqlite"
    with serve(
        api_base=[simulator_engine.base_url],
        model=simulator_engine.model,
        cache_path=str(cache_path),
        engine_timeout=120,
        mcp_toolset="tool=APIBank/apibank_account&tool=APIBank/apibank_finance",
        session_history=8,  # the tiny model trained on calls alone: its record alone would turn sessions off
    ) as server:

        async def episode(client):
            login = await client.call_tool("getusertoken", LOGIN_ARGS)
            balance = await client.call_tool("querybalance", {"token": "o8i7u6y5t4r3e2w1q0"})
            return [r.content[0].text for r in (login, balance)]

        # The legacy handshake gives an MCP session (Mcp-Session-Id): it is the simulation session.
        first = call(server.url + "/mcp", episode, mode="legacy")
        assert server.metric("mirrorapi_requests_total", outcome="simulated") == 2
        # The same episode from a 2026-07-28 client, which names its session with X-Session-Id: cache hits.
        again = call(server.url + "/mcp", episode, headers={"X-Session-Id": "replay"})
        assert again == first and server.metric("mirrorapi_requests_total", outcome="hit") == 2
        # /virtual in a session of its own gives the same answer for the first call.
        virtual = server.client.post(
            "/virtual",
            headers={"X-Session-Id": "v"},
            json={
                "category": "APIBank",
                "tool_name": "apibank_account",
                "api_name": "getusertoken",
                "tool_input": json.dumps(LOGIN_ARGS),
            },
        )
        assert virtual.text == first[0]
    # The login, first in its session, is the stateless call (no earlier call to show); the balance is step 1.
    db = sqlite3.connect(cache_path)
    assert [s for (s,) in db.execute("SELECT steps FROM entries WHERE history != ''")] == [1]
    assert [a for (a,) in db.execute("SELECT api FROM entries WHERE history = ''")] == ["getusertoken"]


def test_a_call_does_not_list_the_toolset(serve, recorded_cache, engine_down, samples, monkeypatch):
    """With a 2026-07-28 client (the SDK's `auto` mode negotiates it), the SDK checks a call's `Mcp-Param-*` headers
    against the called tool's schema, found by running the server's `tools/list` page by page unless the server says
    how to get it (`Server(get_tool_input_schema=...)`, mcp/server/lowlevel/server.py): our tools declare no such
    header, so a call must cost no listing (on every API of ToolEnv2404, 94 pages: seconds per call, the server's
    event loop held all along)."""
    from mirrorapi.serving.mcp_server import McpFrontDoor

    listed = []
    original = McpFrontDoor.list_tools

    async def counted(self, ctx, params):
        listed.append(params)
        return await original(self, ctx, params)

    monkeypatch.setattr(McpFrontDoor, "list_tools", counted)
    with serve(
        tools_folder=[str(samples / "tools")], api_base=[engine_down], cache_path=str(recorded_cache)
    ) as server:

        async def steps(client):
            await client.list_tools()  # the client's own listing (else the SDK client lists to check the result)
            answer = await client.call_tool("getusertoken", LOGIN_ARGS)
            return answer, client.session._negotiated_version

        answer, version = call(server.url + "/mcp?tool=APIBank/apibank_account", steps, mode="auto")
    assert version == "2026-07-28" and json.loads(answer.content[0].text) == LOGIN_ANSWER
    assert len(listed) == 1  # the client's listing, none for the call


def test_a_lone_surrogate_in_a_tool_s_arguments_is_a_tool_error_not_an_internal_one(
    serve, recorded_cache, engine_down
):
    """`"\\ud800"` is valid JSON text (a JavaScript client can send it; the Python SDK client cannot, so the request
    is written here as a 2026-07-28 client writes it): /virtual answers such tool_input with an error observation,
    and a tools/call must be that tool's error (isError), not JSON-RPC's -32603 internal error."""
    import httpx

    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    headers = {
        "accept": "application/json, text/event-stream",
        "content-type": "application/json",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": "checktoken",
    }
    call_body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    call_body["params"] = {"_meta": meta, "name": "checktoken", "arguments": {"token": "\ud800"}}
    with serve(
        api_base=[engine_down], cache_path=str(recorded_cache), mcp_toolset="tool=APIBank/apibank_account"
    ) as s:
        answer = httpx.post(s.url + "/mcp", headers=headers, content=json.dumps(call_body).encode(), timeout=30)
    assert answer.status_code == 200 and "error" not in answer.json(), answer.text
    result = answer.json()["result"]
    # the observation /virtual gives arguments holding one (until 2026-11-30 the body's "Invalid JSON": pydantic's
    # parser refused the escape, which JSON allows)
    error = json.loads(result["content"][0]["text"])["error"]
    assert result["isError"] is True and "tool_input holds a lone surrogate '\\ud800'" in error, error


def test_a_non_ascii_session_header_names_one_session_on_virtual_and_mcp(serve, tmp_path):
    """One episode's id in `X-Session-Id`, UTF-8 as clients write it, names the same session whichever door a call
    comes in by: /mcp read the header as Latin-1 ("épisode" was "Ã©pisode", a second session) where /virtual
    reads UTF-8."""
    from harness.fake_engines import StubEngine
    from mirrorapi.serving.cache import ResponseCache

    from .test_sessions import LOGIN, body

    cache_path = tmp_path / "c.sqlite"
    header = {"X-Session-Id": "épisode".encode()}
    with (
        StubEngine(model="stub") as engine,
        serve(
            api_base=[engine.url],
            model="stub",
            cache_path=str(cache_path),
            session_history=8,
            mcp_toolset="tool=APIBank/apibank_account&tool=APIBank/apibank_finance",
        ) as server,
    ):
        assert server.client.post("/virtual", json=body(*LOGIN[:4]), headers=header).status_code == 200

        async def steps(client):
            return await client.call_tool("querybalance", {"token": "o8i7u6y5t4r3e2w1q0"})

        call(server.url + "/mcp", steps, headers=header)
    sessions = {row[0]: row[2] for row in ResponseCache(cache_path).sessions()}
    assert sessions == {"épisode": 2}
