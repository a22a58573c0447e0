"""The /virtual request path, without HTTP: body -> names -> doc -> validation -> cache -> simulator.

Order of the steps (StableToolBench's, plus validation): `chat_with_user` is answered first;
`tool_input` is parsed; the names are resolved in the in-memory registry (unknown ones come back
with the closest known names, and the engine is never called); the cache is looked up by canonical
key (a recorded answer is returned even for a call the policy would reject: it is what the API
said); on a miss the arguments are checked against the doc per the validation policy, then the
call is simulated (mode `simulate`) or answered with an error observation (mode `replay`). Every outcome, failures
included, is an `Answer` ready to send (see `mirrorapi.protocol.to_failure`).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

from mirrorapi.cache import ResponseCache, canonical_json
from mirrorapi.config import ServerSettings
from mirrorapi.names import api_key_name
from mirrorapi.protocol import (CHAT_WITH_USER, CHAT_WITH_USER_REPLY, ReplayMiss, VirtualRequest, check_arguments,
                                observation_bytes, parse_tool_input, to_failure)
from mirrorapi.simulator import Simulator
from mirrorapi.tools import ToolRegistry


def _is_chat_with_user(api_name: str) -> bool:
    name = api_key_name(api_name)
    return name == CHAT_WITH_USER or name.startswith(CHAT_WITH_USER + "_for_")


@dataclass(slots=True)
class Answer:
    status: int
    body: bytes
    outcome: str  # hit, simulated, replay_miss, validation_error, engine_error, chat_with_user, invalid_body, ...
    names: tuple[str, str, str] | None = None  # the API, once resolved
    provenance: str | None = None  # of the response given (hits and simulations)
    cache: str | None = None  # "hit" or "miss" when the cache was looked up
    coalesced: bool = False
    detail: str = ""  # why it failed (for the log line)
    extra_fields: list[str] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)  # seconds per stage


class VirtualApi:
    def __init__(self, settings: ServerSettings, registry: ToolRegistry, cache: ResponseCache, simulator: Simulator):
        self.settings, self.registry, self.cache, self.simulator = settings, registry, cache, simulator
        # Name normalisation is regex work; the same few thousand names come back all the time.
        self.resolve = functools.lru_cache(maxsize=65536)(registry.resolve)

    async def answer(self, body: bytes) -> Answer:
        answer = Answer(200, b"", "")
        stages, clock = answer.stages, time.perf_counter
        start = clock()
        try:
            request = VirtualRequest.model_validate_json(body)
            answer.extra_fields = list(request.model_extra or ())
            if "chat" in request.api_name.lower() and _is_chat_with_user(request.api_name):
                answer.body, answer.outcome = observation_bytes("", CHAT_WITH_USER_REPLY), "chat_with_user"
                return answer
            answer.names = (request.category, request.tool_name, request.api_name)
            arguments = parse_tool_input(request.tool_input)
            stages["parse"] = (now := clock()) - start

            doc = self.resolve(request.category, request.tool_name, request.api_name)
            answer.names = (doc.category, doc.tool, doc.api)
            key = canonical_json(arguments)
            stages["resolve"] = (mark := clock()) - now

            found = self.cache.get(doc.category, doc.tool, doc.api, key)
            stages["cache_lookup"] = (now := clock()) - mark
            answer.cache = "miss" if found is None else "hit"
            if found is not None:  # a recorded answer wins over the validation policy: it is what the API said
                answer.body, answer.provenance, answer.outcome = found[0].encode(), found[1], "hit"
                return answer
            check_arguments(doc, arguments, self.settings.missing_required, self.settings.unknown_arguments)
            if self.settings.mode == "replay":
                raise ReplayMiss(f"no cached response for {doc.category}/{doc.tool}/{doc.api} {key[:200]}")

            try:
                simulation = await self.simulator.simulate(doc, arguments, key)
            finally:
                stages["engine"] = clock() - now
            answer.coalesced = simulation.coalesced
            answer.provenance = self.simulator.provenance
            answer.body = observation_bytes(simulation.observation["error"], simulation.observation["response"])
            answer.outcome = "simulated"
            return answer
        except Exception as exc:  # every failure becomes an observation (or a 422), never a 500
            failure = to_failure(exc)
            answer.status, answer.outcome, answer.body, answer.detail = (failure.status, failure.outcome,
                                                                         failure.body, failure.detail)
            return answer
        finally:
            stages["total"] = clock() - start
