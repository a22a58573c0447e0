"""What mirrorapi/serving/transport.py needs of uvicorn below its public API (its module doc lists where): each test
fails, naming the piece, when a uvicorn release moves one. pyproject.toml pins uvicorn to the releases they passed
on (`TESTED_UVICORN`)."""

import inspect
from pathlib import Path

import httpx
import tomllib
import uvicorn.config
from packaging.requirements import Requirement

from harness.processes import free_port, serve_in_thread
from mirrorapi.serving.transport import (
    TESTED_UVICORN,
    Connections,
    GatheredWrites,
    ReceiveDeadline,
    check_uvicorn,
    uvicorn_protocol,
)


def test_the_installed_uvicorn_is_a_tested_release_and_pyproject_pins_that_range():
    assert check_uvicorn() is None, check_uvicorn()
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    pins = [Requirement(r) for r in project["optional-dependencies"]["serve"] if Requirement(r).name == "uvicorn"]
    assert [str(r.specifier) for r in pins] == [f"<{TESTED_UVICORN[1]},>={TESTED_UVICORN[0]}"]


def test_uvicorns_protocol_table_and_the_arguments_it_builds_a_protocol_with():
    assert "auto" in uvicorn.config.HTTP_PROTOCOLS, "uvicorn.config.HTTP_PROTOCOLS has no 'auto' protocol"
    parameters = inspect.signature(uvicorn_protocol()).parameters
    assert {"config", "server_state", "app_state", "_loop"} <= set(parameters), (
        f"uvicorn builds its HTTP protocol with other arguments now: {list(parameters)}"
    )


class _AppWithConnections:
    """An app of ours as the protocol sees one: it holds its `connections`; it answers with the class of the
    deadline its connection has (the protocol's, or the stand-in of a connection that has none)."""

    def __init__(self):
        self.connections = Connections(request_timeout=10.0)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return
        body = type(self.connections.of(scope)).__name__.encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))],
            }
        )
        await send({"type": "http.response.body", "body": body})


def test_through_a_real_uvicorn_the_deadline_is_kept_and_a_responses_writes_leave_together(monkeypatch):
    """uvicorn's own protocol, inside ours, on a real socket: the app's connections are found through uvicorn's
    config (`Config.loaded_app`), and the response's head and body reach the stand-in transport in one turn."""
    flushed: list[int] = []
    flush = GatheredWrites.flush

    def counted(self):
        flushed.append(len(self._gathered))
        flush(self)

    monkeypatch.setattr(GatheredWrites, "flush", counted)
    port = free_port()
    with serve_in_thread(_AppWithConnections(), port, http=ReceiveDeadline, log_level="warning") as url:
        answer = httpx.get(url + "/", timeout=10)
    assert answer.text == "ReceiveDeadline", "uvicorn no longer gives its protocol the app (Config.loaded_app)"
    assert 2 in flushed, f"uvicorn's protocol no longer writes a response through the transport it is given: {flushed}"
