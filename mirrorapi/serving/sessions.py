"""Simulation sessions: what an agent did earlier in an episode, so later answers can agree with it.

A session is named by the client (`X-Session-Id` header or `session_id` body field on /virtual;
the MCP session on /mcp). Each answered call of a session (a cache hit or a simulation) is kept as
the line the simulator prompt shows (`mirrorapi.prompts.simulator_formats.history_line`), and folded into a digest
chain: `digest(n+1) = sha256(digest(n) + "\\n" + line(n))`, starting from EMPTY_HISTORY. The digest
names the whole history so far and is part of the cache key of a session call (outside a session
that part is ''), so replaying the same episode (whatever the session id) finds the same answers.

Sessions live in the cache store (`sessions` table: digest, steps, the newest `keep` lines, last use),
so they survive a restart and are shared by every server process on the store; one idle longer than
`session_ttl` is forgotten (its next call starts over) and removed by the server's maintenance.
`Session` is one session's state in memory while a call uses it. A call with no earlier call to show (the first of a
session) has no history (`Session.history` is None): it is the stateless call, with the stateless cache key.
"""

from __future__ import annotations

import hashlib
from collections import deque
from dataclasses import dataclass
from typing import Any

from mirrorapi.prompts.simulator_formats import SESSION_FORMAT, history_line, select_history

EMPTY_HISTORY = hashlib.sha256(b"").hexdigest()


def session_id_problem(session_id: str, max_chars: int) -> str | None:
    """Why `session_id` cannot name a session, or None; the one check of a /virtual session id and of an OpenEnv
    episode id (the name of its session). An id is a name kept in the store: 1 to `max_chars` characters, no control
    character (PostgreSQL cannot keep a NUL in text: a session named with one worked on SQLite and failed every call
    on PostgreSQL), no lone surrogate (no store can keep one)."""
    if not session_id or len(session_id) > max_chars:
        return f"must have 1 to {max_chars} characters, got {len(session_id):,}"
    if (control := next((c for c in session_id if c < " " or c == "\x7f"), None)) is not None:
        return f"holds the control character {control!r}: an id is printable text"
    if not session_id.isascii():
        try:
            session_id.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"holds a lone surrogate {session_id[exc.start : exc.end]!r}: not valid Unicode text"
    return None


State = tuple[str, int, list[str]]  # (digest, steps, kept lines oldest first): what the store keeps


@dataclass(frozen=True, slots=True)
class History:
    """A session's history as one call found it: the cache key part and what the prompt shows."""

    digest: str
    steps: int
    lines: list[str]  # newest first, as `select_history` chose them


class Session:
    __slots__ = ("lines", "digest", "steps")

    def __init__(self, keep: int, state: State | None = None):
        digest, steps, lines = state or (EMPTY_HISTORY, 0, [])
        self.lines: deque[str] = deque(lines, maxlen=keep)
        self.digest = digest  # of every call recorded so far, not only the kept lines
        self.steps = steps

    def record(
        self, tool: str, api: str, arguments: dict, error: str, response: Any, fmt: str = SESSION_FORMAT
    ) -> None:
        self.record_line(history_line(tool, api, arguments, error, response, fmt))

    def record_line(self, line: str) -> None:
        self.lines.append(line)
        self.digest = hashlib.sha256(f"{self.digest}\n{line}".encode()).hexdigest()
        self.steps += 1

    def history(self, max_calls: int, char_budget: int, related_to: tuple[str, dict] | None = None) -> History | None:
        """What the next call's prompt shows of this session; None when that is no earlier call (a session's first
        call, or earlier calls none of which fit `char_budget`, or with `related_to`, none related to the call): the
        call is then asked, cached and answered as the stateless call it is, so a fresh session's first call answers
        as the same call alone. Its prompt would differ from the stateless one only in an empty list and the session
        wording, and that answered worse: on the shipped simulator's 31 held-out first calls of episodes, ROUGE-L
        24.6 points lower per call (docs/training.md)."""
        lines = select_history(list(self.lines), max_calls, char_budget, related_to)
        return History(self.digest, self.steps, lines) if lines else None

    def state(self) -> State:
        return self.digest, self.steps, list(self.lines)


def advance(keep: int, char_budget: int, line: str):
    """The update the store applies to a session's state when one of its calls is answered with `line`
    (None: a new or expired session). Only the lines a prompt could still show are kept: the newest, at most
    `keep`, within `char_budget` (`select_history` stops at the first call that does not fit, so an older one
    is never shown again); the digest covers every call. A session row so stays within about the budget however
    large its calls (8 calls of 16 KB each were 128 KB per session)."""

    def apply(state: State | None) -> State:
        session = Session(keep, state)
        session.record_line(line)
        digest, steps, _ = session.state()
        return digest, steps, select_history(list(session.lines), keep, char_budget)[::-1]

    return apply
