"""The benchmark's agent runner: an OpenAI-compatible tool-calling model against `/virtual`.

Methods (StableToolBench's, notes §6):
- `CoT@1`: one chain. Each model call adds a Thought node (its text) and, per tool call, an Action
  node (the function name) and an Action Input node (the arguments, the observation). The chain ends
  on a final answer, on `give_up_and_restart`, or when a node reaches depth `single_chain_max_step`.
- `DFS_woFilter_w<N>`: depth-first tree search. Each node gets up to N children; the second and later
  children are asked for with a message listing the earlier actions from that node. A final answer
  ends the search; a give-up backtracks two levels, a dead end (depth limit) one; the search also ends
  after `max_query_count` model calls.
Budgets default to what StableToolBench's pipeline runs with: depth 12, 200 model calls.

The model acts through the engine's tool calls (`agent-v1`: the functions are sent as `tools`), or,
for a model whose engine cannot pass tool calls for its chat template, through text (`agent-react-v1`,
mirrorapi/prompts.py): the functions are listed in the system prompt, each reply is parsed into one
call (`parse_react_step`) and the history is sent as text (`react_conversation`). Either way the
tree and the answer files hold the same StableToolBench messages (`tool_calls`, `tool` results).

Every finished query is written at once as `<out>/answer/<group>/<query_id>_<method>.json` in
StableToolBench's raw answer format (what its `convert_to_answer_format.py` reads: assistant
messages carry `tool_calls`, never a `function_call` key, tool messages carry `tool_call_id`; the
nodes of `trys` / `tree` carry `observation`), and the group's converted file
`<out>/<group>.json` (what `eval/fac.py` reads) is rebuilt from all raw files of the group. The agent
settings go into both (`agent_settings`, and `agent` in each converted record).

A query fails, is reported on one line and is left unwritten (a rerun retries it) when the agent
engine or the virtual server cannot be reached or times out. A model error that retrying cannot fix
(HTTP 400 / 413, e.g. a prompt longer than the model's context) ends the chain like an error message
does upstream: the answer is written, without a final answer.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass
from tqdm import tqdm

from mirrorapi.command_line import Flag
from mirrorapi.engine_client import EngineClient, EngineError
from mirrorapi.evaluation.agent_env import (
    FINAL_ANSWER,
    FINISH,
    GAVE_UP,
    NO_SUCH_FUNCTION,
    QueryError,
    QueryTools,
    VirtualClient,
    VirtualServerError,
    cut_observation,
    finish_status,
    query_tools,
    unknown_function_observation,
)
from mirrorapi.evaluation.answer_convert import convert_answer_folder
from mirrorapi.evaluation.judging import engine_concurrency
from mirrorapi.prompts import (
    AGENT_FORMATS,
    DEFAULT_AGENT_FORMAT,
    TEXT_AGENT_FORMATS,
    agent_diversity_message,
    agent_messages,
    parse_react_step,
    react_conversation,
    react_grammar,
)
from mirrorapi.tools import RegistryError, ToolRegistry

logger = logging.getLogger(__name__)

METHODS = ("CoT@1", "DFS_woFilter_w2")
_DFS = re.compile(r"^DFS_woFilter_w(\d+)$")
ANSWER_DIR = "answer"
# Upstream's back-off lengths (DFS): a final answer ends the search, a give-up goes back two levels.
_GIVE_UP_BACK, _STOP = 2, 10 ** 6
# Engine answers that say "this request cannot be answered" (e.g. longer than the model's context):
# they end the chain. Other errors (404 wrong URL, 401, 5xx) fail the query, which a rerun retries.
_REFUSALS = (400, 413)


class AgentRunError(Exception):
    """A run that cannot start: bad queries, no tools, an unreachable engine or server."""


class QueryFailed(Exception):
    """One query could not be finished (engine or server down); nothing is written for it."""


@pydantic_dataclass
class AgentSettings:
    """What produced a run: recorded in every raw and converted answer. Each field is also a flag of
    eval/run_agent.py and `mirrorapi benchmark` (mirrorapi/command_line.py), its help the description."""

    server: str = Field(description="The /virtual URL, e.g. http://127.0.0.1:8080/virtual.")
    base_urls: Annotated[list[str], Flag("base-url", "URL")] = Field(description=(
        "OpenAI-compatible base URL(s) of the agent model, e.g. http://127.0.0.1:8000/v1."))
    model: str = Field(description="The agent's model name on that engine.")
    method: str = Field(default="CoT@1", description=" or ".join(METHODS) + " (DFS_woFilter_w<width>).")
    api_key: str = Field(default="EMPTY", description="API key of the agent engine.")
    temperature: float = Field(default=0.0, ge=0, description="Agent temperature.")
    max_tokens: int = Field(default=1024, ge=1, description="Tokens per agent step.")
    single_chain_max_step: int = Field(default=12, ge=1, description="Depth budget of a chain / tree path "
                                       "(StableToolBench: 12).")
    max_query_count: int = Field(default=200, ge=1,
                                 description="Model calls per query for DFS (StableToolBench: 200).")
    max_observation_length: int = Field(default=1024, ge=1, description=(
        "Observations are cut to this many characters plus '...'."))
    concurrency: int | None = Field(default=None, ge=1, description=(
        "Queries in flight (default: 16 on vLLM, 2 on other engines such as transformers serve)."))
    timeout: float = Field(default=300.0, gt=0, description="Seconds per agent call, retries included.")
    server_timeout: float = Field(default=120.0, gt=0, description="Seconds per /virtual call.")
    prompt_format: Literal[AGENT_FORMATS] = Field(  # type: ignore[valid-type]
        default=DEFAULT_AGENT_FORMAT, description=(
        "agent-v1: the functions go to the engine as OpenAI tools and the model answers with tool calls; "
        "agent-react-v1: a text protocol (Thought / Action / Action Input) for models whose engine cannot pass "
        "tool calls, e.g. SmolLM2."))
    system_prompt_file: str | None = Field(default=None, description=(
        "Use this text as the agent's system prompt ({tools} is replaced by the tool list)."))
    tool_choice: str | None = Field(default=None, description=(
        "Sent as the request's tool_choice when given (\"auto\", \"required\")."))
    react_grammar: bool = Field(default=False, description=(
        "agent-react-v1 only: send a GBNF grammar of the reply layout (one thought line, one of the query's "
        "functions, a JSON object) as the request's `grammar`, which llama.cpp's servers enforce, so a model that "
        "does not keep the layout still acts."))

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
        out = {"is_terminal": self.terminal, "pruned": self.pruned, "finished": self.finished,
               "depth": self.depth, "node_type": self.node_type, "description": self.description, "Elo": 1000.0}
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
    calls = [{"type": "function", "function": {"name": step.action, "arguments": step.arguments}}] \
        if step.action is not None else []
    return {"role": "assistant", "content": step.thought, "tool_calls": calls}


class ModelRefused(Exception):
    """The engine rejected the request itself (HTTP 4xx): the chain ends here, as upstream ends it."""


class QueryRun:
    """One query's search: the model, the functions, the server, the tree."""

    def __init__(self, query: dict, tools: QueryTools, engine: EngineClient, server: VirtualClient,
                 settings: AgentSettings, system_prompt: str | None):
        self.query, self.tools, self.engine, self.server, self.settings = query, tools, engine, server, settings
        self.root = Node("Action Input", messages=agent_messages(str(query.get("query", "")), tools.tool_descriptions,
                                                                 settings.prompt_format, system_prompt, tools.schemas))
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
            message, usage = await self.engine.complete(messages, temperature=self.settings.temperature,
                                                        max_tokens=self.settings.max_tokens, extra_body=self._extra)
        except EngineError as exc:
            if exc.kind == "http" and exc.status in _REFUSALS:
                raise ModelRefused(str(exc)) from None
            raise QueryFailed(f"agent engine: {exc}") from None
        self.total_tokens += int(usage.get("total_tokens") or 0)
        return react_as_tool_calls(message) if self.text_protocol else message

    async def step(self, node: Node, extra_message: dict | None = None) -> Node:
        """One model call from `node`; returns the last node it added."""
        prompt = node.messages + [extra_message] if extra_message else node.messages
        try:
            message = await self._ask(prompt)
        except ModelRefused as exc:
            leaf = node.child("Thought", f"The agent engine refused the request: {exc}", node.messages)
            leaf.observation_code, leaf.pruned = 1, True
            return leaf
        content = text if isinstance(text := message.get("content"), str) else ""
        calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        history = list(node.messages)  # the extra (diversity) message is not kept for the children
        current = node
        if content.strip() or not calls:
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
            call_id = f"call_{node.depth}_{index}"  # unique along a path, whatever ids the engine gives
            action = current.child("Action", name, history)
            observation, status = await self._run(name, arguments)
            observation = cut_observation(observation, self.settings.max_observation_length)
            shown_name = name if status != NO_SUCH_FUNCTION else "invalid_hallucination_function_name"
            assistant["tool_calls"].append({"id": call_id, "type": "function",
                                            "function": {"name": shown_name, "arguments": arguments}})
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
            node = await self.step(node)
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
                candidates.append({"name": leaf.parent.description, "arguments": leaf.description,
                                   "function_output": leaf.observation})
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
            leaf = await self.step(node, self._diversity(node) if node.children else None)
            back = await self.search(leaf, width)
            if self.terminals or back >= _STOP:
                return _STOP
            if back > 1:
                return back - 1
        return 1


def _finish_args(node: Node | None) -> str:
    return node.description if node is not None and node.node_type == "Action Input" else ""


async def run_query(query: dict, tools: QueryTools, engine: EngineClient, server: VirtualClient,
                    settings: AgentSettings, system_prompt: str | None = None) -> dict:
    """Run one query with `settings.method`; the raw answer file's content."""
    width = check_method(settings.method)
    run = QueryRun(query, tools, engine, server, settings, system_prompt)
    generation = {"valid_data": False, "final_answer": "", "function": tools.schemas, "query_count": 0,
                  "total_tokens": 0, "train_messages": [], "chain": [], "query": str(query.get("query", ""))}
    if settings.method == "CoT@1":
        leaf = await run.chain()
        win = leaf.terminal
        chain = [n.to_json() for n in leaf.path()]
        data = {"win": win, "try_count": 1, "trys": [{"chain": chain, "win": win}],
                "compare_candidates": [chain] if win else [],
                "forward_args": {"single_chain_max_step": settings.single_chain_max_step, "pass_at": 1, "answer": 1}}
        if win:
            generation.update(valid_data=True, final_answer=_finish_args(leaf), train_messages=train_messages(leaf))
    else:
        await run.search(run.root, width)
        answer = run.terminals[0] if run.terminals else None
        data = {"win": answer is not None,
                "tree": {"size": run.root.size(), "max_length": run.root.height(), "tree": run.root.to_json(True)},
                "forward_args": {"single_chain_max_step": settings.single_chain_max_step, "tree_beam_size": width,
                                 "max_query_count": settings.max_query_count, "answer": 1, "with_filter": False},
                "compare_candidates": [[n.to_json() for n in t.path()] for t in run.terminals]}
        generation["finish_type"] = "give_answer"
        # No final answer: upstream reports a random give-up node; we report the first one (reproducible).
        chosen = answer or (run.give_ups[0] if run.give_ups else None)
        if chosen is not None:
            generation.update(valid_data=True, final_answer=_finish_args(chosen), train_messages=train_messages(chosen),
                              finish_type="give_answer" if answer is not None else "give_up")
    generation.update(query_count=run.query_count, total_tokens=run.total_tokens)
    data["answer_generation"] = generation
    data["agent_settings"] = settings.record()
    return data


# ------------------------------------------------------------------------------------ the run
def load_queries(path: str | os.PathLike) -> dict[str, list[dict]]:
    """{group: [queries]} from a StableToolBench query file (`test_instruction/<group>.json`) or a folder."""
    path = Path(path)
    if not path.exists():
        raise AgentRunError(f"queries not found: {path} (expected a test_instruction file or folder)")
    files = sorted(p for p in path.iterdir() if p.suffix == ".json") if path.is_dir() else [path]
    groups = {}
    for file in files:
        try:
            data = json.loads(file.read_bytes())
        except (OSError, ValueError) as exc:
            raise AgentRunError(f"cannot read {file}: {exc}") from None
        if not isinstance(data, list) or not all(isinstance(q, dict) and "query" in q and "api_list" in q
                                                 for q in data):
            raise AgentRunError(f"{file}: expected a StableToolBench query file (a list of {{query, api_list, "
                                "query_id}})")
        groups[file.stem] = data
    if not groups:
        raise AgentRunError(f"no <group>.json query files in {path}")
    return groups


def raw_answer_path(out: Path, group: str, query_id: str, method: str) -> Path:
    return out / ANSWER_DIR / group / f"{query_id}_{method}.json"


def _finished(path: Path) -> dict | None:
    """The content of a finished raw answer file; None when absent or torn by an interrupted write (redo it)."""
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("answer_generation"), dict) else None


def _check_same_agent(data: dict, settings: AgentSettings, path: Path) -> None:
    """A rerun resumes a run; it must not mix another model's answers into it."""
    earlier = data.get("agent_settings")
    if not isinstance(earlier, dict):
        return
    if (earlier.get("model"), earlier.get("method")) != (settings.model, settings.method):
        raise AgentRunError(f"{path} holds an answer of model {earlier.get('model')!r} ({earlier.get('method')}), "
                            f"not {settings.model!r} ({settings.method}); use another --out")
    if earlier.get("prompt_format", "agent-v1") != settings.prompt_format:
        raise AgentRunError(f"{path} holds an answer in prompt format {earlier.get('prompt_format', 'agent-v1')!r}, "
                            f"not {settings.prompt_format!r}; use another --out")


def _write_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class AgentRun:
    done: int  # queries finished in this run
    skipped: int  # finished before (resume)
    failures: list[str]  # one line per query not finished
    converted: dict[str, Path | dict]  # group -> converted file (convert_answer_folder's answer)
    seconds: float = 0.0

    @property
    def complete(self) -> bool:
        return not self.failures


def load_registry(tools: list[str | os.PathLike], query_files: list[Path]) -> ToolRegistry:
    """The tools folder(s) first, then the query files (their api_list fills missing docs)."""
    try:
        registry = ToolRegistry.load(tools)
    except RegistryError as exc:
        raise AgentRunError(str(exc)) from None
    for file in query_files:
        registry.add_query_file(file)
    return registry


async def check_services(engine: EngineClient, server: VirtualClient) -> None:
    health = await engine.health()
    if not any(h.reachable for h in health):
        raise AgentRunError("the agent engine is not reachable (" + "; ".join(f"{h.base_url}: {h.detail}"
                                                                             for h in health) + "); start it or fix --base-url")
    problem = await server.probe()
    if problem:
        raise AgentRunError(f"{problem}; start it or fix --server")


async def run_agent_async(queries: str | os.PathLike, settings: AgentSettings, out: str | os.PathLike,
                          tools: Sequence[str | os.PathLike] = (), progress: bool = True,
                          limit: int | None = None) -> AgentRun:
    """Run every query of `queries` not finished in `out` yet; write raw + converted answers."""
    start = time.monotonic()
    check_method(settings.method)
    out = Path(out)
    groups = load_queries(queries)
    query_path = Path(queries)
    files = sorted(p for p in query_path.iterdir() if p.suffix == ".json") if query_path.is_dir() else [query_path]
    registry = load_registry(list(tools), files)
    system_prompt = Path(settings.system_prompt_file).read_text(encoding="utf-8") if settings.system_prompt_file \
        else None
    todo, skipped = [], 0
    for group, items in groups.items():
        for item in items[:limit] if limit else items:
            qid = str(item.get("query_id"))
            path = raw_answer_path(out, group, qid, settings.method)
            finished = _finished(path)
            if finished is not None:
                _check_same_agent(finished, settings, path)
                skipped += 1
            else:
                todo.append((group, qid, item))
    failures: list[str] = []
    done = 0
    if todo:
        engine = EngineClient(settings.base_urls, settings.model, api_key=settings.api_key, timeout=settings.timeout)
        server = VirtualClient(settings.server, timeout=settings.server_timeout)
        try:
            await check_services(engine, server)
            if settings.concurrency is None:
                settings = replace(settings, concurrency=await engine_concurrency(engine))
                logger.info("agent engine %s: %d queries in flight (--concurrency sets another number)",
                            settings.base_urls[0], settings.concurrency)
            done = await _run_all(todo, registry, engine, server, settings, system_prompt, out, failures, progress)
        finally:
            await engine.aclose()
            await server.aclose()
    converted = {group: convert_answer_folder(out / ANSWER_DIR / group, settings.method, out / f"{group}.json")
                 for group in groups if (out / ANSWER_DIR / group).is_dir()}
    return AgentRun(done, skipped, failures, converted, time.monotonic() - start)


async def _run_all(todo, registry, engine, server, settings, system_prompt, out, failures, progress) -> int:
    semaphore = asyncio.Semaphore(max(1, settings.concurrency))
    down = asyncio.Event()  # engine or server unreachable: the rest are not started
    bar = tqdm(total=len(todo), desc=f"{settings.model} {settings.method}", unit="query",
               disable=None if progress else True)
    done = 0

    async def one(group: str, qid: str, item: dict) -> None:
        nonlocal done
        async with semaphore:
            try:
                if down.is_set():
                    raise QueryFailed("not started: the agent engine or the virtual server is down")
                try:
                    tools = query_tools(item, registry)
                except QueryError as exc:
                    raise QueryFailed(str(exc)) from None
                data = await run_query(item, tools, engine, server, settings, system_prompt)
                _write_atomically(raw_answer_path(out, group, qid, settings.method), data)
                done += 1
            except QueryFailed as exc:
                line = f"query {group}/{qid} failed: {exc}"
                failures.append(line)
                bar.write(line)
                if "unreachable" in str(exc):
                    down.set()
            finally:
                bar.update()

    try:
        await asyncio.gather(*(one(*task) for task in todo))
    finally:
        bar.close()
    return done


def run_agent(queries, settings: AgentSettings, out, tools=(), progress: bool = True, limit: int | None = None) -> AgentRun:
    return asyncio.run(run_agent_async(queries, settings, out, tools, progress, limit))
