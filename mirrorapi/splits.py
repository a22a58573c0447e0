"""Seeded train/test splits that keep episodes whole.

Two questions a simulator's test set must answer separately (MirrorAPI-Bench does the same):
- out of distribution (`test_ood`): calls of APIs the model never saw in training;
- in distribution (`test_id`): held-out calls of APIs it did see.

An episode (a session, a trajectory) is never split between train and test: its later calls
depend on its earlier ones (a token, a booking), so a test call whose episode is partly in train
would leak. Any episode that calls a held-out API goes to test as a whole; its other calls are
in-distribution test calls. A test call whose API ended up with no training call at all is
reported as out of distribution, because that is what it is.

Two rules draw the held-out side (`SPLIT_RULES`):
- `shuffled` (the shipped models' split): one generator shuffles the sorted lists of APIs and episodes, so an
  input that differs by one episode (one more file, another file order that deduplication keeps other copies
  of) draws another split;
- `grouped` (for the next training run): each group draws its own rank from a seeded hash of its name, and the
  lowest ranks are held out, so a group's side does not depend on what else the data holds. The caller groups
  what must not be split: twin APIs (an API-Bank `lv3_` tool and its namesake), the trials of one task (a
  tau-bench task's episodes), the answers that share a query or a text (the judge's).
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence

SPLIT_RULES = ("shuffled", "grouped")


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

    return assign_episodes(apis, episodes, in_test)


def heldout_episodes_grouped(
    apis: Sequence[Hashable],
    episodes: Sequence[Hashable],
    ood_fraction: float,
    id_fraction: float,
    seed: int,
    api_group: Callable[[Hashable], Hashable],
    episode_group: Callable[[Hashable], Hashable],
) -> set[Hashable]:
    """The episodes the `grouped` rule holds out, given each record's API and episode: `ood_fraction` of the API
    groups (each group's every episode, and every episode of its episode group, goes to test), then
    `id_fraction` of the other episode groups, each group whole; by each group's seeded rank."""
    api_groups = {api_group(api) for api in apis}
    n_ood = round(len(api_groups) * ood_fraction)
    if ood_fraction > 0 and len(api_groups) > 1:
        n_ood = max(n_ood, 1)
    held_out = set(ranked(api_groups, seed, "api")[: min(n_ood, len(api_groups) - 1) if n_ood else 0])

    by_group: dict[Hashable, set[Hashable]] = defaultdict(set)
    test_groups = set()
    for api, episode in zip(apis, episodes, strict=True):
        group = episode_group(episode)
        by_group[group].add(episode)
        if api_group(api) in held_out:
            test_groups.add(group)
    remaining = ranked((g for g in by_group if g not in test_groups), seed, "episode")
    test_groups.update(remaining[: round(len(remaining) * id_fraction)])
    return {episode for group in test_groups for episode in by_group[group]}


def assign_episodes(
    apis: Sequence[Hashable], episodes: Sequence[Hashable], in_test: set[Hashable]
) -> dict[str, list[int]]:
    """Indices of `train`, `test_id` and `test_ood` records, given the episodes held out: a held-out record
    whose API has no training record is out of distribution."""
    train = [i for i, episode in enumerate(episodes) if episode not in in_test]
    seen = {apis[i] for i in train}
    test_id = [i for i, episode in enumerate(episodes) if episode in in_test and apis[i] in seen]
    test_ood = [i for i, episode in enumerate(episodes) if episode in in_test and apis[i] not in seen]
    return {"train": train, "test_id": test_id, "test_ood": test_ood}


def ranked(keys: Iterable[Hashable], seed: int, kind: str) -> list[Hashable]:
    """`keys` in the order of a seeded hash of each key's text: a key's place among any others is its own draw."""

    def draw(key: Hashable) -> tuple[bytes, str]:
        text = repr(key)
        return hashlib.sha256(f"{seed}\0{kind}\0{text}".encode()).digest(), text

    return sorted(set(keys), key=draw)


def split_groups(
    groups: Sequence[Hashable], test_fraction: float, seed: int, rule: str = "shuffled"
) -> dict[str, list[int]]:
    """Indices of `train` and `test`, whole groups at a time (e.g. every answer to the same query)."""
    if rule == "grouped":
        distinct = ranked(groups, seed, "group")
    else:
        rng = random.Random(seed)
        distinct = sorted(set(groups), key=str)
        rng.shuffle(distinct)
    test = set(distinct[: round(len(distinct) * test_fraction)])
    return {
        "train": [i for i, g in enumerate(groups) if g not in test],
        "test": [i for i, g in enumerate(groups) if g in test],
    }
