"""Rebuild `data/samples/` from `../shared/data` (deterministic; the output is committed).

    python scripts/make_samples.py [--shared ../shared/data] [--out data/samples]

The sample lets the tests and the demo run in a clone without `../shared`. It keeps whole episodes
(stateful APIs need their earlier calls) and every tool doc those pairs need.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from collections import defaultdict
from pathlib import Path

from mirrorapi.records import read_jsonl

SEED = 20251121
PAIR_EPISODES = {
    "api-bank-generated.jsonl": 70,
    "api-bank.jsonl": 25,
    "tau-bench.jsonl": 12,
    "toolbench-example.jsonl": 15,
}
JUDGE_PER_KIND = {"env-reward": 20, "reference-answer": 25, "synthetic-mismatch": 25, "stb-pass-rate-gpt": 6}
EXAMPLE_IDS = ["588", "608", "1073"]  # StableToolBench's solvable_queries_example
TOOLENV_TOOLS = ["Artificial_Intelligence_Machine_Learning/ttskraken.json", "Data/theclique.json"]


def read_records(path: Path) -> list[dict]:
    return [record for _, record in read_jsonl(path)]


def write_jsonl(path: Path, records: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for r in records:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--shared", default="../shared/data", type=Path)
    parser.add_argument("--out", default="data/samples", type=Path)
    args = parser.parse_args()
    rng = random.Random(SEED)
    out = args.out
    needed = [
        args.shared / "pairs",
        args.shared / "toolenv/realtools",
        args.shared / "toolenv/toolenv2404",
        args.shared / "judge/labelled.jsonl",
        args.shared / "stabletoolbench",
    ]
    if missing := [str(path) for path in needed if not path.exists()]:  # before anything of --out is removed
        parser.error(
            f"--shared {args.shared} is not the shared data folder ({', '.join(missing)} missing); nothing changed"
        )
    for sub in ("tools", "stabletoolbench"):
        shutil.rmtree(out / sub, ignore_errors=True)

    pairs = []
    for name, n_episodes in PAIR_EPISODES.items():
        by_episode = defaultdict(list)
        for p in read_records(args.shared / "pairs" / name):
            by_episode[p["episode"]].append(p)
        chosen = sorted(rng.sample(sorted(by_episode), min(n_episodes, len(by_episode))))
        for episode in chosen:
            pairs.extend(sorted(by_episode[episode], key=lambda p: p["step"]))
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "pairs.jsonl", pairs)

    # Every realtools doc (0.3 MB) plus the ToolEnv2404 tools of StableToolBench's README request and example.
    shutil.copytree(args.shared / "toolenv/realtools", out / "tools")
    for rel in TOOLENV_TOOLS:
        (out / "tools" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.shared / "toolenv/toolenv2404" / rel, out / "tools" / rel)

    by_kind = defaultdict(list)
    for r in read_records(args.shared / "judge/labelled.jsonl"):
        by_kind[r["label_kind"]].append(r)
    judge = []
    for kind, n in JUDGE_PER_KIND.items():
        records = by_kind[kind]
        if kind == "env-reward":  # balanced: half Solved, half Unsolved
            judge += rng.sample([r for r in records if r["label"] == "Solved"], n // 2)
            judge += rng.sample([r for r in records if r["label"] == "Unsolved"], n // 2)
        else:
            judge += rng.sample(records, min(n, len(records)))
    write_jsonl(out / "judge.jsonl", judge)

    stb_in, stb_out = args.shared / "stabletoolbench", out / "stabletoolbench"
    for method in ("virtual_chatgpt_cot", "virtual_chatgpt_dfs"):
        rel = Path("data_example/model_predictions_converted") / method / "G1_instruction.json"
        (stb_out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(stb_in / rel, stb_out / rel)
        # The raw answer files too: the recorded agent replays them (CoT tries, whole DFS trees).
        raw = Path("data_example/answer") / method / "G1_instruction"
        (stb_out / raw).mkdir(parents=True, exist_ok=True)
        for file in sorted((stb_in / raw).glob("*.json")):
            shutil.copy(file, stb_out / raw / file.name)
    queries = json.loads((stb_in / "solvable_queries/test_instruction/G1_instruction.json").read_text())
    example = [q for q in queries if str(q["query_id"]) in EXAMPLE_IDS]
    for sub, content in (("test_instruction", example), ("test_query_ids", {i: 0 for i in EXAMPLE_IDS})):
        path = stb_out / "solvable_queries_example" / sub / "G1_instruction.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(content, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"{len(pairs):,} pairs, {len(judge):,} judge records, tools and StableToolBench example -> {out}")


if __name__ == "__main__":
    main()
