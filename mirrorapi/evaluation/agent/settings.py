"""What an agent run is asked to do (`AgentSettings`, recorded in every answer) and its methods.

Methods (StableToolBench's, notes §6):
- `CoT@1`: one chain. Each model call adds a Thought node (its text, whenever the reply has content, "" too;
  none for a null content beside tool calls, as upstream) and, per tool call, an Action
  node (the function name) and an Action Input node (the arguments, the observation). The chain ends
  on a final answer, on `give_up_and_restart`, or when a node reaches depth `single_chain_max_step`.
- `DFS_woFilter_w<N>`: depth-first tree search. Each node gets up to N children; the second and later
  children are asked for with a message listing the earlier actions from that node. A final answer
  ends the search; a give-up backtracks two levels, a dead end (depth limit) one; the search also ends
  on the `max_query_count`-th model call, whose reply is not used (as upstream's DFS).
Budgets default to what StableToolBench's pipeline runs with: depth 12, 200 model calls.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from mirrorapi.command_line import Flag
from mirrorapi.engine_client import NO_API_KEY
from mirrorapi.prompts.agent_formats import AGENT_FORMATS, DEFAULT_AGENT_FORMAT

METHODS = ("CoT@1", "DFS_woFilter_w2")
_DFS = re.compile(r"^DFS_woFilter_w(\d+)$")


class AgentRunError(Exception):
    """A run that cannot start: bad queries, no tools, an unreachable engine or server."""


@pydantic_dataclass
class AgentSettings:
    """What produced a run: recorded in every raw and converted answer. Each field is also a flag of
    eval/run_agent.py and `mirrorapi benchmark` (mirrorapi/command_line.py), its help the description."""

    server: str = Field(description="The /virtual URL, e.g. http://127.0.0.1:8080/virtual.")
    base_urls: Annotated[list[str], Flag("base-url", "URL")] = Field(
        description=("OpenAI-compatible base URL(s) of the agent model, e.g. http://127.0.0.1:8000/v1.")
    )
    model: str = Field(description="The agent's model name on that engine.")
    method: str = Field(default="CoT@1", description=" or ".join(METHODS) + " (DFS_woFilter_w<width>).")
    api_key: str = Field(default=NO_API_KEY, description="API key of the agent engine.")
    temperature: float = Field(default=0.0, ge=0, description="Agent temperature.")
    max_tokens: int = Field(default=1024, ge=1, description="Tokens per agent step.")
    single_chain_max_step: int = Field(
        default=12, ge=1, description="Depth budget of a chain / tree path (StableToolBench: 12)."
    )
    max_query_count: int = Field(
        default=200, ge=1, description="Model calls per query for DFS (StableToolBench: 200)."
    )
    max_observation_length: int = Field(
        default=1024, ge=1, description=("Observations are cut to this many characters plus '...'.")
    )
    concurrency: int | None = Field(
        default=None,
        ge=1,
        description=("Queries in flight (default: 16 on vLLM, 2 on other engines such as transformers serve)."),
    )
    timeout: float = Field(default=300.0, gt=0, description="Seconds per agent call, retries included.")
    server_timeout: float = Field(default=120.0, gt=0, description="Seconds per /virtual call.")
    prompt_format: Literal[AGENT_FORMATS] = Field(  # type: ignore[valid-type]
        default=DEFAULT_AGENT_FORMAT,
        description=(
            "agent-v1: the functions go to the engine as OpenAI tools and the model answers with tool calls; "
            "agent-react-v1: a text protocol (Thought / Action / Action Input) for models whose engine cannot pass "
            "tool calls, e.g. SmolLM2."
        ),
    )
    system_prompt_file: str | None = Field(
        default=None,
        description=("Use this text as the agent's system prompt ({tools} is replaced by the tool list)."),
    )
    tool_choice: str | None = Field(
        default=None, description=('Sent as the request\'s tool_choice when given ("auto", "required").')
    )
    react_grammar: bool = Field(
        default=False,
        description=(
            "agent-react-v1 only: send a GBNF grammar of the reply layout (one thought line, one of the query's "
            "functions, a JSON object) as the request's `grammar`, which llama.cpp's servers enforce, so a model that "
            "does not keep the layout still acts."
        ),
    )

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str) -> str:
        check_method(method)
        return method

    def record(self) -> dict:
        """The settings as they go into answer files (no API key)."""
        return {k: v for k, v in asdict(self).items() if k not in ("api_key", "concurrency")}


def check_method(method: str) -> int:
    """The width of a method (1 for CoT@1); ValueError for an unknown method."""
    if method == "CoT@1":
        return 1
    found = _DFS.match(method)
    if found and int(found.group(1)) >= 1:
        return int(found.group(1))
    raise ValueError(f"unknown method {method!r}; use CoT@1 or DFS_woFilter_w<width> (e.g. DFS_woFilter_w2)")
