"""The wire contract of StableToolBench's `POST /virtual`, and the one mapping of failures into it.

Request: `category`, `tool_name`, `api_name`, `tool_input` (a JSON string, or an object), and
optionally `strip` and `toolbench_key` (both ignored, as by every StableToolBench virtual server).
Extra fields are allowed and reported in the request log line. A body that is not of this shape is
the only HTTP 422; every mistake at the API level is HTTP 200 with an error observation, so the
agent sees an observation, never a crash.

Answer: always a JSON object `{"error": str, "response": ...}`; `error == ""` means success.
Error strings an agent client maps to status codes (`API not working error...`, `Unauthorized
error...`, ...) are passed through unchanged from stored responses; the server's own errors reuse
StableToolBench's wording where it had one (`Tool input parse error...`, `Failed to generate fake
response`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from mirrorapi.engine import EngineError
from mirrorapi.tools import ApiDoc, UnknownName

logger = logging.getLogger(__name__)

CHAT_WITH_USER = "chat_with_user"
CHAT_WITH_USER_REPLY = "Chat with user."
TOOL_INPUT_PARSE_ERROR = "Tool input parse error...\n"
ENGINE_FAILURE = "Failed to generate fake response"
# Error strings StableToolBench's agent client maps to status codes 6-11 (notes §1).
SPECIAL_ERRORS = ("API not working error...", "Unauthorized error...", "Unsubscribed error...",
                  "Too many requests error...", "Rate limit per minute error...", "Message error...")


class VirtualRequest(BaseModel):
    """The body StableToolBench's agents send (`toolbench/inference/Downstream_tasks/rapidapi.py`)."""

    # Numbers are accepted as names, as pydantic 1 did for StableToolBench's server.
    model_config = ConfigDict(extra="allow", coerce_numbers_to_str=True)

    category: str
    tool_name: str
    api_name: str
    tool_input: Any  # a JSON string (the model's raw arguments) or an object; "" means {}
    strip: str = ""
    toolbench_key: str = ""


class ToolInputError(ValueError):
    """`tool_input` is not a JSON object (nor a string holding one)."""


class ArgumentError(ValueError):
    """Arguments the API would refuse (a missing required argument, an unknown one): per the policy."""


class ReplayMiss(LookupError):
    """Replay mode and no cached response for the call."""


def parse_tool_input(value: Any) -> dict:
    """`tool_input` -> the argument object; raises ToolInputError for anything that is not an object."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            # strict=False: raw model output often holds literal newlines inside strings.
            parsed = json.loads(value, strict=False)
        except ValueError as exc:
            raise ToolInputError(f"tool_input is not valid JSON: {exc}") from None
        if isinstance(parsed, dict):
            return parsed
        raise ToolInputError(f"tool_input must be a JSON object, got {type(parsed).__name__}: {value[:80]}")
    raise ToolInputError(f"tool_input must be a JSON object or a string holding one, got {type(value).__name__}")


def check_arguments(doc: ApiDoc, arguments: dict, missing_required: str, unknown_arguments: str) -> None:
    """Apply the validation policy (`reject` raises ArgumentError; `simulate` lets the model answer)."""
    required, optional = doc.parameter_names()
    if missing_required == "reject":
        missing = [name for name in required if name not in arguments]
        if missing:
            names = ", ".join(repr(n) for n in missing)
            raise ArgumentError(f"Missing required parameter{'s' if len(missing) > 1 else ''} {names} "
                                f"of {doc.api_title} ({doc.tool_title}).")
    if unknown_arguments == "reject":
        known = set(required) | set(optional)
        unknown = [name for name in arguments if name not in known]
        if unknown:
            raise ArgumentError(f"{doc.api}() got an unexpected keyword argument {unknown[0]!r}")


def observation_bytes(error: str, response: Any) -> bytes:
    return json.dumps({"error": error, "response": response}, ensure_ascii=False,
                      separators=(",", ":")).encode()


_ENGINE_REASONS = {
    "unreachable": "the simulator engine is unreachable",
    "timeout": "the simulator engine did not answer in time",
    "garbage": "the simulator's output was not a response",
    "empty": "the simulator's output was empty",
}


@dataclass(frozen=True, slots=True)
class Failure:
    status: int  # HTTP status: 200 for everything but a body of the wrong shape (422)
    outcome: str  # metrics label
    body: bytes
    detail: str  # for the log line


def to_failure(exc: BaseException) -> Failure:
    """Every failure of a /virtual call -> the HTTP status, the metrics outcome and the body."""
    if isinstance(exc, ValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        body = json.dumps({"error": f"Invalid request body: {problems}", "response": "",
                           "detail": json.loads(exc.json(include_url=False, include_input=False))},
                          ensure_ascii=False).encode()
        return Failure(422, "invalid_body", body, problems)
    if isinstance(exc, ToolInputError):
        return Failure(200, "validation_error", observation_bytes(TOOL_INPUT_PARSE_ERROR + str(exc), ""), str(exc))
    if isinstance(exc, (UnknownName, ArgumentError)):
        return Failure(200, "validation_error", observation_bytes(str(exc), ""), str(exc))
    if isinstance(exc, ReplayMiss):
        message = "No recorded response for this call (the server replays its cache only)."
        return Failure(200, "replay_miss", observation_bytes(message, ""), str(exc))
    if isinstance(exc, EngineError):
        # The agent gets a short reason; the engine's address and details go to the log only.
        reason = _ENGINE_REASONS.get(exc.kind, "the simulator engine failed")
        return Failure(200, "engine_error", observation_bytes(f"{ENGINE_FAILURE} ({reason})", ""), f"{exc.kind}: {exc}")
    # A bug of ours, not the client's: logged with its traceback, answered as an observation so
    # that the agent's run goes on (StableToolBench's servers answered 500 here).
    logger.error("internal error on /virtual", exc_info=exc)
    return Failure(200, "internal_error", observation_bytes(f"{ENGINE_FAILURE}: internal server error", ""),
                   f"{type(exc).__name__}: {exc}")
