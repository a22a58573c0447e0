"""The request log (`RequestLogWriter`): one JSON line per /virtual request, whatever the names hold."""

import json

from mirrorapi.serving.answer import Answer
from mirrorapi.serving.config import ServerSettings
from mirrorapi.serving.observability import RequestLogWriter

# Names as a client may send them (a failure logs them as sent): quotes, backslashes, control characters, non-ASCII.
NAMES = ('Da"ta', "the\\clique", "transfer\nmarkt \u00e9\u4e2d\U0001f600\x00")


def written_lines(tmp_path, answers: list[Answer]) -> list[dict]:
    writer = RequestLogWriter(
        ServerSettings(tools_folder=[tmp_path], log_file=tmp_path / "requests.jsonl", log_level="warning")
    )
    for answer in answers:
        writer.record(answer)
    writer.close()
    return [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text(encoding="utf-8").splitlines()]


def test_every_line_is_json_with_the_names_as_sent(tmp_path):
    hit = Answer(
        200, b"", "hit", names=NAMES, provenance='imported:"odd" \\ folder', cache="hit", stages={"total": 0.0000123}
    )
    failed = Answer(422, b"", "invalid_body", detail="body: Field required", stages={"total": 0.00002})
    simulated = Answer(
        200,
        b"",
        "simulated",
        names=NAMES,
        provenance="simulated:m@f",
        cache="miss",
        coalesced=True,
        session="s\u00e9ssion",
        detail="",
        rationale='because\n"so"',
        parsed="fenced",
        extra_fields=["unexpected_field"],
        stages={"total": 0.0512, "engine": 0.0501},
    )
    hit_line, failed_line, simulated_line = written_lines(tmp_path, [hit, failed, simulated])

    assert hit_line["api"] == "/".join(NAMES) and hit_line["provenance"] == 'imported:"odd" \\ folder'
    assert (hit_line["outcome"], hit_line["status"], hit_line["ms"]) == ("hit", 200, 0.012)
    assert set(hit_line) == {"time", "outcome", "status", "api", "provenance", "ms"}

    assert (failed_line["api"], failed_line["provenance"], failed_line["status"]) == (None, None, 422)
    assert failed_line["detail"] == "body: Field required"

    assert simulated_line["engine_ms"] == 50.1 and simulated_line["coalesced"] is True
    assert simulated_line["parsed"] == "fenced" and simulated_line["extra_fields"] == ["unexpected_field"]
    assert simulated_line["session"] == "s\u00e9ssion" and simulated_line["rationale"] == 'because\n"so"'
    assert simulated_line["ms"] == 51.2


def test_a_lone_surrogate_in_a_rationale_is_written_as_its_escape(tmp_path):
    # A CoT model's rationale holding half an emoji's escape pair: UTF-8 cannot encode it, and the whole batch of
    # lines was lost with it.
    simulated = Answer(200, b"", "simulated", names=NAMES, rationale="Messi \ud83d", stages={"total": 0.01})
    hit = Answer(200, b"", "hit", names=NAMES, stages={"total": 0.001})
    lines = written_lines(tmp_path, [simulated, hit])
    assert [line["outcome"] for line in lines] == ["simulated", "hit"]
    assert lines[0]["rationale"] == "Messi \ud83d"


def test_the_outcome_headers_carry_any_provenance_as_ascii():
    # A provenance names the model's folder, which may hold any character; a header value is visible ASCII.
    from urllib.parse import unquote

    from mirrorapi.serving.app import answer_headers

    provenance = "simulated:/home/\u00e9l\u00e8ve/mod\u00e8le 100%@mirrorapi-v2,temperature=0"
    (outcome_name, outcome), (provenance_name, encoded) = answer_headers("simulated", provenance)
    assert (outcome_name, outcome, provenance_name) == (
        b"x-mirrorapi-outcome",
        b"simulated",
        b"x-mirrorapi-provenance",
    )
    assert encoded.isascii() and all(0x20 <= c < 0x7F for c in encoded)
    assert unquote(encoded.decode("ascii")) == provenance
    assert answer_headers("validation_error", None) == [(b"x-mirrorapi-outcome", b"validation_error")]


def test_sighup_opens_the_log_file_again_after_it_was_moved(tmp_path, sample_tools):
    """logrotate moves the log and sends SIGHUP (its `postrotate`): the server stopped at once (uvicorn handles only
    SIGINT and SIGTERM), or, without the signal, went on writing to the moved file. It opens the file again by name
    and serves on (audit of 2026-12-01)."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import httpx

    from harness.processes import free_port, poll_until, stop, wait_until_ready

    repo = Path(__file__).resolve().parents[2]
    log, port = tmp_path / "requests.jsonl", free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "serving/main_mirrorapi.py", "--tools-folder", str(sample_tools), "--mode", "replay",
        "--cache-path", str(tmp_path / "c.sqlite"), "--port", str(port), "--log-file", str(log),
    ]  # fmt: skip
    with open(tmp_path / "server.out", "wb") as out:
        process = subprocess.Popen(command, cwd=repo, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until_ready(url + "/live", 120, process=process, log_path=tmp_path / "server.out")
        body = {"category": "Data", "tool_name": "theclique", "api_name": "transfermarkt_search", "tool_input": "{}"}
        httpx.post(url + "/virtual", json=body, timeout=30)
        poll_until(lambda: log.exists() and log.read_text().count("\n") == 1 or None, 10, "no first line")
        log.rename(tmp_path / "requests.jsonl.1")
        process.send_signal(signal.SIGHUP)
        poll_until(lambda: log.exists() or None, 10, "the log was not opened again")
        httpx.post(url + "/virtual", json=body, timeout=30)
        poll_until(lambda: log.read_text().count("\n") == 1 or None, 10, "no line in the new file")
        assert process.poll() is None  # still serving
    finally:
        stop(process)
    assert (tmp_path / "requests.jsonl.1").read_text().count("\n") == 1


def test_every_outcome_the_server_gives_is_declared_and_documented():
    """The outcomes a request is counted under are declared once (`answer.OUTCOMES`): each one the server's code
    gives (a refusal before a handler, a failure, an answer) is there, and docs/serving.md's metrics paragraph names
    each (`shutting_down` was counted but named by neither the metrics' help nor the docs)."""
    import re
    from pathlib import Path

    from mirrorapi.serving.answer import OUTCOMES

    serving = Path(__file__).resolve().parents[2] / "mirrorapi" / "serving"
    given = set()
    for source in serving.rglob("*.py"):
        text = source.read_text(encoding="utf-8")
        given |= set(re.findall(r"(?:refused|_refuse)\(\s*[^,()]+,\s*\"([a-z_]+)\"", text))
        given |= set(re.findall(r"Failure\(\s*\d+,\s*\"([a-z_]+)\"", text))
        given |= set(re.findall(r"Failure\(\s*\d+,\s*\n\s*\"([a-z_]+)\"", text))
        given |= set(re.findall(r"answer\.outcome = (?:\(\"[a-z]+\", )?\"([a-z_]+)\"", text))
    assert {"shutting_down", "headers_too_large", "invalid_body", "engine_error", "hit"} <= given
    assert given - set(OUTCOMES) == set()
    docs = (serving.parents[1] / "docs" / "serving.md").read_text(encoding="utf-8")
    paragraph = docs[docs.index("`mirrorapi_requests_total{outcome}`") :][:2500]
    assert [name for name in OUTCOMES if name not in paragraph] == []
