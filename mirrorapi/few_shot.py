"""Few-shot examples for the simulator: one choice, used by the server and by the SFT data builder."""

from __future__ import annotations

import json

from mirrorapi.records import canonical_json

# Candidates read per API when choosing few-shot examples (bounds the cost of a miss).
FEW_SHOT_CANDIDATES = 256


def argument_similarity(a: dict, b: dict) -> float:
    """How alike two calls' arguments are: shared argument values count twice as much as shared
    argument names (Jaccard of each). Few-shot selection and the fidelity baseline both use it."""
    items_a = {(k, canonical_json(v)) for k, v in a.items()}
    items_b = {(k, canonical_json(v)) for k, v in b.items()}
    names = len(a.keys() & b.keys()) / max(1, len(a.keys() | b.keys()))
    return 2 * len(items_a & items_b) / max(1, len(items_a | items_b)) + names


def select_examples(candidates: list[tuple[str, str]], arguments: dict, k: int, char_budget: int) -> list[tuple[dict, dict]]:
    """Up to `k` (arguments, observation) pairs most similar to `arguments`, whose rendered size
    (arguments + observation JSON) fits `char_budget` together. Deterministic: ties go to the
    shorter, then the lexically first example. Examples that do not fit are skipped, never cut."""
    if k <= 0:
        return []
    scored = []
    for args_json, observation_json in candidates:
        args = json.loads(args_json)
        if isinstance(args, dict) and args != arguments:
            size = len(args_json) + len(observation_json)
            scored.append((-argument_similarity(arguments, args), size, args_json, args, observation_json))
    scored.sort(key=lambda item: item[:3])
    chosen, used = [], 0
    for _, size, _, args, observation_json in scored:
        if used + size <= char_budget:
            chosen.append((args, json.loads(observation_json)))
            used += size
            if len(chosen) == k:
                break
    return chosen


