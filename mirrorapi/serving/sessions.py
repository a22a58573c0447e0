"""Simulation sessions: what an agent did earlier in an episode, so later answers can agree with it.

A session is named by the client (`X-Session-Id` header or `session_id` body field on /virtual;
the MCP session on /mcp). Each answered call of a session (a cache hit or a simulation) is kept as
the line the simulator prompt shows (`mirrorapi.prompts.history_line`), and folded into a digest
chain: `digest(n+1) = sha256(digest(n) + "\\n" + line(n))`. The digest names the whole history so
far, so the cache can store a session call's answer under the call *and* its history: replaying
the same episode (whatever the session id) finds the same answers again.

Only the newest `keep` lines are held per session (the prompt never shows more), and at most
`max_sessions` sessions (the least recently used is forgotten: its next call starts over).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from mirrorapi.prompts import history_line, select_history

EMPTY_HISTORY = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True, slots=True)
class History:
    """A session's history as one call found it: the cache key part and what the prompt shows."""

    digest: str
    steps: int
    lines: list[str]  # newest first, as `select_history` chose them


class Session:
    __slots__ = ("lines", "digest", "steps")

    def __init__(self, keep: int):
        self.lines: deque[str] = deque(maxlen=keep)
        self.digest = EMPTY_HISTORY  # of every call recorded so far, not only the kept lines
        self.steps = 0

    def record(self, tool: str, api: str, arguments: dict, error: str, response: Any) -> None:
        line = history_line(tool, api, arguments, error, response)
        self.lines.append(line)
        self.digest = hashlib.sha256(f"{self.digest}\n{line}".encode()).hexdigest()
        self.steps += 1

    def history(self, max_calls: int, char_budget: int) -> History:
        return History(self.digest, self.steps, select_history(list(self.lines), max_calls, char_budget))


class SessionStore:
    def __init__(self, keep: int, max_sessions: int):
        self.keep, self.max_sessions = keep, max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def get(self, session_id: str) -> Session:
        """The session named `session_id` (a new one the first time)."""
        session = self._sessions.get(session_id)
        if session is None:
            session = self._sessions[session_id] = Session(self.keep)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(session_id)
        return session

    def __len__(self) -> int:
        return len(self._sessions)
