"""The CPU demo (`make demo`, `python scripts/demo.py`): the whole loop with a tiny model. Not part of the wheel."""
