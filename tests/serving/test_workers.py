"""Several server processes on one cache (issue 21 §3): `--workers N` (uvicorn's workers) as a real process,
and the lease that makes an identical miss arriving at two of them one simulation."""

import concurrent.futures
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.fake_engines import StubEngine
from harness.processes import free_port, poll_until, wait_until_ready

REPO = Path(__file__).resolve().parents[2]
README_REQUEST = {
    "category": "Artificial_Intelligence_Machine_Learning",
    "tool_name": "TTSKraken",
    "api_name": "List Languages",
    "tool_input": "{}",
    "strip": "truncate",
    "toolbench_key": "",
}


def test_an_identical_miss_at_two_servers_on_one_cache_is_simulated_once(serve, tmp_path):
    """Two servers (as two workers are) on one SQLite file get the same new call at the same time: the first
    leases it in the store and asks the engine (an answer takes 1 s); the other waits for the stored answer."""
    body = {**README_REQUEST, "tool_input": '{"language": "same for both"}'}
    settings = dict(workers=2, cache_path=str(tmp_path / "shared.sqlite"))
    with (
        StubEngine(delay=1.0) as engine,
        serve(api_base=[engine.url], **settings) as first,
        serve(api_base=[engine.url], **settings) as second,
        concurrent.futures.ThreadPoolExecutor(2) as pool,
    ):
        answers = list(pool.map(lambda server: server.virtual(body).json(), (first, second)))
        calls = sum(s.metric("mirrorapi_engine_calls_total", result="ok") for s in (first, second))
        coalesced = sum(s.metric("mirrorapi_coalesced_requests_total") for s in (first, second))
    assert answers[0] == answers[1] and answers[0]["error"] == ""
    assert (calls, coalesced) == (1, 1)


def test_workers_share_one_port_cache_request_log_and_metrics_and_a_killed_one_is_replaced(sample_tools, tmp_path):
    log_file, server_log = tmp_path / "requests.jsonl", tmp_path / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # The engine lists the model: otherwise each worker's start-up check asks it for a one-token completion, which
    # the in-flight limit does not hold back, and a worker still starting while the misses come counts one more.
    with StubEngine(delay=0.2, model="stub") as engine, open(server_log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "serving/main_mirrorapi.py",
                "--tools-folder",
                str(sample_tools),
                "--workers",
                "2",
                "--cache-path",
                str(tmp_path / "c.sqlite"),
                "--api-base",
                engine.url,
                "--model",
                "stub",
                "--port",
                str(port),
                "--log-file",
                str(log_file),
                "--engine-max-in-flight",  # the replica's limit, which each of the 2 workers takes half of
                "4",
                "--api-key",  # the stub takes any: a secret the workers' environment must not hold
                "ENGINE-SECRET-123",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        try:
            wait_until_ready(url + "/live", 120, process=process, log_path=server_log)
            workers = _workers(process.pid)
            environments = [Path(f"/proc/{pid}/environ").read_bytes() for pid in workers]

            def call(i: int) -> dict:
                with httpx.Client(timeout=60) as client:  # a connection each: the kernel spreads them over the workers
                    body = {**README_REQUEST, "tool_input": json.dumps({"call": i})}
                    return client.post(url + "/virtual", json=body).json()

            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                misses = list(pool.map(call, range(16)))
                hits = list(pool.map(call, range(16)))  # now in the cache, whichever worker stored them
            metrics = httpx.get(url + "/metrics", timeout=10).text
            os.kill(workers[0], signal.SIGKILL)  # a worker dies: uvicorn starts another, the others go on serving

            def replaced_workers() -> list[int] | None:
                now = _workers(process.pid)
                return now if workers[0] not in now and len(now) == 2 else None

            replaced = poll_until(replaced_workers, 120, "the killed worker was not replaced")
            after = call(0)
        finally:
            process.send_signal(signal.SIGTERM)
            status = process.wait(60)
    assert len(workers) == 2  # uvicorn's worker processes, children of the one that was started
    # Their settings came in a file only this user may read, not in the environment every child inherits.
    assert all(b"ENGINE-SECRET-123" not in environment for environment in environments)
    assert 0 < engine.most_at_once <= 4  # 16 misses at once: within the replica's limit, not 4 per worker
    assert len(replaced) == 2 and after == misses[0]  # uvicorn started another; the cache still answers
    assert hits == misses and all(answer["error"] == "" for answer in misses)
    # Any worker's /metrics counts the requests of all of them.
    assert 'mirrorapi_requests_total{outcome="simulated"} 16.0' in metrics
    assert 'mirrorapi_requests_total{outcome="hit"} 16.0' in metrics
    lines = [json.loads(line) for line in log_file.read_text().splitlines()]  # whole lines only
    assert (
        sorted(line["outcome"] for line in lines) == ["hit"] * 17 + ["simulated"] * 16
    )  # with the one after the kill
    assert status == 0
    folder = re.search(r"metrics summed over them in (\S+)\)", server_log.read_text()).group(1)
    assert not Path(folder).exists()  # the metrics folder of the run is removed when it ends


def test_workers_die_with_their_master_and_the_server_starts_again(sample_tools, tmp_path):
    """kill -9 of the process `--workers 2` started: its workers stop within seconds (they went on serving, and
    a new server could not bind the port), and the same command starts again."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable,
        "serving/main_mirrorapi.py",
        "--tools-folder",
        str(sample_tools),
        "--workers",
        "2",
        "--cache-path",
        str(tmp_path / "c.sqlite"),
        "--port",
        str(port),
        "--mode",
        "replay",
    ]
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    # kill -9 leaves the run's metrics folder behind (nothing can remove it): in this test's folder, not /tmp
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    with open(logs[0], "wb") as out:
        first = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        try:
            wait_until_ready(url + "/live", 120, process=first, log_path=logs[0])
            workers = poll_until(
                lambda: _workers(first.pid) if len(_workers(first.pid)) == 2 else None, 60, "two workers"
            )
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)

            def gone() -> bool | None:
                return (
                    all(
                        not Path(f"/proc/{pid}").exists()
                        or Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
                        for pid in workers
                    )
                    or None
                )

            poll_until(gone, 30, f"the workers {workers} of the killed master still run")
        finally:
            for pid in workers if "workers" in locals() else []:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    with open(logs[1], "wb") as out:
        second = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            wait_until_ready(url + "/live", 120, process=second, log_path=logs[1])
            assert httpx.get(url + "/live", timeout=10).status_code == 200
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(60) == 0
    assert "address already in use" not in logs[1].read_text()


def _workers(pid: int) -> list[int]:
    """The live worker processes of the uvicorn parent `pid`: children started by multiprocessing's spawn (not its
    resource tracker), not yet exited."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            try:
                alive = Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
                spawned = b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:  # gone meanwhile
                continue
            if alive and spawned:
                found.append(int(child))
    return found


def test_a_worker_that_cannot_start_stops_the_server_instead_of_being_restarted_for_ever(
    sample_tools, tmp_path, monkeypatch
):
    """What the master's check did not meet (the shared store gone since) fails a worker at start; uvicorn restarts
    a worker that dies, without end, the port bound and nothing answering. The worker says why in the run's folder
    (the master then stops with that one line) and stops its master. In this process: the master is a stand-in
    process (a real one would be uvicorn's), and the worker's process-wide effects (its logging, the thread that
    ends it with its master) are left out."""
    from mirrorapi.serving import app as app_module
    from mirrorapi.serving.cache import CacheError
    from mirrorapi.serving.config import load_settings

    unreachable = f"postgresql://postgres@127.0.0.1:{free_port()}/cache"
    settings = load_settings(overrides={"tools_folder": [str(sample_tools)], "cache_url": unreachable}, environ={})
    master = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / app_module.WORKER_SETTINGS_FILE).write_text(settings.model_dump_json())
        monkeypatch.setenv(app_module.WORKER_SETTINGS_ENV, str(tmp_path / app_module.WORKER_SETTINGS_FILE))
        monkeypatch.setenv(app_module.MASTER_ENV, str(master.pid))
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        monkeypatch.setattr(app_module, "die_with_master", lambda pid: None)
        monkeypatch.setattr(app_module, "configure_logging", lambda settings: None)
        with pytest.raises(CacheError):
            app_module.worker_app()
        assert master.wait(timeout=10) == -signal.SIGTERM
        assert "CacheError" in (tmp_path / app_module.WORKER_FAILED_FILE).read_text()
    finally:
        master.kill()
        master.wait()
