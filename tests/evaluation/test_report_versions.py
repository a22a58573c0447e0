"""An evaluation report records the software it was computed with: `fac.json` of a real `eval/fac.py` run
(against the fake judge: the versions do not depend on the verdicts) names the installed versions."""

from __future__ import annotations

import json
import sys
from importlib import metadata

KEY_PACKAGES = ("transformers", "openai", "sacrebleu", "fastapi", "uvicorn")


def test_fac_report_names_the_installed_versions(eval_cli, faulty_judge, stb_answers, samples, tmp_path):
    ids = samples / "stabletoolbench" / "solvable_queries_example" / "test_query_ids"
    argv = [
        "--answers",
        str(stb_answers),
        "--ids",
        str(ids),
        "--base-url",
        faulty_judge.base_url,
        "--model",
        faulty_judge.model,
        "--out",
        str(tmp_path),
        "--no-progress",
    ]
    assert eval_cli("fac")(argv) == 0
    versions = json.loads((tmp_path / "fac.json").read_text())["versions"]
    assert {name: versions.get(name) for name in KEY_PACKAGES} == {n: metadata.version(n) for n in KEY_PACKAGES}
    assert versions["python"] == "{}.{}.{}".format(*sys.version_info[:3])
    assert versions["mirrorapi"] == metadata.version("mirrorapi")
