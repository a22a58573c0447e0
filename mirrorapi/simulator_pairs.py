"""Real pairs chosen for a simulator: the quality rules, and the split that holds whole episodes out.

The data builder (`mirrorapi.data.simulator_sft`) renders the pairs chosen here as training and test records;
the fidelity eval (`mirrorapi.evaluation.fidelity.session_history`) replays the episodes held out here. Both
choose through `select_pairs`, so the eval replays exactly the episodes the builder kept out of training.
Rules, each counted (the builder's `stats.json`):
- a pair whose API has no doc is dropped (`unknown_api`);
- transport failures (rate limits, timeouts, auth, gateway and server errors) are dropped
  (`mirrorapi.transport_failures.transport_failure`, by kind); genuine API errors are kept as error examples;
- with `need_rationale` (chain-of-thought data), a pair without a `rationale` is dropped (`no_rationale`);
- a step read again (the same source, episode and step: a file given twice) is a `duplicate`;
- a call seen before (same API, same canonical arguments, `mirrorapi.records.canonical_json`) is
  dropped; the first one in input order is kept, and conflicting answers are counted apart;
- responses over the server's budget are cut the way the server cuts them (`truncate_response`).
With `history` K > 0, each pair also carries the earlier calls of its episode (every earlier step that resolved
and was not a transport failure, duplicates included, as the server's session would hold them), newest first,
chosen by `select_history` with the server's budget; a call is then a duplicate only when its earlier calls are
the same too. Then the split holds out APIs (`test_ood`) and calls of seen APIs (`test_id`), by one of
`mirrorapi.splits.SPLIT_RULES`: `shuffled` (`split_episodes`, on the pairs kept) or `grouped`
(`heldout_episodes_grouped`, decided on every usable pair before deduplication, so that neither the file order
nor which copy of a call is kept moves an episode to the other side; API-Bank's `lv3_` tools held out with their
namesakes, a task's trials together, and a recorded call kept before its generated copy).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, cast

from tqdm.auto import tqdm

from mirrorapi.prompts.simulator_formats import (
    HISTORY_CHAR_BUDGET,
    SESSION_FORMAT,
    history_line,
    select_history,
    truncate_response,
)
from mirrorapi.records import canonical_json
from mirrorapi.splits import SPLIT_RULES, assign_episodes, heldout_episodes_grouped, split_episodes
from mirrorapi.tools import ApiDoc, ArgumentError, ToolRegistry, UnknownName, check_arguments
from mirrorapi.transport_failures import api_failed, transport_failure

DEFAULT_OOD_FRACTION = 0.05  # share of distinct APIs held out entirely (test_ood)
DEFAULT_ID_FRACTION = 0.05  # share of the remaining episodes held out (test_id)
DEFAULT_SPLIT_SEED = 42
TEST_SPLITS = ("test_id", "test_ood")
# API-Bank's level-3 tools repeat level-1/2 tools' APIs (`apibank_lv3_meeting` beside `apibank_meeting`: the same
# AddMeeting plus a token): held out apart, the unseen API would be one the model trained on under another name.
_LEVEL3_TWIN = re.compile(r"^(apibank_)lv3_")
# tau-bench runs each task several times (`airline/task37-trial0`, `-trial1`): the trials share a user and their calls.
_TRIAL = re.compile(r"-trial\d+$")
# Pairs we made by running a reference implementation (../shared/data/README.md), kept after recorded copies.
_GENERATED_SOURCE_SUFFIX = "-generated"


def api_group(api: Hashable) -> Hashable:
    """The group of a (category, tool, api) that the `grouped` split holds out as one: an API and its twins."""
    category, tool, name = cast(tuple[str, str, str], api)
    return category, _LEVEL3_TWIN.sub(r"\1", tool), name


def episode_group(episode: Hashable) -> Hashable:
    """The group of a (source, episode) that the `grouped` split keeps on one side: the trials of one task."""
    source, name = cast(tuple[str, str], episode)
    return source, _TRIAL.sub("", name)


@dataclass(frozen=True)
class ChosenPair:
    doc: ApiDoc
    arguments: dict
    error: str
    response: Any  # cut to the server's budget
    pair: dict  # the pair as read (its response whole)
    kind: str  # success | error | in_band_error
    arguments_key: str  # canonical JSON of the arguments
    history: tuple[str, ...]  # the episode's earlier calls as the prompt shows them (empty without `history`)


@dataclass
class PairSelection:
    kept: list[ChosenPair]
    splits: dict[str, list[int]]  # train / test_id / test_ood: indices into `kept`
    read: Counter = field(default_factory=Counter)  # pairs read, by source
    dropped: Counter = field(default_factory=Counter)  # unknown_api, no_rationale, duplicate, duplicate_conflicting
    transport: Counter = field(default_factory=Counter)  # transport failures by kind
    kinds: Counter = field(default_factory=Counter)  # kept pairs by kind
    truncated: int = 0
    unknown_examples: list[str] = field(default_factory=list)  # the first unknown APIs, for the stats

    def heldout_episodes(self) -> set[tuple[str, str]]:
        """(source, episode) of every episode held out (test_id or test_ood)."""
        return {
            (self.kept[i].pair["source"], str(self.kept[i].pair["episode"]))
            for name in TEST_SPLITS
            for i in self.splits[name]
        }


def select_pairs(
    pairs: Iterable[dict],
    registry: ToolRegistry,
    *,
    history: int = 0,
    history_char_budget: int = HISTORY_CHAR_BUDGET,
    history_rule: str = "recent",
    history_format: str = SESSION_FORMAT,
    need_rationale: bool = False,
    ood_fraction: float = DEFAULT_OOD_FRACTION,
    id_fraction: float = DEFAULT_ID_FRACTION,
    seed: int = DEFAULT_SPLIT_SEED,
    split_rule: str = "shuffled",
    missing_required: str = "reject",
    unknown_arguments: str = "simulate",
    progress: bool = False,
) -> PairSelection:
    """Apply the quality rules and split; the kept pairs in input order (`grouped`: recorded sources' first) and
    the split's indices into them. With `history`, each pair's earlier calls are rendered as session format
    `history_format` shows them, chosen by `history_rule` (`select_history`'s rules, as the server's
    `session_history_rule`); an earlier call the server's argument policy (`missing_required`, `unknown_arguments`)
    refuses is shown with the refusal its session holds, not the real API's answer."""
    if split_rule not in SPLIT_RULES:
        raise ValueError(f"unknown split rule {split_rule!r}; known: {', '.join(SPLIT_RULES)}")
    selection = PairSelection([], {})
    seen: dict[tuple, tuple] = {}
    usable = _with_history(
        pairs,
        registry,
        history,
        history_char_budget,
        history_rule,
        history_format,
        (missing_required, unknown_arguments),
        selection,
        progress,
    )
    if split_rule == "grouped":
        usable.sort(key=lambda item: str(item[0]["source"]).endswith(_GENERATED_SOURCE_SUFFIX))  # stable
    for pair, doc, earlier in usable:
        error, response = pair["response"]["error"], pair["response"]["response"]
        if need_rationale and not pair.get("rationale"):
            selection.dropped["no_rationale"] += 1  # a CoT target needs the mechanism (MirrorAPI's train_cot.json)
            continue
        key = (doc.category, doc.tool, doc.api, canonical_json(pair["tool_input"]), *earlier)
        observation = (error, canonical_json(response))
        if key in seen:
            selection.dropped["duplicate" if seen[key] == observation else "duplicate_conflicting"] += 1
            continue
        seen[key] = observation
        cut = truncate_response(response)
        selection.truncated += cut is not response
        failed = api_failed(error, response)
        kind = "success" if not failed else "error" if error else "in_band_error"
        selection.kinds[kind] += 1
        selection.kept.append(ChosenPair(doc, pair["tool_input"], error, cut, pair, kind, key[3], earlier))
    apis = [(c.doc.category, c.doc.tool, c.doc.api) for c in selection.kept]
    if split_rule == "shuffled":
        episodes = [(c.pair["source"], c.pair["episode"]) for c in selection.kept]
        selection.splits = split_episodes(apis, episodes, ood_fraction, id_fraction, seed)
    else:
        episodes = [(c.pair["source"], str(c.pair["episode"])) for c in selection.kept]
        in_test = heldout_episodes_grouped(
            [(doc.category, doc.tool, doc.api) for _, doc, _ in usable],
            [(pair["source"], str(pair["episode"])) for pair, _, _ in usable],
            ood_fraction,
            id_fraction,
            seed,
            api_group,
            episode_group,
        )
        selection.splits = assign_episodes(apis, episodes, in_test)
    return selection


def _with_history(
    pairs: Iterable[dict],
    registry: ToolRegistry,
    history: int,
    char_budget: int,
    rule: str,
    fmt: str,
    policy: tuple[str, str],
    selection: PairSelection,
    progress: bool,
) -> list[tuple[dict, ApiDoc, tuple[str, ...]]]:
    """(pair, doc, history) of the pairs that resolve and are not transport failures, in input order;
    `history`: the prompt's lines of the episode's earlier steps (empty without `history`)."""
    usable: list[tuple[dict, ApiDoc]] = []
    steps_read: set[tuple] = set()
    for pair in tqdm(pairs, desc="pairs", unit=" pairs", disable=None if progress else True, mininterval=1.0):
        selection.read[pair["source"]] += 1
        # A step read again (a file given twice, files that overlap) is that recorded call again: a duplicate, and
        # not an earlier call of its own episode (its history showed every earlier call twice).
        step = (pair["source"], str(pair["episode"]), pair["step"])
        if step in steps_read:
            selection.dropped["duplicate"] += 1
            continue
        steps_read.add(step)
        doc = pair.get("doc")
        try:
            doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        except UnknownName:
            if doc is None:
                selection.dropped["unknown_api"] += 1
                if len(selection.unknown_examples) < 10:
                    selection.unknown_examples.append(f"{pair['category']}/{pair['tool_name']}/{pair['api_name']}")
                continue
        failure = transport_failure(pair["response"]["error"], pair["response"]["response"])
        if failure:
            selection.transport[failure] += 1
            continue
        usable.append((pair, doc))
    if not history:
        return [(pair, doc, ()) for pair, doc in usable]
    episodes: dict[tuple, list[tuple[int, str]]] = {}
    for pair, doc in usable:
        error, response = pair["response"]["error"], pair["response"]["response"]
        try:
            check_arguments(doc, pair["tool_input"], *policy)
        except ArgumentError as refused:  # what the server answered and put in the session (its handler)
            error, response = str(refused), ""
        line = history_line(doc.tool, doc.api, pair["tool_input"], error, response, fmt)
        episodes.setdefault((pair["source"], pair["episode"]), []).append((int(pair["step"]), line))
    for steps in episodes.values():
        steps.sort(key=lambda item: item[0])
    out = []
    for pair, doc in usable:
        earlier = [line for step, line in episodes[(pair["source"], pair["episode"])] if step < int(pair["step"])]
        related_to = (doc.api, pair["tool_input"]) if rule == "related" else None
        out.append((pair, doc, tuple(select_history(earlier, history, char_budget, related_to))))
    return out
