"""Start, wait for and stop the local processes and servers the loop needs.

- `poll_until`: the one bounded wait; `wait_until_ready`: an HTTP endpoint answers 2xx (a child's
  exit or a 4xx ends the wait at once); `serve_in_thread`: an ASGI app on uvicorn in this process;
- `transformers_serve`: `transformers serve` as the CPU engine, ready when the block starts;
- `llama_cpp_serve`: llama.cpp's OpenAI-compatible server (`llama-cpp-python[server]`) on a GGUF file;
- `cpu_engine_serve`: the documented CPU engine on a model folder (llama.cpp when it can, else transformers),
  as scripts/serve_engine_cpu.sh chooses it;
- `vllm_serve`: vLLM's server on a model folder (`mirrorapi.vllm_engine`, as scripts/serve_engine_vllm.sh starts it);
- `stop`: SIGINT, then SIGTERM, then SIGKILL to a child's process group, each after a bounded grace
  (`transformers serve`: SIGTERM, then SIGKILL).
Used by the tests, the demo and the benchmarks. Everything binds to 127.0.0.1 on a free port and is
stopped on exit (also on errors).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from harness import REPO
from mirrorapi.models.to_gguf import GGUFExportError, gguf_for_serving
from mirrorapi.vllm_engine import VllmNotInstalled, installed_build, vllm_command, vllm_environment, vllm_python

T = TypeVar("T")


# Under pytest-xdist each worker takes its ports from a range of its own, below the kernel's ephemeral ports (32768
# and up, where clients' own ends are): a port from bind(0) is free again once that socket closes, and the kernel
# handed one to two workers at once (a test then talked to the other worker's server, `make test` of 2026-11-30).
WORKER_PORTS = 4000  # ports per worker: gw0 10000-13999, gw1 14000-17999, ...
_next_ports: dict[str, int] = {}


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing is bound to on `host`; under pytest-xdist, from its worker's range (above)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ...
    if not (worker.startswith("gw") and worker[2:].isdigit() and int(worker[2:]) < 5):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            return sock.getsockname()[1]
    base = 10000 + WORKER_PORTS * int(worker[2:])
    # A process starts where its pid says (a test's own server processes may ask too), then goes on in turn.
    offset = _next_ports.get(worker, os.getpid() * 97 % WORKER_PORTS)
    for step in range(WORKER_PORTS):
        port = base + (offset + step) % WORKER_PORTS
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:  # in use (or lingering): the next one
                continue
        _next_ports[worker] = (offset + step + 1) % WORKER_PORTS
        return port
    raise OSError(f"no free port in {base}-{base + WORKER_PORTS - 1} for pytest-xdist worker {worker}")


def checkout_env(root: str | os.PathLike = REPO, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (default: this process's environment) with `root` (default: this clone) first on PYTHONPATH: a child
    that runs a script of the checkout (`python serving/main_mirrorapi.py`) imports that checkout's library, not
    the one the venv's editable install points at (another clone or worktree sharing the venv)."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    return env


@dataclass
class RunningEngine:
    base_url: str  # ends in /v1, what an OpenAI client and our `api_base` take
    model: str  # the `model` field requests must carry (`transformers serve`: the folder path)
    process: subprocess.Popen
    log_path: Path
    name: str = "transformers serve"  # which engine, for people reading progress and reports
    # Calls it works on at once: vLLM batches up to BATCHING_CALLS; llama.cpp's server and `transformers serve`
    # generate one at a time (more queue inside the engine, and an abandoned one is still generated).
    concurrency: int = 1


# What a client keeps in flight to a batching engine (vLLM): the virtual server's default per replica
# (`engine_max_in_flight`); on 2 cores tokens/s still grows from 16 to 64 clients (docs/serving.md).
BATCHING_CALLS = 64


class ProcessExited(RuntimeError):
    """A child process ended before it answered; the message ends with the tail of its log."""


def poll_until(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.2) -> T:
    """The one bounded wait of the project: call `check` every `interval` seconds until it returns something
    other than None, and return that; TimeoutError naming `what` after `timeout` seconds. `check` raises
    to stop early (a child that exited, an answer that will not change)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() + interval > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        time.sleep(interval)


def wait_until_ready(
    url: str,
    timeout: float,
    *,
    body: dict | None = None,
    process: subprocess.Popen | None = None,
    log_path: Path | None = None,
    interval: float = 0.2,
) -> Any:
    """Request `url` (GET, or POST `body` as JSON) until it answers 2xx, and return the decoded JSON answer
    (None when not JSON). Bounded by `timeout` seconds.

    Retried: refused connections, timeouts and 5xx (a server that is still loading). Not retried: a 4xx
    (a wrong model name does not fix itself), raised at once as RuntimeError. When `process` exits
    first, raises ProcessExited with the end of `log_path`; when time runs out, TimeoutError.
    """
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    deadline = time.monotonic() + timeout
    last = ["no answer yet"]

    def answered(client: httpx.Client) -> tuple[Any] | None:
        if process is not None and process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path and log_path.exists() else ""
            raise ProcessExited(f"exited with status {process.returncode} before answering {url}:\n{tail}")
        try:
            answer = client.request(
                "GET" if data is None else "POST",
                url,
                content=data,
                headers=headers,
                timeout=max(0.1, min(10.0, deadline - time.monotonic())),
            )
        except httpx.HTTPError as exc:  # refused, reset, timed out
            last[0] = f"{type(exc).__name__}: {exc}"
            return None
        if answer.status_code >= 500:
            last[0] = f"HTTP {answer.status_code}"
            return None
        if answer.status_code >= 400:
            raise RuntimeError(f"{url} answered HTTP {answer.status_code}: {answer.text[:300]}")
        try:
            return (answer.json(),)
        except ValueError:
            return (None,)

    with httpx.Client(trust_env=False, follow_redirects=True) as client:  # loopback: never through a proxy
        try:
            return poll_until(lambda: answered(client), timeout, f"{url} did not answer", interval)[0]
        except TimeoutError as exc:
            raise TimeoutError(f"{exc} (last: {last[0]})") from None


def wait_until_engine_answers(engine: RunningEngine, timeout: float) -> None:
    """A one-token chat completion answers: the model is loaded, not just the HTTP port open."""
    ping = {
        "model": engine.model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
        "temperature": 0,
    }
    wait_until_ready(
        engine.base_url + "/chat/completions",
        timeout,
        body=ping,
        process=engine.process,
        log_path=engine.log_path,
        interval=0.5,
    )


@contextlib.contextmanager
def serve_in_thread(
    app: Any, port: int, host: str = "127.0.0.1", timeout: float = 30.0, **config: Any
) -> Iterator[str]:
    """An ASGI app on a real uvicorn in a background thread of this process (stand-in engines, replay
    servers, test servers); yields `http://host:port` once uvicorn has started, stops it after the block."""
    import uvicorn  # the serve extra's; only callers that serve import it

    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, **{"log_level": "warning", **config}))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool | None:
        if not thread.is_alive():
            raise RuntimeError(f"uvicorn on {host}:{port} stopped before it started")
        return True if server.started else None

    try:
        poll_until(started, timeout, f"uvicorn on {host}:{port} did not start", interval=0.02)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) arriving inside the block is raised when the block ends. Around `Popen`: an
    interrupt raised inside it, after the fork, would leave a child that nobody knows to stop."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):  # SIGINT ignored or handled
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            raise KeyboardInterrupt


GENTLY = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)
# `transformers serve` keeps nothing to save. Its uvicorn shuts down the same on either signal, then raises it
# again: SIGINT as a KeyboardInterrupt, after which the interpreter garbage-collects torch and transformers on the
# way out (2.5-3 s), SIGTERM as the default action, which ends the process there (~0.6 s; a tiny model, 2026-11-29).
AT_ONCE = (signal.SIGTERM, signal.SIGKILL)


def stop(process: subprocess.Popen, grace: float = 10.0, signals: Sequence[int] = GENTLY) -> None:
    """Stop a child and, when it leads its own process group (`start_new_session=True`), the whole group.

    By default SIGINT first (uvicorn and trainers shut down cleanly on it), then SIGTERM after `grace` seconds:
    uvicorn takes a second signal as "exit now" instead of waiting for requests in flight, which a
    CPU engine still generating abandoned requests would otherwise finish first (issue 15: it
    "ignored SIGTERM"). SIGKILL after another `grace`. Every wait is bounded. `signals=AT_ONCE` skips SIGINT, for a
    child with nothing to save.
    """
    group = _own_group(process)
    for sig in signals:
        if process.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig) if group else process.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    if group:  # the group may outlive its leader (a grandchild still shutting down)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


def _own_group(process: subprocess.Popen) -> bool:
    try:
        return os.getpgid(process.pid) == process.pid
    except (ProcessLookupError, PermissionError):  # already reaped
        return False


@contextlib.contextmanager
def transformers_serve(
    model_dir: str | os.PathLike,
    port: int | None = None,
    log_path: str | os.PathLike | None = None,
    timeout: float = 180.0,
    extra_args: Sequence[str] = (),
) -> Iterator[RunningEngine]:
    """`transformers serve MODEL_DIR --device cpu` on 127.0.0.1, ready to answer when the block starts."""
    model = str(Path(model_dir).resolve())
    port = port or free_port()
    log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")[1])
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # `GET /v1/models` answers 500 unless the hub cache folder exists; give it a private one, removed with the server
    # (the suite starts a few dozen).
    hub_cache = None if "HF_HUB_CACHE" in env else tempfile.TemporaryDirectory(prefix="mirrorapi-hf-")
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = hub_cache.name
    cli = Path(sys.executable).parent / "transformers"
    command = [str(cli), "serve", model, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), *extra_args]
    process = None
    try:
        with interrupts_deferred(), open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        engine = RunningEngine(f"http://127.0.0.1:{port}/v1", model, process, log_path)
        try:
            wait_until_engine_answers(engine, timeout)
        except ProcessExited as exc:
            raise ProcessExited(f"transformers serve {exc}") from None
        yield engine
    finally:
        if process is not None:
            stop(process, signals=AT_ONCE)
        if hub_cache is not None:
            hub_cache.cleanup()


def llama_cpp_available() -> bool:
    """Whether this interpreter has llama.cpp's server (`pip install -e ".[cpu-engine]"`, `make engine`)."""
    return importlib.util.find_spec("llama_cpp") is not None and importlib.util.find_spec("sse_starlette") is not None


def llama_cpp_command(
    gguf_path: str | os.PathLike, model: str, port: int, extra_args: Sequence[str] = ()
) -> list[str]:
    """The command line of llama.cpp's server for one GGUF, answering requests whose `model` is `model`
    (`mirrorapi.llama_cpp_engine`: llama-cpp-python's server taking OpenAI's `response_format`, with our
    defaults: 127.0.0.1, all cores, one request at a time without cutting the one in progress)."""
    return [
        sys.executable,
        "-m",
        "mirrorapi.llama_cpp_engine",
        "--model",
        str(gguf_path),
        "--model_alias",
        model,
        "--port",
        str(port),
        *extra_args,
    ]


@contextlib.contextmanager
def llama_cpp_serve(
    gguf_path: str | os.PathLike,
    model: str | None = None,
    port: int | None = None,
    log_path: str | os.PathLike | None = None,
    timeout: float = 120.0,
    extra_args: Sequence[str] = (),
) -> Iterator[RunningEngine]:
    """llama.cpp's server on `gguf_path` on 127.0.0.1, ready to answer when the block starts. `model` is the
    name clients send (default: the GGUF's absolute path)."""
    model = model or str(Path(gguf_path).resolve())
    port = port or free_port()
    log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="llama-cpp-", suffix=".log")[1])
    command = llama_cpp_command(gguf_path, model, port, extra_args)
    process = None
    try:
        with interrupts_deferred(), open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        engine = RunningEngine(f"http://127.0.0.1:{port}/v1", model, process, log_path, "llama.cpp server")
        try:
            wait_until_engine_answers(engine, timeout)
        except ProcessExited as exc:
            raise ProcessExited(f"llama.cpp server {exc}") from None
        yield engine
    finally:
        if process is not None:
            stop(process)


@contextlib.contextmanager
def cpu_engine_serve(
    model_dir: str | os.PathLike, log_path: str | os.PathLike | None = None, timeout: float = 180.0
) -> Iterator[RunningEngine]:
    """The CPU engine scripts/serve_engine_cpu.sh starts, on `model_dir`: llama.cpp's server when it is installed
    (`make engine`) and the folder has a GGUF (`gguf_for_serving`: a base model's own, a fine-tune of one
    exported), else `transformers serve` (e.g. the tiny test model). Clients send the folder's absolute path
    either way."""
    gguf = None
    if llama_cpp_available():
        with contextlib.suppress(GGUFExportError):
            gguf = gguf_for_serving(model_dir)
    if gguf is None:
        with transformers_serve(model_dir, log_path=log_path, timeout=timeout) as engine:
            yield engine
    else:
        with llama_cpp_serve(gguf, str(Path(model_dir).resolve()), log_path=log_path, timeout=timeout) as engine:
            yield engine


def vllm_available() -> str | None:
    """None when vLLM can be started (`make vllm`, or a GPU host's), else why not."""
    try:
        installed_build(vllm_python())
    except VllmNotInstalled as exc:
        return str(exc)
    return None


@contextlib.contextmanager
def vllm_serve(
    model_dir: str | os.PathLike,
    port: int | None = None,
    log_path: str | os.PathLike | None = None,
    timeout: float = 600.0,
    lora: str | os.PathLike | None = None,
    extra_args: Sequence[str] = (),
    dtype: str = "bfloat16",
    all_cores: bool = False,
) -> Iterator[RunningEngine]:
    """vLLM's server on `model_dir` (with `lora`: that adapter on it) on 127.0.0.1, ready to answer when the block
    starts; clients send the folder's absolute path (the adapter's). Start-up takes about 30 s on 2 cores.
    `dtype`, `all_cores`: `python -m mirrorapi.vllm_engine --dtype, --all-cores`."""
    python = vllm_python()
    cpu = installed_build(python) == "cpu"
    model, adapter = os.path.abspath(model_dir), os.path.abspath(lora) if lora else None
    port = port or free_port()
    log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="vllm-", suffix=".log")[1])
    command = vllm_command(python, model, port, cpu, adapter, extra_args, dtype)
    process = None
    try:
        with interrupts_deferred(), open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=vllm_environment(cpu, all_cores),
                start_new_session=True,
            )
        engine = RunningEngine(
            f"http://127.0.0.1:{port}/v1", adapter or model, process, log_path, "vLLM", BATCHING_CALLS
        )
        try:
            wait_until_engine_answers(engine, timeout)
        except ProcessExited as exc:
            raise ProcessExited(f"vLLM {exc}") from None
        yield engine
    finally:
        if process is not None:
            stop(process)
