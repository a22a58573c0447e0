"""The servers bench/server.py measures ours against, one process each (`python bench/server_floors.py ROLE --port N`):
not servers anyone would run, but the least work a server on this stack does, so a target can be read against
what the stack and the machine allow.

- `bare`: a constant JSON body from an ASGI function on uvicorn with uvloop and httptools, as ours runs;
- `lookup_floor`: a hit and nothing else (the body's JSON, the canonical arguments, the answer read from the
  SQLite cache through our `ResponseCache.lookup`); `--in-memory`: from a dict of every answer instead;
- `forwarder`: a miss and nothing else: per request the chat call engine_direct makes, through one HTTP client
  (`--client`), answered with a constant body. aiohttp is the client of our engine calls; `streams` is the load
  generator's kind (keep-alive asyncio streams), the least an HTTP/1.1 client costs in Python; httpx is the
  client of the rest of the project: side by side they tell the client's share of a miss.
"""

import argparse
import asyncio
import json
import sys
from pathlib import Path

from server_load import read_answer

REPO = Path(__file__).resolve().parents[1]
BARE_BODY = json.dumps({"error": "", "response": "word " * 120}).encode()  # about the size of a cached answer
# A chat request of the size the server sends (a prompt of about 3 kB): engine_direct's and the forwarder's.
ENGINE_REQUEST = json.dumps(
    {
        "model": "stub",
        "messages": [{"role": "system", "content": "s" * 800}, {"role": "user", "content": "u" * 2200}],
        "temperature": 0.0,
        "max_tokens": 1024,
    }
).encode()
UVICORN = dict(host="127.0.0.1", log_level="warning", access_log=False, http="httptools", loop="uvloop")


async def bare_app(scope, receive, send) -> None:
    """The floor: reads the body and answers a constant one, nothing else."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(BARE_BODY))],
        }
    )
    await send({"type": "http.response.body", "body": BARE_BODY})


def serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.run(bare_app, port=port, **UVICORN)


async def _read_body(receive) -> bytes:
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    return body


async def _send_body(send, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))],
        }
    )
    await send({"type": "http.response.body", "body": body})


def serve_lookup_floor(port: int, cache_path: str, in_memory: bool) -> None:
    """A hit and nothing else: the body's JSON, the canonical arguments, the answer read from the SQLite cache
    (`in_memory`: from a dict of every answer, read from the cache at start)."""
    import uvicorn

    from mirrorapi.records import canonical_json
    from mirrorapi.serving.cache import Call, ResponseCache

    cache = ResponseCache(cache_path, autocheckpoint=False)
    answers = {entry.call: entry.observation.encode() for entry in cache.rows()} if in_memory else {}

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/live":
            return await _send_body(send, b"{}")
        request = json.loads(await _read_body(receive))
        call = Call(
            request["category"],
            request["tool_name"],
            request["api_name"],
            canonical_json(json.loads(request["tool_input"])),
        )
        if in_memory:
            found = answers.get(call)
        else:
            found = await cache.lookup(call, "")
            found = found[0] if found else None
        await _send_body(send, found or b'{"error": "not in the cache", "response": ""}')  # counted as an error

    uvicorn.run(app, port=port, **UVICORN)


def serve_forwarder(port: int, engine_port: int, client: str) -> None:
    """A miss and nothing else: one chat completion (engine_direct's request), answered with a constant body.
    `client` "aiohttp": through a pooled aiohttp session, the client the server's engine calls use; "httpx": a
    pooled httpx.AsyncClient, the client of the rest of the project (and of openai's SDK); "streams": the load
    generator's kind of client (keep-alive asyncio streams, the head read up to its blank line), the least an
    HTTP/1.1 client can cost in Python, to tell the client's share from the rest."""
    import aiohttp
    import httpx
    import uvicorn

    url = f"http://127.0.0.1:{engine_port}/v1/chat/completions"
    sessions: list[aiohttp.ClientSession] = []
    clients: list[httpx.AsyncClient] = []
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: engine\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(ENGINE_REQUEST), ENGINE_REQUEST)
    )

    async def call_aiohttp() -> None:
        if not sessions:
            sessions.append(aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1024, limit_per_host=1024)))
        async with sessions[0].post(url, data=ENGINE_REQUEST, headers={"content-type": "application/json"}) as answer:
            await answer.json()

    async def call_httpx() -> None:
        if not clients:
            limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
            clients.append(httpx.AsyncClient(limits=limits, timeout=60))
        answer = await clients[0].post(url, content=ENGINE_REQUEST, headers={"content-type": "application/json"})
        answer.json()

    async def call_streams() -> None:
        reader, writer = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", engine_port)
        writer.write(request)
        json.loads((await read_answer(reader))[1])
        idle.append((reader, writer))

    call = {"aiohttp": call_aiohttp, "httpx": call_httpx, "streams": call_streams}[client]

    async def app(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/live":
            return await _send_body(send, b"{}")
        await _read_body(receive)
        await call()
        await _send_body(send, BARE_BODY)

    uvicorn.run(app, port=port, **UVICORN)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("role", choices=["bare", "lookup_floor", "forwarder"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cache", help="lookup_floor: the SQLite cache.")
    parser.add_argument("--in-memory", action="store_true", help="lookup_floor: every answer in a dict.")
    parser.add_argument("--engine-port", type=int, help="forwarder: the stub engine's port.")
    parser.add_argument("--client", choices=["aiohttp", "httpx", "streams"], default="aiohttp", help="forwarder.")
    args = parser.parse_args()
    if args.role == "bare":
        return serve_bare(args.port)
    if args.role == "lookup_floor":
        sys.path.insert(0, str(REPO))
        return serve_lookup_floor(args.port, args.cache, args.in_memory)
    return serve_forwarder(args.port, args.engine_port, args.client)


if __name__ == "__main__":
    main()
