"""StableToolBench's converted answers and test ids, read into the items a judge scores.

- Converted answers (`convert_to_answer_format.py` output, notes §5.2): one JSON object per group,
  `{qid: {query, available_tools, answer: {method, total_steps, final_answer, answer_details}}}`,
  stored as `<model>/<group>.json`. A directory of model folders gives several candidate models.
- Test ids: `test_query_ids/<group>.json` (`{"<qid>": 0, ...}`) or a query file
  (`test_instruction/<group>.json`, a list with `query_id`), a file or a directory of them.

The ids decide the denominator: every id becomes an item, with or without an answer.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mirrorapi.prompts.judge_formats import extract_final_answer

logger = logging.getLogger(__name__)

# StableToolBench's six test groups in the column order of its FAC table, with the column titles.
GROUPS = {
    "G1_instruction": "I1 Inst",
    "G1_category": "I1 Cat",
    "G1_tool": "I1 Tool",
    "G2_category": "I2 Cat",
    "G2_instruction": "I2 Inst",
    "G3_instruction": "I3 Inst",
}

# What an item holds instead of an answer to judge; all of them are Unsolved without a judge call.
# (EMPTY and GIVE_UP come from `extract_final_answer`, in mirrorapi/prompts/judge_formats.py: what a judge is shown.)
MISSING = "missing"


class AnswersError(Exception):
    """An input file or folder that cannot be used (absent, not JSON, wrong shape)."""


@dataclass(frozen=True)
class AnswerItem:
    model: str
    group: str
    query_id: str
    query: str  # "" when the answer is missing
    answer: str  # the text to judge ("" unless status == "answer")
    status: str  # "answer", or MISSING / EMPTY / GIVE_UP
    steps: str = ""  # the tool calls of the trajectory, rendered for judges that look at them (SoPR)


def group_order(groups) -> list[str]:
    """StableToolBench's column order first, any other group names after, sorted."""
    known = [g for g in GROUPS if g in groups]
    return known + sorted(g for g in groups if g not in GROUPS)


# StableToolBench's older converted files (its tooleval results, default_evalset) store a tool node's message as
# the Python repr of its dict, cut at 100 characters: the call's name is all that can be read back.
_REPR_NAME = re.compile(r"""^\{'name': '([^']*)'""")


def tool_message(node: dict) -> dict | None:
    """A tool node's message as a dict ({"name", "arguments", "response"}); from an older file's cut repr, its
    name with the text itself as `raw`."""
    message = node.get("message")
    if isinstance(message, str):
        try:
            message = ast.literal_eval(message)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            name = _REPR_NAME.match(message)
            return {"name": name.group(1), "raw": message} if name else None
    return message if isinstance(message, dict) else None


def render_steps(answer_details: Any, response_chars: int = 300, budget: int = 4000) -> str:
    """The tool calls of a converted trajectory (first-child path), one block per call, cut to a budget."""
    lines: list[str] = []
    nodes = answer_details if isinstance(answer_details, list) else [answer_details]
    node = nodes[0] if nodes and isinstance(nodes[0], dict) else None
    while node is not None:
        message = tool_message(node) if node.get("role") == "tool" else None
        if message is not None and message.get("name") != "Finish":
            response = str(message.get("response", ""))
            if len(response) > response_chars:
                response = response[:response_chars] + "..."
            arguments = " ".join(str(message.get("arguments", "")).split())  # one line per call
            raw = " ".join(str(message.get("raw", "")).split())  # an older file's text, shown as upstream shows it
            lines.append(f"- {raw}..." if raw else f"- {message.get('name', '')}({arguments}) -> {response}")
        children = node.get("next")
        node = children[0] if isinstance(children, list) and children and isinstance(children[0], dict) else None
    text = "\n".join(lines)
    return text if len(text) <= budget else text[:budget] + "..."


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as exc:
        raise AnswersError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise AnswersError(f"{path} is not valid JSON ({exc})") from exc


def _json_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".json")


def load_ids(path: str | os.PathLike) -> dict[str, list[str]]:
    """{group: [query ids]} from a test_query_ids/test_instruction file, or a folder of them."""
    path = Path(path)
    if not path.exists():
        raise AnswersError(f"ids not found: {path} (expected a test_query_ids file or folder)")
    files = _json_files(path) if path.is_dir() else [path]
    if not files:
        raise AnswersError(f"no <group>.json id files in {path}")
    ids: dict[str, list[str]] = {}
    for file in files:
        data = _read_json(file)
        if isinstance(data, dict):
            group_ids = [str(k) for k in data]
        elif isinstance(data, list) and all(isinstance(q, dict) and "query_id" in q for q in data):
            group_ids = [str(q["query_id"]) for q in data]
        else:
            raise AnswersError(f'{file}: expected {{"<query_id>": 0, ...}} or a list of queries with `query_id`')
        if not group_ids:  # a group without queries has no score: as a 0 it would pull every Average down
            raise AnswersError(f"{file}: no query ids (group {file.stem!r} would have no score)")
        ids[file.stem] = list(dict.fromkeys(group_ids))  # order kept, duplicates dropped
    return ids


def _is_answer_file(data: Any) -> bool:
    return isinstance(data, dict) and all(isinstance(v, dict) and "answer" in v for v in data.values())


def load_answers(path: str | os.PathLike) -> dict[str, dict[str, dict]]:
    """{model: {group: {qid: converted record}}} from one `<model>/<group>.json` file or a folder.

    A folder holding `<group>.json` files is one model (named after the folder); a folder of such
    folders gives one model per subfolder.
    """
    path = Path(path)
    if not path.exists():
        raise AnswersError(f"answers not found: {path} (expected <model>/<group>.json files)")
    if path.is_file():
        folders = {path.parent.name or "model": [path]}
    elif _json_files(path):
        folders = {path.resolve().name: _json_files(path)}
    else:
        folders = {sub.name: _json_files(sub) for sub in sorted(path.iterdir()) if sub.is_dir() and _json_files(sub)}
    if not folders:
        raise AnswersError(f"no converted answer files in {path} (expected <model>/<group>.json)")
    answers: dict[str, dict[str, dict]] = {}
    for model, files in folders.items():
        for file in files:
            data = _read_json(file)
            if not _is_answer_file(data):
                raise AnswersError(
                    f"{file}: not a converted answer file ({{qid: {{query, answer: {{final_answer, ...}}}}}})"
                )
            answers.setdefault(model, {})[file.stem] = {str(k): v for k, v in data.items()}
    return answers


def build_items(answers: dict[str, dict[str, dict]], ids: dict[str, list[str]]) -> list[AnswerItem]:
    """One item per (model, group, id) of the id lists; answers outside the id lists are left out (logged)."""
    items = []
    for model in sorted(answers):
        for group in group_order(ids):
            records = answers[model].get(group, {})
            if not records:
                logger.warning("%s has no answers for %s: its %d ids count as Unsolved", model, group, len(ids[group]))
            for qid in ids[group]:
                record = records.get(qid)
                if record is None:
                    items.append(AnswerItem(model, group, qid, "", "", MISSING))
                    continue
                answer = record.get("answer") if isinstance(record.get("answer"), dict) else {}
                status, text = extract_final_answer(answer.get("final_answer"))
                # Every answer's calls, a final answer or not: SoWR tells two answers without one apart by them, as
                # upstream's check_identity_answers compares answer_details too.
                steps = render_steps(answer.get("answer_details"))
                items.append(AnswerItem(model, group, qid, str(record.get("query") or ""), text, status, steps))
            extra = set(records) - set(ids[group])
            if extra:
                logger.warning(
                    "%s/%s: %d answers whose ids are not in the id list are not scored", model, group, len(extra)
                )
        for group in sorted(set(answers[model]) - set(ids)):
            logger.warning("%s/%s.json: no id list for group %s; not scored", model, group, group)
    return items
