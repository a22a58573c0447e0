"""The server with `/virtual` as an ordinary FastAPI route (typed dependencies for the API key and the
session header, the body bound as middleware): the alternative issue 19 §1 asks to weigh against the raw
ASGI endpoint of `mirrorapi.serving.app.VirtualEndpoint`. bench/server.py runs it beside the real server
in the same run (`mirrorapi_route` in its JSON) and prints the CPU of a hit through it over the real one's.

    python bench/virtual_route.py --tools-folder ... --cache-path ... --port 8090   # the server's flags

Everything but the routing is the real server's: `create_app` (its FastAPI app: lifespan, /health,
/metrics), `VirtualServer.answer` (the answer, the metrics and the request log), uvicorn's options and the receive
deadline of each request.
"""

import argparse
import sys
from pathlib import Path
from typing import Annotated

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvicorn  # noqa: E402
from fastapi import Depends, Header, HTTPException, Request, Response  # noqa: E402
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer  # noqa: E402

from mirrorapi.serving.app import configure_logging, create_app  # noqa: E402
from mirrorapi.serving.asgi import UNAUTHORIZED, declared_length, error_body, send_json  # noqa: E402
from mirrorapi.serving.config import ServerSettings, add_server_arguments, settings_from_args  # noqa: E402
from mirrorapi.serving.transport import Connections, RequestDeadlineMiddleware, uvicorn_options  # noqa: E402


class BodyLimit:
    """The body bound as ASGI middleware (a declared length over the bound: 413); the outermost app, so it holds the
    receive deadlines of the connections (`connections`, where the server's protocol looks for them)."""

    def __init__(self, app, limit: int, connections: Connections):
        self.app, self.limit, self.connections = app, limit, connections

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and (declared_length(scope) or 0) > self.limit:
            return await send_json(send, 413, error_body("Request body too large"))
        return await self.app(scope, receive, send)


def route_app(settings: ServerSettings):
    endpoint = create_app(settings)  # the real app; its FastAPI app gets /virtual as a route
    app, server = endpoint.app, endpoint.server
    bearer = HTTPBearer(auto_error=False)
    key = settings.server_api_key

    def api_key(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
        toolbench_key: Annotated[str | None, Header()] = None,
    ) -> None:
        if key is not None and key not in ((credentials.credentials if credentials else None), toolbench_key):
            raise HTTPException(401, UNAUTHORIZED, headers={"www-authenticate": "Bearer"})

    @app.post("/virtual", dependencies=[Depends(api_key)])
    async def virtual(request: Request, x_session_id: Annotated[str | None, Header()] = None) -> Response:
        answer = await server.answer(await request.body(), x_session_id)
        return Response(answer.body, status_code=answer.status, media_type="application/json")

    connections = Connections(settings.request_timeout, server.refused)
    return BodyLimit(RequestDeadlineMiddleware(app, connections), settings.max_body_bytes, connections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    settings = settings_from_args(add_server_arguments(parser).parse_args())
    configure_logging(settings)
    uvicorn.run(route_app(settings), **uvicorn_options(settings))


if __name__ == "__main__":
    main()
