"""Data: real request -> response pairs and labelled answers become SFT sets (simulator, judge).

Pair sources beyond our JSONL schema, transport-failure rules, episode/group splits, and the two
builders. Imports the core only.
"""
