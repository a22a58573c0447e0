"""The server's FastAPI routes besides /virtual: `GET /live`, `GET /health`, `GET /metrics`. Each gets the one
`VirtualServer` of its app as a typed dependency (`ServerDep`); /virtual itself is answered in front of FastAPI
(`mirrorapi.serving.app.VirtualEndpoint`, which says why).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from mirrorapi.serving.asgi import authorized
from mirrorapi.serving.cache import CacheError
from mirrorapi.serving.server import VirtualServer

router = APIRouter()


def get_server(request: Request) -> VirtualServer:
    """The server of the app the request came to (`create_app` puts it on `app.state.server`)."""
    return request.app.state.server


ServerDep = Annotated[VirtualServer, Depends(get_server)]


@router.get("/live")
async def live() -> JSONResponse:
    """200 as soon as the server answers HTTP (readiness polls, liveness probes); /health says more."""
    return JSONResponse({"status": "live"})


@router.get("/health")
async def health(request: Request, server: ServerDep) -> JSONResponse:
    """200 `ok` (every replica serves the model, or replay mode), 200 `degraded` (some do), 503 `unavailable`
    (none: misses cannot be simulated; cache hits are still served). With an API key set, a caller without it is
    told the status only: no cache path, engine URLs or model name."""
    settings, cache = server.settings, server.cache
    engines = [] if settings.mode == "replay" else await server.engine.health(timeout=2.0)
    key = settings.server_api_key
    told_all = key is None or authorized(request.scope, key.encode())
    serving = sum(e.ok for e in engines)
    try:
        entries, open_sessions, session_entries = await cache.health_counts(settings.session_ttl)
    except CacheError as exc:  # the shared store is away: hits fail too; say so rather than answer 500
        content: dict[str, Any] = {
            "status": "unavailable",
            "mode": settings.mode,
            "misses": "not answered: the cache cannot be read",
        }
        if told_all:
            content.update(detail=str(exc), model=settings.model, cache={"location": cache.location})
        return JSONResponse(status_code=503, content=content)
    if settings.mode == "replay":
        status, misses = "ok", "answered from the cache only (replay mode)"
    elif serving == len(engines):
        status, misses = "ok", "simulated"
    elif serving:
        status, misses = "degraded", f"simulated by {serving} of {len(engines)} engine replicas"
    else:
        status, misses = (
            "unavailable",
            (
                "not simulated: no engine replica serves the model; cache hits are still "
                "served, misses get an error observation"
            ),
        )
    code = 503 if status == "unavailable" else 200
    if not told_all:
        return JSONResponse(
            status_code=code,
            content={
                "status": status,
                "misses": misses,
                "mode": settings.mode,
                "detail": "send the server's API key for the engines, the cache and the sessions",
            },
        )
    return JSONResponse(
        status_code=code,
        content={
            "status": status,
            "misses": misses,
            "mode": settings.mode,
            "model": settings.model,
            "prompt_format": settings.prompt_format,
            "engine": [
                {
                    "base_url": e.base_url,
                    "reachable": e.reachable,
                    "serves_model": e.ok,
                    "detail": e.detail,
                    "cooling_down_s": e.cooling_down,
                }
                for e in engines
            ],
            "cache": {"location": cache.location, "entries": entries},
            "tools": server.tool_counts,
            "sessions": {"open": open_sessions, "history": settings.session_history, "cache_entries": session_entries},
        },
    )


@router.get("/metrics")
async def metrics(server: ServerDep) -> Response:
    body, media_type = server.metrics.exposition()
    return Response(body, media_type=media_type)
