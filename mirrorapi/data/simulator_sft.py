"""Simulator SFT data: real pairs + tool docs -> conversational prompt/completion records.

Prompts are rendered by `mirrorapi.prompts.simulator_formats.simulator_messages` and targets by
`mirrorapi.records.observation_json`, the functions the server uses, so a model is trained on exactly what it will
be served. Which pairs are kept and which episodes are held out (`test_id`, `test_ood`) is decided in the core,
`mirrorapi.simulator_pairs.select_pairs` (its quality rules, each counted in `stats.json`), so the fidelity eval
replays the same held-out episodes.

The output folder is a `datasets.DatasetDict` (`load_from_disk`) with a `stats.json` beside its splits.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass as pydantic_dataclass

from mirrorapi.command_line import Flag
from mirrorapi.data.sources import check_repeated_sources, parse_source_repeats
from mirrorapi.few_shot import FEW_SHOT_TIES, candidate_pool, select_examples, shrink_response
from mirrorapi.prompts.simulator_formats import (
    COT_FORMAT,
    DEFAULT_SIMULATOR_FORMAT,
    HISTORY_CHAR_BUDGET,
    HISTORY_RULES,
    OUR_SIMULATOR_FORMATS,
    RESPONSE_CHAR_BUDGET,
    SESSION_FORMATS,
    SIMULATOR_FORMATS,
    check_cot_system_prompt,
    render_observation,
    simulator_messages,
    stateless_format,
    truncate_response,
)
from mirrorapi.prompts.simulator_output import COT_RATIONALE_KEY
from mirrorapi.records import STATS_FILE, observation_json
from mirrorapi.simulator_pairs import (
    DEFAULT_ID_FRACTION,
    DEFAULT_OOD_FRACTION,
    DEFAULT_SPLIT_SEED,
    ChosenPair,
    select_pairs,
)
from mirrorapi.splits import SPLIT_RULES
from mirrorapi.tools import ARGUMENT_POLICIES, ToolRegistry

logger = logging.getLogger(__name__)

SIMULATOR_COLUMNS = (
    "prompt",
    "completion",
    "prompt_format",
    "source",
    "episode",
    "step",
    "category",
    "tool",
    "api",
    "arguments",
    "kind",
    "call_in_train",  # read by the recipes' eval loss (`training.recipe.training_splits`) and the answer stage
)


@pydantic_dataclass
class SimulatorDataOptions:
    """How the simulator's SFT records are built; each field but system_prompt is also a flag of
    data/build_simulator_sft.py (mirrorapi/command_line.py), its help the description."""

    prompt_format: Annotated[str, Flag(choices=SIMULATOR_FORMATS)] = Field(
        default=DEFAULT_SIMULATOR_FORMAT,
        description=(
            "Simulator prompt format (mirrorapi/prompts/simulator_formats.py); mirrorapi-v2 writes responses that "
            "hold JSON as JSON values, not escaped strings (the SmolLM2 recipes' data)."
        ),
    )
    system_prompt: str | None = None  # required by the `stabletoolbench` formats (the released model's own)
    few_shot: int = Field(
        default=0,
        description=(
            "Real examples of the same API per prompt, chosen as the server chooses them; match the server's "
            "`few_shot` setting."
        ),
    )
    few_shot_char_budget: int = Field(
        default=2048,
        description=("Most characters of examples per prompt; match the server's `few_shot_char_budget`."),
    )
    few_shot_response_chars: int = Field(
        default=0,
        description=(
            "Shrink each example's response to about this many characters, JSON kept valid (0: whole); match the "
            "server's `few_shot_response_chars`."
        ),
    )
    few_shot_ties: Annotated[str, Flag(choices=FEW_SHOT_TIES)] = Field(
        default="shortest",
        description=(
            "Which of the equally similar examples a prompt shows: the shortest, or the one of median size "
            "(mirrorapi.few_shot.select_examples); match the server's `few_shot_ties`."
        ),
    )
    without_examples_share: float = Field(
        default=0.0,
        description=(
            "Share of the training calls shown without their examples (each of their records), drawn with --seed: "
            "a server asks a call of an API its cache holds no call of (a new API, every test_ood call) without one, "
            "a case otherwise under 1% of the training records, so the model learns to answer from the doc alone."
        ),
    )
    test_ood_shown: bool = Field(
        default=False,
        description=(
            "Also write `test_ood_shown`: test_ood's calls of half its episodes (drawn with --seed), each shown an "
            "example of its API from the other half, as a server whose cache holds recorded calls of an API the "
            "simulator never trained on asks it (test_ood itself is asked without one, as for an API with no "
            "recorded call)."
        ),
    )
    target_response_chars: int = Field(
        default=0,
        description=(
            "Shrink the training targets of longer real responses to about this many characters, JSON kept valid, so "
            "their records fit max_length (0: whole, cut at the server's 2,048 characters)."
        ),
    )
    ood_fraction: float = Field(
        default=DEFAULT_OOD_FRACTION, description="Share of distinct APIs held out entirely (test_ood)."
    )
    id_fraction: float = Field(
        default=DEFAULT_ID_FRACTION, description="Share of the other episodes held out (test_id)."
    )
    seed: int = Field(default=DEFAULT_SPLIT_SEED, description="Seed of the split.")
    split_rule: Annotated[str, Flag(choices=SPLIT_RULES)] = Field(
        default="shuffled",
        description=(
            "How the held-out side is drawn (mirrorapi.splits): `shuffled`, the shipped models' split, or `grouped`, "
            "each episode's side its own seeded draw before deduplication, twin APIs and a task's trials held out "
            "together, a recorded call kept before its generated copy (the next training run's)."
        ),
    )
    history: Annotated[int, Flag(metavar="K")] = Field(
        default=0,
        description=(
            "Show each call's K earlier episode calls (newest first; format mirrorapi-session-v1, or -v2 with "
            "--prompt-format mirrorapi-v2, chosen automatically); match the server's `session_history`. A call with "
            "no earlier call to show (an episode's first) is rendered in the stateless format, as the server asks it."
        ),
    )
    history_char_budget: int = Field(
        default=HISTORY_CHAR_BUDGET,
        description=("Most characters of history per prompt; match the server's `session_char_budget`."),
    )
    history_rule: Annotated[str, Flag(choices=HISTORY_RULES)] = Field(
        default="recent",
        description=(
            "Which of those earlier calls a prompt shows: every one, or only those related to the call "
            "(mirrorapi.prompts.simulator_formats.select_history); match the server's `session_history_rule`."
        ),
    )
    missing_required: Annotated[str, Flag(choices=ARGUMENT_POLICIES)] = Field(
        default="reject",
        description=(
            "The server's `missing_required` policy: with history, an earlier call without a required argument is "
            "shown with the refusal a server that rejects it puts in its session, as the model will be shown it."
        ),
    )
    unknown_arguments: Annotated[str, Flag(choices=ARGUMENT_POLICIES)] = Field(
        default="simulate",
        description="The server's `unknown_arguments` policy, for the history as --missing-required.",
    )
    stateless_too: bool = Field(
        default=False,
        description=(
            "With --history: also render each distinct call of a split without its history, in the stateless format "
            "(mirrorapi-v2 beside mirrorapi-session-v2), from the same split: a server answers calls outside sessions "
            "in that format, so one model trained on both serves both."
        ),
    )
    repeat_sources: Annotated[list[str], Flag(metavar="SOURCE=N")] = Field(
        default_factory=list,
        description=(
            "Repeat the training records of a source N times (e.g. tau-bench=3): the 20,000 generated API-Bank "
            "calls would otherwise drown the few hundred recorded calls of each real source."
        ),
    )
    repeat_failures: Annotated[int, Flag(metavar="N")] = Field(
        default=1,
        description=(
            "Repeat the training records whose real answer is a failure (an error field or an in-band error) N times, "
            "on top of --repeat-sources: a simulator must learn when an API fails, and failures are the minority."
        ),
    )

    def check(self) -> None:
        if self.prompt_format not in SIMULATOR_FORMATS:
            raise ValueError(f"unknown prompt format {self.prompt_format!r}; known: {', '.join(SIMULATOR_FORMATS)}")
        if (self.history > 0) != (self.prompt_format in SESSION_FORMATS):
            raise ValueError(
                f"history > 0 goes with a session prompt format ({', '.join(SESSION_FORMATS)}) and only "
                f"with one (got history={self.history}, prompt format {self.prompt_format!r})"
            )
        if self.history < 0 or self.history_char_budget <= 0:
            raise ValueError("history must be >= 0 and history_char_budget > 0")
        if self.prompt_format not in OUR_SIMULATOR_FORMATS and not self.system_prompt:
            raise ValueError(f"prompt format {self.prompt_format!r} needs a system prompt file")
        if self.prompt_format == COT_FORMAT:
            check_cot_system_prompt(self.system_prompt or "")
        for what, value, known in (
            ("history rule", self.history_rule, HISTORY_RULES),
            ("split rule", self.split_rule, SPLIT_RULES),
            ("few-shot tie rule", self.few_shot_ties, FEW_SHOT_TIES),
            ("missing_required policy", self.missing_required, ARGUMENT_POLICIES),
            ("unknown_arguments policy", self.unknown_arguments, ARGUMENT_POLICIES),
        ):
            if value not in known:
                raise ValueError(f"unknown {what} {value!r}; known: {', '.join(known)}")
        for name in ("few_shot", "few_shot_response_chars", "target_response_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("ood_fraction", "id_fraction", "without_examples_share"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.test_ood_shown and not self.few_shot:
            raise ValueError("test_ood_shown asks unseen APIs' calls with examples: it needs few_shot > 0")
        if self.stateless_too and not self.history:
            raise ValueError("stateless_too adds stateless records beside session records: it needs history > 0")
        if self.repeat_failures < 1:
            raise ValueError(f"repeat_failures must be >= 1, got {self.repeat_failures}")
        self.source_repeats()

    def source_repeats(self) -> dict[str, int]:
        """`repeat_sources` as {source: N}; ValueError for an entry that is not SOURCE=N with N >= 1."""
        return parse_source_repeats(self.repeat_sources)


def build_simulator_records(
    pairs: Iterable[dict], registry: ToolRegistry, options: SimulatorDataOptions, progress: bool = False
) -> tuple[dict[str, list[dict]], dict]:
    """Choose (the quality rules), split, and render; returns (records per split, stats)."""
    options.check()
    chosen = select_pairs(
        pairs,
        registry,
        history=options.history,
        history_char_budget=options.history_char_budget,
        history_rule=options.history_rule,
        history_format=options.prompt_format,
        need_rationale=options.prompt_format == COT_FORMAT,
        ood_fraction=options.ood_fraction,
        id_fraction=options.id_fraction,
        seed=options.seed,
        split_rule=options.split_rule,
        missing_required=options.missing_required,
        unknown_arguments=options.unknown_arguments,
        progress=progress,
    )
    kept, dropped = chosen.kept, chosen.dropped
    examples = _example_picker(kept, chosen.splits["train"], options)
    splits = {
        name: [_render(kept[i], options, examples(i), _format_of(kept[i], options)) for i in members]
        for name, members in chosen.splits.items()
    }
    # A call the training split has is a cache hit on a server, not a held-out call: held-out splits' stateless
    # records leave it out (rendered without history, it would be that training record, prompt and answer).
    trained = {_call(kept[i]) for i in chosen.splits["train"]}
    left_out = 0
    if options.stateless_too:
        for name, members in chosen.splits.items():
            records, skipped = _stateless_records(
                kept, members, options, examples, set() if name == "train" else trained
            )
            splits[name] += records
            left_out += skipped
    if options.test_ood_shown:
        asked, pool = _halve_episodes(kept, chosen.splits["test_ood"], options.seed)
        shown = _example_picker(kept, pool, replace(options, without_examples_share=0.0))
        splits["test_ood_shown"] = [_render(kept[i], options, shown(i), _format_of(kept[i], options)) for i in asked]
        if options.stateless_too:
            splits["test_ood_shown"] += _stateless_records(kept, asked, options, shown, trained)[0]
    for records in splits.values():  # what a held-out split's evaluation leaves out (its eval loss, a server's hits)
        for record in records:
            record["call_in_train"] = (
                record["category"],
                record["tool"],
                record["api"],
                record["arguments"],
            ) in trained
    repeats = options.source_repeats()
    check_repeated_sources(repeats, {r["source"] for records in splits.values() for r in records})
    splits["train"] = [
        record
        for record in splits["train"]
        for _ in range(
            repeats.get(record["source"], 1) * (options.repeat_failures if record["kind"] != "success" else 1)
        )
    ]
    stats = {
        "kind": "simulator",
        "prompt_format": options.prompt_format,
        "options": {k: v for k, v in asdict(options).items() if k != "system_prompt"},
        "response_char_budget": RESPONSE_CHAR_BUDGET,
        "read": {"total": sum(chosen.read.values()), **dict(sorted(chosen.read.items()))},
        "dropped": {
            "unknown_api": dropped["unknown_api"],
            "transport_failure": sum(chosen.transport.values()),
            "transport_failure_by_kind": dict(sorted(chosen.transport.items())),
            "duplicate": dropped["duplicate"],
            "duplicate_conflicting": dropped["duplicate_conflicting"],
            **({"no_rationale": dropped["no_rationale"]} if options.prompt_format == COT_FORMAT else {}),
        },
        "unknown_api_examples": chosen.unknown_examples,
        "kept": {
            "total": len(kept),
            **{k: chosen.kinds[k] for k in ("success", "error", "in_band_error")},
            "truncated": chosen.truncated,
        },
        "splits": {name: _split_stats(records) for name, records in splits.items()},
        **({"stateless_held_out_calls_in_train": left_out} if options.stateless_too else {}),
    }
    return splits, stats


def _example_picker(kept: list[ChosenPair], train: list[int], options: SimulatorDataOptions):
    """index -> few-shot examples: the server's own choice (`select_examples` over `candidate_pool`, the
    one candidate order) among the training calls of the same API, as its cache would hold them after
    `mirrorapi cache import` of the same pairs; none for the `without_examples_share` of the training calls. Test
    records only ever see training calls (test_ood_shown's: the calls of test_ood's other half, passed as `train`)."""
    if not options.few_shot:
        return lambda index: []
    draw = random.Random(f"{options.seed}:without-examples").random
    without = {i for i in train if draw() < options.without_examples_share}

    by_api: dict[tuple, list[tuple[str, str]]] = {}
    cached: set[tuple] = set()
    for i in train:
        chosen = kept[i]
        # As `import_pairs` stores the call in the server's cache: once, its first pair (with history a call is
        # kept once per history it was made with, maybe answered differently), the observation whole, uncut.
        if _call(chosen) in cached:
            continue
        cached.add(_call(chosen))
        observation = observation_json(chosen.error, chosen.pair["response"]["response"])
        by_api.setdefault((chosen.doc.category, chosen.doc.tool, chosen.doc.api), []).append(
            (chosen.arguments_key, observation)
        )
    pools = {api: candidate_pool(candidates) for api, candidates in by_api.items()}

    @functools.cache  # a call with history is rendered again without it (`stateless_too`), with the same examples
    def pick(index: int) -> list[tuple[dict, dict]]:
        if index in without:
            return []
        doc, arguments = kept[index].doc, kept[index].arguments
        return select_examples(
            pools.get((doc.category, doc.tool, doc.api), []),
            arguments,
            options.few_shot,
            options.few_shot_char_budget,
            options.few_shot_response_chars,
            options.few_shot_ties,
        )

    return pick


def _halve_episodes(kept: list[ChosenPair], members: list[int], seed: int) -> tuple[list[int], list[int]]:
    """`members` split by episode, drawn with `seed`: (the calls asked, the calls whose answers make the pool of
    examples). Whole episodes, so a call is never shown its own episode's answers as examples."""
    episodes = sorted({(kept[i].pair["source"], str(kept[i].pair["episode"])) for i in members})
    random.Random(f"{seed}:test-ood-shown").shuffle(episodes)
    in_pool = set(episodes[: len(episodes) // 2])
    asked = [i for i in members if (kept[i].pair["source"], str(kept[i].pair["episode"])) not in in_pool]
    return asked, [i for i in members if (kept[i].pair["source"], str(kept[i].pair["episode"])) in in_pool]


def _format_of(chosen: ChosenPair, options: SimulatorDataOptions) -> str:
    """The format a call is rendered in: with history, the session format only when there are earlier calls to show;
    a session's first call is the stateless call it is, as the server asks it (`Session.history` is None)."""
    return options.prompt_format if chosen.history or not options.history else stateless_format(options.prompt_format)


def _call(chosen: ChosenPair) -> tuple:
    """A call as a server's cache keys it: the API and its arguments."""
    return chosen.doc.category, chosen.doc.tool, chosen.doc.api, chosen.arguments_key


def _stateless_records(
    kept: list[ChosenPair], members: list[int], options: SimulatorDataOptions, examples, leave_out: set[tuple]
) -> tuple[list[dict], int]:
    """Each distinct call (API and arguments) of a split once, without history, in the stateless format; the first
    one in input order, as a build without history keeps it. A call the split already has in that format (a
    session's first call) is not added again, nor one of `leave_out` (counted: the second value)."""
    fmt = stateless_format(options.prompt_format)
    seen = {_call(kept[i]) for i in members if _format_of(kept[i], options) == fmt}
    records, skipped = [], 0
    for i in members:
        call = _call(kept[i])
        if call in seen:
            continue
        seen.add(call)
        if call in leave_out:
            skipped += 1
            continue
        records.append(_render(kept[i], options, examples(i), fmt))
    return records, skipped


def _render(chosen: ChosenPair, options: SimulatorDataOptions, examples: list[tuple[dict, dict]], fmt: str) -> dict:
    doc, arguments, pair, history = chosen.doc, chosen.arguments, chosen.pair, chosen.history
    response = chosen.response  # cut at the server's budget
    if options.target_response_chars:  # a long answer shrunk (JSON kept valid) before that cut
        response = truncate_response(shrink_response(pair["response"]["response"], options.target_response_chars))
    return {
        "prompt": simulator_messages(
            doc,
            arguments,
            examples,
            fmt=fmt,
            # as a server asks: a system prompt file is for the stateless format, a session call gets its own
            system_prompt=None if fmt in SESSION_FORMATS else options.system_prompt,
            history=list(history) if fmt in SESSION_FORMATS else None,
        ),
        "completion": [{"role": "assistant", "content": _target(chosen.error, response, pair, fmt)}],
        "prompt_format": fmt,
        "source": pair["source"],
        "episode": str(pair["episode"]),
        "step": int(pair["step"]),
        "category": doc.category,
        "tool": doc.tool,
        "api": doc.api,
        "arguments": chosen.arguments_key,
        "kind": chosen.kind,
    }


def _target(error: str, response, pair: dict, prompt_format: str) -> str:
    """The answer a record teaches: the observation; in CoT mode the rationale first (MirrorAPI's CoT schema)."""
    observation = render_observation(error, response, prompt_format)
    if prompt_format != COT_FORMAT:
        return observation
    return (
        "{"
        + json.dumps(COT_RATIONALE_KEY)
        + ":"
        + json.dumps(pair["rationale"], ensure_ascii=False)
        + ","
        + observation[1:]
    )


def _split_stats(records: list[dict]) -> dict:
    kinds = Counter(r["kind"] for r in records)
    return {
        "records": len(records),
        "apis": len({(r["category"], r["tool"], r["api"]) for r in records}),
        "episodes": len({(r["source"], r["episode"]) for r in records}),
        **{k: kinds[k] for k in ("success", "error", "in_band_error") if k in kinds},
        "by_source": dict(sorted(Counter(r["source"] for r in records).items())),
        "by_prompt_format": dict(sorted(Counter(r["prompt_format"] for r in records).items())),
    }


def write_sft_dataset(
    out_dir: str | os.PathLike, splits: dict[str, list[dict]], stats: dict, columns: Iterable[str] = SIMULATOR_COLUMNS
) -> Path:
    """Save the splits as a `DatasetDict` plus `stats.json`; replaces `out_dir` only once all is written."""
    from datasets import Dataset, DatasetDict

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    columns = list(columns)
    tables = {}
    for name, records in splits.items():
        # Column-wise construction: several times faster than Dataset.from_list on 100k records.
        tables[name] = Dataset.from_dict({c: [r[c] for r in records] for c in columns}, features=_features(columns))
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    umask = os.umask(0)
    os.umask(umask)
    staging.chmod(0o777 & ~umask)  # as a folder made plainly: mkdtemp's 0700, renamed into place, hid it from others
    try:
        DatasetDict(tables).save_to_disk(str(staging))
        (staging / STATS_FILE).write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    logger.info("wrote %s: %s", out_dir, {name: len(records) for name, records in splits.items()})
    if "train" in splits and not splits["train"] and any(splits.values()):  # e.g. one API: held out whole
        logger.warning("%s: the train split is empty, every record is held out (too few APIs or episodes)", out_dir)
    return out_dir


def _features(columns: list[str]):
    from datasets import Features, List, Value

    message = List({"role": Value("string"), "content": Value("string")})
    types = {"prompt": message, "completion": message, "step": Value("int64"), "call_in_train": Value("bool")}
    return Features({c: types.get(c, Value("string")) for c in columns})
