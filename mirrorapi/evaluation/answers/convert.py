"""Raw StableToolBench answer files -> the converted format `eval/fac.py` reads (notes §5.2).

Reads our runner's files and StableToolBench's own, in both of its message dialects: legacy
`function_call` / `role: function` messages, and `tool_calls` / `role: tool` messages matched by
`tool_call_id`. A `"function_call": null` (what its pipeline writes under today's `openai` SDK, and
what makes its own `convert_to_answer_format.py` crash) is read as "no function call".

Output per query, as upstream's converter writes it: `{query, available_tools, answer: {method,
total_steps, final_answer, answer_details}}`, `answer_details` = one linear chain of nodes
`{role, message, next}` (system and user messages blanked; a tool node's message is `{name,
arguments, response}`, Finish with response ""), `total_steps` = the number of nodes.
Two deliberate differences: where upstream samples (a random try of a failed CoT run, a random walk
down a failed DFS tree) we take the last try / the first-child path, so a conversion is reproducible;
and the runner's `agent_settings` are kept in each record as `agent`.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class ConvertError(Exception):
    """A raw answer file that cannot be read."""


def _tool_node(name: Any, arguments: Any, response: Any) -> dict:
    return {"role": "tool", "message": {"name": name, "arguments": arguments, "response": response}}


def _assistant_node(text: Any) -> dict:
    return {"role": "assistant", "message": text if text is not None else ""}


def _valid_chain(conversation: list[dict]) -> list[dict]:
    """The nodes of the last training conversation (after its system and user messages)."""
    nodes: list[dict] = []
    index = 2
    while index < len(conversation):
        message = conversation[index] if isinstance(conversation[index], dict) else {}
        index += 1
        if message.get("role") != "assistant":
            continue
        legacy = message.get("function_call")
        calls = message.get("tool_calls")
        if isinstance(legacy, dict):
            name = legacy.get("name")
            following = (
                conversation[index] if index < len(conversation) and isinstance(conversation[index], dict) else {}
            )
            nodes.append(
                _tool_node(name, legacy.get("arguments"), following.get("content", "") if name != "Finish" else "")
            )
            index += 1  # the function message that answered it
        elif isinstance(calls, list) and calls:
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict):
                    continue
                name = function.get("name")
                if name == "Finish":
                    nodes.append(_tool_node(name, function.get("arguments"), ""))
                    break
                response = next(
                    (
                        m.get("content", "")
                        for m in conversation[index:]
                        if isinstance(m, dict) and m.get("role") == "tool" and m.get("tool_call_id") == call.get("id")
                    ),
                    "",
                )
                nodes.append(_tool_node(name, function.get("arguments"), response))
        else:
            nodes.append(_assistant_node(message.get("content")))
    return nodes


def _trace_chain(trace: list[dict]) -> list[dict]:
    """Nodes of a CoT try (Thought / Action + Action Input nodes)."""
    nodes, index = [], 0
    while index < len(trace):
        node = trace[index] if isinstance(trace[index], dict) else {}
        if node.get("node_type") == "Action":
            following = trace[index + 1] if index + 1 < len(trace) and isinstance(trace[index + 1], dict) else {}
            nodes.append(
                _tool_node(node.get("description"), following.get("description", ""), following.get("observation", ""))
            )
            index += 2
            continue
        if node.get("node_type") == "Thought":
            nodes.append(_assistant_node(node.get("description")))
        index += 1
    return nodes


def _first_path(root: dict) -> list[dict]:
    """The first-child path below a DFS tree's root, as tree nodes."""
    path, node = [], root
    while isinstance(node, dict) and node.get("children"):
        node = node["children"][0]
        path.append(node)
    return path


def _link(nodes: list[dict]) -> tuple[list[dict], int]:
    """[system, user, *nodes] linked through `next`; (answer_details, node count)."""
    chain = [{"role": "system", "message": ""}, {"role": "user", "message": ""}] + nodes
    linked: dict = {}
    for node in reversed(chain):
        linked = {"role": node["role"], "message": node["message"], "next": [linked] if linked else []}
    return [linked], len(chain)


def convert_answer(data: dict, method: str) -> dict:
    """One raw answer file's content -> its converted record."""
    generation = data.get("answer_generation") if isinstance(data, dict) else None
    if not isinstance(generation, dict):
        raise ConvertError("no `answer_generation` object")
    messages = generation.get("train_messages") or []
    if generation.get("valid_data") and messages and isinstance(messages[-1], list):
        nodes = _valid_chain(messages[-1])
    elif isinstance(data.get("trys"), list) and data["trys"]:
        last = data["trys"][-1]
        nodes = _trace_chain(last.get("chain") or [] if isinstance(last, dict) else [])
    elif isinstance(data.get("tree"), dict):
        nodes = _trace_chain(_first_path(data["tree"].get("tree")))
    else:
        nodes = []
    details, steps = _link(nodes)
    final_answer = generation.get("final_answer")
    record = {
        "query": generation.get("query", ""),
        "available_tools": generation.get("function") or [],
        "answer": {
            "method": method,
            "total_steps": steps,
            "final_answer": final_answer if isinstance(final_answer, str) else "",
            "answer_details": details,
        },
    }
    if isinstance(data.get("agent_settings"), dict):
        record["agent"] = data["agent_settings"]
    return record


def convert_answer_folder(
    folder: str | os.PathLike, method: str, output: str | os.PathLike | None = None
) -> Path | dict:
    """Convert every `<qid>_<method>*.json` of `folder` (upstream's selection: the file name contains
    the method; the id is the name up to the first `_`). Writes `output` when given (returns its
    path), else returns {qid: record}. Unreadable files are logged and left out."""
    folder = Path(folder)
    converted: dict[str, dict] = {}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.suffix != ".json" or method not in path.name:
            continue
        try:
            converted[path.name.split("_")[0]] = convert_answer(json.loads(path.read_bytes()), method)
        except (OSError, ValueError, ConvertError) as exc:
            logger.warning("%s: not converted (%s)", path, exc)
    converted = dict(
        sorted(converted.items(), key=lambda kv: (not kv[0].isdigit(), int(kv[0]) if kv[0].isdigit() else 0, kv[0]))
    )
    if output is None:
        return converted
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(json.dumps(converted, ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, output)
    return output
