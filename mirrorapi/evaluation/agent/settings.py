"""What an agent run is asked to do (`AgentSettings`, recorded in every answer) and its methods.

Methods (StableToolBench's, notes §6):
- `CoT@1`: one chain. Each model call adds a Thought node (its text) and, per tool call, an Action
  node (the function name) and an Action Input node (the arguments, the observation). The chain ends
  on a final answer, on `give_up_and_restart`, or when a node reaches depth `single_chain_max_step`.
- `DFS_woFilter_w<N>`: depth-first tree search. Each node gets up to N children; the second and later
  children are asked for with a message listing the earlier actions from that node. A final answer
  ends the search; a give-up backtracks two levels, a dead end (depth limit) one; the search also ends
  after `max_query_count` model calls.
Budgets default to what StableToolBench's pipeline runs with: depth 12, 200 model calls.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

METHODS = ("CoT@1", "DFS_woFilter_w2")
_DFS = re.compile(r"^DFS_woFilter_w(\d+)$")


class AgentRunError(Exception):
    """A run that cannot start: bad queries, no tools, an unreachable engine or server."""


@dataclass
class AgentSettings:
    """What produced a run: recorded in every raw and converted answer."""

    server: str  # the /virtual URL
    base_urls: list[str]
    model: str
    method: str = "CoT@1"
    api_key: str = "EMPTY"
    temperature: float = 0.0
    max_tokens: int = 1024
    single_chain_max_step: int = 12
    max_query_count: int = 200
    max_observation_length: int = 1024
    concurrency: int | None = None  # queries in flight; None: suited to the engine (16 vLLM, 2 others)
    timeout: float = 300.0  # seconds per model call, retries included
    server_timeout: float = 120.0
    prompt_format: str = "agent-v1"
    system_prompt_file: str | None = None
    tool_choice: str | None = None  # sent as is when set ("auto", "required")
    react_grammar: bool = False  # text formats: constrain replies to the layout (llama.cpp's `grammar` field)

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
