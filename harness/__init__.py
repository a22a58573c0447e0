"""Harnesses shared by the tests, `bench/` and the demo (`make demo`): child processes, fake engines, a throwaway
PostgreSQL, the recorded agent. Not part of the library or its wheel: it lives beside `mirrorapi/` in a clone,
imports the library, and nothing in the library imports it (.importlinter)."""

from pathlib import Path

# The clone's root: child processes that run a harness module (`python -m harness.<module>`) get it on PYTHONPATH.
REPO = Path(__file__).resolve().parents[1]
