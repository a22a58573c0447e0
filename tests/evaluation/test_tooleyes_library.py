"""ToolEyes' tool library (data/tooleyes) through the function-schema import and the virtual server.

Expected values come from ToolEyes itself (Junjie-Ye/ToolEyes at c818fcebe017951570a25e552a7984e40093fd52): its
README's statistics table ("# Tool ... 568"), its 382 test queries (`Test_Data/scenario_data_raw.json`, each naming
its tool's folder) and, below, one config file transcribed from `Tool_Library/Advice/Advice_slip/config_gpt4.json`.
"""

import contextlib
import json
from pathlib import Path

import httpx
from fastapi import FastAPI, Request

from harness.processes import free_port, serve_in_thread
from mirrorapi.evaluation.benchmarks.tooleyes_library import library_tools, write_tools_folder
from mirrorapi.serving.app import create_app
from mirrorapi.serving.config import ServerSettings
from mirrorapi.tools import ToolRegistry

DATA = Path(__file__).resolve().parents[2] / "data" / "tooleyes"
ADVICE_SLIP = [  # Tool_Library/Advice/Advice_slip/config_gpt4.json, as ToolEyes ships it
    {
        "name": "random_advice",
        "description": "Returns a random advice slip as a slip object.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
    {
        "name": "advice_by_id",
        "description": "If an advice slip is found with the corresponding {slip_id}, a slip object is returned.",
        "parameters": {
            "type": "object",
            "properties": {"slip_id": {"type": "string", "description": "The unique ID of this advice slip."}},
            "required": ["slip_id"],
        },
    },
    {
        "name": "search_advice",
        "description": "If an advice slip is found, containing the corresponding search term "
        "in {query}, an array of slip objects is returned inside a search object.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "The search query provided."}},
            "required": ["query"],
        },
    },
    {
        "name": "ask_to_user",
        "description": "You can ask user for guidance when you think you need more information "
        "to handle the task, but you should use this tool as less as you can.",
        "parameters": {
            "type": "object",
            "properties": {"question": {"type": "string", "description": "The question you want to ask to user."}},
            "required": ["question"],
        },
    },
    {
        "name": "finish",
        "description": "Finish the task and give your answer.",
        "parameters": {
            "type": "object",
            "properties": {"answer": {"type": "string", "description": "Your answer for the task."}},
            "required": ["answer"],
        },
    },
]


def test_the_shipped_library_is_toolEyes_568_tools_and_serves_every_test_query():
    files = sorted((DATA / "tools").glob("*/*.json"))
    functions = [f for path in files for f in json.loads(path.read_text(encoding="utf-8"))]
    assert (len(files), len(functions)) == (95, 568)  # ToolEyes' README: 568 tools (its functions)
    assert not {f["name"] for f in functions} & {"ask_to_user", "finish"}
    registry = ToolRegistry.load([DATA / "tools"])
    assert not registry.unreadable
    # every one of ToolEyes' 382 test queries names a tool folder the registry serves, with its functions
    queries = json.loads((DATA / "scenario_data_raw.json").read_text(encoding="utf-8"))
    assert len(queries) == 382
    for query in queries:
        category, tool = query["path"].split("/")[-2:]
        assert registry.find_tool(category, tool).apis, query["path"]


def test_a_library_checkout_is_copied_without_the_agent_controls(tmp_path):
    config = tmp_path / "Tool_Library" / "Advice" / "Advice_slip" / "config_gpt4.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps(ADVICE_SLIP), encoding="utf-8")
    assert write_tools_folder(tmp_path / "Tool_Library", tmp_path / "tools") == {
        "categories": 1,
        "tools": 1,
        "functions": 3,
    }
    assert library_tools(tmp_path / "Tool_Library")[("Advice", "Advice_slip")] == ADVICE_SLIP[:3]
    doc = ToolRegistry.load([tmp_path / "tools"]).resolve("Advice", "Advice_slip", "advice_by_id")
    assert doc.required_parameters == [
        {
            "name": "slip_id",
            "type": "STRING",
            "default": "",
            "description": "The unique ID of this advice slip.",
            "schema": ADVICE_SLIP[1]["parameters"]["properties"]["slip_id"],
        }
    ]
    assert doc.description.startswith("If an advice slip is found") and doc.method == "POST"
    # the shipped copy holds the same functions for this tool
    assert json.loads((DATA / "tools" / "Advice" / "Advice_slip.json").read_text()) == ADVICE_SLIP[:3]


@contextlib.contextmanager
def simulator_engine(seen: list):
    """A stand-in for the simulator's OpenAI-compatible engine: keeps the prompts, answers one observation."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict:
        seen.append((await request.json())["messages"])
        answer = json.dumps({"error": "", "response": {"total_results": "1", "query": "studying"}})
        return {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": "sim",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    with serve_in_thread(app, free_port(), access_log=False) as url:
        yield url + "/v1"


def test_a_toolEyes_tool_answers_through_the_virtual_server(tmp_path):
    seen: list = []
    with simulator_engine(seen) as engine:
        settings = ServerSettings(
            api_base=engine,
            model="sim",
            tools_folder=[DATA / "tools"],
            port=free_port(),
            cache_path=tmp_path / "cache.sqlite",
            log_file=tmp_path / "requests.log",
            log_level="warning",
        )
        with serve_in_thread(create_app(settings), settings.port, timeout=60, access_log=False) as url:
            body = {
                "category": "Advice",
                "tool_name": "Advice_slip",
                "api_name": "search_advice",
                "tool_input": json.dumps({"query": "studying"}),
            }
            first = httpx.post(url + "/virtual", json=body, timeout=30).json()
            again = httpx.post(url + "/virtual", json=body, timeout=30).json()
    assert first == again == {"error": "", "response": {"total_results": "1", "query": "studying"}}
    simulated = [m for m in seen if m[0]["role"] == "system"]  # not the server's start-up probe ("ping")
    assert len(simulated) == 1  # the second call is the cache's
    prompt = json.dumps(simulated[0])
    assert "The search query provided." in prompt and "search_advice" in prompt  # ToolEyes' own doc text
    outcomes = [json.loads(line)["outcome"] for line in (tmp_path / "requests.log").read_text().splitlines()]
    assert outcomes == ["simulated", "hit"]
