"""Serving: the virtual API server. Imports the core only; never `data`, `training` or `evaluation`.

Where a request is answered: `app` (the ASGI app every request enters: the API key, /virtual, the other doors;
uvicorn), `server` (`VirtualServer`, the server's state built once, which answers and records a call), `handler`
(/virtual without HTTP: parse, resolve, session), `responder` (look up, else simulate, then store), `simulator`
(the engine call); the other doors: `routes` (/health, /live, /metrics), `mcp_server` (/mcp), `openenv` (OpenEnv's
episodes). Where it is stored: `cache` (`cache.store.Store`, the interface; `cache.sqlite`, `cache.postgres`, the
backends). Where its settings are declared: `config` (`ServerSettings`). Around them: `protocol` (the wire models,
a pure leaf), `answer` (what a call comes to), `asgi` (ASGI helpers), `transport` (what uvicorn's public API does
not give: the receive deadline, gathered writes), `observability` (metrics, the request log), `sessions`.
"""
