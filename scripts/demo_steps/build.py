"""What the demo builds once and reuses: the data slice, the SFT sets, a StableToolBench cache folder, models.

Each thing lives in `<work>/build/<kind>-<key>/`, where the key hashes everything it is built from
(input file contents, sizes and options, the training recipe, mirrorapi's own code and the library
versions). A folder counts only once its completion marker is written, so an interrupted build is
redone, and a changed input gets a new folder instead of a stale one.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import shutil
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mirrorapi.data.judge_sft import JUDGE_COLUMNS, build_judge_records
from mirrorapi.data.simulator_sft import SimulatorDataOptions, build_simulator_records, write_sft_dataset
from mirrorapi.records import read_labelled, read_pairs_jsonl
from mirrorapi.serving.cache import ResponseCache, export_stabletoolbench_cache, import_pairs
from mirrorapi.tools import ToolRegistry

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SAMPLES = REPO / "data" / "samples"
MARKER = ".demo-complete.json"
# The shared slice: whole episodes of each source, a few hundred pairs in all (training stays fast).
SHARED_EPISODES = {"api-bank-generated": 60, "tau-bench": 20, "toolbench-example": 15}
STB_CACHE = "tool_response_cache"  # StableToolBench's name for its cache folder


@dataclass
class DataSource:
    description: str
    pair_files: list[Path]
    episodes: dict[str, int] | None  # whole episodes per source; None: every pair of the files
    tools: Path
    labelled: Path


def choose_data(shared: Path | None) -> DataSource:
    """A slice of `../shared/data` when it is there, else the bundled `data/samples`."""
    if shared is not None and (shared / "pairs").is_dir():
        where = "../shared/data" if shared == REPO.parent / "shared" / "data" else str(shared)
        return DataSource(
            f"{where} (a slice: " + ", ".join(f"{n} {s} episodes" for s, n in SHARED_EPISODES.items()) + ")",
            [shared / "pairs" / f"{s}.jsonl" for s in SHARED_EPISODES],
            SHARED_EPISODES,
            shared / "toolenv" / "realtools",
            shared / "judge" / "labelled.jsonl",
        )
    return DataSource(
        f"{SAMPLES.relative_to(REPO)} (bundled sample)",
        [SAMPLES / "pairs.jsonl"],
        None,
        SAMPLES / "tools",
        SAMPLES / "judge.jsonl",
    )


def read_slice(source: DataSource) -> list[dict]:
    """Whole episodes, the sources interleaved episode by episode: the first training records (which a
    short training run uses) then hold every source, not just the first file's."""
    by_source: dict[str, dict[str, list[dict]]] = {}
    for path in source.pair_files:
        for pair in read_pairs_jsonl(path):
            episodes = by_source.setdefault(pair["source"], {})
            limit = source.episodes.get(pair["source"]) if source.episodes else None
            if pair["episode"] not in episodes and limit is not None and len(episodes) >= limit:
                continue
            episodes.setdefault(pair["episode"], []).append(pair)
    rounds = itertools.zip_longest(*(list(episodes.values()) for episodes in by_source.values()))
    return [pair for episodes in rounds for episode in episodes if episode for pair in episode]


# ------------------------------------------------------------------------------- keys and reuse
def digest(*parts) -> str:
    sha = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path):
            files = sorted(p for p in part.rglob("*") if p.is_file()) if part.is_dir() else [part]
            for path in files:
                sha.update(str(path.relative_to(part) if part.is_dir() else path.name).encode())
                sha.update(path.read_bytes())
        else:
            sha.update(json.dumps(part, sort_keys=True, default=str).encode())
    return sha.hexdigest()[:12]


def code_version() -> str:
    """What the built things depend on besides their inputs: the library, the recipes, this module
    (it decides what is built) and the libraries' versions. The demo's other modules only run
    things, so editing them rebuilds nothing."""
    files = [
        p
        for folder in ("mirrorapi", "training")
        for p in sorted((REPO / folder).rglob("*"))
        if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts
    ] + [Path(__file__).resolve()]
    versions = {name: metadata.version(name) for name in ("torch", "transformers", "trl", "datasets", "tokenizers")}
    return digest(versions, *files)


def complete(folder: Path) -> bool:
    return (folder / MARKER).is_file()


def mark_complete(folder: Path, inputs: dict) -> None:
    (folder / MARKER).write_text(
        json.dumps({"built": time.strftime("%Y-%m-%d %H:%M:%S"), "inputs": inputs}, indent=2, default=str) + "\n",
        encoding="utf-8",
    )


def fresh(folder: Path) -> Path:
    """An empty folder (what an interrupted build left there is removed)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


# ------------------------------------------------------------------------------------- the data
@dataclass
class DemoData:
    folder: Path
    reused: bool
    source: DataSource
    pairs: Path  # the slice
    train_pairs: Path  # pairs of the simulator's training split (they also seed the cache)
    test_pairs: Path  # test_id + test_ood pairs (each with its `split`), in slice order
    judge_test: Path  # labelled answers of the judge's test split
    simulator: Path  # SFT DatasetDicts
    judge: Path
    stb_cache: Path  # the training pairs' real responses in StableToolBench's cache layout
    summary: dict


def _write_jsonl(path: Path, records) -> int:
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def build_data(build: Path, source: DataSource, code: str, options: SimulatorDataOptions) -> DemoData:
    pairs = read_slice(source)
    inputs = {
        "pairs": digest(pairs),
        "tools": digest(source.tools),
        "labelled": digest(source.labelled),
        "options": vars(options),
        "code": code,
    }
    folder = build / f"data-{digest(inputs)}"
    data = DemoData(
        folder,
        complete(folder),
        source,
        folder / "pairs.jsonl",
        folder / "train.jsonl",
        folder / "test.jsonl",
        folder / "judge_test.jsonl",
        folder / "simulator",
        folder / "judge",
        folder / STB_CACHE,
        {},
    )
    if data.reused:
        data.summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
        return data
    fresh(folder)
    _write_jsonl(data.pairs, pairs)
    registry = ToolRegistry.load([source.tools])
    splits, stats = build_simulator_records(read_pairs_jsonl(data.pairs), registry, options)
    write_sft_dataset(data.simulator, splits, stats)
    split_of = {(r["source"], r["episode"], r["step"]): name for name, records in splits.items() for r in records}
    where = [(pair, split_of.get((pair["source"], str(pair["episode"]), int(pair["step"])))) for pair in pairs]
    _write_jsonl(data.train_pairs, (pair for pair, split in where if split == "train"))
    _write_jsonl(
        data.test_pairs, ({**pair, "split": split} for pair, split in where if split in ("test_id", "test_ood"))
    )

    labelled = list(read_labelled(source.labelled, lambda reason: logger.warning("skipping %s", reason)))
    judge_splits, judge_stats = build_judge_records(labelled)
    write_sft_dataset(data.judge, judge_splits, judge_stats, JUDGE_COLUMNS)
    test_ids = {(r["source"], r["id"]) for r in judge_splits["test"]}
    _write_jsonl(data.judge_test, (r for r in labelled if (r["source"], r["id"]) in test_ids))

    # The real responses an agent's benchmark would have recorded, written as StableToolBench writes them.
    staging = ResponseCache(folder / "seed.sqlite")
    try:
        import_pairs(staging, data.train_pairs, registry)
        exported = export_stabletoolbench_cache(staging, data.stb_cache)
    finally:
        staging.close()
    for leftover in folder.glob("seed.sqlite*"):
        leftover.unlink()
    data.summary = {
        "pairs": len(pairs),
        "by_source": dict(sorted(stats["read"].items())),
        "simulator_splits": {k: v["records"] for k, v in stats["splits"].items()},
        "simulator_dropped": {k: v for k, v in stats["dropped"].items() if isinstance(v, int) and v},
        "judge_splits": {k: v["records"] for k, v in judge_stats["splits"].items()},
        "stb_cache": {"files": exported["files"], "entries": exported["entries"]},
    }
    (folder / "summary.json").write_text(json.dumps(data.summary, indent=2) + "\n", encoding="utf-8")
    mark_complete(folder, inputs)
    return data


def build_base_model(build: Path, data: DemoData, code: str) -> tuple[Path, bool]:
    """The tiny from-scratch model, its tokenizer trained on the demo's own data."""
    from mirrorapi.training.tiny_model import build_tiny_model

    corpus = [data.pairs, data.source.labelled, *sorted(data.source.tools.rglob("*.json"))]
    folder = build / f"tiny-base-{digest({'data': data.folder.name, 'code': code})}"
    if complete(folder):
        return folder, True
    build_tiny_model(fresh(folder), corpus=corpus)
    mark_complete(folder, {"corpus": [str(p) for p in corpus[:2]] + [str(data.source.tools)]})
    return folder, False


def select_heldout(pairs: list[dict], calls: int) -> list[dict]:
    """Whole held-out episodes of `pairs`, up to `calls` calls (at least one episode), taken from each source in turn
    (in the pairs' order within a source), so that a small sample still holds every source."""
    by_source: dict[str, dict[str, list[dict]]] = {}
    for pair in pairs:
        by_source.setdefault(pair["source"], {}).setdefault(str(pair["episode"]), []).append(pair)
    queues = [list(episodes.values()) for episodes in by_source.values()]
    chosen: list[dict] = []
    while any(queues):
        for queue in queues:
            if queue:
                episode = queue.pop(0)
                if not chosen or len(chosen) + len(episode) <= calls:
                    chosen += episode
    return chosen
