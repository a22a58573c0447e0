"""The simulator: an API's doc and a request (and a few real examples) -> the engine -> an observation.

The prompt is built by `mirrorapi.prompts.simulator_formats.simulator_messages` (the same code the data builder
uses, so a model is served with the format it was trained on); the answer is read defensively by
`parse_simulator_output` (a legitimately empty response stays a success). An engine failure (down,
slow, busy, garbage) raises `EngineError`. The simulator neither looks answers up nor stores them:
`mirrorapi.serving.responder.Responder` owns look up -> simulate -> store.

A call inside a session is prompted in format `mirrorapi-session-v1` with the session's history
(`mirrorapi.serving.sessions.History`). Its answers belong to another simulator identity than the
stateless ones (`simulator_identity(settings, in_session=True)`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from typing import NamedTuple

from mirrorapi.engine_client import Completion, EngineClient, EngineError
from mirrorapi.few_shot import select_examples
from mirrorapi.prompts.simulator_formats import (
    COT_FORMAT,
    OBSERVATION_SCHEMA,
    observation_schema,
    session_format,
    simulator_messages,
    truncate_response,
)
from mirrorapi.prompts.simulator_output import cot_rationale, parse_simulator_output
from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.sessions import History
from mirrorapi.tools import ApiDoc

logger = logging.getLogger(__name__)

RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "observation", "schema": OBSERVATION_SCHEMA}}


def response_format(doc: ApiDoc, prompt_format: str) -> dict:
    """OpenAI's `response_format` for one call: the observation schema, in `mirrorapi-v2` the doc's response
    shape for a success (`mirrorapi.prompts.simulator_formats.observation_schema`)."""
    schema = observation_schema(doc, prompt_format)
    return (
        RESPONSE_FORMAT
        if schema is OBSERVATION_SCHEMA
        else {"type": "json_schema", "json_schema": {"name": "observation", "schema": schema}}
    )


def simulator_identity(settings: ServerSettings, in_session: bool = False) -> str:
    """The name this server's simulated answers are stored and looked up under: the model, the prompt
    format (named with its version), and the settings that change what the model answers for a call:
    temperature, structured output, few-shot examples (k, their budget, the tie rule), the system prompt text
    (a hash), when sampling, the seed, and the second try of a cut answer. `max_tokens`, timeouts and replicas
    are left out: they do not change a complete answer. The `simulator_identity` setting names one instead.
    E.g. `mirrorapi@mirrorapi-v1,temperature=0,structured_output=on,few_shot=0,second_try=0.7`.

    Calls inside a session are prompted in the session format (`session_format`: `mirrorapi-session-v2` on a
    `mirrorapi-v2` server, else `-v1`; no system prompt file: that is the stateless format's) with a history of
    `session_history` calls and `session_char_budget` characters, chosen by `session_history_rule`, which change
    what the model sees: `mirrorapi@mirrorapi-session-v1,temperature=0,...,history=8,history_chars=4096` (and
    `,history_rule=related` with that rule; a named identity gets `+mirrorapi-session-v1`)."""
    if settings.simulator_identity:
        return settings.simulator_identity + (f"+{session_format(settings.prompt_format)}" if in_session else "")
    prompt_format = session_format(settings.prompt_format) if in_session else settings.prompt_format
    parts = [
        f"{settings.model}@{prompt_format}",
        f"temperature={settings.temperature:g}",
        f"structured_output={'on' if settings.structured_output else 'off'}",
        f"few_shot={settings.few_shot}",
    ]
    if settings.few_shot:
        parts.append(f"few_shot_chars={settings.few_shot_char_budget}")
        if settings.few_shot_response_chars:
            parts.append(f"few_shot_response_chars={settings.few_shot_response_chars}")
        if settings.few_shot_ties != "shortest":  # the first rule: the identities stored before the setting stay
            parts.append(f"few_shot_ties={settings.few_shot_ties}")
    if settings.temperature and settings.seed is not None:
        parts.append(f"seed={settings.seed}")
    if settings.second_try_temperature:  # changes the answers cut at max_tokens
        parts.append(f"second_try={settings.second_try_temperature:g}")
    system_prompt = None if in_session else settings.system_prompt()
    if system_prompt is not None:
        parts.append("system_prompt=" + hashlib.sha256(system_prompt.encode()).hexdigest()[:12])
    if in_session:
        parts += [f"history={settings.session_history}", f"history_chars={settings.session_char_budget}"]
        if settings.session_history_rule != "recent":  # the first rule: the identities stored before the setting stay
            parts.append(f"history_rule={settings.session_history_rule}")
    return ",".join(parts)


class Simulated(NamedTuple):
    observation: dict  # {"error", "response"}
    parsed: str  # how the model's text was read: json (as written), fenced, literal, regex, repaired
    rationale: str  # a CoT-mode answer's rationale, else ""
    second_try: str  # "" (none asked), "kept", "cut again" or "failed": `ask_engine`


class Simulator:
    """The prompt of a call and the engine's answer to it, read as an observation. Few-shot examples are chosen
    from the candidates the caller read from the store (`Responder`: the API's recorded answers)."""

    def __init__(self, engine: EngineClient, settings: ServerSettings):
        self.engine, self.settings = engine, settings
        self.system_prompt = settings.system_prompt()

    def messages(
        self,
        doc: ApiDoc,
        arguments: dict,
        history: History | None = None,
        candidates: list[tuple[str, str]] | None = None,
    ) -> list[dict]:
        """The chat messages for a call; `candidates`: the API's recorded (arguments, observation) pairs
        to choose few-shot examples from."""
        examples = []
        if self.settings.few_shot:
            examples = select_examples(
                candidates or [],
                arguments,
                self.settings.few_shot,
                self.settings.few_shot_char_budget,
                self.settings.few_shot_response_chars,
                self.settings.few_shot_ties,
            )
        if history is not None:  # our session format; a system prompt file is for the stateless format
            return simulator_messages(
                doc, arguments, examples, fmt=session_format(self.settings.prompt_format), history=history.lines
            )
        return simulator_messages(
            doc, arguments, examples, fmt=self.settings.prompt_format, system_prompt=self.system_prompt
        )

    async def simulate(
        self,
        doc: ApiDoc,
        arguments: dict,
        history: History | None = None,
        candidates: list[tuple[str, str]] | None = None,
    ) -> Simulated:
        """The simulated answer to `arguments` as received, after `history` inside a session; raises EngineError
        (kinds of the engine client, plus `empty` and `garbage`)."""
        settings = self.settings
        completion, second_try = await ask_engine(
            self.engine,
            self.messages(doc, arguments, history, candidates),
            response_format(doc, settings.prompt_format) if settings.structured_output else None,
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
            seed=settings.seed,
            second_try_temperature=settings.second_try_temperature,
        )
        content = completion.message.get("content")
        text = content if isinstance(content, str) else ""
        if not text:
            raise EngineError("empty", "the engine's message holds no text")
        observation, how = parse_simulator_output(text)
        if observation is None:
            logger.info("simulator output is not an observation: %r", text[:200])
            raise EngineError("garbage", unusable_output(text))
        # CoT mode: the model's `mechanism_of_the_api`, for the request log (the agent gets error/response)
        rationale = cot_rationale(text) if history is None and settings.prompt_format == COT_FORMAT else ""
        observation["response"] = truncate_response(observation["response"])
        return Simulated(observation, how, rationale, second_try)


# The seed of a second try when the server sets none: a fixed one, so that a call's answer is the same every time.
SECOND_TRY_SEED = 0


async def ask_engine(
    engine: EngineClient,
    messages: list[dict],
    response_format: dict | None,
    *,
    temperature: float,
    max_tokens: int,
    seed: int | None,
    second_try_temperature: float,
) -> tuple[Completion, str]:
    """The engine's answer to a simulator prompt, and what its second try came to: "" (none was asked), "kept",
    "cut again" or "failed" (the engine failed it: the first answer is served). The one way every caller asks
    (the server; scripts/train_shipped_models.py's served answers).

    An answer cut at `max_tokens` is asked once more, sampled at `second_try_temperature` (0: never) with the
    server's seed or SECOND_TRY_SEED, and the second answer is kept when it ends before the limit. Why: a small
    simulator that answers greedily and runs to the limit has looped (the same list item or phrase again until the
    limit: the shipped simulator's 16 cut answers of 414 held-out calls), and a loop is neither the API's answer
    nor, cut, JSON; sampling leaves the loop. Answers that end before the limit are never asked again, so a greedy
    server's other answers are its greedy ones.

    Both tries share one deadline, the engine's `timeout`: the second gets what the first left (given each its own,
    a call outlived its lease, `engine_timeout` + a margin, and another worker simulated it again)."""
    started = time.monotonic()
    first = await engine.complete(
        messages, temperature=temperature, max_tokens=max_tokens, seed=seed, response_format=response_format
    )
    if first.finish_reason != "length" or not second_try_temperature:
        return first, ""
    try:
        second = await engine.complete(
            messages,
            temperature=second_try_temperature,
            max_tokens=max_tokens,
            seed=SECOND_TRY_SEED if seed is None else seed,
            response_format=response_format,
            started=started,
        )
    except EngineError as exc:  # the first answer is still an answer
        logger.warning("the second try of a cut answer failed: %s", exc)
        return first, "failed"
    if second.finish_reason == "length":
        return first, "cut again"
    return second, "kept"


def unusable_output(text: str) -> str:
    """What a model's text that is no observation was instead, in a few words the agent is shown."""
    try:
        value = json.loads(text)
    except ValueError:
        return f"the simulator's output was not JSON ({len(text):,} characters)"
    if isinstance(value, dict):
        keys = ", ".join(repr(k)[:40] for k in list(value)[:5]) or "none"
        return f'the simulator\'s output was a JSON object without "error" or "response" (keys: {keys})'
    return f'the simulator\'s output was a JSON {type(value).__name__}, not an {{"error", "response"}} object'
