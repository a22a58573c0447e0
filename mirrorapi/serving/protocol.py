"""The wire contract of StableToolBench's `POST /virtual` (the mapping of failures into it is
`mirrorapi.serving.handler.to_failure`).

Request: `category`, `tool_name`, `api_name`, `tool_input` (a JSON string, or an object), and
optionally `strip` and `toolbench_key` (both ignored, as by every StableToolBench virtual server),
and `session_id` (ours; StableToolBench's clients never send it): the simulation session the call
belongs to, like the `X-Session-Id` header (the body field wins when both are given).
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
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

logger = logging.getLogger(__name__)

SESSION_HEADER = b"x-session-id"  # as ASGI gives header names: lower case
# Sent with every /virtual answer (the body stays StableToolBench's): how the server answered (the request log's
# `outcome`: hit, simulated, validation_error, ...) and, for hits and simulations, the answer's provenance,
# percent-encoded (a model's folder may hold any character). A client scoring a simulator reads them to tell
# the calls its cache answered from those the simulator did.
OUTCOME_HEADER = b"x-mirrorapi-outcome"
PROVENANCE_HEADER = b"x-mirrorapi-provenance"
# Sent (value "1") with an answer that is the server's own failure that may pass (the engine busy, away or slow; the
# store away: `Answer.transient`), not the API's: the body is still StableToolBench's `Failed to generate fake
# response` observation, and a client that reads the header (mirrorapi's agent runner) asks again later.
RETRY_HEADER = b"x-mirrorapi-retry"
CHAT_WITH_USER = "chat_with_user"
CHAT_WITH_USER_REPLY = "Chat with user."
TOOL_INPUT_PARSE_ERROR = "Tool input parse error...\n"
ENGINE_FAILURE = "Failed to generate fake response"


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
    session_id: str | None = None  # ours: see the module doc; "" or absent means no session


def read_virtual_request(body: bytes) -> VirtualRequest:
    """A /virtual body as its request; ValidationError when it is not of the request's shape. pydantic's JSON parser
    refuses a lone surrogate escape (`"\\ud83d"`, half of an emoji pair a model wrote into its arguments), which
    JSON's grammar allows (RFC 8259 §8.2) and StableToolBench's server reads (`json.loads`): such a body is read
    that way, so its call gets the error observation of its arguments (or of its name), not HTTP 422."""
    try:
        return VirtualRequest.model_validate_json(body)
    except ValidationError as exc:
        if not any(error["type"] == "json_invalid" for error in exc.errors()):
            raise
        try:
            data = json.loads(body)
        except ValueError:  # not JSON for json.loads either: the parser's own reason
            raise exc from None
        return VirtualRequest.model_validate(data)


class ToolInputError(ValueError):
    """`tool_input` is not a JSON object (nor a string holding one)."""


class ReplayMiss(LookupError):
    """Replay mode and no cached response for the call."""
