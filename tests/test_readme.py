"""The README as a newcomer follows it: one way to start a CPU engine, clients that send the model
name that engine serves, no placeholder paths, and that name accepted by a real engine started
through the script (`transformers serve` is pinned to the exact string it was started with)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest

from mirrorapi.processes import RunningEngine, free_port, stop, wait_until_engine_answers

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "serve_engine_cpu.sh"


# How a command line of the README starts (its other code blocks are diagrams and sample output).
COMMAND = re.compile(r"(\.venv/bin/|scripts/|make |curl |export |rm |accelerate |vllm |pip |python |transformers )")


PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def readme_commands() -> list[str]:
    """Every command of the README's and docs pages' CPU code blocks (```sh, not ```sh gpu), continuation
    lines joined, comments dropped."""
    commands = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"^```sh\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            for command in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+#\s.*$", "", command).strip()
                if COMMAND.match(command):
                    commands.append(command)
    return commands


def test_every_client_sends_the_name_its_cpu_engine_serves():
    started: dict[str, str] = {}  # port -> the folder the script was started on
    clients = 0
    for command in readme_commands():
        assert not re.match(r"(\S*/)?transformers serve", command), f"not through the script: {command}"
        if engine := re.match(r"scripts/serve_engine_cpu\.sh (\S+) (\d+)", command):
            started[engine.group(2)] = engine.group(1)
            continue
        model = re.search(r'--model "\$PWD/([^"]+)"|"model": "\'"\$PWD"\'/([^"]+)"', command)
        if not model:
            continue
        clients += 1
        folder = model.group(1) or model.group(2)
        port = re.search(r"(?:--base-url|--api-base) http://127\.0\.0\.1:(\d+)|127\.0\.0\.1:(\d+)/v1/chat", command)
        # The virtual server's own `api_base` is the config's 12345 unless given.
        port = (port.group(1) or port.group(2)) if port else "12345"
        assert started.get(port) == folder, f"{command}\n sends $PWD/{folder} to port {port}, which serves " \
                                            f"{started.get(port, 'nothing started before it')}"
    assert clients >= 5  # server, FAC, judge agreement, fidelity server, the training section's check


def test_no_placeholder_paths():
    for command in readme_commands():
        for placeholder in ("HELDOUT.jsonl", "TRAIN.jsonl", "../StableToolBench", "LOCAL_MODEL_DIR", "train_sft.json"):
            assert placeholder not in command, command


def test_inputs_exist_or_are_built_before_use():
    """A runs/ path a command reads is under runs/demo/latest (whose names tests/test_demo.py checks
    after a real demo run) or was written by an earlier README command."""
    written: set[str] = set()
    for command in readme_commands():
        if command.startswith("rm "):
            continue
        outputs = set(re.findall(r"(?:--out|--output_dir|--cache-path|cache import \S+ --cache|cache export) "
                                 r"(runs/[\w./-]+)", command))
        for path in set(re.findall(r"(?<![\w/$])runs/[\w./-]+", command)) - outputs:
            assert path.startswith("runs/demo/latest/") or any(path.startswith(w) or w.startswith(path + "/")
                                                                for w in written), \
                f"{path} is read before any command writes it: {command}"
        written |= outputs
        if "training/configs/tiny_cpu.yaml" in command and "--output_dir" not in command:
            written.add("runs/tiny-simulator")  # the recipe's own output_dir


def readme_demo_paths() -> set[str]:
    """The names under runs/demo/latest/ that README commands use."""
    return {re.match(r"runs/demo/latest/([\w.-]+)", p).group(1) for c in readme_commands()
            for p in re.findall(r"runs/demo/latest/[\w.-]+", c)}


@pytest.mark.slow
def test_the_script_serves_the_name_clients_are_told_to_send(tiny_model_dir, tmp_path):
    """The script started on a relative path through a link (as `runs/demo/latest/simulator` is) answers
    `$PWD/<that path>`; another spelling of the same folder is refused, which is why the README has one."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "latest").symlink_to(tiny_model_dir.parent)
    relative = f"runs/latest/{tiny_model_dir.name}"
    port, log = free_port(), tmp_path / "engine.log"
    env = {**os.environ, "TRANSFORMERS": str(Path(sys.executable).parent / "transformers")}
    with open(log, "wb") as out:
        process = subprocess.Popen([str(SCRIPT), relative, str(port)], cwd=tmp_path, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        name = f"{tmp_path}/{relative}"  # what "$PWD/runs/latest/model" expands to in that folder
        wait_until_engine_answers(RunningEngine(f"http://127.0.0.1:{port}/v1", name, process, log), 180)
        assert f"model name (clients' --model): {name}" in log.read_text()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=60)
        answer = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hello"}],
                                                max_tokens=4)
        assert answer.choices[0].message.content is not None
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model=str(tiny_model_dir.resolve()), max_tokens=4,
                                           messages=[{"role": "user", "content": "hello"}])
        assert "pinned" in refused.value.response.text
    finally:
        stop(process)
