"""Evaluation, grouped by job:
- `agent/`: the benchmark's agent runner (queries -> StableToolBench answer files);
- `answers/`: answer files converted and read into the items a judge scores;
- `judge/`: FAC / SoPR scoring, SoWR, judge agreement;
- `fidelity/`: simulator fidelity (replay, metrics, report, session history);
- `benchmarks/`: API-Bank and ToolEyes;
- `benchmark`, `score_tables`, `commands`: `mirrorapi benchmark`, its tables (one writer) and the eval commands.
"""
