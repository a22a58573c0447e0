"""Drive episodes of the virtual API server with OpenEnv's client, as an RL trainer's rollouts would: each
episode resets on a toolset, lists its tools, and calls them in turn with arguments made from their schemas.
Nothing is trained; the JSON printed at the end says what was answered and how (cache hit or simulation).

    make openenv-client        # OpenEnv's client (openenv-core) in .venv-openenv
    .venv-openenv/bin/python scripts/openenv_episodes.py --url http://127.0.0.1:8080 --episodes 64

A trainer does the same per rollout: `MCPToolClient(base_url=URL)`, `reset(toolset=...)` (or `task=<query_id>`),
then one `call_tool` per tool call of the policy (docs/serving.md, "RL episodes: OpenEnv").
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import time


def example_arguments(schema: dict, episode: int, step: int) -> dict:
    """Arguments of a tool's input schema: its required parameters, filled with values of their types."""
    values = {"integer": episode, "number": step, "boolean": True, "array": [], "object": {}}
    properties = schema.get("properties", {})
    return {
        name: values.get(properties.get(name, {}).get("type"), f"example {episode}-{step}")
        for name in schema.get("required", [])
    }


async def episode(url: str, toolset: str, number: int, steps: int, seen: collections.Counter) -> None:
    from openenv.core.env_server.mcp_types import CallToolAction  # imported already, by `main`
    from openenv.core.mcp_client import MCPToolClient

    async with MCPToolClient(base_url=url) as env:
        await env.reset(toolset=toolset)
        tools = await env.list_tools()
        for step in range(steps):
            tool = tools[(number + step) % len(tools)]
            arguments = example_arguments(tool.input_schema, number, step)
            result = await env.step(CallToolAction(tool_name=tool.name, arguments=arguments))
            answer, metadata = result.observation.result, result.observation.metadata
            seen[(metadata.get("cache"), "api error" if answer.get("error") else "answered")] += 1


async def main(args: argparse.Namespace) -> dict:
    # OpenEnv's client is in its own venv (.venv-openenv); imported here so that --help needs none, and before the
    # clock starts (the import takes seconds, which the rate is not about).
    import openenv.core.env_server.mcp_types  # noqa: F401
    import openenv.core.mcp_client  # noqa: F401

    seen: collections.Counter = collections.Counter()
    start = time.perf_counter()
    await asyncio.gather(*(episode(args.url, args.toolset, n, args.steps, seen) for n in range(args.episodes)))
    seconds = time.perf_counter() - start
    return {
        "episodes": args.episodes,
        "steps": sum(seen.values()),
        "seconds": round(seconds, 2),
        "steps_per_second": round(sum(seen.values()) / seconds, 1),
        "by_cache_and_answer": {f"{cache}/{answer}": n for (cache, answer), n in sorted(seen.items())},
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="The virtual API server.")
    parser.add_argument("--episodes", type=int, default=64, help="Episodes run at once.")
    parser.add_argument("--steps", type=int, default=4, help="Tool calls per episode.")
    parser.add_argument(
        "--toolset",
        default="tool=APIBank/apibank_account",
        help="The episodes' toolset, in /mcp's toolset syntax (default: a tool of the sample tools).",
    )
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
