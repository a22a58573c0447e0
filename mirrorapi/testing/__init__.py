"""Harnesses shared by the tests, `bench/` and the demo: not part of any stage, and no stage imports them."""
