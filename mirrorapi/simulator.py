"""The simulator: an API's doc and a request (and a few real examples) -> the engine -> an observation.

The prompt is built by `mirrorapi.prompts.simulator_messages` (the same code the data builder
uses, so a model is served with the format it was trained on); the answer is read defensively by
`parse_simulator_output` (a legitimately empty response stays a success). An answer is stored in
the cache with provenance `simulated:<model>@<prompt format>` (unless `is_save` is off); an engine
failure (down, slow, garbage) raises `EngineError` and is never stored.

Identical concurrent misses share one engine call: the first starts it as a task of its own, the
others await the same task (a client that goes away does not cancel it), and only that task stores.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections import Counter
from dataclasses import dataclass

from mirrorapi.cache import SIMULATED, ResponseCache, canonical_json
from mirrorapi.config import ServerSettings
from mirrorapi.engine import EngineClient, EngineError
from mirrorapi.prompts import OBSERVATION_SCHEMA, parse_simulator_output, simulator_messages, truncate_response
from mirrorapi.tools import ApiDoc

logger = logging.getLogger(__name__)

# Candidates read per API when choosing few-shot examples (bounds the cost of a miss).
FEW_SHOT_CANDIDATES = 256
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "observation", "schema": OBSERVATION_SCHEMA}}


@dataclass(slots=True)
class Simulation:
    observation: dict  # {"error": str, "response": ...}
    how: str  # how the model's text was read: json, fenced, literal, regex, repaired
    stored: bool  # written to the cache by this request
    coalesced: bool  # answered by an identical call already in flight (no engine call of its own)


def argument_similarity(a: dict, b: dict) -> float:
    """How alike two calls' arguments are: shared argument values count twice as much as shared
    argument names (Jaccard of each). Few-shot selection and the fidelity baseline both use it."""
    items_a = {(k, canonical_json(v)) for k, v in a.items()}
    items_b = {(k, canonical_json(v)) for k, v in b.items()}
    names = len(a.keys() & b.keys()) / max(1, len(a.keys() | b.keys()))
    return 2 * len(items_a & items_b) / max(1, len(items_a | items_b)) + names


def select_examples(candidates: list[tuple[str, str]], arguments: dict, k: int, char_budget: int) -> list[tuple[dict, dict]]:
    """Up to `k` (arguments, observation) pairs most similar to `arguments`, whose rendered size
    (arguments + observation JSON) fits `char_budget` together. Deterministic: ties go to the
    shorter, then the lexically first example. Examples that do not fit are skipped, never cut."""
    if k <= 0:
        return []
    scored = []
    for args_json, observation_json in candidates:
        args = json.loads(args_json)
        if isinstance(args, dict) and args != arguments:
            size = len(args_json) + len(observation_json)
            scored.append((-argument_similarity(arguments, args), size, args_json, args, observation_json))
    scored.sort(key=lambda item: item[:3])
    chosen, used = [], 0
    for _, size, _, args, observation_json in scored:
        if used + size <= char_budget:
            chosen.append((args, json.loads(observation_json)))
            used += size
            if len(chosen) == k:
                break
    return chosen


class Simulator:
    def __init__(self, engine: EngineClient, cache: ResponseCache, settings: ServerSettings):
        self.engine, self.cache, self.settings = engine, cache, settings
        self.system_prompt = settings.system_prompt()
        self.provenance = f"{SIMULATED}{settings.model}@{settings.prompt_format}"
        self._in_flight: dict[tuple, asyncio.Task] = {}
        # Read by the server's /metrics: engine calls by result, and requests that joined one in flight.
        self.engine_calls: Counter[str] = Counter()
        self.coalesced = 0

    def messages(self, doc: ApiDoc, arguments: dict) -> list[dict]:
        examples = []
        if self.settings.few_shot:
            candidates = self.cache.examples(doc.category, doc.tool, doc.api, FEW_SHOT_CANDIDATES)
            examples = select_examples(candidates, arguments, self.settings.few_shot, self.settings.few_shot_char_budget)
        return simulator_messages(doc, arguments, examples, fmt=self.settings.prompt_format,
                                  system_prompt=self.system_prompt)

    async def simulate(self, doc: ApiDoc, arguments: dict, key: str) -> Simulation:
        """The simulated answer to `arguments` (canonical form `key`); raises EngineError."""
        flight = (doc.category, doc.tool, doc.api, key)
        task = self._in_flight.get(flight)
        coalesced = task is not None
        self.coalesced += coalesced
        if task is None:
            task = asyncio.ensure_future(self._simulate(doc, arguments, key))
            self._in_flight[flight] = task
            task.add_done_callback(lambda done: self._landed(flight, done))
        observation, how, stored = await asyncio.shield(task)
        return Simulation(observation, how, stored and not coalesced, coalesced)

    def _landed(self, flight: tuple, task: asyncio.Task) -> None:
        self._in_flight.pop(flight, None)
        if not task.cancelled():
            task.exception()  # retrieved here, so a failure nobody awaits any more is not reported as lost

    async def _simulate(self, doc: ApiDoc, arguments: dict, key: str) -> tuple[dict, str, bool]:
        settings = self.settings
        try:
            text = await self.engine.chat(
                self.messages(doc, arguments), temperature=settings.temperature, max_tokens=settings.max_tokens,
                response_format=RESPONSE_FORMAT if settings.structured_output else None, seed=settings.seed)
        except EngineError as exc:
            self.engine_calls[exc.kind] += 1
            raise
        observation, how = parse_simulator_output(text)
        if observation is None:
            self.engine_calls["garbage"] += 1
            raise EngineError("garbage", f"engine output is not an observation: {text[:200]!r}")
        self.engine_calls["ok"] += 1
        observation["response"] = truncate_response(observation["response"])
        stored = False
        if settings.is_save:
            try:
                stored = self.cache.put(doc.category, doc.tool, doc.api, key, observation["error"],
                                        observation["response"], self.provenance)
            except sqlite3.Error as exc:  # the answer is still good: give it, unstored
                logger.warning("could not store a simulated answer of %s/%s/%s: %s", doc.category, doc.tool, doc.api, exc)
        return observation, how, stored
