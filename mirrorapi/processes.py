"""Start and stop local processes the loop needs: `transformers serve` as the CPU engine.

Used by the tests, the demo and `scripts/serve_engine_cpu.sh`-style launches. Everything binds to
127.0.0.1 on a free port, waits with a bounded loop, and is stopped on exit (also on errors).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class RunningEngine:
    base_url: str  # ends in /v1, what an OpenAI client and our `api_base` take
    model: str  # the `model` field requests must carry (`transformers serve`: the folder path)
    process: subprocess.Popen
    log_path: Path


def wait_until_answers(base_url: str, model: str, timeout: float, process: subprocess.Popen | None = None,
                       log_path: Path | None = None) -> None:
    """Poll with a one-token chat completion until the engine answers (bounded by `timeout`)."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="EMPTY", max_retries=0, timeout=10)
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:] if log_path and log_path.exists() else ""
            raise RuntimeError(f"engine exited with code {process.returncode} before answering:\n{tail}")
        try:
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "ping"}],
                                           max_tokens=1, temperature=0)
            return
        except (openai.APIConnectionError, openai.APITimeoutError, openai.InternalServerError) as exc:
            last = exc
            time.sleep(0.5)
    raise TimeoutError(f"engine at {base_url} did not answer within {timeout:g} s (last error: {last})")


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) arriving inside the block is raised when the block ends. Around `Popen`: an
    interrupt raised inside it, after the fork, would leave a child that nobody knows to stop."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):  # SIGINT ignored or handled
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


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGINT)  # uvicorn shuts down cleanly on SIGINT
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(grace)


@contextlib.contextmanager
def transformers_serve(model_dir: str | os.PathLike, port: int | None = None, log_path: str | os.PathLike | None = None,
                       timeout: float = 180.0, extra_args: list[str] = ()) -> Iterator[RunningEngine]:
    """`transformers serve MODEL_DIR --device cpu` on 127.0.0.1, ready to answer when the block starts."""
    model = str(Path(model_dir).resolve())
    port = port or free_port()
    log_path = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="transformers-serve-", suffix=".log")[1])
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    # `GET /v1/models` answers 500 unless the hub cache folder exists; give it a private one.
    env.setdefault("HF_HUB_CACHE", tempfile.mkdtemp(prefix="mirrorapi-hf-"))
    cli = Path(sys.executable).parent / "transformers"
    command = [str(cli), "serve", model, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port), *extra_args]
    process = None
    try:
        with interrupts_deferred(), open(log_path, "wb") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        engine = RunningEngine(f"http://127.0.0.1:{port}/v1", model, process, log_path)
        wait_until_answers(engine.base_url, model, timeout, process, log_path)
        yield engine
    finally:
        if process is not None:
            stop(process)
