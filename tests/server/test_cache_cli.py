"""`mirrorapi cache import | export | stats`."""

import json

from mirrorapi.cli import main


def test_import_stats_export(stb_cache, sample_tools, samples, tmp_path, capsys):
    folder, written = stb_cache
    db = str(tmp_path / "c.sqlite")
    assert main(["cache", "import", str(folder), "--cache", db, "--tools", str(sample_tools), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["entries"] == len(written) and report["unresolved_apis"] == 0
    assert main(["cache", "import", str(folder), "--cache", db]) == 0
    assert "imported before and unchanged, nothing done" in capsys.readouterr().out

    assert main(["cache", "import", str(samples / "pairs.jsonl"), "--cache", db, "--tools", str(sample_tools)]) == 0
    assert "451 entries read" in capsys.readouterr().out
    assert main(["cache", "stats", "--cache", db, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["by_provenance"]["imported:tool_response_cache"] == report["stored"]
    assert stats["entries"] == report["stored"] + stats["by_provenance"].get("real", 0)
    assert [i["origin"] for i in stats["imports"]] == [str(folder)]

    out = tmp_path / "export"
    assert main(["cache", "export", str(out), "--cache", db, "--provenance", "real"]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"{stats['by_provenance'].get('real', 0):,} entries written")
    assert all(path.parent.name.endswith("_for_" + path.parent.parent.name) for path in out.glob("*/*/*.json"))


def test_user_mistakes_are_one_line_and_exit_2(tmp_path, capsys):
    assert main(["cache", "stats", "--cache", str(tmp_path / "none.sqlite")]) == 2
    assert capsys.readouterr().err == f"mirrorapi: error: cache database not found: {tmp_path / 'none.sqlite'}\n"
    assert main(["cache", "import", str(tmp_path / "nowhere"), "--cache", str(tmp_path / "c.sqlite")]) == 2
    assert "StableToolBench cache folder not found" in capsys.readouterr().err
