"""Simulator SFT data: real pairs + tool docs -> conversational prompt/completion records.

Prompts are rendered by `mirrorapi.prompts.simulator_messages` and targets by `mirrorapi.records.observation_json`,
the functions the server uses, so a model is trained on exactly what it will be served. Quality
rules, each counted in `stats.json`:
- a pair whose API has no doc is dropped (`unknown_api`);
- transport failures (rate limits, timeouts, auth, gateway and server errors) are dropped
  (`mirrorapi.data.transport_failures.transport_failure`, by kind); genuine API errors are kept as error examples;
- a call seen before (same API, same canonical arguments, `mirrorapi.records.canonical_json`) is
  dropped; the first one in input order is kept, and conflicting answers are counted apart;
- responses over the server's budget are cut the way the server cuts them (`truncate_response`).
With `history` K > 0 (format `mirrorapi-session-v1`), each prompt also shows the earlier calls of its
episode (every earlier step that resolved and was not a transport failure, duplicates included, as
the server's session would hold them), newest first, chosen by `select_history` with the server's
budget; a call is then a duplicate only when its earlier calls are the same too.
Then `mirrorapi.data.splits.split_episodes` holds out APIs (`test_ood`) and calls of seen APIs (`test_id`).

The output folder is a `datasets.DatasetDict` (`load_from_disk`) with a `stats.json` beside its splits.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from mirrorapi.data.splits import split_episodes
from mirrorapi.data.transport_failures import in_band_error, transport_failure
from mirrorapi.few_shot import candidate_pool, select_examples, shrink_response
from mirrorapi.prompts import (
    COT_FORMAT,
    COT_RATIONALE_KEY,
    DEFAULT_SIMULATOR_FORMAT,
    HISTORY_CHAR_BUDGET,
    OUR_SIMULATOR_FORMATS,
    RESPONSE_CHAR_BUDGET,
    SESSION_FORMAT,
    SIMULATOR_FORMATS,
    check_cot_system_prompt,
    history_line,
    render_observation,
    select_history,
    simulator_messages,
    truncate_response,
)
from mirrorapi.records import canonical_json, observation_json
from mirrorapi.tools import ApiDoc, ToolRegistry, UnknownName

logger = logging.getLogger(__name__)

STATS_FILE = "stats.json"
SIMULATOR_COLUMNS = ("prompt", "completion", "prompt_format", "source", "episode", "step", "category", "tool",
                     "api", "arguments", "kind")


@dataclass
class SimulatorDataOptions:
    prompt_format: str = DEFAULT_SIMULATOR_FORMAT
    system_prompt: str | None = None  # required by the `stabletoolbench` formats (the released model's own)
    few_shot: int = 0  # real examples of the same API in each prompt, chosen as the server chooses them
    few_shot_char_budget: int = 2048
    few_shot_response_chars: int = 0  # the server's few_shot_response_chars: examples' responses shrunk to this
    target_response_chars: int = 0  # long real responses shrunk to this in the targets (0: cut at the server's budget)
    ood_fraction: float = 0.05  # share of distinct APIs held out entirely (test_ood)
    id_fraction: float = 0.05  # share of the remaining episodes held out (test_id)
    seed: int = 42
    history: int = 0  # earlier calls of the episode per prompt (format mirrorapi-session-v1); the server's session_history
    history_char_budget: int = HISTORY_CHAR_BUDGET  # the server's session_char_budget

    def check(self) -> None:
        if self.prompt_format not in SIMULATOR_FORMATS:
            raise ValueError(f"unknown prompt format {self.prompt_format!r}; known: {', '.join(SIMULATOR_FORMATS)}")
        if (self.history > 0) != (self.prompt_format == SESSION_FORMAT):
            raise ValueError(f"history > 0 goes with prompt format {SESSION_FORMAT!r} and only with it "
                             f"(got history={self.history}, prompt format {self.prompt_format!r})")
        if self.history < 0 or self.history_char_budget <= 0:
            raise ValueError("history must be >= 0 and history_char_budget > 0")
        if self.prompt_format not in OUR_SIMULATOR_FORMATS and not self.system_prompt:
            raise ValueError(f"prompt format {self.prompt_format!r} needs a system prompt file")
        if self.prompt_format == COT_FORMAT:
            check_cot_system_prompt(self.system_prompt or "")
        for name in ("few_shot", "few_shot_response_chars", "target_response_chars"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("ood_fraction", "id_fraction"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")


def build_simulator_records(pairs: Iterable[dict], registry: ToolRegistry, options: SimulatorDataOptions,
                            progress: bool = False) -> tuple[dict[str, list[dict]], dict]:
    """Apply the quality rules, split, and render; returns (records per split, stats)."""
    options.check()
    read: Counter = Counter()
    dropped: Counter = Counter()
    transport: Counter = Counter()
    kept_kinds: Counter = Counter()
    truncated = 0
    unknown_examples: list[str] = []
    seen: dict[tuple, tuple] = {}
    kept: list[tuple] = []  # (doc, arguments, error, response, pair, kind, arguments key, history)
    for pair, doc, history in _with_history(pairs, registry, options, read, dropped, transport, unknown_examples,
                                            progress):
        error, response = pair["response"]["error"], pair["response"]["response"]
        if options.prompt_format == COT_FORMAT and not pair.get("rationale"):
            dropped["no_rationale"] += 1  # a CoT target needs the mechanism (MirrorAPI's train_cot.json has one)
            continue
        key = (doc.category, doc.tool, doc.api, canonical_json(pair["tool_input"]), *history)
        observation = (error, canonical_json(response))
        if key in seen:
            dropped["duplicate" if seen[key] == observation else "duplicate_conflicting"] += 1
            continue
        seen[key] = observation
        cut = truncate_response(shrink_response(response, options.target_response_chars))
        truncated += cut is not response
        kind = "error" if error else "in_band_error" if in_band_error(response) else "success"
        kept_kinds[kind] += 1
        kept.append((doc, pair["tool_input"], error, cut, pair, kind, key[3], history))

    indices = split_episodes([(d.category, d.tool, d.api) for d, *_ in kept],
                             [(e[4]["source"], e[4]["episode"]) for e in kept],
                             options.ood_fraction, options.id_fraction, options.seed)
    examples = _example_picker(kept, indices["train"], options)
    splits = {name: [_render(kept[i], options, examples(i)) for i in members] for name, members in indices.items()}
    stats = {
        "kind": "simulator",
        "prompt_format": options.prompt_format,
        "options": {k: v for k, v in asdict(options).items() if k != "system_prompt"},
        "response_char_budget": RESPONSE_CHAR_BUDGET,
        "read": {"total": sum(read.values()), **dict(sorted(read.items()))},
        "dropped": {"unknown_api": dropped["unknown_api"], "transport_failure": sum(transport.values()),
                    "transport_failure_by_kind": dict(sorted(transport.items())),
                    "duplicate": dropped["duplicate"], "duplicate_conflicting": dropped["duplicate_conflicting"],
                    **({"no_rationale": dropped["no_rationale"]} if options.prompt_format == COT_FORMAT else {})},
        "unknown_api_examples": unknown_examples,
        "kept": {"total": len(kept), **{k: kept_kinds[k] for k in ("success", "error", "in_band_error")},
                 "truncated": truncated},
        "splits": {name: _split_stats(records) for name, records in splits.items()},
    }
    return splits, stats


def _with_history(pairs: Iterable[dict], registry: ToolRegistry, options: SimulatorDataOptions, read: Counter,
                  dropped: Counter, transport: Counter, unknown_examples: list[str], progress: bool):
    """(pair, doc, history) of the pairs that resolve and are not transport failures, in input order;
    `history`: the prompt's lines of the episode's earlier steps (empty without `options.history`)."""
    usable: list[tuple[dict, ApiDoc]] = []
    for pair in tqdm(pairs, desc="pairs", unit=" pairs", disable=None if progress else True, mininterval=1.0):
        read[pair["source"]] += 1
        doc = pair.get("doc")
        try:
            doc = registry.resolve(pair["category"], pair["tool_name"], pair["api_name"])
        except UnknownName:
            if doc is None:
                dropped["unknown_api"] += 1
                if len(unknown_examples) < 10:
                    unknown_examples.append(f"{pair['category']}/{pair['tool_name']}/{pair['api_name']}")
                continue
        failure = transport_failure(pair["response"]["error"], pair["response"]["response"])
        if failure:
            transport[failure] += 1
            continue
        usable.append((pair, doc))
    if not options.history:
        return [(pair, doc, ()) for pair, doc in usable]
    episodes: dict[tuple, list[tuple[int, str]]] = {}
    for pair, doc in usable:
        line = history_line(doc.tool, doc.api, pair["tool_input"], pair["response"]["error"],
                            pair["response"]["response"])
        episodes.setdefault((pair["source"], pair["episode"]), []).append((int(pair["step"]), line))
    for steps in episodes.values():
        steps.sort(key=lambda item: item[0])
    out = []
    for pair, doc in usable:
        earlier = [line for step, line in episodes[(pair["source"], pair["episode"])] if step < int(pair["step"])]
        out.append((pair, doc, tuple(select_history(earlier, options.history, options.history_char_budget))))
    return out


def _example_picker(kept: list[tuple], train: list[int], options: SimulatorDataOptions):
    """index -> few-shot examples: the server's own choice (`select_examples` over `candidate_pool`, the
    one candidate order) among the training calls of the same API, as its cache would hold them after
    `mirrorapi cache import` of the same pairs. Test records only ever see training calls."""
    if not options.few_shot:
        return lambda index: []

    by_api: dict[tuple, list[tuple[str, str]]] = {}
    for i in train:
        doc, _, error, _, pair, _, arguments_key, _ = kept[i]
        # As `import_pairs` stores the call in the server's cache: the observation whole, uncut.
        observation = observation_json(error, pair["response"]["response"])
        by_api.setdefault((doc.category, doc.tool, doc.api), []).append((arguments_key, observation))
    pools = {api: candidate_pool(candidates) for api, candidates in by_api.items()}

    def pick(index: int) -> list[tuple[dict, dict]]:
        doc, arguments = kept[index][0], kept[index][1]
        return select_examples(pools.get((doc.category, doc.tool, doc.api), []), arguments, options.few_shot,
                               options.few_shot_char_budget, options.few_shot_response_chars)
    return pick


def _render(entry: tuple, options: SimulatorDataOptions, examples: list[tuple[dict, dict]]) -> dict:
    doc, arguments, error, response, pair, kind, arguments_key, history = entry
    return {
        "prompt": simulator_messages(doc, arguments, examples, fmt=options.prompt_format,
                                     system_prompt=options.system_prompt,
                                     history=list(history) if options.history else None),
        "completion": [{"role": "assistant", "content": _target(error, response, pair, options.prompt_format)}],
        "prompt_format": options.prompt_format,
        "source": pair["source"], "episode": str(pair["episode"]), "step": int(pair["step"]),
        "category": doc.category, "tool": doc.tool, "api": doc.api, "arguments": arguments_key, "kind": kind,
    }


def _target(error: str, response, pair: dict, prompt_format: str) -> str:
    """The answer a record teaches: the observation; in CoT mode the rationale first (MirrorAPI's CoT schema)."""
    observation = render_observation(error, response, prompt_format)
    if prompt_format != COT_FORMAT:
        return observation
    return "{" + json.dumps(COT_RATIONALE_KEY) + ":" + json.dumps(pair["rationale"], ensure_ascii=False) + "," + \
        observation[1:]


def _split_stats(records: list[dict]) -> dict:
    kinds = Counter(r["kind"] for r in records)
    return {"records": len(records), "apis": len({(r["category"], r["tool"], r["api"]) for r in records}),
            "episodes": len({(r["source"], r["episode"]) for r in records}),
            **{k: kinds[k] for k in ("success", "error", "in_band_error") if k in kinds}}


def write_sft_dataset(out_dir: str | os.PathLike, splits: dict[str, list[dict]], stats: dict,
                      columns: Iterable[str] = SIMULATOR_COLUMNS) -> Path:
    """Save the splits as a `DatasetDict` plus `stats.json`; replaces `out_dir` only once all is written."""
    from datasets import Dataset, DatasetDict

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    columns = list(columns)
    tables = {}
    for name, records in splits.items():
        # Column-wise construction: several times faster than Dataset.from_list on 100k records.
        tables[name] = Dataset.from_dict({c: [r[c] for r in records] for c in columns},
                                         features=_features(columns))
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
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
    return out_dir


def _features(columns: list[str]):
    from datasets import Features, List, Value

    message = List({"role": Value("string"), "content": Value("string")})
    types = {"prompt": message, "completion": message, "step": Value("int64")}
    return Features({c: types.get(c, Value("string")) for c in columns})
