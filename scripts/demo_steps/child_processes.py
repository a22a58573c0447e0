"""The demo's child processes (commands run to completion with a log file, the virtual server) and their environment.

Every child starts in its own session (a terminal's Ctrl-C reaches the demo only, which then stops
its children in order; an interrupt during a `Popen` is deferred until the child is known, see
`harness.processes.interrupts_deferred`) and is stopped as a process group: `accelerate launch` runs the
training in a grandchild that must not outlive it. Waits are bounded; a child that exits early is
reported with the end of its log.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from harness.processes import ProcessExited, interrupts_deferred, stop, wait_until_ready

REPO = Path(__file__).resolve().parents[2]


def without_server_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment less the server's settings (`MIRRORAPI_<KEY>`, `MIRRORAPI_CONFIG`): the demo's servers take
    theirs from the config it writes, where a user's exported MIRRORAPI_PORT would move one off the port the demo
    waits on."""
    from mirrorapi.command_line import settings_fields
    from mirrorapi.serving.config import CONFIG_ENV, ENV_PREFIX, ServerSettings

    settings = {ENV_PREFIX + name.upper() for name in settings_fields(ServerSettings)} | {CONFIG_ENV}
    return {k: v for k, v in environ.items() if k not in settings}


def child_environment(work_dir: Path) -> dict[str, str]:
    """Settings for the demo and every process it starts: caches inside the work folder (nothing in the
    user's home folder), no model hub, no telemetry, no progress bars in the logs."""
    cache = work_dir.resolve() / "cache"
    folders = {
        "HF_HOME": cache / "huggingface",
        "HF_HUB_CACHE": cache / "huggingface" / "hub",
        "XDG_CACHE_HOME": cache,
        "XDG_CONFIG_HOME": cache / "config",
        "MPLCONFIGDIR": cache / "matplotlib",
        "TORCH_HOME": cache / "torch",
    }
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        **{k: str(v) for k, v in folders.items()},
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }


def brief(message: str, tail: int = 8) -> str:
    """A failure's first line and the end of the log it quotes (the whole log is in the run's logs/)."""
    lines = message.rstrip().splitlines()
    return "\n".join(lines if len(lines) <= tail + 1 else [lines[0], "...", *lines[-tail:]])


@contextlib.contextmanager
def sigint_ignored():
    """While stopping children: a second Ctrl-C must not leave half of them running (each stop is bounded)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class StepFailed(Exception):
    """A step of the demo could not finish; the message says what failed and where its log is."""


def log_tail(path: Path, lines: int = 12) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_command(command: list[str], log_path: Path, on_line: Callable[[str], None] | None = None) -> None:
    """Run `command` in the repository root until it exits; its output goes to `log_path`, line by
    line to `on_line`. Raises StepFailed on a non-zero exit status; stops it when interrupted."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + " ".join(command) + "\n")
        log.flush()
        process = None
        try:
            with interrupts_deferred():  # raised here, inside the `try`, once `process` is known
                process = subprocess.Popen(
                    command,
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                    start_new_session=True,
                )
            for line in process.stdout:
                log.write(line)
                log.flush()
                if on_line is not None:
                    on_line(line.rstrip("\n"))
            process.wait()
        finally:
            if process is not None:
                stop(process)
                process.stdout.close()
    if process.returncode != 0:
        raise StepFailed(
            f"`{' '.join(command[:4])} ...` exited with status {process.returncode}; its log "
            f"{log_path} ends with:\n{log_tail(log_path)}"
        )


@contextlib.contextmanager
def virtual_server(config: Path, log_path: Path, timeout: float = 60.0) -> Iterator[str]:
    """`python serving/main_mirrorapi.py --config CONFIG` until the block ends; yields its base URL once
    `/live` answers (the port is the config's; `/health` also asks the engine: 503 while none serves the model)."""
    import yaml

    port = yaml.safe_load(config.read_text(encoding="utf-8"))["port"]
    url = f"http://127.0.0.1:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "serving/main_mirrorapi.py", "--config", str(config)]
    process = None
    try:
        with interrupts_deferred(), open(log_path, "wb") as log:  # raised inside the `try`, `process` known
            process = subprocess.Popen(
                command,
                cwd=REPO,
                env=without_server_settings(os.environ),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until_ready(url + "/live", timeout, process=process, log_path=log_path)
        except ProcessExited:
            raise StepFailed(
                f"the virtual server exited with status {process.returncode}; its log {log_path} "
                f"ends with:\n{log_tail(log_path)}"
            ) from None
        except TimeoutError:
            raise StepFailed(f"the virtual server did not answer in {timeout:g} s; see {log_path}") from None
        yield url
    finally:
        if process is not None:
            stop(process)
