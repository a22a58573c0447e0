"""The files of an agent run: StableToolBench query files in, raw answer files out (resumable).

Every finished query is written at once as `<out>/answer/<group>/<query_id>_<method>.json` in
StableToolBench's raw answer format (what its `convert_to_answer_format.py` reads: assistant
messages carry `tool_calls`, never a `function_call` key, tool messages carry `tool_call_id`; the
nodes of `trys` / `tree` carry `observation`), and the group's converted file
`<out>/<group>.json` (what `eval/fac.py` reads) is rebuilt from all raw files of the group. The agent
settings go into both (`agent_settings`, and `agent` in each converted record).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mirrorapi.evaluation.agent.settings import AgentRunError, AgentSettings

ANSWER_DIR = "answer"


def load_queries(path: str | os.PathLike) -> dict[str, list[dict]]:
    """{group: [queries]} from a StableToolBench query file (`test_instruction/<group>.json`) or a folder."""
    path = Path(path)
    if not path.exists():
        raise AgentRunError(f"queries not found: {path} (expected a test_instruction file or folder)")
    files = sorted(p for p in path.iterdir() if p.suffix == ".json") if path.is_dir() else [path]
    groups = {}
    for file in files:
        try:
            data = json.loads(file.read_bytes())
        except (OSError, ValueError) as exc:
            raise AgentRunError(f"cannot read {file}: {exc}") from None
        if not isinstance(data, list) or not all(
            isinstance(q, dict) and "query" in q and "api_list" in q for q in data
        ):
            raise AgentRunError(
                f"{file}: expected a StableToolBench query file (a list of {{query, api_list, query_id}})"
            )
        # A query without a query_id is named by its place in the file, as StableToolBench's runner names it
        # (rapidapi_multithread.py); each query writes its own answer file under that name.
        groups[file.stem] = [q if "query_id" in q else {**q, "query_id": index} for index, q in enumerate(data)]
    if not groups:
        raise AgentRunError(f"no <group>.json query files in {path}")
    return groups


def raw_answer_path(out: Path, group: str, query_id: str, method: str) -> Path:
    return out / ANSWER_DIR / group / f"{query_id}_{method}.json"


def finished_answer(path: Path) -> dict | None:
    """The content of a finished raw answer file; None when absent or torn by an interrupted write (redo it)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("answer_generation"), dict) else None


# AgentSettings fields a rerun into the same --out must keep (`check_same_agent`).
ANSWER_SETTINGS = (
    "temperature",
    "max_tokens",
    "single_chain_max_step",
    "max_query_count",
    "max_observation_length",
    "system_prompt_file",
    "tool_choice",
    "react_grammar",
)


def check_same_agent(data: dict, settings: AgentSettings, path: Path) -> None:
    """A rerun resumes a run; it must not mix another model's answers into it."""
    earlier = data.get("agent_settings")
    if not isinstance(earlier, dict):
        return
    if (earlier.get("model"), earlier.get("method")) != (settings.model, settings.method):
        raise AgentRunError(
            f"{path} holds an answer of model {earlier.get('model')!r} ({earlier.get('method')}), "
            f"not {settings.model!r} ({settings.method}); use another --out"
        )
    if earlier.get("prompt_format", "agent-v1") != settings.prompt_format:
        raise AgentRunError(
            f"{path} holds an answer in prompt format {earlier.get('prompt_format', 'agent-v1')!r}, "
            f"not {settings.prompt_format!r}; use another --out"
        )
    # Settings that change what an answer is: a rerun with other values mixed two runs into one result, silently.
    # (Not the server's URL, nor the engine's: a server started again on another port is the same simulator.)
    now = settings.record()
    differ = [key for key in ANSWER_SETTINGS if key in earlier and earlier[key] != now.get(key)]
    if differ:
        said = ", ".join(f"{key} {earlier[key]!r} (now {now.get(key)!r})" for key in differ)
        raise AgentRunError(f"{path} holds an answer made with {said}; use another --out, or the same settings")


def write_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, path)
