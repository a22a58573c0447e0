"""Every command of the README and of docs/*.md runs as written in a fresh clone after `make demo`.

The commands are the lines of the pages' ```sh blocks (```sh gpu: GPU hosts; their vLLM engines are not started
here, everything else is checked the same way; ```text blocks are output). For each command: its program
resolves (a console script of the venv, an executable scripts/*.sh, a script file given to .venv/bin/python, a
make target, a system tool), it holds no placeholder, every path it reads exists by then (in the repository,
under runs/demo/latest/, whose names tests/test_demo.py checks after a real demo run, written by an earlier
command of the same page, or in ../shared when that is there), and its arguments pass the real parser of the
script or subcommand, which is called without running anything after it. CPU engines: one way to start them,
clients that send the model name the engine serves (`transformers serve` is pinned to the exact string it was
started with; the slow test below proves that against a real engine). Running the cheap commands for real
against a real demo's folder: tests/test_demo.py.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
import yaml

from harness.postgres_server import temporary_postgres
from harness.processes import RunningEngine, free_port, stop, wait_until_engine_answers

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "serve_engine_cpu.sh"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
VENV_BIN = Path(sys.executable).parent  # the venv the tests run in: `make venv`'s .venv
# OpenEnv's client venv (`make openenv-client`): its Python runs the scripts that drive episodes with openenv-core.
OPENENV_PYTHON = ".venv-openenv/bin/python"
SHARED = REPO.parent / "shared"

# Programs of a GPU host's vLLM environment (`.venv-vllm` with the official wheel), which a CPU machine does not have.
GPU_PROGRAMS = {".venv-vllm/bin/vllm", ".venv-vllm/bin/pip"}
ENGINE_SCRIPTS = re.compile(r"scripts/serve_engine_(?:cpu|vllm)\.sh (\S+) (\d+)")  # both serve "$PWD/<folder>"
SHELL_BUILTINS = {"export", "kill", "jobs", "wait", "cd"}
# Programs of the venv: written bare, they are not on the PATH `make venv` leaves (or are another Python's).
VENV_PROGRAMS = {"python", "python3", "pip", "mirrorapi", "accelerate", "transformers", "vllm", "pytest"}
# Flags whose value a command writes (a file or a folder), not reads.
OUTPUT_FLAGS = {
    "--out",
    "--output_dir",
    "--cache-path",
    "--keep",
    "--work-dir",
    "--work",
    "--models-dir",
    "--write-pairs",
}
# The repository's own top folders: a path under one of them must be in the clone.
REPO_FOLDERS = ("data", "training", "serving", "eval", "scripts", "bench", "tests", "docs", "mirrorapi", "harness")
# All-caps words that are values, not stand-ins: an API key value, file stems.
CAPS_VALUES = {"EMPTY", "README"}


@dataclass
class Command:
    page: str
    line: str  # as written, continuation lines joined, the comment dropped
    argv: list[str]  # the words after VAR=value prefixes, `&` dropped
    env: dict[str, str] = field(default_factory=dict)
    gpu: bool = False

    def __str__(self) -> str:
        return f"{self.page}: {self.line}"


def page_commands(page: Path) -> list[Command]:
    text = page.read_text(encoding="utf-8")
    commands = []
    for info, block in re.findall(r"^```sh( gpu)?\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        pending = ""
        for line in block.replace("\\\n", " ").splitlines():
            line = f"{pending}\n{line}" if pending else line
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # a quoted string goes on on the next line (a curl body)
                pending = line
                continue
            pending = ""
            if not words:
                continue
            env = {}
            while re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                key, value = words.pop(0).split("=", 1)
                env[key] = value
            if words[-1] == "&":
                words.pop()
            line = re.sub(r"\s+#\s.*$", "", line).replace("\n", " ").strip()
            commands.append(Command(page.relative_to(REPO).as_posix(), line, words, env, gpu=bool(info)))
    return commands


def all_commands() -> list[Command]:
    return [command for page in PAGES for command in page_commands(page)]


def readme_commands() -> list[str]:
    """The command lines of every page's CPU blocks (tests/test_demo.py reads their runs/demo/latest names)."""
    return [command.line for command in all_commands() if not command.gpu]


def readme_demo_paths() -> set[str]:
    """The names under runs/demo/latest/ that the pages' commands use."""
    return {
        re.match(r"runs/demo/latest/([\w.-]+)", p).group(1)
        for c in readme_commands()
        for p in re.findall(r"runs/demo/latest/[\w.-]+", c)
    }


def test_the_pages_have_commands_and_the_readme_is_short():
    assert len(PAGES) >= 6 and all(page_commands(page) for page in PAGES)
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


# ------------------------------------------------------------------------------------------ programs
def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))


def extras() -> set[str]:
    import tomllib

    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def program_problem(command: Command) -> str | None:
    """Why the command's program would not run here, or None."""
    program, args = command.argv[0], command.argv[1:]
    if program == OPENENV_PYTHON:  # made by `make openenv-client`, which the Makefile's test target runs first
        return None if args and (REPO / args[0]).is_file() else f"{args[:1]} is not a script of the repository"
    if command.gpu and program in GPU_PROGRAMS:
        return None
    if program in ("python3", "/usr/bin/python3") and args[:2] == ["-m", "venv"]:
        return None  # a new environment, made by the machine's Python
    if program.startswith(".venv/bin/"):
        if not (VENV_BIN / program.removeprefix(".venv/bin/")).is_file():
            return f"{program} is not in the venv"
        if program == ".venv/bin/python":
            if args[:1] == ["-m"]:
                return None if importlib.util.find_spec(args[1]) else f"no module {args[1]}"
            if not args or not (REPO / args[0]).is_file():
                return f"{args[:1]} is not a script of the repository"
        if program == ".venv/bin/pip" and args[:2] == ["install", "-e"]:
            unknown = set(re.fullmatch(r"\.\[([\w,]+)\]", args[2]).group(1).split(",")) - extras()
            return f"unknown extras {unknown}" if unknown else None
        return None
    if program.startswith("scripts/"):
        path = REPO / program
        return None if path.is_file() and os.access(path, os.X_OK) else f"{program} is not an executable script"
    if program == "make":
        unknown = [a for a in args if "=" not in a and a not in make_targets()]
        return f"no make target {unknown}" if unknown else None
    if program in VENV_PROGRAMS:
        return f"a bare {program}: write .venv/bin/{program}"
    if program in SHELL_BUILTINS or shutil.which(program):
        return None
    return f"{program} is not on the PATH"


def test_every_program_resolves():
    problems = [f"{c}\n  {p}" for c in all_commands() if (p := program_problem(c))]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ placeholders
def placeholder_in(command: Command) -> str | None:
    if "..." in command.line or "…" in command.line:
        return "..."
    if re.search(r"<[\w |./-]+>|\[--", command.line):
        return "<...> or [--optional]"
    for word in command.argv[1:]:
        if "://" in word or word.startswith(("{", "$")) or ":" in word:  # URLs, JSON bodies, headers
            continue
        word = re.sub(r"^[A-Z_][A-Z0-9_]*=", "", word)  # a make variable: DEMO_ARGS=--quick
        for part in re.split(r"[/=,]", word.removeprefix("$PWD/")):
            stem = part.split(".")[0]
            if re.fullmatch(r"[A-Z][A-Z0-9_]+", stem) and stem not in CAPS_VALUES:
                return stem
    for name in re.findall(r"\$\{?(\w+)", command.line):
        if name != "PWD":
            return f"${name}"  # checked against the page's exports in test_no_placeholders
    return None


def test_no_placeholders():
    for page in PAGES:
        exported: set[str] = set()
        for command in page_commands(page):
            if command.argv[0] == "export":
                exported |= {word.split("=")[0] for word in command.argv[1:]}
            found = placeholder_in(command)
            if found and not (found.startswith("$") and found[1:] in exported):
                pytest.fail(f"{command}\n  holds the placeholder {found}")
            for name in ("HELDOUT.jsonl", "TRAIN.jsonl", "../StableToolBench", "LOCAL_MODEL_DIR", "train_sft.json"):
                assert name not in command.line, command


# ------------------------------------------------------------------------------------------ paths
def recipe(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text(encoding="utf-8"))


def recipe_outputs() -> set[str]:
    return {recipe(f"training/configs/{p.name}")["output_dir"] for p in (REPO / "training/configs").glob("*.yaml")}


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv[:-1] else None


def reads_and_writes(command: Command) -> tuple[set[str], set[str]]:
    """The paths a command reads and those it writes (relative to the repository root)."""
    argv = [word.removeprefix("$PWD/") for word in command.argv]
    writes = {argv[i + 1] for i, word in enumerate(argv[:-1]) if word in OUTPUT_FLAGS}
    if argv[:3] == [".venv/bin/mirrorapi", "cache", "import"]:
        writes.add(flag_value(argv, "--cache"))
    if argv[:3] == [".venv/bin/mirrorapi", "cache", "export"]:
        writes.add(argv[3])
    if config := flag_value(argv, "--config"):
        if config.startswith("training/configs/"):  # a recipe: it reads its model and data, writes output_dir
            keys = recipe(config)
            writes.add(flag_value(argv, "--output_dir") or keys["output_dir"])
            argv = argv + [
                flag_value(argv, "--model_name_or_path") or keys["model_name_or_path"],
                flag_value(argv, "--dataset_path") or keys["dataset_path"],
            ]
    if argv[0] == "rm":
        return set(), set()
    paths = {word for word in argv[1:] if re.match(rf"(runs|\.\./shared|{'|'.join(REPO_FOLDERS)})/", word)}
    return paths - writes, writes


def path_problem(path: str, written: set[str]) -> str | None:
    if path.startswith("runs/"):
        if path.startswith("runs/demo/latest/") or any(
            path == w or path.startswith(w + "/") or w.startswith(path + "/") for w in written
        ):
            return None
        if any(path == w or path.startswith(w + "/") for w in recipe_outputs()):
            return None  # a trained model: the output_dir of a training recipe (training.md)
        return "is read before any command of the page writes it"
    if path.startswith("../shared/"):
        if not SHARED.is_dir():
            return None
        return None if list(REPO.glob(path)) or (REPO / path).exists() else "is not in ../shared"
    return None if list(REPO.glob(path)) else "is not in the repository"


def test_inputs_exist_or_are_built_before_use():
    """A path a command reads is in the clone, in ../shared, under runs/demo/latest or written by an earlier
    command of the same page (or a training recipe's output_dir: a trained model)."""
    problems = []
    for page in PAGES:
        written: set[str] = set()
        for command in page_commands(page):
            reads, writes = reads_and_writes(command)
            problems += [
                f"{command}\n  {path} {why}" for path in sorted(reads) if (why := path_problem(path, written))
            ]
            written |= writes
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ flags
class _Parsed(Exception):
    """Raised by the outermost parse_known_args: the real parser accepted the arguments; nothing runs after."""

    def __init__(self, extras: list[str]):
        self.extras = extras


@contextlib.contextmanager
def parse_only():
    """argparse parsers parse as usual (an error exits with status 2), then raise _Parsed instead of returning."""
    original = argparse.ArgumentParser.parse_known_args
    depth = 0

    def parse_known_args(self, args=None, namespace=None):
        nonlocal depth
        depth += 1
        try:
            namespace, extras = original(self, args, namespace)
        finally:
            depth -= 1
        if depth == 0:  # not a subcommand's parser inside its parent's
            raise _Parsed(extras)
        return namespace, extras

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original


def parse_problem(target: str, args: list[str]) -> str | None:
    """Run the script (or `mirrorapi`) with `args` until its argument parser has accepted or refused them."""
    argv0 = str(REPO / target) if target.endswith(".py") else target
    saved_argv, err = sys.argv, io.StringIO()
    sys.argv = [argv0, *args]
    try:
        with parse_only(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if target == "mirrorapi":
                from mirrorapi.cli import main

                main(args)
            else:
                runpy.run_path(argv0, run_name="__main__")
    except _Parsed as parsed:
        after_dashes = args[args.index("--") + 1 :] if "--" in args else []
        unknown = [a for a in parsed.extras if a not in after_dashes and a != "--"]
        return f"unknown arguments {unknown}" if unknown else None
    except SystemExit as exit_:
        if exit_.code == 0 and "--help" in args:
            return None
        return f"exit {exit_.code}: {err.getvalue().strip()[-500:]}"
    finally:
        sys.argv = saved_argv
    return "the script ran past its argument parser without parsing"


def parse_targets(command: Command) -> list[tuple[str, list[str]]]:
    """(script or 'mirrorapi', its arguments) for each parser the command goes through."""
    program, args = command.argv[0], command.argv[1:]
    if program in (".venv/bin/python", OPENENV_PYTHON) and args[0].endswith(".py"):
        return [(args[0], args[1:])]
    if program == ".venv/bin/mirrorapi":
        return [("mirrorapi", args)]
    if program == ".venv/bin/accelerate" and args[0] == "launch":
        from accelerate.commands.launch import launch_command_parser

        with contextlib.redirect_stderr(io.StringIO()):
            launch = launch_command_parser().parse_args(args[1:])  # an unknown launch flag exits here
        return [(launch.training_script, launch.training_script_args)]
    return []


def test_every_flag_passes_the_real_parser(monkeypatch):
    monkeypatch.chdir(REPO)  # scripts read their recipe files relative to the root, as typed
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problems = []
    for command in all_commands():
        try:
            targets = parse_targets(command)
        except SystemExit:
            problems.append(f"{command}\n  accelerate launch refuses its flags")
            continue
        for target, args in targets:
            if problem := parse_problem(target, [a.replace("$PWD", str(REPO)) for a in args]):
                problems.append(f"{command}\n  {problem}")
    assert not problems, "\n".join(problems)


def test_python_blocks_compile_and_import_what_exists():
    """```python blocks import from this venv; ```python openenv blocks (a trainer's code: TRL and openenv-core) from
    this venv or OpenEnv's client venv, whichever has the package (all of those in one process: importing OpenEnv's
    client takes ~6 s)."""
    in_client_venv = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for info, block in re.findall(r"^```(python(?: openenv)?)\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            for node in ast.walk(ast.parse(block)):
                if not isinstance(node, ast.ImportFrom):
                    continue
                if info == "python openenv" and importlib.util.find_spec(node.module.split(".")[0]) is None:
                    in_client_venv.append(f"from {node.module} import {', '.join(alias.name for alias in node.names)}")
                    continue
                module = importlib.import_module(node.module)
                assert all(hasattr(module, alias.name) for alias in node.names), (page, node.module)
    if in_client_venv:
        done = subprocess.run(
            [str(REPO / OPENENV_PYTHON), "-c", "\n".join(in_client_venv)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (in_client_venv, done.stderr[-500:])


# ------------------------------------------------------------------------------------------ run for real
# Commands that start no engine and train nothing: tests/test_demo.py runs them against a real demo's folder.
CHEAP = re.compile(
    r"(cat |\.venv/bin/mirrorapi (tools|cache) |\.venv/bin/python data/build_|"
    r"\.venv/bin/python eval/apibank\.py --write-pairs |\S+ .*--help$)"
)


# The throwaway PostgreSQL a page starts in the background for the cache commands after it (docs/serving.md).
BACKGROUND_POSTGRES = re.compile(r"\.venv/bin/python -m harness\.postgres_server --port (\d+) &")


def cheap_commands() -> list[Command]:
    """Each distinct command once, where it first appears: the same line on several pages (a data build, `tools
    stats`) does the same thing each time."""
    first: dict[str, Command] = {}
    for command in all_commands():
        if not command.gpu and CHEAP.match(command.line):
            first.setdefault(command.line, command)
    return list(first.values())


def run_as_in_a_clone(commands: list[Command], latest: Path, root: Path) -> list[str]:
    """Run the commands with bash in `root`, laid out as a clone after `make demo`: the repository's files,
    its venv, runs/demo/latest -> `latest`, ../shared when there is one. Returns the failures."""
    clone = root / "clone"
    clone.mkdir()
    for entry in REPO.iterdir():
        if entry.name not in (".git", ".venv", "runs"):
            (clone / entry.name).symlink_to(entry)
    (clone / ".venv").symlink_to(VENV_BIN.parent)
    (clone / "runs" / "demo").mkdir(parents=True)
    (clone / "runs" / "demo" / "latest").symlink_to(latest)
    if SHARED.is_dir():
        (root / "shared").symlink_to(SHARED)
    failures = []
    with contextlib.ExitStack() as background:
        # What the pages start in the background and their cheap commands then use: the throwaway PostgreSQL.
        for port in sorted({int(m.group(1)) for c in all_commands() if (m := BACKGROUND_POSTGRES.match(c.line))}):
            background.enter_context(temporary_postgres(port=port))
        for command in commands:
            done = subprocess.run(["bash", "-c", command.line], cwd=clone, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                failures.append(f"{command}\n  exit {done.returncode}: {(done.stdout + done.stderr)[-800:]}")
    return failures


# ------------------------------------------------------------------------------------------ engines
def test_every_client_sends_the_name_its_engine_serves():
    """The engine scripts (CPU and vLLM, GPU hosts' included) serve the folder's path, and clients send it."""
    clients = 0
    for page in PAGES:
        started: dict[tuple[bool, str], str] = {}  # (GPU host, port) -> the folder the script was started on
        for command in page_commands(page):
            line = re.sub(r"^(?:[A-Z_]+=\S+ )+", "", command.line)  # CUDA_VISIBLE_DEVICES=1 scripts/...
            assert not re.match(r"(\S*/)?transformers serve", line), f"not through the script: {command}"
            if engine := ENGINE_SCRIPTS.match(line):
                started[command.gpu, engine.group(2)] = engine.group(1)
                continue
            model = re.search(r'--model "\$PWD/([^"]+)"|"model": "\'"\$PWD"\'/([^"]+)"', line)
            if not model:
                continue
            clients += 1
            folder = model.group(1) or model.group(2)
            port = re.search(r"(?:--base-url|--api-base) http://127\.0\.0\.1:(\d+)|127\.0\.0\.1:(\d+)/v1/chat", line)
            # The virtual server's own `api_base` is the config's 12345 unless given.
            port = (port.group(1) or port.group(2)) if port else "12345"
            serves = started.get((command.gpu, port), "nothing started before it on this page")
            assert serves == folder, f"{command}\n sends $PWD/{folder} to port {port}, which serves {serves}"
    assert clients >= 6  # server, FAC, SoPR, judge agreement, fidelity servers, the training page's check


def test_the_script_refuses_a_folder_no_engine_serves_in_one_line(tmp_path):
    """A folder without a model's config.json (a typo'd run folder, an adapter): one line and status 2, where
    `transformers serve` printed a 45-line traceback after the GGUF export's own line."""
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{}")
    for folder, says in (("not-a-model", "is not a model folder (no config.json)"), ("adapter", "is a LoRA adapter")):
        done = subprocess.run([str(SCRIPT), folder, "1"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and says in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_script_serves_the_name_clients_are_told_to_send(tiny_model_dir, tmp_path):
    """The script started on a relative path through a link (as `runs/demo/latest/simulator` is) answers
    `$PWD/<that path>`; another spelling of the same folder is refused, which is why the docs have one. A user
    starts it again and again: it leaves nothing in the temporary folder once the engine has stopped."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "latest").symlink_to(tiny_model_dir.parent)
    relative = f"runs/latest/{tiny_model_dir.name}"
    port, log, temporary = free_port(), tmp_path / "engine.log", tmp_path / "tmp"
    temporary.mkdir()
    env = {**os.environ, "TRANSFORMERS": str(Path(sys.executable).parent / "transformers"), "TMPDIR": str(temporary)}
    env.pop("HF_HUB_CACHE", None)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(SCRIPT), relative, str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        name = f"{tmp_path}/{relative}"  # what "$PWD/runs/latest/model" expands to in that folder
        wait_until_engine_answers(RunningEngine(f"http://127.0.0.1:{port}/v1", name, process, log), 180)
        assert f"model name (clients' --model): {name}" in log.read_text()
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=60)
        answer = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": "hello"}], max_tokens=4
        )
        assert answer.choices[0].message.content is not None
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(
                model=str(tiny_model_dir.resolve()), max_tokens=4, messages=[{"role": "user", "content": "hello"}]
            )
        assert "pinned" in refused.value.response.text
    finally:
        stop(process)
    assert sorted(p.name for p in temporary.iterdir()) == []


def github_anchor(heading: str) -> str:
    """A heading's anchor as GitHub makes it: the rendered text (links and code marks dropped to their text) lower
    case, every character but letters, digits, `_`, `-` and spaces dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def page_anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            anchor = github_anchor(heading.group(1))
            anchors.add(anchor if anchor not in seen else f"{anchor}-{seen[anchor]}")  # GitHub numbers repeats
            seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def prose_lines() -> Iterator[tuple[Path, int, str]]:
    """Every line of the pages outside their fenced blocks, with its page and number."""
    for page in PAGES:
        fenced = False
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced:
                yield page, number, line


def test_every_link_between_the_pages_reaches_its_file_and_heading():
    """A link to another page's section whose anchor lost a character (`taubenchs` for the heading's "tau-bench's")
    opens the page at its top on GitHub; nothing else notices."""
    assert github_anchor("The fifth run and the judge's second run") == "the-fifth-run-and-the-judges-second-run"
    assert github_anchor("vLLM, on this CPU and on GPUs") == "vllm-on-this-cpu-and-on-gpus"
    broken, checked = [], 0
    for page, number, line in prose_lines():
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            checked += 1
            if not linked.exists():
                broken.append(f"{page.name}:{number}: no file {target}")
            elif anchor and linked.suffix == ".md" and anchor not in page_anchors(linked):
                broken.append(f"{page.name}:{number}: no heading {target}")
    assert checked > 100 and broken == []


INLINE_COMMAND = re.compile(
    r"`(?:\.venv/bin/python |\.venv/bin/)?"
    r"((?:scripts|data|eval|training|bench|serving)/[\w/]+\.py|mirrorapi)( [^`]*)?`"
)


def help_text(target: str, words: list[str]) -> str:
    """What `<target> [subcommand words] --help` prints (a script run in this process, as parse_problem runs it)."""
    argv0 = str(REPO / target) if target.endswith(".py") else target
    saved_argv, saved_path, out = sys.argv, list(sys.path), io.StringIO()
    sys.argv = [argv0, *words, "--help"]
    sys.path.insert(0, str(Path(argv0).parent))  # as `python script.py` has it: bench/'s scripts import their siblings
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            if target == "mirrorapi":
                from mirrorapi.cli import main

                main([*words, "--help"])
            else:
                runpy.run_path(argv0, run_name="__main__")
    except SystemExit:
        pass
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    return out.getvalue()


def test_every_flag_named_in_the_pages_prose_is_one_its_command_takes(monkeypatch):
    """The pages' prose names commands with their flags too (`scripts/train_shipped_models.py --stage data
    --without-examples-share F`); only the ```sh blocks were checked, so a flag renamed in the code stayed in the
    prose. Each flag of such a span must be in its command's --help (values are placeholders there: only the flag)."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    helps: dict[tuple, str] = {}
    problems, checked = [], 0
    for page, number, line in prose_lines():
        for target, rest in INLINE_COMMAND.findall(line):
            words = rest.split()
            flags = [w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][\w-]*(=.*)?", w)]
            if not flags:
                continue
            subcommand = []
            if target == "mirrorapi":  # its group and command: the words before the first flag or stand-in
                subcommand = [w for w in words[:2] if re.fullmatch(r"[a-z][a-z-]*", w)]
                subcommand = subcommand[: next((i for i, w in enumerate(words) if w.startswith("-")), 2)]
            key = (target, *subcommand)
            if key not in helps:
                helps[key] = help_text(target, subcommand)
            for flag in flags:
                checked += 1
                if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helps[key]):
                    problems.append(f"{page.name}:{number}: {target} {' '.join(subcommand)} has no {flag}")
    assert checked > 20 and problems == [], "\n".join(problems)
