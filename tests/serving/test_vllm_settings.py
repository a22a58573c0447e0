"""How `mirrorapi.vllm_engine` starts vLLM: the command and environment it builds (no vLLM needed to check them;
tests/serving/test_vllm.py starts the real server where vLLM is installed)."""

import os
from pathlib import Path

import pytest

from mirrorapi.vllm_engine import vllm_command, vllm_environment


def _cores(bind: str) -> set[int]:
    """VLLM_CPU_OMP_THREADS_BIND's list of cores, as vLLM's docs write it ("0-31", "0,2,5")."""
    cores: set[int] = set()
    for part in bind.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return cores


def test_all_cores_binds_vllm_s_worker_to_every_core_this_process_may_use(monkeypatch):
    for name in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_KVCACHE_SPACE"):
        monkeypatch.delenv(name, raising=False)
    every = vllm_environment(cpu=True, all_cores=True)
    assert _cores(every["VLLM_CPU_OMP_THREADS_BIND"]) == os.sched_getaffinity(0)
    assert every["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and every["HF_HUB_OFFLINE"] == "1"
    # By default vLLM's own binding (one core left to its API server); a GPU build ignores the CPU variables.
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_environment(cpu=True)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_environment(cpu=False, all_cores=True)
    # What the user set wins.
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert vllm_environment(cpu=True, all_cores=True)["VLLM_CPU_OMP_THREADS_BIND"] == "0"


def test_dtype_is_passed_once_and_an_unknown_one_refused():
    command = vllm_command(Path("python"), "/m", 1234, cpu=True, dtype="float32")
    assert command.count("--dtype") == 1 and command[command.index("--dtype") + 1] == "float32"
    default = vllm_command(Path("python"), "/m", 1234, cpu=True)
    assert default[default.index("--dtype") + 1] == "bfloat16"
    with pytest.raises(ValueError, match="float16"):
        vllm_command(Path("python"), "/m", 1234, cpu=True, dtype="float16")


@pytest.mark.parametrize(
    "given, passed",
    [
        ([], ["--port", "12345"]),
        (["8000"], ["--port", "8000"]),
        (["--all-cores"], ["--port", "12345", "--all-cores"]),  # PORT is optional before the script's own flags
        (["9000", "--dtype", "float32", "--", "--max-num-seqs", "4"], ["--port", "9000", "--dtype", "float32", "--"]),
        (["--", "--max-num-seqs", "4"], ["--port", "12345", "--"]),
    ],
)
def test_the_vllm_script_takes_its_usage_line_s_arguments(tmp_path, given, passed):
    # `MODEL_DIR [PORT] [--all-cores] [--dtype float32] [-- VLLM_FLAGS]`: PYTHON stands in for the engine's
    # interpreter (vLLM itself is not what is tested), printing what the script hands it.
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    echo = tmp_path / "python"
    echo.write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
    echo.chmod(0o755)
    model = tmp_path / "model"
    model.mkdir()
    done = subprocess.run(
        [str(repo / "scripts" / "serve_engine_vllm.sh"), str(model), *given],
        env={"PATH": "/usr/bin:/bin", "PYTHON": str(echo)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    vllm_flags = given[given.index("--") + 1 :] if "--" in given else []
    assert done.stdout.splitlines() == ["-m", "mirrorapi.vllm_engine", str(model), *passed, *vllm_flags]
