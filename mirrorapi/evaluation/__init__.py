"""Evaluation: StableToolBench answer files, judging (FAC / SoPR), score tables, judge agreement,
and simulator fidelity (metrics and report).
"""
