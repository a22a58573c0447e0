"""Response cache keys (and, with the server, `ResponseCache`).

One key function for the whole project: the canonical JSON of the arguments (sorted keys, compact,
UTF-8). The data builder deduplicates with it and the cache stores with it, so a call seen in
training and a call seen by the server are the same call.
"""

from __future__ import annotations

import ast
import json
from typing import Any


def canonical_json(arguments: Any) -> str:
    """`{"b": 2, "a": 1}` -> `{"a":1,"b":2}`. Types are kept: `1` and `"1"` are different calls."""
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def parse_repr_key(key: str) -> Any:
    """A StableToolBench cache key (`str(dict)`: single quotes, `True`/`None`) -> the arguments it stands for.

    Raises ValueError when the key is neither a Python literal nor JSON.
    """
    try:
        return ast.literal_eval(key)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        try:
            return json.loads(key)
        except ValueError as exc:
            raise ValueError(f"not a StableToolBench cache key: {key[:80]!r}") from exc
