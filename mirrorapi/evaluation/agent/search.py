"""One query's search: the model, the functions, the server, the tree (CoT chain or DFS tree).

The model acts through the engine's tool calls (`agent-v1`: the functions are sent as `tools`), or,
for a model whose engine cannot pass tool calls for its chat template, through text (`agent-react-v1`,
`mirrorapi.prompts.agent_formats`): the functions are listed in the system prompt, each reply is parsed into one
call (`parse_react_step`) and the history is sent as text (`react_conversation`). Either way the
tree and the answer files hold the same StableToolBench messages (`tool_calls`, `tool` results).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from mirrorapi.engine_client import EngineClient, EngineError
from mirrorapi.evaluation.agent.environment import (
    FINAL_ANSWER,
    FINISH,
    GAVE_UP,
    NO_SUCH_FUNCTION,
    QueryTools,
    VirtualClient,
    VirtualServerError,
    cut_observation,
    finish_status,
    unknown_function_observation,
)
from mirrorapi.evaluation.agent.settings import AgentSettings, check_method
from mirrorapi.prompts.agent_formats import (
    TEXT_AGENT_FORMATS,
    agent_diversity_message,
    agent_messages,
    parse_react_step,
    react_conversation,
    react_grammar,
)

logger = logging.getLogger(__name__)

# Upstream's back-off lengths (DFS): a final answer ends the search, a give-up goes back two levels.
_GIVE_UP_BACK, _STOP = 2, 10**6
# Engine answers that say "this request cannot be answered" (longer than the model's context: a 413, or a 400 saying
# so in vLLM's, llama.cpp's or OpenAI's words) end the chain. Other errors (404 wrong URL, 401, 5xx, and any other 400:
# vLLM without --enable-auto-tool-choice refuses every request with tools so) fail the query, which a rerun retries.
_PAST_CONTEXT = re.compile(
    r"context length|context size|context window|context_length|too many tokens|prompt is too long", re.IGNORECASE
)


class QueryFailed(Exception):
    """One query could not be finished (engine or server down); nothing is written for it."""


# ------------------------------------------------------------------------------------ the tree
@dataclass(eq=False)
class Node:
    node_type: str  # Thought | Action | Action Input
    description: str = ""
    parent: Node | None = None
    depth: int = 0
    observation: str = ""
    observation_code: int | None = None
    pruned: bool = False
    terminal: bool = False  # a final answer
    finished: bool = False
    expand_num: int = 0
    messages: list = field(default_factory=list)  # the conversation up to this node (shared dicts)
    children: list = field(default_factory=list)

    def child(self, node_type: str, description: str, messages: list) -> Node:
        node = Node(node_type, description, parent=self, depth=self.depth + 1, messages=messages)
        self.children.append(node)
        return node

    def to_json(self, recursive: bool = False) -> dict:
        out = {
            "is_terminal": self.terminal,
            "pruned": self.pruned,
            "finished": self.finished,
            "depth": self.depth,
            "node_type": self.node_type,
            "description": self.description,
            "Elo": 1000.0,
        }
        if self.node_type == "Action Input":
            out["observation"] = self.observation  # always present: the converter reads it on every Action Input
        elif self.observation:
            out["observation"] = self.observation
        if self.observation_code is not None:
            out["observation_code"] = self.observation_code
        out["child_count"] = len(self.children)
        out["expand_num"] = self.expand_num
        if self.node_type == "Action Input":
            out["io_state"] = {}
        if recursive:
            out["children"] = [c.to_json(True) for c in self.children]
        return out

    def path(self) -> list[Node]:
        """The nodes from the root's first child down to this node."""
        nodes, node = [], self
        while node.parent is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def size(self) -> int:
        return 1 + sum(c.size() for c in self.children)

    def height(self) -> int:
        return 1 + max((c.height() for c in self.children), default=0)


def train_messages(node: Node) -> list[list[dict]]:
    """The conversation up to each assistant message on the path to `node` (upstream's `train_messages`)."""
    messages = node.messages
    ends = [i + 1 for i, m in enumerate(messages) if m.get("role") == "assistant"]
    return [list(messages[:end]) for end in ends]


# ------------------------------------------------------------------------------------ one query
REACT_STOP = "\nObservation:"


def react_as_tool_calls(message: dict) -> dict:
    """An `agent-react-v1` reply as the assistant message of a tool-calling model: the thought as content,
    the action (if any) as its one tool call."""
    text = content if isinstance(content := message.get("content"), str) else ""
    step = parse_react_step(text)
    if step.problem:
        logger.debug("agent-react-v1 reply: %s: %r", step.problem, text[:200])
    calls = (
        [{"type": "function", "function": {"name": step.action, "arguments": step.arguments}}]
        if step.action is not None
        else []
    )
    # No thought written: no content, as a tool-calling model's null content beside its call (no Thought node).
    return {
        "role": "assistant",
        "content": step.thought if step.thought.strip() or not calls else None,
        "tool_calls": calls,
    }


class ModelRefused(Exception):
    """The engine rejected the request itself (HTTP 4xx): the chain ends here, as upstream ends it."""


class QueryRun:
    """One query's search: the model, the functions, the server, the tree."""

    def __init__(
        self,
        query: dict,
        tools: QueryTools,
        engine: EngineClient,
        server: VirtualClient,
        settings: AgentSettings,
        system_prompt: str | None,
    ):
        self.query, self.tools, self.engine, self.server, self.settings = query, tools, engine, server, settings
        self.root = Node(
            "Action Input",
            messages=agent_messages(
                str(query.get("query", "")),
                tools.tool_descriptions,
                settings.prompt_format,
                system_prompt,
                tools.schemas,
            ),
        )
        self.query_count = self.total_tokens = self.expanded = 0
        self.terminals: list[Node] = []
        self.give_ups: list[Node] = []
        self.text_protocol = settings.prompt_format in TEXT_AGENT_FORMATS
        if self.text_protocol:
            # Ends the reply where the model would start inventing the function's result (and saves its tokens).
            self._extra: dict = {"stop": [REACT_STOP]}
            if settings.react_grammar:
                self._extra["grammar"] = react_grammar([f.name for f in tools.functions] + [FINISH])
        else:
            self._extra = {"tools": tools.schemas}
            if settings.tool_choice:
                self._extra["tool_choice"] = settings.tool_choice

    async def _ask(self, messages: list[dict]) -> dict:
        self.query_count += 1
        if self.text_protocol:
            messages = react_conversation(messages)
        try:
            message, usage, _ = await self.engine.complete(
                messages,
                temperature=self.settings.temperature,
                max_tokens=self.settings.max_tokens,
                extra_body=self._extra,
            )
        except EngineError as exc:
            if exc.kind == "http" and (exc.status == 413 or (exc.status == 400 and _PAST_CONTEXT.search(str(exc)))):
                raise ModelRefused(str(exc)) from None
            raise QueryFailed(f"agent engine: {exc}") from None
        self.total_tokens += int(usage.get("total_tokens") or 0)
        return react_as_tool_calls(message) if self.text_protocol else message

    async def step(self, node: Node, extra_message: dict | None = None, budgeted: bool = False) -> Node | None:
        """One model call from `node`; returns the last node it added. `budgeted` (DFS): None, adding nothing, when
        this call spent the last of `max_query_count`: upstream's DFS counts the call and stops before it reads
        the reply (DFS.py: `if self.query_count >= max_query_count: return 100000`)."""
        prompt = node.messages + [extra_message] if extra_message else node.messages
        try:
            message = await self._ask(prompt)
        except ModelRefused as exc:
            leaf = node.child("Thought", f"The agent engine refused the request: {exc}", node.messages)
            leaf.observation_code, leaf.pruned = 1, True
            return leaf
        if budgeted and self.query_count >= self.settings.max_query_count:
            return None
        text = message.get("content")
        written = isinstance(text, str)
        content = text if isinstance(text, str) else ""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        history = list(node.messages)  # the extra (diversity) message is not kept for the children
        current = node
        # A Thought node for any content the engine sent, "" and whitespace too, as upstream makes one whenever
        # `content` is not None (single_chain.py, DFS.py): it counts against the depth budget there.
        if written or not calls:
            current = current.child("Thought", content, history)
        if not calls:
            history.append({"role": "assistant", "content": content})
            return current
        assistant: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": []}
        history.append(assistant)
        for index, call in enumerate(calls):
            function = found if isinstance(found := call.get("function"), dict) else {}
            name = str(function.get("name") or "")
            arguments = function.get("arguments")
            if not isinstance(arguments, str):  # some servers send an object
                arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
            # Unique along a path, whatever ids the engine gives, and 9 letters or digits: Mistral's chat templates
            # (and mistral_common) refuse any other id in the next request's history.
            call_id = f"c{node.depth:04d}{index:04d}"
            action = current.child("Action", name, history)
            observation, status = await self._run(name, arguments)
            observation = cut_observation(observation, self.settings.max_observation_length)
            shown_name = name if status != NO_SUCH_FUNCTION else "invalid_hallucination_function_name"
            assistant["tool_calls"].append(
                {"id": call_id, "type": "function", "function": {"name": shown_name, "arguments": arguments}}
            )
            history.append({"role": "tool", "name": shown_name, "content": observation, "tool_call_id": call_id})
            current = action.child("Action Input", arguments, history)
            current.observation, current.observation_code = observation, status
            if status == GAVE_UP:
                current.pruned = True
            if status == FINAL_ANSWER:
                current.terminal = True
            if name == FINISH and status in (GAVE_UP, FINAL_ANSWER):
                break  # calls after Finish are not run (the converter also stops at Finish)
        return current

    async def _run(self, name: str, arguments: str) -> tuple[str, int]:
        if name == FINISH:
            return finish_status(arguments)
        function = self.tools.find(name)
        if function is None:
            return unknown_function_observation(name), NO_SUCH_FUNCTION
        try:
            return await self.server.call(function, arguments)
        except VirtualServerError as exc:
            raise QueryFailed(str(exc)) from None

    # ------------------------------------------------------------------------------- CoT
    async def chain(self) -> Node:
        node = self.root
        while True:
            stepped = await self.step(node)
            assert stepped is not None  # only a budgeted step adds nothing
            node = stepped
            if node.depth >= self.settings.single_chain_max_step and not node.terminal:
                node.pruned = True
            if node.pruned or node.terminal:
                return node

    # ------------------------------------------------------------------------------- DFS
    def _diversity(self, node: Node) -> dict | None:
        candidates = []
        for child in node.children:
            leaf = child
            while not leaf.terminal and leaf.node_type != "Action Input" and leaf.children:
                leaf = leaf.children[0]
            if leaf.node_type == "Action Input":
                candidates.append(
                    {
                        "name": leaf.parent.description,
                        "arguments": leaf.description,
                        "function_output": leaf.observation,
                    }
                )
        return agent_diversity_message(candidates, node.observation) if candidates else None

    async def search(self, node: Node, width: int) -> int:
        """Expand `node` depth-first; returns how many levels to go back (upstream's DFSDT)."""
        node.expand_num = self.expanded
        self.expanded += 1
        if node.terminal:
            self.terminals.append(node)
            return _STOP
        if node.depth >= self.settings.single_chain_max_step or node.pruned:
            node.pruned = True
            if node.observation_code == GAVE_UP:
                self.give_ups.append(node)
                return _GIVE_UP_BACK
            return 1
        for _ in range(width):
            if self.query_count >= self.settings.max_query_count:
                return _STOP
            leaf = await self.step(node, self._diversity(node) if node.children else None, budgeted=True)
            if leaf is None:
                return _STOP
            back = await self.search(leaf, width)
            if self.terminals or back >= _STOP:
                return _STOP
            if back > 1:
                return back - 1
        return 1


def _finish_args(node: Node | None) -> str:
    return node.description if node is not None and node.node_type == "Action Input" else ""


async def run_query(
    query: dict,
    tools: QueryTools,
    engine: EngineClient,
    server: VirtualClient,
    settings: AgentSettings,
    system_prompt: str | None = None,
) -> dict:
    """Run one query with `settings.method`; the raw answer file's content."""
    width = check_method(settings.method)
    run = QueryRun(query, tools, engine, server, settings, system_prompt)
    generation = {
        "valid_data": False,
        "final_answer": "",
        "function": tools.schemas,
        "query_count": 0,
        "total_tokens": 0,
        "train_messages": [],
        "chain": [],
        "query": str(query.get("query", "")),
    }
    if settings.method == "CoT@1":
        leaf = await run.chain()
        win = leaf.terminal
        chain = [n.to_json() for n in leaf.path()]
        data = {
            "win": win,
            "try_count": 1,
            "trys": [{"chain": chain, "win": win}],
            "compare_candidates": [chain] if win else [],
            "forward_args": {"single_chain_max_step": settings.single_chain_max_step, "pass_at": 1, "answer": 1},
        }
        if win:
            generation.update(valid_data=True, final_answer=_finish_args(leaf), train_messages=train_messages(leaf))
    else:
        await run.search(run.root, width)
        answer = run.terminals[0] if run.terminals else None
        data = {
            "win": answer is not None,
            "tree": {"size": run.root.size(), "max_length": run.root.height(), "tree": run.root.to_json(True)},
            "forward_args": {
                "single_chain_max_step": settings.single_chain_max_step,
                "tree_beam_size": width,
                "max_query_count": settings.max_query_count,
                "answer": 1,
                "with_filter": False,
            },
            "compare_candidates": [[n.to_json() for n in t.path()] for t in run.terminals],
        }
        generation["finish_type"] = "give_answer"
        # No final answer: upstream reports a random give-up node; we report the first one (reproducible).
        chosen = answer or (run.give_ups[0] if run.give_ups else None)
        if chosen is not None:
            generation.update(
                valid_data=True,
                final_answer=_finish_args(chosen),
                train_messages=train_messages(chosen),
                finish_type="give_answer" if answer is not None else "give_up",
            )
    generation.update(query_count=run.query_count, total_tokens=run.total_tokens)
    data["answer_generation"] = generation
    data["agent_settings"] = settings.record()
    return data
