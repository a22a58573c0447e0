"""Few-shot examples for the simulator: one choice, used by the server and by the SFT data builder."""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterable

from mirrorapi.records import canonical_json

# Candidates read per API when choosing few-shot examples (bounds the cost of a miss).
FEW_SHOT_CANDIDATES = 256


def candidate_pool(candidates: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The few-shot candidates of one API: the FEW_SHOT_CANDIDATES (canonical arguments, observation
    JSON) pairs with the smallest canonical arguments, in that order. The one order of the project:
    the data builder applies it to the training calls, the server to its cache's recorded entries
    (whose query, `ORDER BY arguments LIMIT`, reads the same ones: SQLite compares the UTF-8 bytes,
    which order as the code points Python compares). Input order never matters."""
    return heapq.nsmallest(FEW_SHOT_CANDIDATES, candidates, key=lambda candidate: candidate[0])


def _value_key(value) -> object:
    # Equal exactly when the canonical JSON is equal (1, 1.0 and True differ); scalars skip the
    # serialisation, which made up most of the cost of a few-shot choice over 256 candidates.
    if isinstance(value, (str, int, float, bool)) or value is None:
        return type(value), value
    return canonical_json(value)


def _items(arguments: dict) -> set:
    return {(k, _value_key(v)) for k, v in arguments.items()}


def _similarity(a: dict, items_a: set, b: dict, items_b: set) -> float:
    names = len(a.keys() & b.keys()) / max(1, len(a.keys() | b.keys()))
    return 2 * len(items_a & items_b) / max(1, len(items_a | items_b)) + names


def argument_similarity(a: dict, b: dict) -> float:
    """How alike two calls' arguments are: shared argument values count twice as much as shared
    argument names (Jaccard of each). Few-shot selection and the fidelity baseline both use it."""
    return _similarity(a, _items(a), b, _items(b))


def select_examples(candidates: list[tuple[str, str]], arguments: dict, k: int, char_budget: int) -> list[tuple[dict, dict]]:
    """Up to `k` (arguments, observation) pairs of `candidate_pool(candidates)` most similar to
    `arguments`, whose rendered size
    (arguments + observation JSON) fits `char_budget` together. Deterministic: ties go to the
    shorter, then the lexically first example. Examples that do not fit are skipped, never cut."""
    if k <= 0:
        return []
    scored = []
    items = _items(arguments)
    for args_json, observation_json in candidate_pool(candidates):
        args = json.loads(args_json)
        if isinstance(args, dict) and args != arguments:
            size = len(args_json) + len(observation_json)
            scored.append((-_similarity(arguments, items, args, _items(args)), size, args_json, args, observation_json))
    scored.sort(key=lambda item: item[:3])
    chosen, used = [], 0
    for _, size, _, args, observation_json in scored:
        if used + size <= char_budget:
            chosen.append((args, json.loads(observation_json)))
            used += size
            if len(chosen) == k:
                break
    return chosen


