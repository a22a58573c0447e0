"""`mirrorapi cache import | export | stats`, on a SQLite file and on PostgreSQL (`cache_location`)."""

import json
from pathlib import Path

from harness.fake_engines import STUB_OBSERVATION, StubEngine
from mirrorapi.cli import main
from mirrorapi.transport_failures import transport_failure


def test_import_stats(stb_cache, sample_tools, samples, cache_location, capsys):
    folder, written = stb_cache
    db = cache_location
    assert main(["cache", "import", str(folder), "--cache", db, "--tools", str(sample_tools), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["entries"] == len(written) and report["unresolved_apis"] == 0
    assert main(["cache", "import", str(folder), "--cache", db]) == 0
    assert "imported before and unchanged, nothing done" in capsys.readouterr().out

    assert main(["cache", "import", str(samples / "pairs.jsonl"), "--cache", db, "--tools", str(sample_tools)]) == 0
    printed = capsys.readouterr().out  # the sample's 451 pairs: 19 of ToolBench's record an outage (the test below)
    assert "432 entries read" in printed and "19 transport failures skipped" in printed
    assert main(["cache", "stats", "--cache", db, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["by_provenance"]["imported:tool_response_cache"] == report["stored"]
    assert stats["entries"] == report["stored"] + stats["by_provenance"].get("real", 0)
    assert [i["origin"] for i in stats["imports"]] == [str(folder)]


def test_export_writes_every_real_call(sample_tools, samples, cache_location, tmp_path, capsys):
    """Real pairs imported into an empty cache come back out as a StableToolBench cache folder: one file per
    API, one key per distinct call (`str(arguments)`, as its server writes them), each with the real answer.
    The expected counts are computed here from the pairs file itself, less the outages an import leaves out (the
    test below)."""
    lines = (samples / "pairs.jsonl").read_text(encoding="utf-8").splitlines()
    pairs = [
        p for p in map(json.loads, lines) if not transport_failure(p["response"]["error"], p["response"]["response"])
    ]
    calls = {
        (p["category"], p["tool_name"], p["api_name"], json.dumps(p["tool_input"], sort_keys=True)): p for p in pairs
    }
    apis = {call[:3] for call in calls}
    assert len(calls) > 100 and len(apis) > 50  # the sample holds what the test is about

    db = cache_location
    assert main(["cache", "import", str(samples / "pairs.jsonl"), "--cache", db, "--tools", str(sample_tools)]) == 0
    assert f"{len(pairs)} entries read, {len(calls)} stored" in capsys.readouterr().out
    out = tmp_path / "export"
    assert main(["cache", "export", str(out), "--cache", db, "--provenance", "real"]) == 0
    assert capsys.readouterr().out.startswith(f"{len(calls):,} entries written to {len(apis)} files")
    for not_a_prefix in ("REAL", "r_al", "%"):  # a prefix is text as written, the same on SQLite and PostgreSQL
        assert main(["cache", "export", str(tmp_path / "none"), "--cache", db, "--provenance", not_a_prefix]) == 0
        assert capsys.readouterr().out.startswith("0 entries written"), not_a_prefix

    files = sorted(out.glob("*/*/*.json"))
    assert len(files) == len(apis)
    assert all(path.parent.name.endswith("_for_" + path.parent.parent.name) for path in files)
    exported = {
        (path, key): value for path in files for key, value in json.loads(path.read_text(encoding="utf-8")).items()
    }
    assert len(exported) == len(calls)
    answers: dict[tuple, list] = {}  # (category, key) -> the real answers of those calls (some calls recur)
    for p in pairs:
        answers.setdefault((p["category"], str(p["tool_input"])), []).append(p["response"])
    for (path, key), value in exported.items():
        assert value in answers[(path.parent.parent.name, key)]


def test_user_mistakes_are_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    assert main(["cache", "stats", "--cache", str(tmp_path / "none.sqlite")]) == 2
    assert (
        capsys.readouterr().err
        == f"mirrorapi cache stats: error: cache database not found: {tmp_path / 'none.sqlite'}\n"
    )
    assert main(["cache", "import", str(tmp_path / "nowhere"), "--cache", str(tmp_path / "c.sqlite")]) == 2
    assert "StableToolBench cache folder not found" in capsys.readouterr().err
    assert not (tmp_path / "c.sqlite").exists()  # a mistyped source leaves no new database behind
    for url in ("postgresql://postgres@127.0.0.1:5/postgres?foo=bar", "postgres://%zz@127.0.0.1/x"):
        assert main(["cache", "stats", "--cache", url]) == 2  # psycopg cannot parse it: never connected
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(
            "mirrorapi cache stats: error: cache_url is not a PostgreSQL URL"
        )
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        json.dumps(
            {"source": "s", "episode": "e", "step": 0, "category": "Data", "tool_name": "t", "api_name": "a"}
            | {"tool_input": {"q": 1}, "response": {"error": "", "response": "ok"}}
        )
        + "\n"
    )
    assert main(["cache", "import", str(pairs), "--cache", str(tmp_path / "c.sqlite")]) == 0
    (tmp_path / "a-file").write_text("")
    capsys.readouterr()
    assert main(["cache", "export", str(tmp_path / "a-file"), "--cache", str(tmp_path / "c.sqlite")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write export folder" in err
    # SQLAlchemy's spelling of a PostgreSQL URL once made a SQLite file named after it
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["cache", "import", str(pairs), "--cache", "postgresql+psycopg://postgres@127.0.0.1:5/x"]) == 2
    assert "is neither a postgresql:// URL nor a SQLite path" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # A file that is no cache folder, flags a pairs file ignored, and a JSONL file of something else (labelled
    # answers): each one line (the file was "not found", the flags silently ignored, and exit 0 for nothing read).
    judge = Path(__file__).resolve().parents[2] / "data" / "samples" / "judge.jsonl"
    for argv, says in (
        ([str(tmp_path / "a-file")], "is a file: give a StableToolBench cache folder or a pairs .jsonl file"),
        ([str(pairs), "--origin", "mine"], "--origin and --force are for a StableToolBench cache folder"),
        ([str(judge)], "nothing read, "),
    ):
        assert main(["cache", "import", *argv, "--cache", str(tmp_path / "c.sqlite")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    # A folder of nothing it could read (StableToolBench's answer files: no cache folder) failed, and then the same
    # command said "imported before and unchanged, nothing done" and exit 0: the failed import was recorded.
    answers = Path(__file__).resolve().parents[2] / "data" / "samples" / "stabletoolbench" / "data_example"
    for _ in range(2):
        assert main(["cache", "import", str(answers), "--cache", str(tmp_path / "c.sqlite")]) == 2
        assert "nothing read, " in capsys.readouterr().err


def test_recorded_outages_are_not_imported_and_the_call_is_simulated(
    serve, agent, samples, sample_tools, tmp_path, capsys
):
    """Real pairs as recorded: a call the API refused for want of a key (RapidAPI's 401 body), one whose executor
    never reached the API (requests' "Exceeded 30 redirects"), an error the API itself answered, and a success.
    The two outages are not stored, so the server simulates those calls (StableToolBench's server caches no such
    real answer either); the API's own error and the success are answered as recorded, without the engine."""
    pairs = [json.loads(line) for line in (samples / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]

    def recorded(api: str, **arguments) -> dict:
        return next(
            p for p in pairs if p["api_name"] == api and all(p["tool_input"].get(k) == v for k, v in arguments.items())
        )

    outages = [recorded("latest_news"), recorded("get_track_info", track_number="RB413450335SG")]
    assert outages[0]["response"]["response"] == '{"status":"401","msg":"Authentication required"}'
    assert outages[1]["response"]["error"].endswith("Exceeded 30 redirects.")
    api_error = recorded("ModifyScene", name="Zorblax")
    assert api_error["response"] == {"error": "The scene does not exist.", "response": ""}
    success = next(
        p
        for p in pairs
        if p["source"] == "toolbench-example"
        and p["api_name"] == "search"
        and p is not outages[0]
        and '"status":"401"' not in p["response"]["response"]
        and not p["response"]["error"]
    )
    chosen = tmp_path / "pairs.jsonl"
    chosen.write_text("".join(json.dumps(p) + "\n" for p in [*outages, api_error, success]), encoding="utf-8")

    db = str(tmp_path / "cache.sqlite")
    assert main(["cache", "import", str(chosen), "--cache", db, "--tools", str(sample_tools)]) == 0
    assert "2 entries read, 2 stored, 0 unreadable" in (printed := capsys.readouterr().out)
    assert "2 transport failures skipped (auth 1, unavailable 1)" in printed

    def body(pair: dict) -> dict:
        return agent(pair["category"], pair["tool_name"], pair["api_name"], pair["tool_input"])

    with StubEngine(model="stub") as engine, serve(api_base=[engine.url], model="stub", cache_path=db) as server:
        answers = [server.virtual(body(pair)).json() for pair in [*outages, api_error, success]]
    assert answers[:2] == [STUB_OBSERVATION, STUB_OBSERVATION] and engine.requests == 2
    assert answers[2] == api_error["response"]
    assert answers[3]["error"] == "" and answers[3]["response"] == success["response"]["response"]
