"""The benchmarks' arithmetic (bench/): medians over runs, ratios of one run's figures, the import child."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from cache_import_stall import ONE_TRANSACTION  # noqa: E402
from server_load import median_of  # noqa: E402


def test_a_status_some_runs_lack_counts_zero_there():
    runs = [{"statuses": {"ok": 5, "error": 1}}, {"statuses": {"ok": 7}}, {"statuses": {"ok": 6, "timeout": 2}}]
    assert median_of(runs) == {"statuses": {"ok": 6, "error": 0, "timeout": 0}}
    assert median_of(list(reversed(runs)))["statuses"]["error"] == 0


def test_a_ratio_is_the_median_of_the_runs_ratios():
    # Made-up runs whose own ratios are 2, 1, 1: the ratio is 1; the ratio of the two medians would be 1.2.
    runs = [{"ours": 2.0, "bare": 1.0}, {"ours": 5.0, "bare": 5.0}, {"ours": 6.0, "bare": 6.0}]
    per_run = [{"ours_over_bare": r["ours"] / r["bare"]} for r in runs]
    assert median_of(per_run) == {"ours_over_bare": 1.0}


def test_the_one_transaction_import_child_runs(tmp_path):
    samples = REPO / "data" / "samples"
    db = tmp_path / "c.sqlite"
    args = [str(samples / "pairs.jsonl"), str(db), str(samples / "tools")]
    command = [sys.executable, "-c", ONE_TRANSACTION, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert db.is_file() and "'stored': " in result.stdout and "'unreadable': []" in result.stdout
