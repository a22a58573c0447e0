"""Serving: the virtual API server. `config` (settings), `protocol` (the wire models, a pure leaf),
`handler` (the /virtual path), `cache`, `simulator`, `app` (ASGI wiring), `observability` (metrics
and the request log). Imports the core only; never `data`, `training` or `evaluation`.
"""
