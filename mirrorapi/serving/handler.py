"""The /virtual request path, without HTTP: body -> names -> doc -> (session) -> answer -> (session).

Order of the steps (StableToolBench's, plus validation): `chat_with_user` is answered first;
`tool_input` is parsed; the names are resolved in the in-memory registry (unknown ones come back
with the closest known names, and the engine is never called); then `Responder.respond` gives the
answer (look up -> on a miss the validation policy of `Responder.check_miss`, then simulate -> store; a
recorded answer is returned even for a call the policy would reject: it is what the API said). Every
outcome, failures included, is an `Answer` ready to send (see `to_failure`).

A call with a session id (and `session_history` > 0) is the same path with the session's history:
its digest is part of the call's cache key (outside a session that part is empty), and the prompt
shows its newest calls; a call with no earlier call to show (the session's first) is asked as the stateless
call it is. With `session_failure_rule: related`, a simulated failure in a session none of whose shown calls is
related to the call is replaced by the call's answer alone (docs/training.md, "A failure needs a related call");
with `alone`, every simulated failure in a session whose call alone is answered without one.
Every answered call (hit or simulation) is then added to the session, in the store (`mirrorapi.serving.sessions`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from mirrorapi.engine_client import EngineError, transient_status
from mirrorapi.names import api_key_name, standardize, standardize_category
from mirrorapi.prompts.simulator_formats import keyed_history_line, related_to_call, session_format
from mirrorapi.records import observation_json
from mirrorapi.serving.answer import Answer
from mirrorapi.serving.arguments import LARGE_BODY_BYTES, ParsedArguments, parse_arguments, parsed_arguments
from mirrorapi.serving.cache import NO_SESSION, SIMULATED, CacheError, Call, Store
from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.observability import ServerMetrics
from mirrorapi.serving.protocol import (
    CHAT_WITH_USER,
    CHAT_WITH_USER_REPLY,
    ENGINE_FAILURE,
    TOOL_INPUT_PARSE_ERROR,
    ReplayMiss,
    ToolInputError,
    read_virtual_request,
)
from mirrorapi.serving.responder import Reply, Responder
from mirrorapi.serving.sessions import History, Session, advance, session_id_problem
from mirrorapi.serving.simulator import Simulator
from mirrorapi.tools import ApiDoc, ArgumentError, ToolRegistry, UnknownName
from mirrorapi.transport_failures import api_failed

logger = logging.getLogger(__name__)

INLINE_WHILE_STARTING = 1024 * 1024  # see `LargeBodies`
MAX_SESSION_ID_CHARS = 256  # a session id (body or X-Session-Id): a name, kept in the store (OpenEnv's bound: 255)
LOGGED_NAME_CHARS = 200  # of a name as sent, in the request log line (a name may be a megabyte of junk)
# Names of a body's fields that StableToolBench does not define, in the log line (a body may hold 60,000 of them).
LOGGED_EXTRA_FIELDS = 20


def _is_chat_with_user(api_name: str) -> bool:
    name = api_key_name(api_name)
    return name == CHAT_WITH_USER or name.startswith(CHAT_WITH_USER + "_for_")


class VirtualApi:
    def __init__(
        self,
        settings: ServerSettings,
        registry: ToolRegistry,
        cache: Store,
        simulator: Simulator,
        metrics: ServerMetrics,
        lease_holder: str | None = None,
    ):
        """`metrics`: where engine calls and coalesced misses are counted; `lease_holder`: this process's name when
        the store is shared by several processes (see `Responder`)."""
        self.settings, self.registry, self.cache = settings, registry, cache
        # Name normalisation is regex work; the same few thousand names come back all the time.
        self.resolve = functools.lru_cache(maxsize=65536)(registry.resolve)
        self.responder = Responder(settings, cache, simulator, metrics, lease_holder)
        self.large_bodies = LargeBodies()

    async def answer(
        self, body: bytes, session_id: str | None = None, client_gone: Callable[[], bool] | None = None
    ) -> Answer:
        """The answer to a /virtual body; `session_id` is the transport's (header, MCP session); `client_gone`
        whether its client is still there to be given the answer (see `_respond`)."""
        answer = Answer(200, b"", "")
        stages, clock = answer.stages, time.perf_counter
        start = clock()
        try:
            parsed: ParsedArguments | None = None
            if len(body) < LARGE_BODY_BYTES:
                request = read_virtual_request(body)
            else:
                read = await self.large_bodies.parse(body, self.settings.max_arguments_chars)
                if isinstance(read, Failure):
                    return _with_failure(answer, read)
                request, parsed = read
            if request.model_extra:
                names = list(request.model_extra)
                answer.extra_fields = [name[:LOGGED_NAME_CHARS] for name in names[:LOGGED_EXTRA_FIELDS]]
                if len(names) > LOGGED_EXTRA_FIELDS:
                    answer.extra_fields.append(f"... {len(names) - LOGGED_EXTRA_FIELDS:,} more")
            if "chat" in request.api_name.lower() and _is_chat_with_user(request.api_name):
                answer.body, answer.outcome = observation_bytes("", CHAT_WITH_USER_REPLY), "chat_with_user"
                return answer
            answer.names = (
                request.category[:LOGGED_NAME_CHARS],
                request.tool_name[:LOGGED_NAME_CHARS],
                request.api_name[:LOGGED_NAME_CHARS],
            )
            arguments, key = arguments_and_key(request.tool_input if parsed is None else parsed)
            stages["parse"] = (now := clock()) - start

            try:
                doc = self.resolve(request.category, request.tool_name, request.api_name)
            except UnknownName:
                if not await self._recorded_without_doc(
                    answer, request.category, request.tool_name, request.api_name, key
                ):
                    raise
                return answer
            answer.names = (doc.category, doc.tool, doc.api)
            stages["resolve"] = clock() - now
            await self._respond(answer, doc, arguments, key, request.session_id or session_id, client_gone)
            return answer
        except Exception as exc:  # every failure becomes an observation (or a 422), never a 500
            return _failed(answer, exc)
        finally:
            stages["total"] = clock() - start

    async def _recorded_without_doc(self, answer: Answer, category: str, tool: str, api: str, key: str) -> bool:
        """Serve a recorded answer of an API the tools folder does not hold, as StableToolBench's server answers a
        cached call before it looks for any doc (its main.py, "load from cache"): an imported cache folder's entries
        of such APIs are stored under StableToolBench's own names (`cache.folders`), found here under the names its
        server derives from the request (`prepare_tool_name_and_url`). Whether it did (else: the unknown name)."""
        standard_category = standardize_category(category)
        suffix = f"_for_{standard_category}"
        standard_tool = standardize(tool[: -len(suffix)] if tool.endswith(suffix) else tool)
        name = api_key_name(api).split(f"_for_{tool}")[0]
        found = await self.cache.lookup(
            Call(standard_category, standard_tool, name, key, NO_SESSION), self.responder.identities[False]
        )
        if found is None or not found[1] or found[1].startswith(SIMULATED):
            return False
        answer.names = (standard_category, standard_tool, name)
        answer.body, answer.provenance = found
        answer.cache, answer.outcome = "hit", "hit"
        return True

    async def answer_call(
        self,
        doc: ApiDoc,
        arguments: Any,
        session_id: str | None,
        client_gone: Callable[[], bool] | None = None,
    ) -> Answer:
        """The answer to a call whose API is known already (an OpenEnv step: a function of its toolset), exactly
        as `answer` gives it for the same call's /virtual body, without writing and parsing that body.
        `arguments`: the argument object, or a `ParsedArguments` that `LargeBodies` made of it."""
        answer = Answer(200, b"", "", names=(doc.category, doc.tool, doc.api))
        start = time.perf_counter()
        try:
            arguments, key = arguments_and_key(arguments)
            answer.stages["parse"] = time.perf_counter() - start
            await self._respond(answer, doc, arguments, key, session_id, client_gone)
            return answer
        except Exception as exc:  # as in `answer`
            return _failed(answer, exc)
        finally:
            answer.stages["total"] = time.perf_counter() - start

    async def _respond(
        self,
        answer: Answer,
        doc: ApiDoc,
        arguments: dict | None,
        key: str,
        session_id: str | None,
        client_gone: Callable[[], bool] | None = None,
    ) -> None:
        """The answer of a resolved call, in its session (when it has one); the session advanced by it, unless its
        client has gone (gave up waiting: the agent never saw this answer, and will likely ask again; the answer
        is in the cache under the same history, so the retry is answered the same and enters the session once)."""
        session, history, settings = None, None, self.settings
        if session_id and (problem := session_id_problem(session_id, MAX_SESSION_ID_CHARS)) is not None:
            raise SessionIdError(f"the session id (session_id or X-Session-Id) {problem}")
        if session_id and settings.session_history:
            answer.session = session_id
            session = Session(settings.session_history, await self.cache.session(session_id, settings.session_ttl))
            related_to: tuple[str, dict] | None = None
            if settings.session_history_rule == "related" and arguments is not None:
                related_to = (doc.api, arguments)
            history = session.history(settings.session_history, settings.session_char_budget, related_to)

        try:
            reply = await self.responder.respond(doc, arguments, key, history, answer.stages)
        except ArgumentError as exc:
            # The argument policy's refusal is what the agent got: later calls of the session show it, as the
            # training data's histories show every earlier call of an episode. Not the refusal of arguments over the
            # server's own size bound: no answer of the API, and its line (the whole request) would push every
            # earlier call out of the session's character budget.
            if session is not None and session_id and arguments is not None and not self.responder.too_large(key):
                await self._advance_session(session_id, doc, key, to_failure(exc).body)
            raise
        if history is not None and arguments is not None and self._failure_to_check(reply, doc, arguments, history):
            reply = await self._answer_alone(reply, doc, arguments, key, answer)
        answer.body, answer.provenance, answer.coalesced = reply.observation, reply.provenance, reply.coalesced
        answer.rationale, answer.parsed, answer.second_try = reply.rationale, reply.parsed, reply.second_try
        answer.cache, answer.outcome = ("hit", "hit") if reply.hit else ("miss", "simulated")
        if session is not None and session_id and not (client_gone is not None and client_gone()):
            try:
                await self._advance_session(session_id, doc, key, reply.observation)
            except CacheError as exc:  # the answer is still good: give it, as an unstored simulation is given
                logger.warning("session %r was not advanced (the cache store failed): %s", session_id[:100], exc)

    async def _advance_session(self, session_id: str, doc: ApiDoc, key: str, observation_body: bytes) -> None:
        """The session's history with this call and the observation its client got."""
        settings = self.settings
        observation = json.loads(observation_body)
        line = keyed_history_line(
            doc.tool,
            doc.api,
            key,
            observation.get("error", ""),
            observation.get("response", ""),
            session_format(settings.prompt_format),
        )
        await self.cache.update_session(
            session_id, settings.session_ttl, advance(settings.session_history, settings.session_char_budget, line)
        )

    def _failure_to_check(self, reply: Reply, doc: ApiDoc, arguments: dict, history: History) -> bool:
        """Whether the session's simulation answered a failure that `session_failure_rule` checks against the call
        alone: with `alone` every one; with `related` one after earlier shown calls none of which is related to the
        call (`related_to_call`), so that nothing the model saw could have caused it. A recorded answer is what the
        API said, and never doubted."""
        rule = self.settings.session_failure_rule
        if rule == "any" or reply.provenance != SIMULATED + self.responder.identities[True]:
            return False
        if not is_api_failure(reply):
            return False
        return rule == "alone" or not any(related_to_call(line, doc.api, arguments) for line in history.lines)

    async def _answer_alone(self, reply: Reply, doc: ApiDoc, arguments: dict, key: str, answer: Answer) -> Reply:
        """The call's answer alone (the stateless call: recorded, cached or simulated), in place of a session's
        failure the rule checks. Under `alone`, where the call alone fails too, the session's failure stays (its
        words may name what the session holds). The session's answer also stays where the stateless ask cannot
        answer (a replay server without it, an engine that fails), as the first of two tries does."""
        stages: dict[str, float] = {}
        try:
            alone = await self.responder.respond(doc, arguments, key, None, stages)
        except (ReplayMiss, EngineError) as exc:
            logger.warning("a session's failure was kept: the call alone was not answered: %s", exc)
            return reply
        finally:
            for stage, seconds in stages.items():
                answer.stages[stage] = answer.stages.get(stage, 0.0) + seconds
        if self.settings.session_failure_rule == "alone" and is_api_failure(alone):
            return reply
        answer.asked_alone = True
        return alone


def is_api_failure(reply: Reply) -> bool:
    """Whether a reply's observation is the API's failure (`transport_failures.api_failed`)."""
    observation = json.loads(reply.observation)
    return api_failed(observation.get("error", ""), observation.get("response", ""))


class LargeBodies:
    """Where bodies of LARGE_BODY_BYTES or more are parsed and canonicalised: a worker process (a few megabytes of
    JSON take the parser seconds, holding the GIL all along, so a thread would stall the event loop as much).
    What comes back is the request (its tool_input dropped), the arguments (None when too large to simulate: the
    key alone finds a recorded answer) and the key. One worker per server process, shared by its apps, started
    by `start()` (the server's start) in the background: until it answers (it takes a second or more to start,
    several on a busy machine), a body of at most INLINE_WHILE_STARTING bytes is parsed here instead of waiting
    for it (a stall of at most a few tenths of a second, once); a larger one waits for it."""

    _pool: ProcessPoolExecutor | None = None
    _ready = threading.Event()

    @classmethod
    def start(cls) -> ProcessPoolExecutor:
        if cls._pool is None:
            cls._ready.clear()
            cls._pool = ProcessPoolExecutor(
                1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=exit_with_parent,
                initargs=(os.getpid(),),
            )
            # Ready once it has imported this module (what a body's parse needs; seconds on a busy machine).
            cls._pool.submit(read_large_body, b"{}", 0).add_done_callback(lambda _: cls._ready.set())
        return cls._pool

    async def parse(self, body: bytes, max_arguments_chars: int):
        return await self.run(read_large_body, body, max_arguments_chars)

    async def run(self, read: Callable[..., Any], body: bytes | str, *args: Any) -> Any:
        """`read(body, *args)` in the worker (a function of a module it can import; what it returns is pickled)."""
        pool = self.start()
        if not self._ready.is_set() and len(body) <= INLINE_WHILE_STARTING:
            return read(body, *args)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, read, body, *args)
        except BrokenProcessPool:  # the worker died (killed, out of memory): a new one for the next body
            type(self)._pool = None
            raise


def exit_with_parent(parent: int) -> None:
    """In `LargeBodies`' worker: exit when the server process is gone (it went on after a server stopped, waiting
    on its queue for ever; a server killed cannot stop it). A thread looks twice a second. A terminal's Ctrl-C,
    which reaches the whole process group, is the server's to act on: here it only printed a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def read_large_body(body: bytes, max_arguments_chars: int):
    """In `LargeBodies`' worker: a Failure (the body is not of the request's shape), or (the request without
    its tool_input, its ParsedArguments; None for `chat_with_user`, which takes none)."""
    try:
        request = read_virtual_request(body)
    except ValidationError as exc:  # not picklable: turned into its answer here
        return to_failure(exc)
    tool_input, request.tool_input = request.tool_input, None
    if _is_chat_with_user(request.api_name):
        return request, None
    return request, parsed_arguments(tool_input, max_arguments_chars)


def arguments_and_key(arguments: Any) -> tuple[dict | None, str]:
    """A call's argument object and key: its `ParsedArguments` as the worker made them (the object None when too
    large to simulate: only a recorded answer can serve them), else parsed here. Raises their ToolInputError."""
    if isinstance(arguments, ParsedArguments):
        if arguments.error is not None:
            raise arguments.error
        return arguments.arguments, arguments.key  # type: ignore[return-value]  # a key whenever no error
    return parse_arguments(arguments)


def _failed(answer: Answer, exc: Exception) -> Answer:
    _with_failure(answer, to_failure(exc))
    if answer.cache is None and "cache_lookup" in answer.stages:
        answer.cache = "miss"
    return answer


def _with_failure(answer: Answer, failure: Failure) -> Answer:
    answer.status, answer.outcome, answer.body, answer.detail = (
        failure.status,
        failure.outcome,
        failure.body,
        failure.detail,
    )
    answer.transient = failure.transient
    return answer


# ------------------------------------------------------------------------------- parsing and failures
class SessionIdError(ValueError):
    """A session id too long to be one, or holding a control character (an id names a session; it is kept in the
    store)."""


def observation_bytes(error: str, response: Any) -> bytes:
    """A response body: the observation as `mirrorapi.records.observation_json` writes it, as bytes."""
    return observation_json(error, response).encode()


_ENGINE_REASONS = {
    "unreachable": "the simulator engine is unreachable",
    "cut": "the simulator engine broke off its answer",
    "timeout": "the simulator engine did not answer in time",
    "not_json": "the simulator engine's answer is not JSON",
    "no_choice": "the simulator engine's answer is not a chat completion (no choices)",
    "empty": "the simulator's output was empty",
    "busy": "the simulator is busy: too many calls are waiting for it; try again later",
}


def _http_reason(exc: EngineError) -> str:
    """An engine's HTTP refusal in words the agent can act on (the engine's own text, which may name its address
    or model path, goes to the log only)."""
    if exc.status is None:
        return "the simulator engine failed"
    text = str(exc).lower()
    if exc.status == 400 and ("context" in text or "too long" in text or "maximum" in text and "token" in text):
        return "the call is too long for the simulator's context (the engine answered HTTP 400)"
    if exc.status == 404:
        return "the simulator engine does not serve the configured model (HTTP 404)"
    return f"the simulator engine answered HTTP {exc.status}"


# Engine failures that the same call asked again may not meet (an engine that is busy, restarting or slow), as against
# what it gives again (a model's text that is no observation, a request it refuses).
TRANSIENT_ENGINE_FAILURES = frozenset({"busy", "unreachable", "cut", "timeout"})


@dataclass(frozen=True, slots=True)
class Failure:
    status: int  # HTTP status: 200 for everything but a body of the wrong shape (422)
    outcome: str  # metrics label
    body: bytes
    detail: str  # for the log line
    transient: bool = False  # the server's own failure (engine, store), not the API's answer: see `Answer.transient`


def to_failure(exc: BaseException) -> Failure:
    """Every failure of a /virtual call -> the HTTP status, the metrics outcome and the body."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        body = json.dumps(
            {
                "error": f"Invalid request body: {problems}",
                "response": "",
                "detail": json.loads(exc.json(include_url=False, include_input=False)),
            },
            ensure_ascii=False,
        ).encode()
        return Failure(422, "invalid_body", body, problems)
    if isinstance(exc, SessionIdError):
        message = f"Invalid request: {exc}"
        return Failure(422, "invalid_body", json.dumps({"error": message, "response": ""}).encode(), str(exc))
    if isinstance(exc, ToolInputError):
        return Failure(200, "validation_error", observation_bytes(TOOL_INPUT_PARSE_ERROR + str(exc), ""), str(exc))
    if isinstance(exc, (UnknownName, ArgumentError)):
        return Failure(200, "validation_error", observation_bytes(str(exc), ""), str(exc))
    if isinstance(exc, ReplayMiss):
        message = "No recorded response for this call (the server replays its cache only)."
        return Failure(200, "replay_miss", observation_bytes(message, ""), str(exc))
    if isinstance(exc, CacheError):  # the store is away (a PostgreSQL restarting): /health says so too
        logger.warning("a /virtual call failed on the cache store: %s", exc)
        message = f"{ENGINE_FAILURE} (the cache store is unavailable; try again later)"
        return Failure(200, "store_error", observation_bytes(message, ""), str(exc), transient=True)
    if isinstance(exc, EngineError):
        # The agent gets a short reason; the engine's address and details go to the log only.
        # `garbage`: the message says what the model's text was instead (see the simulator).
        reason = str(exc) if exc.kind == "garbage" else _ENGINE_REASONS.get(exc.kind) or _http_reason(exc)
        transient = exc.kind in TRANSIENT_ENGINE_FAILURES or exc.kind == "http" and transient_status(exc.status)
        return Failure(
            200,
            "engine_error",
            observation_bytes(f"{ENGINE_FAILURE} ({reason})", ""),
            f"{exc.kind}: {exc}",
            transient,
        )
    # A bug of ours, not the client's: logged with its traceback, answered as an observation so
    # that the agent's run goes on (StableToolBench's servers answered 500 here).
    logger.error("internal error on /virtual", exc_info=exc)
    return Failure(
        200,
        "internal_error",
        observation_bytes(f"{ENGINE_FAILURE}: internal server error", ""),
        f"{type(exc).__name__}: {exc}",
    )
