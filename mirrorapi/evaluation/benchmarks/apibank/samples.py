"""API-Bank's test data as samples, and the chat a model is shown for each (API-Bank's evaluator.py, restated).

Every API turn of a dialogue gives a call sample and, after it, a response sample (see the package doc).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LEVELS = {1: "level-1.jsonl", 2: "level-2.jsonl"}
LEVEL_NAMES = {1: "Call", 2: "Retrieve+Call"}
CATEGORY = "APIBank"
TOOL_SEARCHER = "ToolSearcher"

# API-Bank's two instructions (evaluator.py), as the benchmark states them: the model is scored on this text.
CALL_INSTRUCTION = """
Based on the given API description and the existing conversation history 1..t, please generate the API request \
that the AI should call in step t+1 and output it in the format of [ApiName(key1='value1', key2='value2', ...)], \
replace the ApiName with the actual API name, and replace the key and value with the actual parameters. 
Your output should start with a square bracket "[" and end with a square bracket "]". Do not output any other \
explanation or prompt or the result of the API call in your output. 
This year is 2023.
Input: 
User: [User's utterence]
AI: [AI's utterence]

Expected output:
[ApiName(key1='value1', key2='value2', ...)]

API descriptions:
"""
RESPONSE_INSTRUCTION = """
Based on the given API description and the existing conversation history 1..t, please generate the next dialog \
that the AI should response after the API call t.
This year is 2023.
Input: 
User: [User's utterence]
AI: [AI's utterence]
[ApiName(key1='value1', key2='value2', \u2026)]

Expected output:
AI: [AI's utterence]

API descriptions:
"""


@dataclass
class Sample:
    """One call or response sample of a dialogue (API-Bank's `Sample`)."""

    level: int
    dialogue: str  # the dialogue's file in API-Bank's lv1-lv2-samples/
    history: list[dict]
    apis: list[str]  # the APIs the dialogue uses (sorted; API-Bank used a set)
    truth: dict  # the annotated turn: role API (a call sample) or AI (a response sample)
    number: int = 0  # its place among the dialogue's samples

    @property
    def kind(self) -> str:
        return "call" if self.truth["role"] == "API" else "response"


def load_dialogues(data: str | Path, level: int) -> list[dict]:
    """`{"file", "turns"}` per dialogue of `<data>/level-N.jsonl` (data/apibank: API-Bank's own dialogues)."""
    path = Path(data) / LEVELS[level]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no API-Bank level-{level} dialogues (expected data/apibank/{LEVELS[level]})")
    dialogues = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                dialogue = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc})") from None
            if problem := _dialogue_problem(dialogue):
                raise ValueError(f"{path}:{number}: {problem}")
            dialogues.append(dialogue)
    return dialogues


def _dialogue_problem(dialogue: Any) -> str | None:
    """What keeps a line from being an API-Bank dialogue as `samples_of` and `build_messages` read it, or None."""
    if not isinstance(dialogue, dict) or not isinstance(dialogue.get("file"), str):
        return 'not a dialogue {"file": ..., "turns": [...]}'
    if not isinstance(dialogue.get("turns"), list):
        return f"{dialogue['file']}: no list of turns"
    for i, turn in enumerate(dialogue["turns"]):
        role = turn.get("role") if isinstance(turn, dict) else None
        if role in ("User", "AI") and isinstance(turn.get("text"), str):
            continue
        if (
            role == "API"
            and isinstance(turn.get("api_name"), str)
            and isinstance(turn.get("param_dict"), dict)
            and isinstance(turn.get("result"), dict)
            and "output" in turn["result"]
        ):
            continue
        return (
            f"{dialogue['file']}: turn {i} is neither a User or AI turn with a text nor an API turn with api_name, "
            "param_dict and a result holding an output"
        )
    return None


def samples_of(dialogue: dict, level: int) -> list[Sample]:
    turns = dialogue["turns"]
    apis = sorted({t["api_name"] for t in turns if t["role"] == "API"})
    out: list[Sample] = []
    for i, turn in enumerate(turns):
        if turn["role"] != "API":
            continue
        out.append(Sample(level, dialogue["file"], turns[:i], apis, turn, len(out)))
        # The turn after a call is a sample when it is the AI's (a response sample) or another call: API-Bank's
        # evaluator scores only those two roles (evaluator.py, `ground_truth['role'] == 'API'` / `== 'AI'`), so
        # a user's turn there is no sample. API-Bank indexes past the end here (a crash); no dialogue of levels
        # 1-2 ends so.
        if i + 1 < len(turns) and turns[i + 1]["role"] in ("API", "AI"):
            out.append(Sample(level, dialogue["file"], turns[: i + 1], apis, turns[i + 1], len(out)))
    return out


def load_descriptions(data: str | Path) -> dict[str, str]:
    """API name -> the description text API-Bank shows (`ToolManager.get_api_description`: JSON of name,
    description, input_parameters, output_parameters; data/apibank/api_descriptions.json holds the class
    attributes)."""
    return {name: json.dumps(info) for name, info in _described(data).items()}


# ------------------------------------------------------------------------------- prompts
def call_text(api_name: str, params: dict) -> str:
    return "[{}({})]".format(api_name, ", ".join(f"{k}='{v}'" for k, v in params.items()))


def build_messages(sample: Sample, descriptions: dict[str, str]) -> list[dict]:
    """API-Bank's chat for a sample: the instruction and descriptions as system message, then the history
    (an API turn becomes a system message `[Api(k='v')] Response: <Python str of the output>`)."""
    if sample.kind == "call":
        shown = [TOOL_SEARCHER] if sample.level == 2 else sample.apis
        system = CALL_INSTRUCTION + "\n".join(descriptions[name] for name in shown)
    else:
        system = RESPONSE_INSTRUCTION + "\n".join(descriptions[name] for name in sample.apis)
    messages = [{"role": "system", "content": system}]
    for turn in sample.history:
        if turn["role"] == "User":
            messages.append({"role": "user", "content": turn["text"]})
        elif turn["role"] == "AI":
            messages.append({"role": "assistant", "content": turn["text"]})
        elif turn["role"] == "API":
            content = f"{call_text(turn['api_name'], turn['param_dict'])} Response: {turn['result']['output']}"
            messages.append({"role": "system", "content": content})
        else:
            raise ValueError(f"{sample.dialogue}: unknown role {turn['role']!r}")
    return messages


def parameter_types(data: str | Path) -> dict[str, dict[str, str]]:
    """API name -> {parameter: declared type} (API-Bank's input_parameters)."""
    return {
        name: {k: v["type"] for k, v in info["input_parameters"].items()} for name, info in _described(data).items()
    }


def _described(data: str | Path) -> dict[str, dict]:
    """api_descriptions.json: API name -> its class attributes; ValueError for another shape."""
    path = Path(data) / "api_descriptions.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    for name, info in raw.items() if isinstance(raw, dict) else [(None, None)]:
        parameters = info.get("input_parameters") if isinstance(info, dict) else None
        if not isinstance(parameters, dict) or not all(
            isinstance(v, dict) and "type" in v for v in parameters.values()
        ):
            raise ValueError(f"{path}: {name or 'the file'} is not an API's description with typed input_parameters")
    return raw


def check_described(dialogues: list[dict], descriptions: dict[str, str]) -> None:
    """ValueError naming a dialogue that uses an API api_descriptions.json does not describe (its prompt needs it)."""
    for dialogue in dialogues:
        missing = sorted({t["api_name"] for t in dialogue["turns"] if t["role"] == "API"} - set(descriptions))
        if missing:
            raise ValueError(f"{dialogue['file']}: API(s) {', '.join(missing)} not in api_descriptions.json")
