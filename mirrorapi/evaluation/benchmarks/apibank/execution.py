"""A predicted call executed on the virtual server, as API-Bank records an executed call; API-Bank's recorded calls
as pairs for the server's cache."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from mirrorapi.evaluation.benchmarks.apibank.rules import Result, typed_arguments
from mirrorapi.evaluation.benchmarks.apibank.samples import CATEGORY, TOOL_SEARCHER


def json_value(value: Any) -> Any:
    """A value as JSON text decodes (the server's wire form); other values as they are."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def tools_of(tools_folder: str | Path) -> dict[str, str]:
    """API name -> tool name of API-Bank's level-1/2 tools in `<tools_folder>/APIBank/` (`apibank_*`; the level-3
    `apibank_lv3_*` excluded)."""
    out = {}
    for path in sorted((Path(tools_folder) / CATEGORY).glob("apibank_*.json")):
        if path.name.startswith("apibank_lv3_"):
            continue
        doc = json.loads(path.read_text(encoding="utf-8"))
        out.update({api["name"]: doc["tool_name"] for api in doc["api_list"]})
    return out


def recorded_results(dialogues: list[dict]) -> dict[tuple[str, str], dict]:
    """(API, canonical arguments) -> the annotated result, first seen wins."""
    out: dict[tuple[str, str], dict] = {}
    for dialogue in dialogues:
        for turn in dialogue["turns"]:
            if turn["role"] == "API":
                out.setdefault((turn["api_name"], json.dumps(turn["param_dict"], sort_keys=True)), turn["result"])
    return out


def write_recorded_pairs(dialogues: list[dict], tools: dict[str, str], path: str | Path) -> int:
    """API-Bank's recorded calls as pairs (our JSONL schema) for `mirrorapi cache import`: an annotated call then
    gets its recorded answer from the server. ToolSearcher is left out (see the module doc). Returns the count."""
    rows = []
    for dialogue in dialogues:
        for step, turn in enumerate(t for t in dialogue["turns"] if t["role"] == "API"):
            if turn["api_name"] not in tools:
                continue
            result = turn["result"]
            output = result["output"]
            rows.append(
                {
                    "source": "api-bank",
                    "episode": dialogue["file"].removesuffix(".jsonl"),
                    "step": step,
                    "category": CATEGORY,
                    "tool_name": tools[turn["api_name"]],
                    "api_name": turn["api_name"],
                    "tool_input": turn["param_dict"],
                    "response": {
                        "error": result["exception"] or "",
                        "response": output if isinstance(output, str) else json.dumps(output),
                    },
                }
            )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


@dataclass
class VirtualApiBank:
    """Executes a parsed call on the virtual server (ToolSearcher from the recordings) into API-Bank's result shape."""

    server: str  # the /virtual URL
    tools: dict[str, str]
    searcher: dict[tuple[str, str], dict]
    types: dict[str, dict[str, str]]
    # Made on the event loop that runs the calls (aiohttp binds a session to it): build one inside a coroutine.
    http: aiohttp.ClientSession = field(
        default_factory=lambda: aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120.0), raise_for_status=True
        )
    )

    async def execute(self, api_name: str, arguments: dict[str, str]) -> Result:
        """The call as API-Bank records it: typed input, output, exception. The server gets the arguments as
        written (the recorded calls are all strings, so a right call is a cache hit)."""
        result: Result = {"api_name": api_name, "input": None}
        try:
            result["input"] = typed_arguments(arguments, self.types.get(api_name, {})) or None
        except ValueError as exc:
            return {**result, "input": arguments, "output": None, "exception": str(exc)}
        if api_name == TOOL_SEARCHER:
            recorded = self.searcher.get((api_name, json.dumps(arguments, sort_keys=True)))
            if recorded is None:
                return {**result, "output": None, "exception": "ToolSearcher query not in API-Bank's recordings"}
            return {**result, "output": recorded["output"], "exception": recorded["exception"]}
        if api_name not in self.tools:
            return {**result, "output": None, "exception": f"unknown API {api_name}"}
        body = {
            "category": CATEGORY,
            "tool_name": self.tools[api_name],
            "api_name": api_name,
            "tool_input": json.dumps(arguments),
        }
        async with self.http.post(self.server, json=body) as response:
            answer = await response.json(content_type=None)
        error = answer.get("error") or None
        return {**result, "output": None if error else json_value(answer.get("response")), "exception": error}


def truth_result(truth: dict) -> Result:
    """A call sample's recorded result, its API named as the sample names it: API-Bank's evaluator picks the rule
    by the sample's `api_name`, and some recorded results (DeleteAccount's, ForgotPassword's, RegisterUser's) have
    none."""
    result = {**truth["result"], "api_name": truth["api_name"]}
    result["output"] = json_value(result["output"])
    return result
