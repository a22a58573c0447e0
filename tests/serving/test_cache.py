"""The cache store, on a real SQLite file and on a real PostgreSQL database (`cache_location` runs a test on
each): keys, provenance, hits, concurrency, crashes, StableToolBench import/export."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from harness.processes import poll_until
from mirrorapi.records import canonical_json, parse_repr_key
from mirrorapi.serving.cache import (
    CacheError,
    ResponseCache,
    export_stabletoolbench_cache,
    import_pairs,
    import_stabletoolbench_cache,
    is_url,
    open_cache,
)
from mirrorapi.tools import ToolRegistry

API = ("APIBank", "apibank_agenda", "addagenda")


def test_entry_keys_provenance_created_and_hits(cache_location):
    cache = open_cache(cache_location)
    before = time.time()
    assert cache.put(*API, canonical_json({"b": 2, "a": "x"}), "", {"ok": True}, "real")
    # StableToolBench's Python-repr key of the same call, in another order, maps to the same entry.
    key = canonical_json(parse_repr_key("{'a': 'x', 'b': 2}"))
    observation, provenance = cache.get(*API, key)
    assert json.loads(observation) == {"error": "", "response": {"ok": True}} and provenance == "real"
    assert cache.get(*API, canonical_json({"a": "x", "b": "2"})) is None  # types are part of the call
    cache.get(*API, key)
    cache.close()
    cache = open_cache(cache_location)
    [entry] = list(cache.rows())
    assert entry.provenance == "real" and before <= entry.created <= time.time() and entry.hits == 2


def test_a_write_that_cannot_be_encoded_fails_alone_as_a_cache_error(cache_location):
    """A FAULT no path of ours makes any more (a CoT rationale kept a lone surrogate): the store says CacheError,
    which the server answers past, and another request's write of the same loop turn is stored. It was a
    UnicodeEncodeError (an internal error) on PostgreSQL, and on SQLite the failure of every write of its turn."""
    import asyncio
    import dataclasses

    from mirrorapi.serving.cache import Call, new_entry

    cache = open_cache(cache_location)
    good = new_entry(*API, {"n": 1}, "", "fine", "simulated:m", time.time())
    bad = dataclasses.replace(new_entry(*API, {"n": 2}, "", "fine", "simulated:m", time.time()), rationale="\ud83d")

    async def turn():
        outcomes = await asyncio.gather(cache.store(bad), cache.store(good), return_exceptions=True)
        found = await cache.lookup(Call(*API, canonical_json({"n": 1})), "m")
        await cache.aclose()
        return outcomes, found

    outcomes, found = asyncio.run(turn())
    assert isinstance(outcomes[0], CacheError) and outcomes[1] is True
    assert found is not None and json.loads(found[0])["response"] == "fine"


def test_recorded_answers_win_over_simulated_ones(cache_location):
    cache = open_cache(cache_location)
    assert cache.put(*API, "{}", "", "made up", "simulated:m@mirrorapi-v1")
    assert cache.put(*API, "{}", "", "recorded", "imported:tool_response_cache")  # replaces the simulation
    assert not cache.put(*API, "{}", "", "made up again", "simulated:m@mirrorapi-v1")
    assert not cache.put(*API, "{}", "", "other recording", "real")  # the first recording stays
    assert cache.get(*API, "{}") == ('{"error":"","response":"recorded"}', "imported:tool_response_cache")


def test_database_is_wal_and_a_file_that_is_not_one_is_a_clear_error(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    assert cache._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    cache.close()
    (tmp_path / "junk.sqlite").write_bytes(b"this is not a database" * 100)
    with pytest.raises(CacheError, match="cannot open cache database .*junk.sqlite: file is not a database"):
        ResponseCache(tmp_path / "junk.sqlite")


def test_64_concurrent_writers_on_one_api_lose_nothing(cache_location):
    path = cache_location
    open_cache(path).close()
    start = threading.Barrier(64)
    failures = []

    def write(i: int) -> None:
        cache = open_cache(path)  # one connection each, like separate workers or processes
        try:
            start.wait()
            cache.put(*API, canonical_json({"i": i}), "", f"answer {i}", "simulated:m@mirrorapi-v1")
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            failures.append(exc)
        finally:
            cache.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    cache = open_cache(path)
    assert cache.count() == 64
    assert all(cache.get(*API, canonical_json({"i": i}), "m@mirrorapi-v1") for i in range(64))


WRITER = r"""
import sys
from mirrorapi.serving.cache import open_cache
from mirrorapi.records import canonical_json
cache = open_cache(sys.argv[1])
i = 0
while True:
    key = canonical_json({"i": i, "pad": "x" * 2000})
    cache.put("APIBank", "apibank_agenda", "addagenda", key, "", "r" * 3000, "real")
    print(i, flush=True)  # printed only once the entry is committed
    i += 1
"""


def test_process_killed_mid_write_leaves_every_committed_entry(cache_location):
    path = cache_location
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    lines: list[str] = []  # what the writer printed: read by a thread, so that every wait here has a deadline

    def read() -> None:
        for line in writer.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def enough_committed() -> bool | None:
        if writer.poll() is not None:
            raise AssertionError(f"the writer exited ({writer.returncode}) after {len(lines)} entries")
        return True if len(lines) >= 300 else None

    try:
        poll_until(enough_committed, timeout=60, what="300 entries committed by the writer", interval=0.05)
        writer.send_signal(signal.SIGKILL)  # while it is writing the next entries
        reader.join(10)  # its output ends with it: the reader reads what it printed before the kill, then stops
        assert not reader.is_alive(), "the writer's output did not end within 10 s of its kill"
    finally:
        writer.kill()
        writer.wait(10)
    committed = [int(line) for line in lines]
    assert writer.returncode == -signal.SIGKILL
    if not is_url(path):
        assert os.path.exists(str(path) + "-wal")  # the committed entries may live only in the WAL
    cache = open_cache(path)
    if not is_url(path):
        assert cache._db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    stored = {json.loads(a)["i"] for _, _, _, a, _, _ in cache.entries()}
    assert set(committed) <= stored and len(stored) - len(committed) <= 1


# ------------------------------------------------------------------------ StableToolBench folders
def test_import_export_round_trip(stb_cache, sample_tools, cache_location, tmp_path):
    folder, written = stb_cache
    cache = open_cache(cache_location)
    report = import_stabletoolbench_cache(cache, folder, registry=ToolRegistry.load([sample_tools]))
    # What StableToolBench's files hold, keyed the canonical way (the first of equal calls wins).
    expected = {}
    for (category, tool, api, key), observation in written.items():
        expected.setdefault((category, tool, api, canonical_json(parse_repr_key(key))), observation)
    assert report["entries"] == len(written) and report["stored"] == len(expected)
    assert report["unreadable"] == [] and report["unresolved_apis"] == 0
    assert cache.count() == len(expected)
    assert {p for p in cache.stats()["by_provenance"]} == {"imported:tool_response_cache"}

    out = tmp_path / "export"
    assert export_stabletoolbench_cache(cache, out)["entries"] == len(expected)
    exported = {}
    for path in out.glob("*/*/*.json"):
        category, tool_dir = path.parent.parent.name, path.parent.name
        assert tool_dir.endswith("_for_" + category)
        for key, observation in json.loads(path.read_text()).items():
            exported[
                (category, tool_dir[: -len("_for_" + category)], path.stem, canonical_json(parse_repr_key(key)))
            ] = observation
    # Registry names are the folder names here (all APIs resolve), so the layout round-trips exactly.
    assert {k: json.dumps(v, sort_keys=True) for k, v in exported.items()} == {
        k: json.dumps(v, sort_keys=True) for k, v in expected.items()
    }


def test_an_exported_file_keeps_the_order_of_the_file_imported(stb_cache, sample_tools, cache_location, tmp_path):
    """StableToolBench's GPT server shows the first entries of an API's file as its examples (server/main.py:
    `list(cache.items())[:example_num]`): an import and export gave the keys sorted, other examples to it."""
    folder, _ = stb_cache
    cache = open_cache(cache_location)
    import_stabletoolbench_cache(cache, folder, registry=ToolRegistry.load([sample_tools]))
    export_stabletoolbench_cache(cache, tmp_path / "export")
    reordered = compared = 0
    for path in folder.glob("*/*/*.json"):
        calls = {}  # the file's calls in its order, the first of equal calls kept (as the import keeps it)
        for key in json.loads(path.read_text()):
            calls.setdefault(canonical_json(parse_repr_key(key)), None)
        exported = tmp_path / "export" / path.relative_to(folder)
        keys = [canonical_json(parse_repr_key(key)) for key in json.loads(exported.read_text())]
        assert keys == list(calls), path
        reordered += keys != sorted(keys)
        compared += 1
    assert compared > 50 and reordered > 5  # files whose order is not the sorted one


def test_import_happens_once_per_unchanged_folder(stb_cache, cache_location, tmp_path):
    folder, _ = stb_cache
    copy = tmp_path / "tool_response_cache"
    for path in folder.glob("*/*/*.json"):
        target = copy / path.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    cache = open_cache(cache_location)
    first = import_stabletoolbench_cache(cache, copy)
    assert not first["skipped"] and first["stored"] > 0
    assert import_stabletoolbench_cache(cache, copy)["skipped"]
    # A new file (StableToolBench kept writing) makes the folder new: its entries come in, nothing doubles.
    new = copy / "Data" / "web_search_for_Data" / "websearch.json"
    new.parent.mkdir(parents=True, exist_ok=True)
    new.write_text(
        json.dumps(
            {
                "{'q': 'x'}": {"error": "", "response": "found"},
                "{'q': 'y'}": {"error": "Failed to generate fake response", "response": ""},
            }
        )
    )
    again = import_stabletoolbench_cache(cache, copy)
    assert not again["skipped"] and again["stored"] == 1 and again["skipped_placeholders"] == 1
    assert cache.count() == first["stored"] + 1
    # A category that is a link to a folder elsewhere is read through the link, and its changes seen too.
    elsewhere = tmp_path / "elsewhere" / "Linked"
    (elsewhere / "stocks_for_Linked").mkdir(parents=True)
    (copy / "Linked").symlink_to(elsewhere, target_is_directory=True)
    linked = elsewhere / "stocks_for_Linked" / "quote.json"
    linked.write_text(json.dumps({"{'s': 'A'}": {"error": "", "response": 1}}))
    assert import_stabletoolbench_cache(cache, copy)["stored"] == 1
    linked.write_text(
        json.dumps({"{'s': 'A'}": {"error": "", "response": 1}, "{'s': 'B'}": {"error": "", "response": 2}})
    )
    assert import_stabletoolbench_cache(cache, copy)["stored"] == 1  # was skipped as unchanged


def test_unreadable_files_are_reported_and_skipped(cache_location, tmp_path):
    folder = tmp_path / "cache_folder" / "Data" / "theclique_for_Data"
    folder.mkdir(parents=True)
    (folder / "broken.json").write_text('{"{\'a\': 1}": {"error": "", "resp')
    (folder / "transfermarkt_search.json").write_text(
        json.dumps({"{'name': 'messi'}": {"error": "", "response": "ok"}})
    )
    cache = open_cache(cache_location)
    report = import_stabletoolbench_cache(cache, tmp_path / "cache_folder")
    assert report["stored"] == 1 and len(report["unreadable"]) == 1 and "broken" in report["unreadable"][0]
    with pytest.raises(CacheError, match="not found"):
        import_stabletoolbench_cache(cache, tmp_path / "nowhere")


def test_lone_surrogates_in_a_stabletoolbench_cache_file_neither_stop_the_import_nor_reach_the_store(
    cache_location, tmp_path
):
    # StableToolBench's server json.loads an agent's tool_input (which accepts "\\ud83d", half an emoji's escape
    # pair) and saves the cache as {str(arguments): observation} with json.dump: such a key and such an answer.
    folder = tmp_path / "cache_folder" / "Data" / "theclique_for_Data"
    folder.mkdir(parents=True)
    entries = {
        str(json.loads('{"name": "Messi \\ud83d"}')): {"error": "", "response": "never asked"},
        str({"name": "Pele"}): {"error": "", "response": json.loads('"Pele \\ud83d"')},
        str({"name": "ok"}): {"error": "", "response": "fine"},
        "{1: 'a'}": {"error": "", "response": "not a call"},
    }
    (folder / "transfermarkt_search.json").write_text(json.dumps(entries, indent=4))
    cache = open_cache(cache_location)
    report = import_stabletoolbench_cache(cache, tmp_path / "cache_folder")
    assert report["stored"] == 2 and len(report["unreadable"]) == 2
    assert any("lone surrogate" in line for line in report["unreadable"])
    # each named by its file as it is in the folder (was `Data/theclique/transfermarkt_search`, no such file)
    assert all(line.startswith("Data/theclique_for_Data/transfermarkt_search.json: ") for line in report["unreadable"])
    stored = {json.loads(args)["name"]: json.loads(obs) for _, _, _, args, obs, _ in cache.entries()}
    assert stored == {"Pele": {"error": "", "response": "Pele \ufffd"}, "ok": {"error": "", "response": "fine"}}


def test_odd_keys_of_a_stabletoolbench_cache_file_are_reported_and_the_rest_imported(tmp_path):
    """A key whose literal JSON cannot hold (a set, bytes, mixed keys deeper in it) or nested past the recursion
    limit once stopped the import (and the server's start) with a traceback. Keys of arguments JSON gave as 1e400
    or NaN are what upstream writes (`str(json.loads(...))`: `inf`, `nan`) and are imported as those numbers."""
    folder = tmp_path / "cache_folder" / "Data" / "theclique_for_Data"
    folder.mkdir(parents=True)
    overflow = json.loads('{"name": "x", "limit": 1e400, "score": NaN}')
    entries = {
        "{'q': {1, 2}}": {"error": "", "response": "a set"},
        "{'q': b'x'}": {"error": "", "response": "bytes"},
        "{'q': {1: 'a', 'b': 2}}": {"error": "", "response": "mixed keys"},
        '{"q": ' + "[" * 50_000: {"error": "", "response": "deep"},
        str(overflow): {"error": "", "response": "non-finite"},
        str({"name": "ok"}): {"error": "", "response": "fine"},
    }
    (folder / "transfermarkt_search.json").write_text(json.dumps(entries))
    cache = ResponseCache(tmp_path / "c.sqlite")
    report = import_stabletoolbench_cache(cache, tmp_path / "cache_folder")
    assert report["stored"] == 2 and len(report["unreadable"]) == 4
    # the call a server gets with those arguments (json.loads of its tool_input) is the imported one
    assert cache.get("Data", "theclique", "transfermarkt_search", canonical_json(overflow)) is not None


def test_a_nul_in_an_error_is_stored_by_either_store_and_served_as_recorded(cache_location, tmp_path):
    # An API's error text holding a NUL: SQLite's text holds it, PostgreSQL's cannot. The import failed there on
    # that row, every time (with a traceback), and took the rows of its batch with it.
    pairs = tmp_path / "pairs.jsonl"
    recorded = [("bad\u0000byte", ""), ("", "fine")]
    pairs.write_text(
        "".join(
            json.dumps(
                {"source": "s", "episode": "e", "step": step, "category": "Data", "tool_name": "theclique"}
                | {"api_name": "transfermarkt_search", "tool_input": {"name": f"player {step}"}}
                | {"response": {"error": error, "response": response}}
            )
            + "\n"
            for step, (error, response) in enumerate(recorded)
        )
    )
    cache = open_cache(cache_location)
    assert import_pairs(cache, pairs)["stored"] == 2
    for step, (error, response) in enumerate(recorded):
        observation, _ = cache.get(
            "Data", "theclique", "transfermarkt_search", canonical_json({"name": f"player {step}"})
        )
        assert json.loads(observation) == {"error": error, "response": response}
    cache.close()


def test_keys_of_one_call_in_two_argument_orders_are_one_entry_and_the_import_says_so(tmp_path):
    # StableToolBench's server keys its cache by `str(arguments)` as sent, so one folder may hold the same call
    # twice, in two orders; the cache key is canonical, so they are one entry here (the first read, written back).
    folder = tmp_path / "cache_folder" / "Data" / "theclique_for_Data"
    folder.mkdir(parents=True)
    entries = {
        str({"b": 2, "a": 1}): {"error": "", "response": "first"},
        str({"a": 1, "b": 2}): {"error": "", "response": "second"},
    }
    (folder / "transfermarkt_search.json").write_text(json.dumps(entries, indent=4))
    cache = ResponseCache(tmp_path / "c.sqlite")
    report = import_stabletoolbench_cache(cache, tmp_path / "cache_folder")
    assert (report["entries"], report["stored"], report["argument_orders_merged"]) == (2, 1, 1)
    cache.close()


def test_health_counts_are_the_stores_counts(tmp_path):
    """/health's three counts (entries, open sessions, answers under a session history), which SQLite counts on a
    connection of their own in a thread (a large file's scans held the server's loop back)."""
    import asyncio

    from mirrorapi.serving.cache import new_entry
    from mirrorapi.serving.sessions import advance

    cache = open_cache(tmp_path / "c.sqlite")
    now = time.time()

    async def fill_and_count():
        await cache.store(new_entry(*API, {"n": 1}, "", "alone", "simulated:m", now))
        for n, history in ((2, "digest-a"), (3, "digest-b")):
            await cache.store(new_entry(*API, {"n": n}, "", "in a session", "simulated:m", now, history, 1))
        for session in ("s1", "s2"):
            await cache.update_session(session, 3600, advance(8, 4096, "login() -> token"))
        counts = await cache.health_counts(3600)
        await cache.aclose()
        return counts

    assert asyncio.run(fill_and_count()) == (3, 2, 2)
