"""Which recorded observations are worth learning from: transport failures vs genuine API errors.

A simulator must learn what an API answers, not that RapidAPI was rate-limited or a gateway timed
out on the day the call was recorded. StableToolBench's `check_result` (notes §3) drops those, but
with bare substring tests on the whole payload, so a real answer that merely contains `500` (a
price), `404` (an id), `parameter` or `blocked` is thrown away, while it keeps none of the API's own
error replies. Here:

- the error strings its executor and client give a transport meaning (`"Rate limit per minute
  error..."`, `"API not working error..."`, a network exception inside `"Function executing ...
  error..."`) mark a transport failure;
- otherwise only *message-like* text is inspected: the message/error/detail fields of a small JSON
  or Python-literal object, the title of an HTML error page, or a short plain-text reply, plus the
  numeric status fields (`status`, `statusCode`, `code`) and `status_code=5xx` markers. Digits and
  words inside a real payload never count;
- everything else is the API's genuine answer. Errors (`error` non-empty, or in-band error text such
  as tau-bench's `"Error: ..."`) are kept as error examples.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

# Error strings with a transport meaning: StableToolBench's client status codes 6-10 and the legacy
# executor's errors (notes §1). "Message error..." is NOT here: it wraps the API's own message.
_TRANSPORT_ERRORS = (
    ("api not working error", "unavailable"),
    ("api temporarily not working error", "unavailable"),
    ("unauthorized error", "auth"),
    ("unsubscribed error", "auth"),
    ("blocked error", "auth"),
    ("too many requests error", "rate_limit"),
    ("rate limit per minute error", "rate_limit"),
    ("rate limit error", "rate_limit"),
    ("gateway error", "gateway"),
    ("timeout error", "timeout"),
    ("request invalid, data error", "server_error"),  # the client's view of a non-200 from the server
    ("failed to generate fake response", "simulator_failure"),  # a simulated placeholder, not an answer
)
# Inside "Function executing <import> error...\n<exception>": network exceptions of `requests`.
_EXECUTOR_NETWORK = re.compile(
    r"exceeded \d+ redirects|max retries exceeded|connection(error| refused| reset| aborted)|read timed out|"
    r"timed out|sslerror|name or service not known|remote end closed",
    re.IGNORECASE,
)

# Phrases that, inside a message, mean the call never reached a working API.
_MESSAGE_RULES = (
    (
        "rate_limit",
        re.compile(
            r"rate.?limit|too many requests|quota (is |has been )?exceeded|exceeded (the |your )?"
            r"(monthly |daily |request )?(quota|limit)|check credits balance",
            re.IGNORECASE,
        ),
    ),
    # "timeout" alone is too common in content ("... during a timeout", a config field).
    (
        "timeout",
        re.compile(
            r"\btimed out\b|\b(request|connection|read|gateway|upstream|socket|operation)[ -]?"
            r"time-?out\b|\btime-?out (error|exceeded|expired)|^\W*time-?out\W*$",
            re.IGNORECASE,
        ),
    ),
    # An API's own "invalid token" (a bad argument) is a genuine error; these are about the caller's access.
    (
        "auth",
        re.compile(
            r"not subscribed|unsubscribed|^\W*unauthori[sz]ed|unauthenticated|not authenticated|"
            r"authentication (is )?(failed|required|error)|invalid (api.?key|credentials)|"
            r"api.?key (is )?(invalid|missing|required)|missing api.?key|access (is )?denied|"
            r"access_denied|^\W*(403\W*)?forbidden(\W*$|[.:!])|blocked user|"
            r"disabled for your subscription|invalid consumer key",
            re.IGNORECASE,
        ),
    ),
    (
        "gateway",
        re.compile(r"bad gateway|gateway time-?out|upstream (connect )?error|error in the gateway", re.IGNORECASE),
    ),
    (
        "server_error",
        re.compile(
            r"internal server error|\binternal error\b|service unavailable|"
            r"temporarily unavailable|under maintenance",
            re.IGNORECASE,
        ),
    ),
    (
        "unavailable",
        re.compile(
            r"service not found|\bapi (doesn'?t|does not) exists?|endpoint[^.]{0,40}"
            r"(does not exist|not found)|no route matched|api is unreachable|api \(not working\)",
            re.IGNORECASE,
        ),
    ),
)
_STATUS_CLASS = {
    401: "auth",
    403: "auth",
    407: "auth",
    408: "timeout",
    429: "rate_limit",
    500: "server_error",
    502: "gateway",
    503: "server_error",
    504: "gateway",
}
_STATUS_MARKER = re.compile(r"status_code=(429|5\d\d)\b")
_MESSAGE_KEYS = frozenset(
    {
        "message",
        "messages",  # RapidAPI's "The API is unreachable..." envelope
        "msg",
        "error",
        "errors",
        "error_message",
        "errormessage",
        "detail",
        "details",
        "reason",
        "fault",
        "faultstring",
        "title",
        "info",
        "status_message",
    }
)
_STATUS_KEYS = frozenset({"status", "statuscode", "status_code", "code", "http_status", "httpstatus"})
_PROBLEM_KEYS = _STATUS_KEYS | {"detail"}
_HTML_TEXT = re.compile(r"<(title|h1)[^>]*>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_SMALL_OBJECT_KEYS = 8  # a message envelope, not a payload that happens to have a `message` field
_SHORT_TEXT = 300  # a plain-text reply this short is a message, longer text is content

_IN_BAND_ERROR = re.compile(r"^\s*(error|exception)\b\s*[:!-]", re.IGNORECASE)


def _parse_literal(text: str) -> Any:
    """JSON, or the Python-repr text ToolBench's executor returned; None when it is neither."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return None
    try:
        return json.loads(stripped)
    except ValueError:
        pass
    try:
        return ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _message_parts(response: Any) -> tuple[list[str], list[int]]:
    """(message texts, numeric status values) of a response; empty when it reads as a payload."""
    value = _parse_literal(response) if isinstance(response, str) else response
    if isinstance(response, str) and value is None:
        if response.lstrip(" \n\"'").startswith("<"):  # an HTML page, sometimes inside a JSON string
            return [m.group(2) for m in _HTML_TEXT.finditer(response)], []
        return ([response] if len(response) <= _SHORT_TEXT else []), []
    if not isinstance(value, dict) or len(value) > _SMALL_OBJECT_KEYS:
        return [], []
    texts: list[str] = []
    statuses: list[int] = []
    # `title` is a message only beside a status or problem details' `detail` (RFC 9457): {"title":
    # "Forbidden", "year": 1997} is a film.
    keys = {str(k).lower() for k in value}
    message_keys = _MESSAGE_KEYS if keys & _PROBLEM_KEYS else _MESSAGE_KEYS - {"title"}
    # A numeric `code`/`status` is an HTTP status only in an error envelope ({"status": 500, "message":
    # ...}); {"code": 404, "city": ...} is a payload whose field happens to be called `code`.
    envelope = len(value) <= 2 or bool(keys & message_keys)
    for key, item in value.items():
        lowered = str(key).lower()
        if lowered in _STATUS_KEYS:
            if isinstance(item, int) and not isinstance(item, bool):
                statuses += [item] if envelope else []
            elif isinstance(item, str) and item.strip().isdigit():
                statuses += [int(item.strip())] if envelope else []
            elif isinstance(item, str):
                texts.append(item)
        elif lowered in message_keys:
            if isinstance(item, str):
                texts.append(item)
            elif isinstance(item, dict):  # {"error": {"message": "...", "code": 429}}
                inner_texts, inner_statuses = _message_parts(item)
                texts += inner_texts
                statuses += inner_statuses
            elif isinstance(item, list):
                texts += [x for x in item if isinstance(x, str)]
                texts += [str(x.get("message", "")) for x in item if isinstance(x, dict)]
    return texts, statuses


def transport_failure(error: str, response: Any) -> str | None:
    """The kind of transport failure this observation records (`rate_limit`, `timeout`, `auth`,
    `gateway`, `server_error`, `unavailable`, `simulator_failure`), or None for a genuine answer."""
    lowered = (error or "").strip().lower()
    for prefix, kind in _TRANSPORT_ERRORS:
        if lowered.startswith(prefix):
            return kind
    if lowered.startswith("function executing") and _EXECUTOR_NETWORK.search(lowered):
        return "unavailable"
    marker = _STATUS_MARKER.search(response) if isinstance(response, str) else None
    if marker:
        return "rate_limit" if marker.group(1) == "429" else "server_error"
    texts, statuses = _message_parts(response)
    for status in statuses:
        if status in _STATUS_CLASS:
            return _STATUS_CLASS[status]
    for text in texts:
        for kind, pattern in _MESSAGE_RULES:
            if pattern.search(text):
                return kind
    return None


def in_band_error(response: Any) -> bool:
    """True when a response recorded with an empty `error` is itself an error reply
    (tau-bench's `"Error: ..."`, `{"error": "..."}`, `{"status": "error"}`, `{"success": false}`, or an error
    envelope giving a client error's HTTP status: `{"status": 400, "title": "Bad Request"}`, RFC 9457's problem
    details among them; the statuses of a transport failure were told apart before)."""
    if isinstance(response, str) and _IN_BAND_ERROR.match(response):
        return True
    value = _parse_literal(response) if isinstance(response, str) else response
    if not isinstance(value, dict):
        return False
    if isinstance(value.get("error"), str) and value["error"].strip():
        return True
    if isinstance(value.get("status"), str) and value["status"].strip().lower() in ("error", "fail", "failed"):
        return True
    if any(400 <= status < 500 for status in _message_parts(value)[1]):
        return True
    return value.get("success") is False


def api_failed(error: str, response: Any) -> bool:
    """Whether an observation (recorded or simulated) is the API's failure: an `error` written for it, or an error
    reply in the response (`in_band_error`). ToolBench's executor writes the error "Message error..." whenever the
    text "error" is anywhere in the response (its `process_error`): a page of film titles holding the word, an HTML
    element id such as `af-error-container`. Such an observation is the failure its response alone says it is."""
    if (error or "").strip().lower().startswith("message error"):
        return in_band_error(response)
    return bool(error) or in_band_error(response)
