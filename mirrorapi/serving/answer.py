"""What a /virtual call comes to (`Answer`): the response ready to send, and what the metrics and the request log
line say of it. Made by `mirrorapi.serving.handler`, recorded by `mirrorapi.serving.observability`."""

from __future__ import annotations

from dataclasses import dataclass, field

# Every `outcome` a request is counted under (metrics' label, the request log's field), declared once: the
# metrics' help text is written from these, and docs/serving.md lists them.
ANSWERED = (  # a /virtual call answered by its handler (an observation, or a 422 for a body of the wrong shape)
    "hit",
    "simulated",
    "replay_miss",
    "validation_error",
    "engine_error",
    "store_error",
    "chat_with_user",
    "invalid_body",
    "internal_error",
)
REFUSED = (  # a request of any path refused before a handler
    "unauthorized",
    "method_not_allowed",
    "body_too_large",
    "request_timeout",
    "headers_too_large",
    "foreign_origin",
    "shutting_down",
)
OUTCOMES = ANSWERED + REFUSED


@dataclass(slots=True)
class Answer:
    status: int
    body: bytes
    outcome: str  # one of OUTCOMES
    names: tuple[str, str, str] | None = None  # the API, once resolved
    provenance: str | None = None  # of the response given (hits and simulations)
    cache: str | None = None  # "hit" or "miss" when the cache was looked up
    coalesced: bool = False
    session: str | None = None  # the session id, for calls that belong to one
    detail: str = ""  # why it failed (for the log line)
    rationale: str = ""  # CoT mode: the simulator's reasoning (for the log line; the agent gets error/response)
    parsed: str = ""  # simulated: how the model's text was read (json = as written; fenced, ..., repaired)
    second_try: str = ""  # simulated: an answer cut at max_tokens asked again ("kept", "cut again", "failed")
    asked_alone: bool = False  # a session's failure the session_failure_rule checked, answered as the call alone
    # The server's own failure that the same call asked again may not meet (the engine busy, away or slow; the
    # store away): /virtual answers it as StableToolBench's servers do, an OpenEnv step as an error to retry.
    transient: bool = False
    extra_fields: list[str] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)  # seconds per stage
