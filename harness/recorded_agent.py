"""A RECORDED agent: an OpenAI-compatible engine that replays StableToolBench's real trajectories.

Not a model. It stands in for the agent model where no tool-calling model can run (tests, the CPU
demo): it answers each chat completion with the next step of a recorded trajectory of the same
query, as `tool_calls`, and ends with the recorded `Finish`. Everything around it stays real: the
runner, the virtual server, its cache, the converter and the judges.

Recordings are StableToolBench answer files: raw files (`<qid>_<method>.json`: the CoT try or the
whole DFS tree, alternatives included) or converted files (`<group>.json`: the final chain). They
are read into a tree of steps (one step = one assistant message: its text and its calls).
A request is answered by walking that tree along the conversation's assistant messages (matched by
function name and arguments). At a node with several recorded continuations, the first is given,
and the next one when the request ends with an extra user message (DFS asking for a different
action), which replays a recorded DFS search in the order it was made. A conversation that leaves
the recording, or reaches its end without a Finish, gets `Finish` with `give_up_and_restart`.

With `text_protocol`, it speaks the `agent-react-v1` text protocol instead (mirrorapi/prompts/agent_formats.py): it
reads the Thought / Action / Action Input replies and `Observation:` messages of the request back into
steps and answers with the recorded step rendered in that layout, as a text-only model would.

`recorded_cache_folder` writes the recorded observations as a StableToolBench cache folder, so a
virtual server that imports it answers the recorded calls as they were answered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, Request

from harness.processes import serve_in_thread
from mirrorapi.names import api_key_name, standardize
from mirrorapi.prompts.agent_formats import REACT_OBSERVATION, parse_react_step, render_react_step

RECORDED_MODEL = "recorded-agent"


@dataclass
class Step:
    content: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (function name, raw arguments)
    observations: list[str] = field(default_factory=list)  # what each call got, as recorded
    children: list[Step] = field(default_factory=list)


# ------------------------------------------------------------------------------ reading recordings
def _steps(nodes: list[dict]) -> list[Step]:
    """Steps from the children of a tree node (Thought / Action / Action Input nodes)."""
    steps = []
    for node in nodes:
        kind = node.get("node_type")
        children = [c for c in node.get("children") or [] if isinstance(c, dict)]
        if kind == "Thought":
            # A thought and its call were one model reply, unless the thought was expanded on its own (a reply of
            # text alone, the call the next reply: `expand_num` set, in DFS trees); merged, the replay made one
            # model call fewer there and backtracked from another node than the recorded search did.
            alone = bool(node.get("expand_num"))
            if len(children) == 1 and children[0].get("node_type") == "Action" and not alone:
                step = _action_step(children[0])
                step.content = str(node.get("description") or "")
            else:
                step = Step(content=str(node.get("description") or ""), children=_steps(children))
        elif kind == "Action":
            step = _action_step(node)
        else:
            continue
        steps.append(step)
    return steps


def _action_step(action: dict) -> Step:
    inputs = [c for c in action.get("children") or [] if isinstance(c, dict) and c.get("node_type") == "Action Input"]
    if not inputs:
        return Step(calls=[(str(action.get("description") or ""), "{}")])
    given = inputs[0]
    return Step(
        calls=[(str(action.get("description") or ""), str(given.get("description") or ""))],
        observations=[str(given.get("observation") or "")],
        children=_steps([c for c in given.get("children") or [] if isinstance(c, dict)]),
    )


def _chain_as_tree(chain: list[dict]) -> list[dict]:
    """A linear list of trace nodes nested as a tree (each node the only child of the previous)."""
    root: list[dict] = []
    holder = root
    for node in chain:
        copy = {k: v for k, v in node.items() if k != "children"}
        copy["children"] = []
        holder.append(copy)
        holder = copy["children"]
    return root


def _converted_as_trace(details: list) -> list[dict]:
    trace, node = [], details[0] if details and isinstance(details[0], dict) else None
    while node is not None:
        message = node.get("message")
        if node.get("role") == "assistant":
            trace.append({"node_type": "Thought", "description": message or ""})
        elif node.get("role") == "tool" and isinstance(message, dict):
            trace.append({"node_type": "Action", "description": message.get("name", "")})
            trace.append(
                {
                    "node_type": "Action Input",
                    "description": message.get("arguments", ""),
                    "observation": message.get("response", ""),
                }
            )
        following = node.get("next")
        node = following[0] if isinstance(following, list) and following and isinstance(following[0], dict) else None
    return trace


def _steps_of_raw(data: dict) -> list[Step]:
    if isinstance(data.get("tree"), dict) and isinstance(data["tree"].get("tree"), dict):
        return _steps(data["tree"]["tree"].get("children") or [])
    trys = data.get("trys")
    if isinstance(trys, list) and trys and isinstance(trys[0], dict):
        chain = _chain_as_tree(trys[0].get("chain") or [])
        # A CoT chain sets no `expand_num`: its thoughts that were replies of their own (text and no call) are the
        # assistant messages of `train_messages` without a call.
        messages = (data.get("answer_generation") or {}).get("train_messages") or []
        alone = {
            str(m.get("content"))
            for m in (messages[-1] if messages and isinstance(messages[-1], list) else [])
            if isinstance(m, dict) and m.get("role") == "assistant" and m.get("content")
            and not (m.get("function_call") or m.get("tool_calls"))
        }  # fmt: skip
        node = chain[0] if chain else None
        while node is not None:
            if node.get("node_type") == "Thought" and str(node.get("description") or "") in alone:
                node["expand_num"] = 1
            node = node["children"][0] if node["children"] else None
        return _steps(chain)
    return []


@dataclass
class Recording:
    query: str
    steps: list[Step]
    source: str
    category_of: dict[str, str] = field(default_factory=dict)  # function name -> category (for the cache)


def load_recordings(paths: list[str | Path]) -> dict[str, Recording]:
    """{query text: recording} from raw answer files, converted files, or folders of them (recursively).
    A query recorded several times keeps its first recording (sorted paths)."""
    files: list[Path] = []
    for path in map(Path, paths):
        files += sorted(path.rglob("*.json")) if path.is_dir() else [path]
    recordings: dict[str, Recording] = {}
    for file in files:
        try:
            data = json.loads(file.read_bytes())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("answer_generation"), dict):
            query = str(data["answer_generation"].get("query") or "").strip()
            if query and query not in recordings:
                recordings[query] = Recording(query, _steps_of_raw(data), str(file))
            continue
        if isinstance(data, dict):
            for record in data.values():
                if not isinstance(record, dict) or not isinstance(record.get("answer"), dict):
                    continue
                query = str(record.get("query") or "").strip()
                if query and query not in recordings:
                    trace = _converted_as_trace(record["answer"].get("answer_details") or [])
                    recordings[query] = Recording(query, _steps(_chain_as_tree(trace)), str(file))
    return recordings


# ------------------------------------------------------------------------------ replaying
def _same_arguments(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return json.loads(a, strict=False) == json.loads(b, strict=False)
    except (ValueError, TypeError):
        return " ".join(str(a).split()) == " ".join(str(b).split())


def _matches(step: Step, message: dict) -> bool:
    calls = [c.get("function") or {} for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    if not calls:
        return not step.calls
    if len(calls) > len(step.calls):
        return False
    for call, (name, arguments) in zip(calls, step.calls, strict=False):
        called = call.get("name")
        if called != name and called != "invalid_hallucination_function_name":
            return False
        if not _same_arguments(str(call.get("arguments") or ""), arguments):
            return False
    return True


GIVE_UP_ARGUMENTS = json.dumps({"return_type": "give_up_and_restart"}, indent=2)


def _from_react_text(messages: list[dict]) -> list[dict]:
    """An `agent-react-v1` conversation read back into tool-calling messages (the replay walks those)."""
    out = []
    for message in messages:
        content = str(message.get("content") or "")
        if message.get("role") == "assistant":
            step = parse_react_step(content)
            calls = [{"function": {"name": step.action, "arguments": step.arguments}}] if step.action else []
            out.append({"role": "assistant", "content": step.thought, "tool_calls": calls})
        elif (
            message.get("role") == "user"
            and content.startswith(REACT_OBSERVATION)
            and out
            and out[-1].get("role") in ("assistant", "tool")
        ):
            out.append({"role": "tool", "content": content[len(REACT_OBSERVATION) :]})
        else:
            out.append(message)
    return out


class RecordedAgent:
    """The replaying engine (see module docstring). `latency` seconds are waited before each answer."""

    def __init__(
        self,
        recordings: dict[str, Recording],
        latency: float = 0.0,
        model: str = RECORDED_MODEL,
        text_protocol: bool = False,
    ):
        self.recordings, self.latency, self.model = recordings, latency, model
        self.text_protocol = text_protocol
        self.requests = self.in_flight = self.peak_in_flight = 0
        # The latest chat completion requests as received (tests check what a runner sent).
        self.bodies: collections.deque[dict] = collections.deque(maxlen=1000)
        self._ids = itertools.count()

    def recording_for(self, messages: list[dict]) -> Recording | None:
        first_user = next((m for m in messages if m.get("role") == "user"), None)
        text = str(first_user.get("content") or "") if first_user else ""
        stripped = text.strip().removesuffix("Begin!").strip()
        if stripped in self.recordings:
            return self.recordings[stripped]
        return next((r for q, r in self.recordings.items() if q and q in text), None)

    def next_step(self, messages: list[dict]) -> Step | None:
        """The recorded step that answers `messages`; None when the conversation left the recording."""
        recording = self.recording_for(messages)
        if recording is None:
            return None
        options = recording.steps
        first_user = next(i for i, m in enumerate(messages) if m.get("role") == "user")
        for message in messages[first_user + 1 :]:
            if message.get("role") != "assistant":
                continue
            step = next((s for s in options if _matches(s, message)), None)
            if step is None:
                return None
            options = step.children
        asks_for_another = messages[-1].get("role") == "user" and len(messages) - 1 > first_user
        index = 1 if asks_for_another else 0
        return options[index] if index < len(options) else None

    def reply(self, messages: list[dict]) -> dict:
        step = self.next_step(_from_react_text(messages) if self.text_protocol else messages)
        calls = step.calls if step is not None else [("Finish", GIVE_UP_ARGUMENTS)]
        content = step.content if step is not None else "The recording has no step for this state; giving up."
        if self.text_protocol:
            return {"role": "assistant", "content": render_react_step(content, calls)}
        return {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [
                {
                    "id": f"call_rec_{next(self._ids)}",
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
                for name, arguments in calls
            ],
        }

    def app(self):
        app = FastAPI(title="recorded agent (a replay, not a model)")

        @app.get("/v1/models")
        async def models():
            return {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "recording"}]}

        @app.get("/stats")
        async def stats():  # for benchmarks: how many requests, how many at once at most
            return {"requests": self.requests, "peak_in_flight": self.peak_in_flight}

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            self.requests += 1
            self.bodies.append(body)
            self.in_flight += 1
            self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
            try:
                if self.latency:
                    await asyncio.sleep(self.latency)
            finally:
                self.in_flight -= 1
            message = self.reply(body.get("messages") or [])
            return {
                "id": f"rec-{self.requests}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", self.model),
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                        "message": message,
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }

        return app


@contextlib.contextmanager
def serve_recorded_agent(
    recordings: dict[str, Recording] | list[str | Path],
    port: int,
    latency: float = 0.0,
    host: str = "127.0.0.1",
    text_protocol: bool = False,
) -> Iterator[tuple[str, RecordedAgent]]:
    """Serve a RecordedAgent on host:port in a background thread; yields (base URL, agent)."""
    if not isinstance(recordings, dict):
        recordings = load_recordings(recordings)
    agent = RecordedAgent(recordings, latency=latency, text_protocol=text_protocol)
    with serve_in_thread(agent.app(), port, host) as url:
        yield url + "/v1", agent


# ------------------------------------------------------------------------------ the recorded observations
def _walk(steps: list[Step]) -> Iterator[Step]:
    for step in steps:
        yield step
        yield from _walk(step.children)


def recorded_cache_folder(recordings: dict[str, Recording], queries: list[dict], folder: str | Path) -> dict:
    """Write the recorded observations of `queries` as a StableToolBench cache folder
    (`<category>/<tool>_for_<category>/<api>.json`, keys = Python repr of the arguments).

    Function names are mapped back to (category, tool, api) through the queries' `api_list`.
    Observations that are not whole JSON objects (cut at 1,024 characters) are left out.
    Returns {"entries": n, "skipped": m}."""
    folder = Path(folder)
    functions = {}
    for query_doc in queries:
        for item in query_doc.get("api_list") or []:
            tool = standardize(str(item.get("tool_name", "")))
            api = api_key_name(str(item.get("api_name", "")))
            functions[f"{api}_for_{tool}"[-64:]] = (str(item.get("category_name", "")), tool, api)
    files: dict[Path, dict] = {}
    skipped = 0

    def entries_of(path: Path) -> dict:  # merge with what an earlier call wrote
        if path not in files:
            try:
                files[path] = json.loads(path.read_bytes()) if path.exists() else {}
            except ValueError:
                files[path] = {}
        return files[path]

    wanted = {str(q.get("query", "")).strip() for q in queries}
    for query, recording in recordings.items():
        if query not in wanted:
            continue
        for step in _walk(recording.steps):
            for (name, arguments), observation in zip(step.calls, step.observations, strict=False):
                target = functions.get(name)
                try:
                    args = json.loads(arguments, strict=False) if arguments.strip() else {}
                    response = json.loads(observation)
                except ValueError:
                    skipped += 1
                    continue
                if (
                    target is None
                    or not isinstance(args, dict)
                    or not isinstance(response, dict)
                    or "error" not in response
                ):
                    skipped += 1
                    continue
                category, tool, api = target
                path = folder / category / f"{tool}_for_{category}" / f"{api}.json"
                entries_of(path).setdefault(str(args), response)
    for path, entries in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entries, ensure_ascii=False, indent=2), encoding="utf-8")
    return {"entries": sum(len(e) for e in files.values()), "skipped": skipped}
