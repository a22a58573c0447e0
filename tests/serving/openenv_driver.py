"""Drives the server's OpenEnv episodes with OpenEnv's own clients (openenv-core), as a trainer would; run by
tests/serving/test_openenv.py in the client's venv (`make openenv-client`): `python openenv_driver.py`, then one line
`URL SCENARIO` on stdin for each scenario, answered by one JSON line: {"result": what the clients returned} or
{"error": the traceback}. One process for a module's scenarios: importing OpenEnv's client takes ~6 s (openenv.core
imports gradio)."""

import asyncio
import json
import sys
import traceback

from openenv.core.env_server.mcp_types import CallToolAction, ListToolsObservation
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

TOOLSET = "tool=APIBank/apibank_account"
LOGIN = {"username": "JaneSmith", "password": "password"}


async def tool_client(url: str) -> dict:
    """MCPToolClient: reset on a toolset, list_tools, call_tool (a hit, a refusal, an unknown tool), state."""
    async with MCPToolClient(base_url=url) as env:
        reset = await env.reset(toolset=TOOLSET)
        assert isinstance(reset.observation, ListToolsObservation)
        tools = await env.list_tools(use_cache=False)
        login = await env.call_tool("getusertoken", **LOGIN)
        invalid = await env.step(CallToolAction(tool_name="getusertoken", arguments={"username": "JaneSmith"}))
        try:
            await env.call_tool("no_such_tool")
            unknown = None
        except RuntimeError as exc:
            unknown = str(exc)
        state = await env.state()
        return {
            "reset_tools": sorted(t.name for t in reset.observation.tools),
            "reset_metadata": reset.observation.metadata,
            "tools": sorted(t.name for t in tools),
            "schema": next(t.input_schema for t in tools if t.name == "getusertoken"),
            "login": login,
            "invalid": {
                "result": invalid.observation.result,
                "metadata": invalid.observation.metadata,
                "reward": invalid.reward,
                "done": invalid.done,
            },
            "unknown": unknown,
            "state": {"episode_id": state.episode_id, "step_count": state.step_count},
        }


async def generic_client(url: str) -> dict:
    """GenericEnvClient (raw dictionaries): an episode with a chosen id, a miss and its replay, the whole state."""
    async with GenericEnvClient(base_url=url) as env:
        reset = await env.reset(episode_id="episode-7", toolset=TOOLSET)
        steps = []
        for arguments in ({"username": "new user", "password": "pw"}, {"username": "new user", "password": "pw2"}):
            step = await env.step({"type": "call_tool", "tool_name": "getusertoken", "arguments": arguments})
            steps.append(step.observation)
        state = await env.state()
        return {"reset": reset.observation, "steps": steps, "state": state}


async def capacity(url: str) -> dict:
    """max_episodes=2 on the server: two episodes open, the third is refused with OpenEnv's capacity error."""
    first, second = GenericEnvClient(base_url=url), GenericEnvClient(base_url=url)
    async with first, second:
        await first.reset(toolset=TOOLSET)
        await second.reset(toolset=TOOLSET)
        try:
            async with GenericEnvClient(base_url=url) as third:
                await third.reset(toolset=TOOLSET)
                refused = None
        except (RuntimeError, ConnectionError) as exc:
            refused = str(exc)
    async with GenericEnvClient(base_url=url) as again:  # room again once they are closed
        reopened = (await again.reset(toolset=TOOLSET)).observation["toolset"]
    return {"refused": refused, "reopened": reopened}


async def refused_without_key(url: str) -> dict:
    try:
        async with GenericEnvClient(base_url=url) as env:
            await env.reset(toolset=TOOLSET)
        return {"refused": None}
    except (RuntimeError, ConnectionError) as exc:
        return {"refused": str(exc)}


async def documented_environment(url: str) -> dict:
    """The TRL environment class of docs/serving.md, run as a trainer would (TRL itself is not in this venv: a
    stand-in module named `trl` lets the block import; the class does not use it)."""
    import re
    import types
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "serving.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"^```python openenv\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    sys.modules.setdefault("trl", types.ModuleType("trl")).GRPOTrainer = object
    namespace: dict = {}
    exec(compile(block.replace("127.0.0.1:8080", url.split("//")[1]), "docs/serving.md", "exec"), namespace)

    def run() -> dict:
        environment = namespace["VirtualApis"]()
        prompt = environment.reset(query_id="77", prompt="ignored")
        answer = environment.call_api("getusertoken", json.dumps(LOGIN))
        unknown = environment.call_api("no_such_tool", "{}")
        try:  # a miss, and the engine is down: sent three times, then the server's error
            missed = environment.call_api("getusertoken", json.dumps({"username": "nobody", "password": "x"}))
        except RuntimeError as exc:
            missed = f"raised: {exc}"
        environment.env.close()
        return {"prompt": prompt, "answer": json.loads(answer), "unknown": unknown, "missed": missed}

    return await asyncio.get_running_loop().run_in_executor(None, run)  # the sync client runs its own loop


SCENARIOS = {
    "tool_client": tool_client,
    "generic_client": generic_client,
    "capacity": capacity,
    "refused_without_key": refused_without_key,
    "documented_environment": documented_environment,
}

if __name__ == "__main__":
    for line in sys.stdin:
        url, scenario = line.split()
        try:
            reply = {"result": asyncio.run(SCENARIOS[scenario](url))}
        except Exception:
            reply = {"error": traceback.format_exc()}
        print(json.dumps(reply), flush=True)
