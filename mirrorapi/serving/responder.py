"""Look up -> simulate -> store: the one owner of a call's answer, with or without a session.

`Responder.respond` takes a resolved call (its doc, arguments, canonical key and, inside a session, the
session's history) and gives the answer: the cache's (`mirrorapi.serving.cache.entries.served`: the
recorded answer, else this simulator identity's under the call's history), else a simulation, which
it stores under the call with provenance `simulated:<identity>` (unless `is_save` is off). Before
simulating a miss it applies the server's request policy (`check_miss`: validation, size bound)
and, in replay mode, refuses.

Identical misses share one engine call: in one process the first starts it as a task of its own and
the others await the same task (a client that goes away does not cancel it); across processes that
share a store (uvicorn workers, servers on one PostgreSQL cache) the first takes a *lease* on the call
in the store and the others wait for its answer (polling the cache) until the lease is released or
expires (a process killed mid-call: `engine_timeout` + LEASE_MARGIN_SECONDS). `drain()` waits for the
simulations in flight (the server calls it before closing the cache).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass

from mirrorapi.engine_client import EngineError
from mirrorapi.few_shot import FEW_SHOT_CANDIDATES
from mirrorapi.records import observation_json
from mirrorapi.serving.cache import NO_SESSION, SIMULATED, CacheError, Call, Entry, Store
from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.observability import ServerMetrics
from mirrorapi.serving.protocol import ReplayMiss
from mirrorapi.serving.sessions import History
from mirrorapi.serving.simulator import Simulator, simulator_identity
from mirrorapi.tools import ApiDoc, ArgumentError, check_arguments

logger = logging.getLogger(__name__)

LEASE_MARGIN_SECONDS = 10.0  # beyond engine_timeout, before another process may take over a call
LEASE_POLL_SECONDS = (0.005, 0.25)  # first and longest wait between looks for another process's answer
LEASE_RETAKE_SECONDS = 1.0  # how often a waiting process tries to take the lease over (a write)
_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass(slots=True)
class Reply:
    observation: bytes  # the {"error", "response"} answer, compact JSON: the response body
    provenance: str
    hit: bool  # found in the cache (else simulated, by this call or one it joined)
    coalesced: bool = False  # answered by an identical simulation already in flight (here or in another process)
    parsed: str = ""  # simulated here: how the model's text was read (json = as written; fenced, ..., repaired)
    rationale: str = ""  # CoT mode: the simulator's reasoning (for the request log; the agent gets the observation)
    second_try: str = ""  # simulated here: what asking a cut answer again came to ("kept", "cut again", "failed")


class Responder:
    def __init__(
        self,
        settings: ServerSettings,
        cache: Store,
        simulator: Simulator,
        metrics: ServerMetrics,
        lease_holder: str | None = None,
    ):
        """`metrics`: counts engine calls and coalesced misses; `lease_holder`: this process's name in the store's
        leases when the store is shared, else None."""
        self.settings, self.cache, self.simulator, self.metrics = settings, cache, simulator, metrics
        self.lease_holder = lease_holder
        self.identities = {False: simulator_identity(settings), True: simulator_identity(settings, in_session=True)}
        self._in_flight: dict[tuple[Call, str], asyncio.Task] = {}
        # Leases this process could not let go (the store away): let go by `release_leases_left` once it is back.
        # Left to expire, each kept another process asked the same call waiting `engine_timeout` + 10 s (70 s by
        # default) after a PostgreSQL restart, for an answer never stored (audit of 2026-12-01).
        self._unreleased: set[tuple[Call, str]] = set()

    def too_large(self, key: str) -> bool:
        """Arguments (their canonical JSON) over the bound on what reaches the engine: only a recorded answer
        serves them."""
        return len(key) > self.settings.max_arguments_chars

    def check_miss(self, doc: ApiDoc, arguments: dict | None, key: str) -> None:
        """Before a miss is simulated: the bound on what reaches the engine, and the validation policy
        (`arguments` is None only for arguments over the bound)."""
        if self.too_large(key) or arguments is None:  # never sent to the engine, never stored
            raise ArgumentError(
                f"tool_input is too large to simulate: {len(key):,} characters of JSON "
                f"(this server simulates calls of up to {self.settings.max_arguments_chars:,})."
            )
        check_arguments(doc, arguments, self.settings.missing_required, self.settings.unknown_arguments)

    async def respond(
        self, doc: ApiDoc, arguments: dict | None, key: str, history: History | None, stages: dict[str, float]
    ) -> Reply:
        """The answer to a call (`key`: the canonical JSON of `arguments`; `arguments` None for arguments too large
        to simulate, which only a recorded answer serves); records the time of the cache lookup and the engine in
        `stages`. Raises what `check_miss` raises, ReplayMiss and EngineError."""
        clock = time.perf_counter
        start = clock()
        call = Call(doc.category, doc.tool, doc.api, key, history.digest if history is not None else NO_SESSION)
        identity = self.identities[history is not None]
        found = await self.cache.lookup(call, identity)
        stages["cache_lookup"] = (now := clock()) - start
        if found is not None:  # a recorded answer wins over the validation policy: it is what the API said
            return Reply(found[0], found[1], hit=True)
        self.check_miss(doc, arguments, key)
        assert arguments is not None  # check_miss refuses a miss without them
        if self.settings.mode == "replay":
            after = f" after {history.steps} earlier call(s) of its session" if history is not None else ""
            raise ReplayMiss(f"no cached response for {doc.category}/{doc.tool}/{doc.api} {key[:200]}{after}")
        try:
            return await self._simulation(doc, arguments, call, identity, history)
        finally:
            stages["engine"] = clock() - now

    async def drain(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) for the simulations in flight, and their cache writes."""
        tasks = list(self._in_flight.values())
        if tasks:
            logger.info("waiting for %d simulation(s) in flight before closing the cache", len(tasks))
            await asyncio.wait(tasks, timeout=timeout)

    # ------------------------------------------------------------------------------ simulation
    async def _simulation(
        self, doc: ApiDoc, arguments: dict, call: Call, identity: str, history: History | None
    ) -> Reply:
        flight = (call, identity)
        task = self._in_flight.get(flight)
        joined = task is not None
        if task is None:
            task = asyncio.ensure_future(self._simulate_and_store(doc, arguments, call, identity, history))
            self._in_flight[flight] = task
            task.add_done_callback(lambda done: self._landed(flight, done))
        else:
            self.metrics.coalesced()
        reply = await asyncio.shield(task)
        return Reply(
            reply.observation,
            reply.provenance,
            hit=False,
            coalesced=reply.coalesced or joined,
            parsed=reply.parsed,
            rationale=reply.rationale,
            second_try=reply.second_try,
        )

    def _landed(self, flight: tuple, task: asyncio.Task) -> None:
        self._in_flight.pop(flight, None)
        if not task.cancelled():
            task.exception()  # retrieved here, so a failure nobody awaits any more is not reported as lost

    async def _simulate_and_store(
        self, doc: ApiDoc, arguments: dict, call: Call, identity: str, history: History | None
    ) -> Reply:
        provenance = SIMULATED + identity
        if self.lease_holder is not None:
            found = await self._lease_or_answer(call, identity, self.lease_holder)
            if found is not None:
                self.metrics.coalesced()
                return Reply(found[0], found[1], hit=False, coalesced=True)
        try:
            candidates = None
            if self.settings.few_shot:
                candidates = await self.cache.recorded_examples(doc.category, doc.tool, doc.api, FEW_SHOT_CANDIDATES)
            simulated = await self.simulator.simulate(doc, arguments, history, candidates)
        except EngineError as exc:
            self.metrics.engine_call(exc.kind)
            await self._release(call, identity)
            raise
        except BaseException:
            await self._release(call, identity)
            raise
        self.metrics.engine_call("ok")
        if simulated.second_try:
            self.metrics.second_try(simulated.second_try)
        observation, rationale = simulated.observation, simulated.rationale
        text = observation_json(observation["error"], observation["response"])
        if self.settings.is_save:
            entry = Entry(
                call.category,
                call.tool,
                call.api,
                call.arguments,
                call.history,
                identity,
                history.steps if history is not None else 0,
                _COMPACT(arguments),
                observation["error"],
                text,
                provenance,
                time.time(),
                rationale=rationale,
            )
            try:
                await self.cache.store(entry, self.lease_holder)
            except CacheError as exc:  # the answer is still good: give it, unstored
                logger.warning(
                    "could not store a simulated answer of %s/%s/%s: %s", call.category, call.tool, call.api, exc
                )
                await self._release(call, identity)  # the store lets the lease go with the answer: it did neither
        else:
            await self._release(call, identity)
        return Reply(
            text.encode(),
            provenance,
            hit=False,
            parsed=simulated.parsed,
            rationale=rationale,
            second_try=simulated.second_try,
        )

    async def _lease_or_answer(self, call: Call, identity: str, holder: str) -> tuple[bytes, str] | None:
        """None once `holder` (this process) holds the lease on the call (it simulates); else the answer another
        process stored meanwhile."""
        lease_seconds = self.settings.engine_timeout + LEASE_MARGIN_SECONDS
        poll, retake = LEASE_POLL_SECONDS[0], 0.0
        while True:
            now = time.monotonic()
            if now >= retake:
                if await self.cache.try_lease(call, identity, holder, lease_seconds):
                    # Another process may have stored the answer and let its lease go since this one missed: asked
                    # again, the engine would give a second answer (another one, sampled) for a call already answered.
                    found = await self.cache.lookup(call, identity, count_hit=False)
                    if found is None:
                        return None
                    await self._release(call, identity)
                    return found
                retake = now + LEASE_RETAKE_SECONDS
            await asyncio.sleep(poll)
            poll = min(poll * 2, LEASE_POLL_SECONDS[1])
            found = await self.cache.lookup(call, identity, count_hit=False)
            if found is not None:
                return found

    async def _release(self, call: Call, identity: str) -> None:
        if self.lease_holder is None:
            return
        try:
            await self.cache.release_lease(call, identity, self.lease_holder)
        except CacheError as exc:  # let go later (`release_leases_left`), or it expires on its own
            self._unreleased.add((call, identity))
            logger.warning("could not release the lease on %s/%s/%s: %s", call.category, call.tool, call.api, exc)

    async def release_leases_left(self) -> None:
        """Let go the leases `_release` could not (the server's cache maintenance, every few seconds); CacheError
        while the store is still away."""
        for call, identity in list(self._unreleased):
            assert self.lease_holder is not None  # only a process that takes leases has one left
            await self.cache.release_lease(call, identity, self.lease_holder)
            self._unreleased.discard((call, identity))
