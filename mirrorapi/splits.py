"""Seeded train/test splits that keep episodes whole.

Two questions a simulator's test set must answer separately (MirrorAPI-Bench does the same):
- out of distribution (`test_ood`): calls of APIs the model never saw in training;
- in distribution (`test_id`): held-out calls of APIs it did see.

An episode (a session, a trajectory) is never split between train and test: its later calls
depend on its earlier ones (a token, a booking), so a test call whose episode is partly in train
would leak. Any episode that calls a held-out API goes to test as a whole; its other calls are
in-distribution test calls. A test call whose API ended up with no training call at all is
reported as out of distribution, because that is what it is.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Hashable, Sequence


def split_episodes(
    apis: Sequence[Hashable], episodes: Sequence[Hashable], ood_fraction: float, id_fraction: float, seed: int
) -> dict[str, list[int]]:
    """Indices of `train`, `test_id` and `test_ood` records, given each record's API and episode.

    `ood_fraction` of the distinct APIs are held out; `id_fraction` of the remaining episodes go to
    test. Deterministic for a given seed and input order.
    """
    rng = random.Random(seed)
    distinct_apis = sorted(set(apis), key=str)
    n_ood = round(len(distinct_apis) * ood_fraction)
    if ood_fraction > 0 and len(distinct_apis) > 1:
        n_ood = max(n_ood, 1)
    held_out = set(rng.sample(distinct_apis, min(n_ood, len(distinct_apis) - 1) if n_ood else 0))

    by_episode: dict[Hashable, list[int]] = defaultdict(list)
    for index, episode in enumerate(episodes):
        by_episode[episode].append(index)
    in_test = {e for e, members in by_episode.items() if any(apis[i] in held_out for i in members)}
    remaining = sorted((e for e in by_episode if e not in in_test), key=str)
    rng.shuffle(remaining)
    in_test.update(remaining[: round(len(remaining) * id_fraction)])

    train = [i for i, episode in enumerate(episodes) if episode not in in_test]
    seen = {apis[i] for i in train}
    test_id = [i for i, episode in enumerate(episodes) if episode in in_test and apis[i] in seen]
    test_ood = [i for i, episode in enumerate(episodes) if episode in in_test and apis[i] not in seen]
    return {"train": train, "test_id": test_id, "test_ood": test_ood}


def split_groups(groups: Sequence[Hashable], test_fraction: float, seed: int) -> dict[str, list[int]]:
    """Indices of `train` and `test`, whole groups at a time (e.g. every answer to the same query)."""
    rng = random.Random(seed)
    distinct = sorted(set(groups), key=str)
    rng.shuffle(distinct)
    test = set(distinct[: round(len(distinct) * test_fraction)])
    return {
        "train": [i for i, g in enumerate(groups) if g not in test],
        "test": [i for i, g in enumerate(groups) if g in test],
    }
