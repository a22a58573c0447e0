"""`python serving/main_mirrorapi.py --config FILE` and `mirrorapi serve` as real processes."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from harness.processes import free_port, wait_until_ready
from mirrorapi.serving.cache import ResponseCache

REPO = Path(__file__).resolve().parents[2]


def start(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def wait_healthy(url: str, process: subprocess.Popen, log: Path, timeout: float = 60) -> dict:
    """/health once the server answers (/live); no engine listens here, so /health itself is a 503."""
    wait_until_ready(url + "/live", timeout, process=process, log_path=log)
    health = httpx.get(url + "/health", timeout=10)
    assert health.status_code == 503
    return health.json()


def stop(process: subprocess.Popen) -> int:
    process.send_signal(signal.SIGINT)
    return process.wait(30)


def test_server_process_imports_a_stabletoolbench_cache_once(stb_cache, sample_tools, agent, real_pairs, tmp_path):
    folder, written = stb_cache
    port = free_port()
    config = tmp_path / "server.yml"
    config.write_text(
        json.dumps(
            {  # JSON is YAML
                "tools_folder": str(sample_tools),
                "cache_folder": str(folder),
                "cache_path": "cache.sqlite",
                "api_base": f"http://127.0.0.1:{free_port()}/v1",
                "port": port,
            }
        )
    )
    url = f"http://127.0.0.1:{port}"
    pair = next(p for p in real_pairs if p["source"] == "tau-bench")
    body = agent(pair["category"], pair["tool_name"], pair["api_name"], pair["tool_input"])

    log = tmp_path / "first.log"
    server = start([sys.executable, "serving/main_mirrorapi.py", "--config", str(config)], log)
    try:
        health = wait_healthy(url, server, log)
        assert health["status"] == "unavailable" and health["engine"][0]["reachable"] is False  # started anyway
        entries = health["cache"]["entries"]
        assert entries > 0
        assert (
            httpx.post(url + "/virtual", json=body).json()
            == written[(pair["category"], pair["tool_name"], pair["api_name"], str(pair["tool_input"]))]
        )
    finally:
        assert stop(server) == 0
    assert "imported " in log.read_text()

    log = tmp_path / "second.log"
    server = start([sys.executable, "-m", "mirrorapi.cli", "serve", "--config", str(config)], log)
    try:
        assert wait_healthy(url, server, log)["cache"]["entries"] == entries
    finally:
        assert stop(server) == 0
    assert "was imported before and has not changed: not imported again" in log.read_text()
    stats = ResponseCache(tmp_path / "cache.sqlite").stats()  # relative to the config file's folder
    assert stats["hits"] == 1 and len(stats["imports"]) == 1
