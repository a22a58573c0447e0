"""OpenEnv episodes: the Gym-style `reset` / `step` / `state` that RL trainers drive (OpenEnv's protocol, as its
client `openenv-core` speaks it and TRL's OpenEnv integration uses it), over the WebSocket session endpoint `/ws`
and over HTTP (`POST /reset`, `POST /step`, `GET /state`, and `POST /close`, which OpenEnv's HTTP has not).

An episode is a simulation session on a toolset:
- `reset` opens one. Its fields (all optional): `toolset`, in the toolset syntax of /mcp (`category=Data&tool=
  APIBank/apibank_account&api=C/T/A&query=<query_id>`; default `mcp_toolset`); `task`, a StableToolBench query_id
  of a query file the server loaded (its APIs are the toolset when none is given, and its text is in the
  observation); `episode_id` (default: a new random id). The observation names the episode, its task and its
  tools (name, description, input_schema: OpenEnv's `ListToolsObservation`).
- `step` takes one of OpenEnv's MCP actions: `{"type": "call_tool", "tool_name", "arguments"}` or
  `{"type": "list_tools"}`. A tool call is answered exactly as /virtual answers it in the episode's session
  (cache, simulator, history, provenance): the observation's `result` is /virtual's `{"error", "response"}`,
  and its `metadata` tells the provenance, whether the cache had it, and the step. `error` is OpenEnv's
  `ToolError`, for what is not the API's answer (an unknown tool, arguments that are not an object). The
  server gives no reward (`reward` null) and never ends an episode (`done` false): the trainer scores and
  decides. A call the server failed to answer for a cause that may pass (the engine busy, away, slow; the store
  away) is not taken: an error to send again (`StepNotTaken`), not an observation.
- `state` tells the episode's id, its number of steps, its toolset and task, and its calls so far (the newest
  STATE_CALLS of them: tool, arguments, the API's error, provenance).
The episode id is the simulation session of its calls (`X-Session-Id` of /virtual), so a replayed episode is
answered from the cache, and a `reset` naming an id that was used before starts that session over.

On `/ws` an episode lives as long as its connection (OpenEnv's clients open one per environment): a step
before any `reset` runs in an episode on the default toolset, as OpenEnv's servers do. `{"type": "mcp", "data":
<JSON-RPC>}` messages (`tools/list`, `tools/call`) are answered in the same episode, and a WebSocket at `/mcp`
takes JSON-RPC messages alone, on the toolset its URL names (as HTTP /mcp). Over HTTP an episode is named by
`episode_id` in each request (OpenEnv's own HTTP endpoints keep nothing between requests) and kept in this
process's memory until `POST /close` or idle for `episode_idle_timeout`; with `--workers N` a client's
connection stays with one worker, so a new connection may not find it: use `/ws`. Open episodes (WebSockets,
HTTP, and HTTP resets waiting for the store) are bounded by `max_episodes`. A client's mistake is an error reply;
a failure of the server's own (the store) is OpenEnv's EXECUTION_ERROR on a WebSocket, which stays open, and 503
or 500 over HTTP.

Why not openenv-core's own server (`HTTPEnvServer`): it runs each session's environment on a thread pool of its
own (a thread per session: 16,384 threads for 16,384 episodes) and its HTTP endpoints keep no episode; this
module is the protocol's few message shapes, on the server's event loop, with no thread per episode.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from mcp import types

from mirrorapi.serving.answer import Answer
from mirrorapi.serving.arguments import (
    LARGE_BODY_BYTES,
    MAX_ARGUMENT_DEPTH,
    ParsedArguments,
    json_text_nested_deeper_than,
    parsed_arguments,
)
from mirrorapi.serving.asgi import BodyTooLarge, ClientGone, read_body, send_json
from mirrorapi.serving.cache import CacheError
from mirrorapi.serving.mcp_server import json_rpc_error
from mirrorapi.serving.server import VirtualServer
from mirrorapi.serving.sessions import EMPTY_HISTORY, session_id_problem
from mirrorapi.toolsets import Toolset, ToolsetError, TooManyFunctions, description, input_schema

logger = logging.getLogger(__name__)

WS_PATH, MCP_WS_PATH = "/ws", "/mcp"
HTTP_PATHS = ("/reset", "/step", "/state", "/close")
MAX_EPISODE_TOOLS = 2048  # an agent is given a toolset, not the whole registry (46,803 APIs in ToolEnv2404)
MAX_EPISODE_ID_CHARS = 255  # OpenEnv's own bound (ResetRequest.episode_id)
REFUSAL_WAIT_SECONDS = 10.0  # for the first message of a WebSocket refused for capacity, to answer it
STATE_CALLS = 256  # the calls `state` lists (the newest); `step_count` counts them all
# What `state` keeps of a call (an episode holds STATE_CALLS of them): the JSON text of its arguments up to this many
# characters (whole, a call of a megabyte each gave `state` a 120 MB reply, past OpenEnv's client limit of 100 MB:
# the socket closed), and of its answer only the error `state` shows. Kept as text, not as the argument objects and
# answer bodies: 256 simulated steps of 2.8 KB answers held ~1 MB an episode that way (audit of 2026-11-30).
STATE_ARGUMENT_CHARS = 4096
# ... and of a tool name no tool of the toolset has (function names are at most 64 characters): a client's name is any
# JSON value up to the body limit, which `state` kept whole (a megabyte's list of lists held ~23 MB a step).
STATE_NAME_CHARS = 256
# What echoes a client's text (tool names, arguments, episode ids) is written in ASCII: a lone surrogate that came
# in as JSON ("\ud83d") goes out as the same escape, where UTF-8 could not encode it. The tool lists are ours.
_ENCODE = json.JSONEncoder().encode
_ENCODE_TOOLS = json.JSONEncoder(ensure_ascii=False).encode
_ENCODE_FINITE = json.JSONEncoder(allow_nan=False).encode


class EpisodeError(ValueError):
    """A reset or an action the server cannot take; the message says why. `code`: OpenEnv's WSErrorCode."""

    def __init__(self, message: str, code: str = "VALIDATION_ERROR"):
        super().__init__(message)
        self.code = code


class EpisodeIdTaken(EpisodeError):
    """A reset naming the id of another live episode (HTTP 409)."""


class StepNotTaken(EpisodeError):
    """A call the server could not answer for a cause of its own that may pass (the engine busy, away or slow; the
    store away): no answer of the API, so the episode is left as it was, for the client to send the step again
    (OpenEnv's EXECUTION_ERROR; HTTP 503 with Retry-After)."""

    def __init__(self, message: str):
        super().__init__(message, "EXECUTION_ERROR")


class UnknownEpisode(LookupError):
    """An HTTP request naming an episode this process has not opened, or has let go (HTTP 404). Its own class, so
    that a KeyError of the server's own is not answered as a 404 naming the key."""


@dataclass(slots=True)
class Episode:
    episode_id: str
    toolset_spec: str
    toolset: Toolset
    task: dict | None
    steps: int = 0
    # (tool, its arguments' JSON text, the API's error ('' for an answer) or why it was not called, provenance or None)
    calls: deque = field(default_factory=lambda: deque(maxlen=STATE_CALLS))
    last_used: float = 0.0
    # One action at a time, as OpenEnv steps an environment: two HTTP steps of one episode sent at once would each
    # be simulated without the other in its history, and the session would then hold both (a rerun differs). Only
    # an HTTP episode has one (a WebSocket's messages come one at a time): `lock_of`.
    lock: asyncio.Lock | None = None


class Episodes:
    """OpenEnv's side of one app: opens episodes, answers their actions as the server answers /virtual, holds the
    HTTP ones, and bounds them all (`max_episodes`)."""

    def __init__(self, server: VirtualServer):
        self.server = server
        settings = server.settings
        self.default_toolset = settings.mcp_toolset
        self.max_episodes, self.idle_seconds = settings.max_episodes, settings.episode_idle_timeout
        self.max_body = settings.max_body_bytes
        self.toolsets = server.toolsets
        self.over_http: dict[str, Episode] = {}
        # The named episode ids of open WebSockets, and which connection holds each: an id names one live episode
        # (its session: two rollouts under one id would each be answered with the other's calls in its history)
        self.on_websockets: dict[str, object] = {}
        self.connected = 0  # episodes of open WebSockets
        self.opening = 0  # HTTP resets waiting for the store: each holds the place its episode will take
        self._swept = time.monotonic()  # when idle HTTP episodes were last let go

    # ------------------------------------------------------------------------------------ episodes
    async def reset(self, data: Any, owner: object = None) -> Episode:
        """A new episode from a reset's fields (see the module doc); EpisodeError for fields it cannot take, or
        for an `episode_id` another live episode holds. `owner`: the WebSocket connection asking (None: HTTP),
        which holds a named id from now on (`release` lets it go)."""
        if not isinstance(data, dict):
            raise EpisodeError('reset takes an object: {"toolset", "task", "episode_id"}, each optional')
        task_id, spec, episode_id = data.get("task"), data.get("toolset"), data.get("episode_id")
        for name, value in (("task", task_id), ("toolset", spec), ("episode_id", episode_id)):
            if value is not None and not isinstance(value, (str, int)) or isinstance(value, bool):
                raise EpisodeError(f"reset: {name} must be a string, got {type(value).__name__}")
        task = None
        registry = self.server.registry
        if task_id is not None:
            task_id = str(task_id)
            if task_id not in registry.queries:
                raise EpisodeError(
                    f"reset: unknown task {task_id[:100]!r}: a task is the query_id of a "
                    "StableToolBench query file the server loaded with its tools"
                )
            task = {"query_id": task_id, "query": registry.query_texts.get(task_id)}
            if spec is None:
                spec = f"query={task_id}"
        spec = self.default_toolset if spec is None else str(spec)
        try:
            toolset = self.toolsets.get(spec, MAX_EPISODE_TOOLS)  # a larger one is counted, not made nor kept
        except TooManyFunctions as exc:
            raise EpisodeError(
                f"reset: toolset {spec[:200]!r} has {exc.functions:,} tools; an episode takes "
                f"at most {MAX_EPISODE_TOOLS:,}: name a category, tools, APIs or a query (`toolset`)"
            ) from None
        except ToolsetError as exc:
            raise EpisodeError(f"reset: toolset {spec[:200]!r}: {exc}") from None
        if episode_id is None:
            episode_id = uuid.uuid4().hex
        else:
            episode_id = _named_episode_id(str(episode_id))
            holder = self.on_websockets.get(episode_id, owner)
            if holder is not owner or owner is not None and episode_id in self.over_http:
                raise EpisodeIdTaken(
                    f"reset: episode_id {episode_id[:100]!r} is another live episode's (an open WebSocket's, or "
                    "one opened over HTTP): an id names one episode, whose calls its simulator sees. Name another "
                    "(or none: the server names it), or end that one first"
                )
            if owner is not None:
                self.on_websockets[episode_id] = owner  # taken now: a reset at the same time on another is refused
            try:
                await self._start_over(episode_id)
            except BaseException:
                self.release(episode_id, owner)
                raise
        return Episode(episode_id, spec, toolset, task, last_used=time.monotonic())

    def release(self, episode_id: str, owner: object) -> None:
        """The WebSocket `owner` no longer holds `episode_id` (it reset to another, or closed)."""
        if owner is not None and self.on_websockets.get(episode_id) is owner:
            del self.on_websockets[episode_id]

    async def _start_over(self, episode_id: str) -> None:
        """A session used before under this id starts again from no calls (a new episode, not a continued one)."""
        settings = self.server.settings
        if settings.session_history:
            await self.server.cache.update_session(episode_id, settings.session_ttl, lambda _: (EMPTY_HISTORY, 0, []))

    def observation_of_reset(self, episode: Episode) -> str:
        """JSON text: the episode, its task and its tools (OpenEnv's ListToolsObservation, with more fields)."""
        head = _ENCODE(
            {
                "episode_id": episode.episode_id,
                "toolset": episode.toolset_spec,
                "task": episode.task,
                # also here: OpenEnv's MCPToolClient keeps only `tools` and `metadata` of a reset's observation
                "metadata": {"episode_id": episode.episode_id, "toolset": episode.toolset_spec, "task": episode.task},
            }
        )
        return '{"observation":' + head[:-1] + ',"tools":' + self.tools_json(episode) + '},"reward":null,"done":false}'

    async def step(
        self,
        episode: Episode,
        action: Any,
        client_gone: Callable[[], bool] | None = None,
        transient_as_error: bool = True,
    ) -> str:
        """The observation of one action, as the JSON text of OpenEnv's serialised form (observation, reward,
        done). A tool call's /virtual answer goes into it as the bytes the server answered (never decoded and
        written again: a step's CPU is what 16,384 episodes at once are made of). A call the server failed to
        answer for a cause that may pass raises StepNotTaken (with `transient_as_error`; JSON-RPC's tools/call
        answers it as MCP does, a result with isError), and a step whose client has gone (`client_gone`: an HTTP
        client that gave up waiting, and will likely send it again) is answered but not taken: neither counts in
        the episode or its session, so the retry is answered from the cache and enters them once."""
        if not isinstance(action, dict):
            raise EpisodeError(
                'step takes an action object: {"type": "call_tool", "tool_name", "arguments"} '
                'or {"type": "list_tools"}'
            )
        kind = action.get("type")
        episode.last_used = time.monotonic()
        if kind == "list_tools":
            return (
                '{"observation":{"tools":' + self.tools_json(episode) + ',"metadata":{}},"reward":null,"done":false}'
            )
        if kind != "call_tool":
            raise EpisodeError(
                f"unknown action type {str(kind)[:60]!r}: this environment takes call_tool and "
                "list_tools (OpenEnv's MCP actions)"
            )
        name, arguments = action.get("tool_name"), action.get("arguments", {})
        # ParsedArguments: the arguments of a large message, parsed by `LargeBodies`' worker (`read_large_message`)
        kept = arguments.kept if isinstance(arguments, ParsedArguments) else None
        metadata: dict[str, Any] = {"episode_id": episode.episode_id, "step": episode.steps + 1}
        doc = episode.toolset.functions.get(name) if isinstance(name, str) else None
        if doc is not None and (kept is not None or isinstance(arguments, dict)):
            answer = await self.call(episode, doc, arguments, client_gone)
            if answer.transient and transient_as_error:
                why = _answer_error(answer.body)
                raise StepNotTaken(f"{why}. The step was not taken (the episode is as it was): send it again.")
            if client_gone is None or not client_gone():
                episode.steps += 1
                episode.calls.append(
                    (name, kept or _kept_arguments(arguments), _answer_error(answer.body), answer.provenance)
                )
            metadata.update(provenance=answer.provenance, cache=answer.cache, outcome=answer.outcome)
            return (
                f'{{"observation":{{"tool_name":{_ENCODE(name)},"result":{answer.body.decode()},"error":null,'
                f'"metadata":{_ENCODE(metadata)}}},"reward":null,"done":false}}'
            )
        if doc is None:
            # OpenEnv's CallToolAction.tool_name is a string: anything else is named by its type, not kept
            name = name[:STATE_NAME_CHARS] if isinstance(name, str) else f"({type(name).__name__}, not a name)"
            error = {
                "error_type": "tool_not_found",
                "message": (
                    f"Unknown tool {name[:100]!r} in this episode's toolset of "
                    f"{len(episode.toolset.functions):,} tools (list_tools names them)."
                ),
            }
        else:
            error = {
                "error_type": "invalid_args",
                "message": f"arguments must be an object of the tool's parameters, got {type(arguments).__name__}",
            }
        episode.steps += 1
        episode.calls.append((name, kept or _kept_arguments(arguments), error["message"], None))
        return _ENCODE(
            {
                "observation": {"tool_name": name, "result": None, "error": error, "metadata": metadata},
                "reward": None,
                "done": False,
            }
        )

    async def call(
        self, episode: Episode, doc, arguments: dict | ParsedArguments, client_gone: Callable[[], bool] | None = None
    ) -> Answer:
        """The `Answer` of one tool call in the episode's session, as /virtual gives it; counted in /metrics and
        written to the request log like a /virtual call."""
        return await self.server.answer_call(doc, arguments, episode.episode_id, client_gone)

    def tools_json(self, episode: Episode) -> str:
        """The toolset's tools as OpenEnv's `Tool` list, in JSON (made once per toolset)."""
        tools = episode.toolset.made.get("openenv_tools")
        if tools is None:
            tools = episode.toolset.made["openenv_tools"] = _ENCODE_TOOLS(tool_list(episode.toolset))
        return tools

    @staticmethod
    def state_of(episode: Episode) -> dict:
        """OpenEnv's State: episode_id and step_count, with the episode's toolset, task and calls so far (each
        call: the tool, its arguments, the API's error ('' for an answer) or why it was not called, provenance)."""
        calls = [
            {"tool_name": tool, "arguments": json.loads(arguments), "error": error, "provenance": provenance}
            for tool, arguments, error, provenance in episode.calls
        ]
        return {
            "episode_id": episode.episode_id,
            "step_count": episode.steps,
            "toolset": episode.toolset_spec,
            "task": episode.task,
            "calls": calls,
        }

    def room(self) -> str | None:
        """Why no episode can be opened now, or None."""
        if self.open_now() < self.max_episodes:
            return None
        self._forget_idle()
        if self.open_now() < self.max_episodes:
            return None
        return (
            f"Too many open episodes: {self.open_now():,} of {self.max_episodes:,} "
            f"(max_episodes; {self.connected:,} on WebSockets, {len(self.over_http):,} over HTTP, which end after "
            f"{self.idle_seconds:g} s without a request). Close one (a close message on /ws, POST /close over "
            "HTTP), or try again later."
        )

    def open_now(self) -> int:
        return self.connected + len(self.over_http) + self.opening

    def _forget_idle(self) -> None:
        self._swept = time.monotonic()
        stale = self._swept - self.idle_seconds
        for episode_id in [i for i, e in self.over_http.items() if e.last_used < stale]:
            del self.over_http[episode_id]

    # ----------------------------------------------------------------------------------- WebSocket
    async def websocket(self, scope, receive, send) -> None:
        """`/ws` (OpenEnv's messages) or `/mcp` (JSON-RPC alone): one episode per connection."""
        if (await receive())["type"] != "websocket.connect":
            return
        refusal = self.room()
        await send({"type": "websocket.accept"})
        if refusal is not None:  # the answer to the client's first message (OpenEnv's clients raise it), then close
            with contextlib.suppress(asyncio.TimeoutError):
                if (await asyncio.wait_for(receive(), REFUSAL_WAIT_SECONDS))["type"] == "websocket.receive":
                    await send({"type": "websocket.send", "text": _ws_error(refusal, "CAPACITY_REACHED")})
            return await send({"type": "websocket.close", "code": 1013, "reason": "too many open episodes"})
        self.connected += 1
        jsonrpc_only = scope["path"] == MCP_WS_PATH
        episode: Episode | None = None  # until a reset, or a message that needs one (then on the default toolset)
        owner = object()  # this connection, as the holder of the episode id it named
        try:
            while True:
                message = await receive()
                if message["type"] != "websocket.receive":
                    return
                text = message.get("text")
                if text is None:
                    text = (message.get("bytes") or b"").decode("utf-8", "replace")
                reply: str | None
                if jsonrpc_only:
                    try:
                        # The toolset of the URL (`/mcp?tool=...`), as HTTP /mcp reads it, else the default.
                        spec = scope.get("query_string", b"").decode("latin-1")
                        episode = episode or await self.reset({"toolset": spec} if spec else {}, owner)
                        reply = await self.json_rpc(episode, text)
                    except EpisodeError as exc:
                        reply = json_rpc_error(400, str(exc)).decode()
                    except Exception as exc:  # the server's fault (the store): said, and the session goes on
                        logger.exception("an /mcp WebSocket message failed")
                        reply = json_rpc_error(500, f"Internal error: {type(exc).__name__}: {exc}").decode()
                else:
                    before = episode
                    reply, episode = await self.on_message(episode, text, owner)
                    if before is not None and episode is not None and before.episode_id != episode.episode_id:
                        self.release(before.episode_id, owner)
                if reply is None:  # {"type": "close"}
                    return await send({"type": "websocket.close", "code": 1000})
                await send({"type": "websocket.send", "text": reply})
        finally:
            self.connected -= 1
            if episode is not None:  # only once its last step is done: a new socket may take the id then
                self.release(episode.episode_id, owner)

    async def on_message(
        self, episode: Episode | None, text: str, owner: object = None
    ) -> tuple[str | None, Episode | None]:
        """The reply to one message of `/ws` (None: close), and the episode from then on (before any reset, one on
        the default toolset, as OpenEnv's servers give a connection)."""
        message = await self.read_message(text, "data")
        if isinstance(message, NotJson):
            return _ws_error(f"Invalid JSON: {message.why}", "INVALID_JSON"), episode
        kind = message.get("type") if isinstance(message, dict) else None
        try:
            if kind == "reset":
                episode = await self.reset(message.get("data") or {}, owner)
                return '{"type":"observation","data":' + self.observation_of_reset(episode) + "}", episode
            if kind == "close":
                return None, episode
            if kind not in ("step", "state", "mcp"):
                return _ws_error(
                    f"Unknown message type: {str(kind)[:60]} (reset, step, state, close, mcp)", "UNKNOWN_TYPE"
                ), episode
            current = episode or await self.reset({}, owner)
            if kind == "step":
                return '{"type":"observation","data":' + await self.step(current, message.get("data")) + "}", current
            if kind == "state":
                return _ENCODE({"type": "state", "data": self.state_of(current)}), current
            data = message.get("data")
            return _ENCODE({"type": "mcp", "data": json.loads(await self.json_rpc(current, data))}), current
        except EpisodeError as exc:
            return _ws_error(str(exc), exc.code), episode
        except Exception as exc:
            # The server's fault (the store): said as OpenEnv's server says it, and the session goes on.
            logger.exception("a /ws message failed")
            return _ws_error(f"Internal error: {type(exc).__name__}: {exc}", "EXECUTION_ERROR"), episode

    async def json_rpc(self, episode: Episode, request: Any) -> str:
        """MCP's `tools/list` and `tools/call` as JSON-RPC in an episode (`request`: the object, or its text)."""
        if isinstance(request, str):
            try:
                request = json.loads(request)
            except (ValueError, RecursionError) as exc:
                return _rpc_error(None, types.PARSE_ERROR, f"Parse error: {_why(exc)}")
        if not isinstance(request, dict) or not isinstance(request.get("method"), str):
            return json_rpc_error(400, "Invalid Request: a JSON-RPC 2.0 request object").decode()
        request_id, method, params = request.get("id"), request["method"], request.get("params")
        params = {} if params is None else params
        if not isinstance(params, dict):
            return _rpc_error(request_id, types.INVALID_PARAMS, "params must be an object")
        if method == "tools/list":
            tools = [
                {"name": t["name"], "description": t["description"], "inputSchema": t["input_schema"]}
                for t in json.loads(self.tools_json(episode))
            ]
            return _ENCODE({"jsonrpc": "2.0", "id": request_id, "result": {"tools": tools}})
        if method != "tools/call":
            return _rpc_error(request_id, types.METHOD_NOT_FOUND, f"Method not found: {method[:60]}")
        observation = json.loads(
            await self.step(
                episode,
                {
                    "type": "call_tool",
                    "tool_name": params.get("name"),
                    "arguments": {} if params.get("arguments") is None else params["arguments"],  # [] is a mistake
                },
                transient_as_error=False,
            )
        )["observation"]
        if observation["error"] is not None:
            return _rpc_error(request_id, types.INVALID_PARAMS, observation["error"]["message"])
        result = observation["result"]
        failed = not isinstance(result, dict) or bool(result.get("error"))
        return _ENCODE(
            {
                "jsonrpc": "2.0",
                "id": request_id,
                "result": {"content": [{"type": "text", "text": _ENCODE(result)}], "isError": failed},
            }
        )

    async def read_message(self, body: bytes | str, action_at: str) -> Any:
        """A message's JSON (a NotJson when it is none): one of LARGE_BODY_BYTES or more is parsed in `LargeBodies`'
        worker (`read_large_message`), as /virtual's bodies are: its parse holds the GIL, and a megabyte's step held
        the event loop, every other episode's request waiting, for a tenth of a second or more (audit of
        2026-12-01: a tiny request's p50 137 ms over HTTP, 523 ms on /ws, against 2.6 ms on /virtual)."""
        if len(body) < LARGE_BODY_BYTES:
            try:
                return json.loads(body)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
                return NotJson(_why(exc))
        large_bodies = self.server.virtual.large_bodies
        return await large_bodies.run(read_large_message, body, action_at, self.server.settings.max_arguments_chars)

    # ---------------------------------------------------------------------------------------- HTTP
    async def http(self, scope, receive, send, client_gone: Callable[[], bool] | None = None) -> None:
        """`POST /reset`, `POST /step` (`episode_id` beside the `action`), `GET /state?episode_id=...`, `POST
        /close` (`episode_id`). `client_gone`: whether the client has closed its connection (see `step`)."""
        path, method = scope["path"], scope["method"]
        if (path == "/state") != (method == "GET") or method not in ("GET", "POST"):
            allowed = b"GET" if path == "/state" else b"POST"
            return await send_json(
                send, 405, _detail(f"Method Not Allowed: {path} takes {allowed.decode()}"), [(b"allow", allowed)]
            )
        try:
            if path == "/state":
                query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
                return await send_json(
                    send, 200, _ENCODE(self.state_of(self._known(query.get("episode_id")))).encode()
                )
            body = await read_body(scope, receive, self.max_body)
            data = await self.read_message(body, "action") if body.strip() else {}
            if isinstance(data, NotJson):
                raise EpisodeError(f"the body is not JSON: {data.why}")
            if not isinstance(data, dict):
                raise EpisodeError("the body must be a JSON object")
            if path == "/reset":
                return await self._reset_over_http(data, send)
            episode = self._known(data.get("episode_id"))
            async with lock_of(episode):
                if path == "/close":  # after a step of it that is being answered
                    self.over_http.pop(episode.episode_id, None)
                    closed = {"episode_id": episode.episode_id, "step_count": episode.steps}
                    return await send_json(send, 200, _ENCODE(closed).encode())
                observation = await self.step(episode, data.get("action"), client_gone)
            return await send_json(send, 200, observation.encode())
        except BodyTooLarge as exc:  # as /virtual answers it: the connection closes (the rest of the body is not read)
            self.server.refused(413, "body_too_large", f"{path}: {exc.size:,} bytes or more")
            return await send_json(send, 413, _detail(str(exc)), [(b"connection", b"close")])
        except ClientGone:
            return
        except UnknownEpisode as exc:
            return await send_json(send, 404, _detail(str(exc.args[0])))
        except EpisodeIdTaken as exc:
            return await send_json(send, 409, _detail(str(exc)))
        except StepNotTaken as exc:
            return await send_json(send, 503, _detail(str(exc)), [(b"retry-after", b"1")])
        except EpisodeError as exc:
            return await send_json(send, 422, _detail(str(exc)))
        except CacheError as exc:  # the store failed (a reset naming an episode starts its session over there)
            logger.error("%s %s: %s", method, path, exc)
            return await send_json(send, 503, _detail(f"The cache store failed: {exc}"), [(b"retry-after", b"5")])
        except Exception as exc:  # the server's fault, said in FastAPI's shape rather than a bare 500
            logger.exception("%s %s failed", method, path)
            return await send_json(send, 500, _detail(f"Internal error: {type(exc).__name__}: {exc}"))

    async def _reset_over_http(self, data: dict, send) -> None:
        # Idle episodes are let go now and then (a sweep costs one look at each), not only when full.
        if time.monotonic() - self._swept > self.idle_seconds / 10:
            self._forget_idle()
        named = data.get("episode_id")
        held = self.over_http.get(named) if isinstance(named, str) else None  # reset again: it keeps its place
        refusal = None if held else self.room()
        if refusal is not None:
            return await send_json(send, 503, _detail(refusal), [(b"retry-after", b"5")])
        self.opening += held is None  # its place, while the store starts its session over
        try:
            if held is not None:  # after a step of it that is being answered, not in its middle
                async with lock_of(held):
                    episode = await self.reset(data)
            else:
                episode = await self.reset(data)
        finally:
            self.opening -= held is None
        self.over_http[episode.episode_id] = episode
        return await send_json(send, 200, self.observation_of_reset(episode).encode())

    def _known(self, episode_id: Any) -> Episode:
        if not isinstance(episode_id, str) or not episode_id:
            raise EpisodeError("name the episode: `episode_id` as its reset answered it")
        episode = self.over_http.get(episode_id)
        if episode is not None and episode.last_used < time.monotonic() - self.idle_seconds:
            del self.over_http[episode_id]  # idle too long: gone, whether or not a sweep came by
            episode = None
        if episode is None:
            raise UnknownEpisode(
                f"unknown episode {episode_id[:100]!r}: not opened by POST /reset on this server "
                f"process, or idle for more than {self.idle_seconds:g} s"
            )
        episode.last_used = time.monotonic()  # any request of it (a state too) keeps it
        return episode


@dataclass(frozen=True, slots=True)
class NotJson:
    why: str  # the parser's message


def read_large_message(body: bytes | str, action_at: str, max_arguments_chars: int) -> Any:
    """In `LargeBodies`' worker: an HTTP step's body (its action at `action_at` "action") or a /ws message (at
    "data"), parsed, with a tool call's arguments made into ParsedArguments (their key and what `state` keeps
    computed here too); NotJson when it is not JSON."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as exc:
        return NotJson(_why(exc))
    action = message.get(action_at) if isinstance(message, dict) else None
    if isinstance(action, dict) and action.get("type") == "call_tool" and isinstance(action.get("arguments"), dict):
        arguments = action["arguments"]
        action["arguments"] = parsed_arguments(arguments, max_arguments_chars, _kept_arguments(arguments))
    return message


def lock_of(episode: Episode) -> asyncio.Lock:
    if episode.lock is None:
        episode.lock = asyncio.Lock()
    return episode.lock


def _kept_arguments(arguments: Any) -> str:
    """The JSON text of a call's arguments as `state` keeps them: whole up to STATE_ARGUMENT_CHARS characters, else
    a string saying so; arguments nested deeper than a call may be (refused as such) are said too: `state` writes
    them two levels deeper, past Python's recursion limit for the deepest a message can bring. NaN and Infinity
    (which Python's JSON reads, as /virtual takes them) are kept as the strings "NaN", "Infinity": RFC 8259 has
    neither, and a strict client (JavaScript's, Go's) cannot parse a `state` reply holding one."""
    try:
        text = _ENCODE_FINITE(arguments)
    except ValueError:  # a NaN or an Infinity in them
        text = _ENCODE_FINITE(_finite(arguments))
    if len(text) > STATE_ARGUMENT_CHARS:
        return _ENCODE(f"(arguments of {len(text):,} characters of JSON, not kept)")
    if text.count("{") + text.count("[") > MAX_ARGUMENT_DEPTH and json_text_nested_deeper_than(
        text, MAX_ARGUMENT_DEPTH
    ):
        return _ENCODE(f"(arguments nested more than {MAX_ARGUMENT_DEPTH} levels deep, not kept)")
    return text


def _finite(value: Any) -> Any:
    """`value` with its non-finite floats as the strings JSON's readers write them ("NaN", "Infinity")."""
    if isinstance(value, float) and not math.isfinite(value):
        return json.dumps(value)
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def _answer_error(body: bytes) -> str:
    """The error of an observation the server wrote (compact JSON, `error` first): '' for an answer."""
    if body.startswith(b'{"error":"",'):  # most answers: no decoding
        return ""
    error = json.loads(body).get("error", "")
    return error if isinstance(error, str) else str(error)


def _named_episode_id(episode_id: str) -> str:
    """A reset's `episode_id`, as a session id can be; EpisodeError saying why not."""
    if (problem := session_id_problem(episode_id, MAX_EPISODE_ID_CHARS)) is not None:
        raise EpisodeError(f"reset: episode_id {problem}")
    return episode_id


def tool_list(toolset: Toolset) -> list[dict]:
    """The toolset's tools as OpenEnv's `Tool` (name, description, input_schema)."""
    return [
        {"name": name, "description": description(doc), "input_schema": input_schema(doc)}
        for name, doc in toolset.functions.items()
    ]


def _why(exc: Exception) -> str:
    return "nested too deep" if isinstance(exc, RecursionError) else str(exc)


def _ws_error(message: str, code: str) -> str:
    return _ENCODE({"type": "error", "data": {"message": message, "code": code}})


def _rpc_error(request_id: Any, code: int, message: str) -> str:
    return _ENCODE({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})


def _detail(message: str) -> bytes:
    """An HTTP refusal as FastAPI (and so OpenEnv's HTTP server) writes one: `{"detail": ...}`."""
    return _ENCODE({"detail": message}).encode()
