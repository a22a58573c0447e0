"""What the response cache holds (`Call`, `Entry`) and the rules every store keeps, whichever database holds it.

An entry answers one *call*: (category, tool, api, the canonical JSON of the arguments, the session
history digest), the digest being '' for a call outside a session (`Call`). Next to the key it keeps the
arguments as first received (key order included: StableToolBench looks calls up by
`str(json.loads(tool_input))`, so that is the order an export writes), the observation, its provenance
(`real`, `imported:<origin>`, `simulated:<identity>`), when it was created and how often it was served.

Recorded answers (`real`, `imported:*`; identity '') are shared by every simulator and exist only
outside sessions. A simulated answer belongs to the *simulator identity* that produced it (model,
prompt format, decoding settings: `mirrorapi.serving.simulator.simulator_identity`); a lookup under one
identity never returns another identity's answer. Which entry serves a call (`served`): its recorded
answer, else the answer of the looking identity under the call's own history. A simulated answer is
not stored where a recorded one exists, and a recording removes every simulated answer of the call.

Sessions (`mirrorapi.serving.sessions`) live in the store too: per session id its history digest,
the number of calls so far, the newest history lines and when it was last used. Leases say which
server process is simulating a call right now, so that servers sharing a store simulate a call once.

What a store must answer (the interface, declared once) is `mirrorapi.serving.cache.store.Store`; the SQLite
and PostgreSQL stores implement it, each with its own SQL (`.sqlite`, `.postgres`).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from mirrorapi.records import canonical_json, observation_json

SCHEMA_VERSION = 4
REAL = "real"
IMPORTED = "imported:"  # + origin (the folder or file name the entries came from)
SIMULATED = "simulated:"  # + the simulator identity
RECORDED = ""  # the `identity` of recorded entries (real, imported:*): shared by every simulator
NO_SESSION = ""  # the `history` of calls outside a session
# The columns of an entry, in the order `Entry` holds them and `rows()` / `put_entries` copy them.
ENTRY_COLUMNS = (
    "category",
    "tool",
    "api",
    "arguments",
    "history",
    "identity",
    "steps",
    "arguments_as_sent",
    "error",
    "observation",
    "provenance",
    "created",
    "hits",
    "rationale",
)


class CacheError(Exception):
    """The cache database or a folder to import cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Call:
    """One call as the cache keys it."""

    category: str
    tool: str
    api: str
    arguments: str  # canonical_json of the argument object
    history: str = NO_SESSION  # digest of the session's earlier calls and answers; '' outside a session

    def digest(self) -> bytes:
        """A fixed-size key for databases whose indexes cannot hold long text (PostgreSQL's btree)."""
        return hashlib.sha256(
            "\0".join((self.category, self.tool, self.api, self.arguments, self.history)).encode(
                "utf-8", "surrogatepass"
            )
        ).digest()


@dataclass(frozen=True, slots=True)
class Entry:
    """One stored answer, every column (see ENTRY_COLUMNS)."""

    category: str
    tool: str
    api: str
    arguments: str
    history: str
    identity: str
    steps: int  # earlier calls in the session history (0 outside a session)
    arguments_as_sent: str
    error: str
    observation: str  # the whole {"error", "response"} answer, compact JSON
    provenance: str
    created: float
    hits: int = 0
    rationale: str = ""  # CoT mode: the simulator's reasoning behind a simulated answer (never served)

    @property
    def call(self) -> Call:
        return Call(self.category, self.tool, self.api, self.arguments, self.history)

    def values(self) -> tuple:
        """The entry's columns in ENTRY_COLUMNS order: a row for the stores' INSERT statements."""
        return tuple(getattr(self, column) for column in ENTRY_COLUMNS)


def identity_of(provenance: str) -> str:
    """The `identity` column of an entry of this provenance ('' for recorded answers)."""
    return provenance[len(SIMULATED) :] if provenance.startswith(SIMULATED) else RECORDED


def version_number(value: Any, location: str) -> int:
    """The schema version a cache database records; CacheError when it is not a number (the file was edited)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        raise CacheError(f"{location}: unreadable cache schema version {str(value)[:40]!r}") from None


def new_entry(
    category: str,
    tool: str,
    api: str,
    arguments: Any,
    error: str,
    response: Any,
    provenance: str,
    now: float,
    history: str = NO_SESSION,
    steps: int = 0,
) -> Entry:
    """`arguments`: the argument object, or its JSON text; either way its key order is kept as given."""
    as_sent = (
        arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    )
    key = canonical_json(json.loads(as_sent) if isinstance(arguments, str) else arguments)
    identity = identity_of(provenance)
    if history and not identity:
        raise CacheError("a recorded answer belongs to no session (history must be empty)")
    return Entry(
        category,
        tool,
        api,
        key,
        history,
        identity,
        steps,
        as_sent,
        error,
        observation_json(error, response),
        provenance,
        now,
    )


def served(rows: Iterable[tuple], identity: str, history: str) -> tuple | None:
    """Of a call's rows (id, observation, provenance, identity, history), the one a server of `identity`
    answers after `history` with: the recorded one, else its own."""
    own = None
    for row in rows:
        if not row[3]:
            return row
        if row[3] == identity and row[4] == history:
            own = row
    return own


def lease_holder() -> str:
    """This process's name in the leases table (host, pid and a random part: pids are reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
