"""The simulator: an API's doc and a request (and a few real examples) -> the engine -> an observation.

The prompt is built by `mirrorapi.prompts.simulator_messages` (the same code the data builder
uses, so a model is served with the format it was trained on); the answer is read defensively by
`parse_simulator_output` (a legitimately empty response stays a success). An answer is stored in
the cache with provenance `simulated:<identity>` (unless `is_save` is off; see `simulator_identity`);
an engine failure (down, slow, garbage) raises `EngineError` and is never stored.

A call inside a session is prompted in format `mirrorapi-session-v1` with the session's history
(`mirrorapi.serving.sessions.History`) and stored under the call and the history's digest, apart
from the stateless entries, with provenance `simulated:<session identity>` (`session_identity`).

Identical concurrent misses share one engine call: the first starts it as a task of its own, the
others await the same task (a client that goes away does not cancel it), and only that task stores.
`drain()` waits for the tasks in flight (the server calls it before closing the cache).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import sqlite3
from collections import Counter
from dataclasses import dataclass

from mirrorapi.engine_client import EngineClient, EngineError
from mirrorapi.few_shot import FEW_SHOT_CANDIDATES, select_examples
from mirrorapi.prompts import (
    COT_FORMAT,
    OBSERVATION_SCHEMA,
    observation_schema,
    cot_rationale,
    SESSION_FORMAT,
    parse_simulator_output,
    simulator_messages,
    truncate_response,
)
from mirrorapi.serving.cache import SIMULATED, ResponseCache
from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.sessions import History
from mirrorapi.tools import ApiDoc

logger = logging.getLogger(__name__)

RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "observation", "schema": OBSERVATION_SCHEMA}}


def response_format(doc: ApiDoc, prompt_format: str) -> dict:
    """OpenAI's `response_format` for one call: the observation schema, in `mirrorapi-v2` the doc's response
    shape for a success (`mirrorapi.prompts.observation_schema`)."""
    schema = observation_schema(doc, prompt_format)
    return RESPONSE_FORMAT if schema is OBSERVATION_SCHEMA else \
        {"type": "json_schema", "json_schema": {"name": "observation", "schema": schema}}


@dataclass(slots=True)
class Simulation:
    observation: dict  # {"error": str, "response": ...}
    how: str  # how the model's text was read: json, fenced, literal, regex, repaired
    stored: bool  # written to the cache by this request
    coalesced: bool  # answered by an identical call already in flight (no engine call of its own)
    rationale: str = ""  # CoT mode: the model's `mechanism_of_the_api` (for the request log, not the agent)


def simulator_identity(settings: ServerSettings) -> str:
    """The name this server's simulated answers are stored and looked up under: the model, the prompt
    format (named with its version), and the settings that change what the model answers for a call:
    temperature, structured output, few-shot examples (k and their budget), the system prompt text
    (a hash) and, when sampling, the seed. `max_tokens`, timeouts and replicas are left out: they do
    not change a complete answer. The `simulator_identity` setting names one instead.
    E.g. `mirrorapi@mirrorapi-v1,temperature=0,structured_output=on,few_shot=0`."""
    if settings.simulator_identity:
        return settings.simulator_identity
    parts = [f"{settings.model}@{settings.prompt_format}", f"temperature={settings.temperature:g}",
             f"structured_output={'on' if settings.structured_output else 'off'}", f"few_shot={settings.few_shot}"]
    if settings.few_shot:
        parts.append(f"few_shot_chars={settings.few_shot_char_budget}")
    if settings.temperature and settings.seed is not None:
        parts.append(f"seed={settings.seed}")
    system_prompt = settings.system_prompt()
    if system_prompt is not None:
        parts.append("system_prompt=" + hashlib.sha256(system_prompt.encode()).hexdigest()[:12])
    return ",".join(parts)


def session_identity(settings: ServerSettings) -> str:
    """The identity of answers simulated inside sessions: `simulator_identity` with the session format
    (no system prompt file: that is the stateless format's) and the history budget, which changes
    what the model sees. E.g. `mirrorapi@mirrorapi-session-v1,temperature=0,...,history=8,history_chars=4096`."""
    if settings.simulator_identity:
        return f"{settings.simulator_identity}+{SESSION_FORMAT}"
    stateless = simulator_identity(settings.model_copy(update={"prompt_format": SESSION_FORMAT,
                                                               "system_prompt_file": None}))
    return f"{stateless},history={settings.session_history},history_chars={settings.session_char_budget}"


class Simulator:
    def __init__(self, engine: EngineClient, cache: ResponseCache, settings: ServerSettings):
        self.engine, self.cache, self.settings = engine, cache, settings
        self.system_prompt = settings.system_prompt()
        self.identity = simulator_identity(settings)
        self.provenance = SIMULATED + self.identity
        self.session_identity = session_identity(settings)
        self.session_provenance = SIMULATED + self.session_identity
        self._in_flight: dict[tuple, asyncio.Task] = {}
        # Read by the server's /metrics: engine calls by result, and requests that joined one in flight.
        self.engine_calls: Counter[str] = Counter()
        self.coalesced = 0

    def messages(self, doc: ApiDoc, arguments: dict, history: History | None = None) -> list[dict]:
        examples = []
        if self.settings.few_shot:
            candidates = self.cache.examples(doc.category, doc.tool, doc.api, FEW_SHOT_CANDIDATES)
            examples = select_examples(candidates, arguments, self.settings.few_shot, self.settings.few_shot_char_budget)
        if history is not None:  # our session format; a system prompt file is for the stateless format
            return simulator_messages(doc, arguments, examples, fmt=SESSION_FORMAT, history=history.lines)
        return simulator_messages(doc, arguments, examples, fmt=self.settings.prompt_format,
                                  system_prompt=self.system_prompt)

    async def simulate(self, doc: ApiDoc, arguments: dict, key: str, history: History | None = None) -> Simulation:
        """The simulated answer to `arguments` (as received; canonical form `key`), after `history`
        when the call is part of a session; raises EngineError."""
        flight = (doc.category, doc.tool, doc.api, key, history.digest if history else None)
        task = self._in_flight.get(flight)
        coalesced = task is not None
        self.coalesced += coalesced
        if task is None:
            task = asyncio.ensure_future(self._simulate(doc, arguments, key, history))
            self._in_flight[flight] = task
            task.add_done_callback(lambda done: self._landed(flight, done))
        observation, how, stored, rationale = await asyncio.shield(task)
        return Simulation(observation, how, stored and not coalesced, coalesced, rationale)

    async def drain(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) for the simulations in flight, and their cache writes."""
        tasks = list(self._in_flight.values())
        if tasks:
            logger.info("waiting for %d simulation(s) in flight before closing the cache", len(tasks))
            await asyncio.wait(tasks, timeout=timeout)

    def _landed(self, flight: tuple, task: asyncio.Task) -> None:
        self._in_flight.pop(flight, None)
        if not task.cancelled():
            task.exception()  # retrieved here, so a failure nobody awaits any more is not reported as lost

    async def _simulate(self, doc: ApiDoc, arguments: dict, key: str,
                        history: History | None) -> tuple[dict, str, bool, str]:
        settings = self.settings
        try:
            text = await self.engine.chat(
                self.messages(doc, arguments, history), temperature=settings.temperature, max_tokens=settings.max_tokens,
                response_format=response_format(doc, settings.prompt_format) if settings.structured_output else None,
                seed=settings.seed)
        except EngineError as exc:
            self.engine_calls[exc.kind] += 1
            raise
        if not text:
            self.engine_calls["empty"] += 1
            raise EngineError("empty", "the engine's message holds no text")
        observation, how = parse_simulator_output(text)
        if observation is None:
            self.engine_calls["garbage"] += 1
            logger.info("simulator output is not an observation: %r", text[:200])
            raise EngineError("garbage", unusable_output(text))
        self.engine_calls["ok"] += 1
        rationale = cot_rationale(text) if history is None and settings.prompt_format == COT_FORMAT else ""
        observation["response"] = truncate_response(observation["response"])
        stored = False
        if settings.is_save:
            try:
                if history is None:
                    stored = await self.cache.store(doc.category, doc.tool, doc.api, arguments, observation["error"],
                                                    observation["response"], self.provenance)
                else:
                    stored = await self.cache.store_in_session(
                        doc.category, doc.tool, doc.api, key, self.session_identity, history.digest, history.steps,
                        observation["error"], observation["response"], self.session_provenance)
            except sqlite3.Error as exc:  # the answer is still good: give it, unstored
                logger.warning("could not store a simulated answer of %s/%s/%s: %s", doc.category, doc.tool, doc.api, exc)
        return observation, how, stored, rationale


def unusable_output(text: str) -> str:
    """What a model's text that is no observation was instead, in a few words the agent is shown."""
    try:
        value = json.loads(text)
    except ValueError:
        return f"the simulator's output was not JSON ({len(text):,} characters)"
    if isinstance(value, dict):
        keys = ", ".join(repr(k)[:40] for k in list(value)[:5]) or "none"
        return f"the simulator's output was a JSON object without \"error\" or \"response\" (keys: {keys})"
    return f"the simulator's output was a JSON {type(value).__name__}, not an {{\"error\", \"response\"}} object"
