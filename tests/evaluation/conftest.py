"""Fixtures of the evaluation tests: the eval CLIs, StableToolBench files, a faulty fake judge, a virtual server.

- `eval_cli(name)`: the `main(argv)` of `eval/<name>.py`, called in-process (exit status returned).
- `stb_answers`, `stb_ids`: StableToolBench converted answers and test ids (shared data, else the
  bundled sample of the same files).
- `faulty_judge`: a FAKE OpenAI-compatible engine for the two faults a real engine cannot be made
  to show on demand: it answers garbage (no verdict line), and it can fail (HTTP 503) on chosen
  queries. It also keeps the messages it was sent, which a real engine does not show; with
  `owned_by = "vllm"` it lists its model as vLLM's /v1/models does (no vLLM runs here).
  Everything else uses the real tiny model behind `transformers serve`.
- `virtual_server`: starts `python serving/main_mirrorapi.py` as real processes on free 127.0.0.1
  ports, each with its own SQLite cache in a temporary folder and the bundled tool docs.

The engines are the untrained tiny model (`tiny_engine`), not the trained `simulator_engine` /
`judge_engine`: training those costs about two minutes each here, beyond this folder's test budget,
and these tests check structure, counts and resumption, not model quality.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from harness.processes import free_port, serve_in_thread, stop, wait_until_ready

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def eval_cli():
    loaded = {}

    def get(name: str):
        if name not in loaded:
            spec = importlib.util.spec_from_file_location(f"eval_cli_{name}", REPO / "eval" / f"{name}.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            loaded[name] = module.main
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def stb_root(samples) -> Path:
    shared = REPO.parent / "shared" / "data" / "stabletoolbench"
    return shared if shared.is_dir() else samples / "stabletoolbench"


@pytest.fixture(scope="session")
def stb_answers(stb_root) -> Path:
    return stb_root / "data_example" / "model_predictions_converted"


@pytest.fixture(scope="session")
def stb_ids(stb_root) -> Path:
    full = stb_root / "solvable_queries" / "test_query_ids"
    return full if full.is_dir() else stb_root / "solvable_queries_example" / "test_query_ids"


class FaultyJudge:
    """FAKE engine (see module docstring). `reply` is what every chat completion says; a request whose
    messages contain `fail_on` gets HTTP `fail_status` (503) saying `fail_message` while `failing` is true."""

    def __init__(self, reply: str):
        self.reply, self.fail_on, self.failing, self.requests = reply, None, False, 0
        self.fail_status, self.fail_message = 503, "overloaded"  # what a failing request is answered
        self.received: list[list[dict]] = []  # the messages of every chat completion request
        self.model = "fake-judge"
        self.owned_by: str | None = None  # the engine named in /v1/models (vLLM: "vllm")
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models():
            owner = {"owned_by": self.owned_by} if self.owned_by else {}
            return {"object": "list", "data": [{"id": self.model, "object": "model", **owner}]}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.requests += 1
            self.received.append(body["messages"])
            if self.failing and self.fail_on and self.fail_on in str(body["messages"]):
                return JSONResponse({"error": {"message": self.fail_message}}, status_code=self.fail_status)
            return {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": self.reply}}
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }

        return app


@pytest.fixture
def faulty_judge():
    judge = FaultyJudge("I cannot decide; the answer has some merits and some flaws.")
    with serve_in_thread(judge.app(), judge.port, timeout=20):
        yield judge


def start_virtual_server(folder: Path, samples: Path, api_base: str, model: str, **settings):
    """`python serving/main_mirrorapi.py` in `folder` -> (base URL, request log, process, output file)."""
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    values = {
        "api_base": api_base,
        "model": model,
        "tools_folder": samples / "tools",
        "port": port,
        "cache_path": folder / "cache.sqlite",
        "log_file": folder / "requests.log",
        "max_tokens": 48,
        "engine_timeout": 60,
        "log_level": "info",
        **settings,
    }
    config = folder / "server.yml"
    config.write_text("".join(f"{key}: {value}\n" for key, value in values.items()))
    output = open(folder / "server.out", "wb")
    command = [sys.executable, str(REPO / "serving" / "main_mirrorapi.py"), "--config", str(config)]
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/live", 60, process=process, log_path=folder / "server.out")
    except Exception:
        stop(process)
        output.close()
        raise
    return url, values["log_file"], process, output


@pytest.fixture(scope="session")
def virtual_server_process():
    """`start(folder, samples, api_base, model, **settings)` -> (base URL, request log, process, output);
    the caller stops the process (`harness.processes.stop`) and closes the output."""
    return start_virtual_server


@pytest.fixture
def virtual_server(samples, tmp_path):
    """Start real virtual server processes: `start(api_base, model, **settings)` -> (base URL, request log).

    Each gets its own cache database (fresh unless the test filled `settings["cache_path"]`) and the
    bundled tool docs; all are stopped after the test.
    """
    started = []

    def start(api_base: str, model: str, **settings) -> tuple[str, Path]:
        url, log, process, output = start_virtual_server(
            tmp_path / f"server{len(started)}", samples, api_base, model, **settings
        )
        started.append((process, output))
        return url, log

    yield start
    for process, output in started:
        stop(process)
        output.close()
