"""harness.processes on real child processes and a real HTTP server on 127.0.0.1: the readiness poll
and the stop that escalates when a child ignores the polite signals (issue 15)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from harness.processes import AT_ONCE, ProcessExited, stop, wait_until_ready

# A child that says it is ready once its signal handlers are set, then sleeps. SIGINT and SIGTERM start at
# their default action: a child of a shell job started in the background inherits SIGINT ignored.
IGNORING = """
import signal, sys, time
for name in ("SIGINT", "SIGTERM"):
    signal.signal(getattr(signal, name), signal.SIG_DFL)
for name in sys.argv[1:]:
    signal.signal(getattr(signal, name), signal.SIG_IGN)
print("ready", flush=True)
time.sleep(60)
"""


def child(*ignored: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", IGNORING, *ignored], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout.readline() == "ready\n"
    return process


@pytest.mark.parametrize(
    "ignored, signal_name", [((), "SIGINT"), (("SIGINT",), "SIGTERM"), (("SIGINT", "SIGTERM"), "SIGKILL")]
)
def test_stop_escalates_until_the_child_is_gone(ignored, signal_name):
    process = child(*ignored)
    start = time.monotonic()
    stop(process, grace=0.5)
    assert process.returncode is not None
    # a negative return code names the signal that ended it
    assert -process.returncode == getattr(__import__("signal"), signal_name)
    assert time.monotonic() - start < 0.5 * len(ignored) + 2


def test_a_child_with_nothing_to_save_is_sent_sigterm_first():
    process = child()  # SIGINT would end it too, with another return code
    stop(process, grace=0.5, signals=AT_ONCE)
    assert -process.returncode == __import__("signal").SIGTERM


class Answers(BaseHTTPRequestHandler):
    status = 503  # changed by the tests

    def do_GET(self):
        body = b'{"ok": true}' if self.status == 200 else b'{"detail": "no"}'
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_ready_once_it_answers_2xx_and_5xx_is_waited_out(http_server):
    url = f"http://127.0.0.1:{http_server.server_address[1]}/health"
    Answers.status = 503
    threading.Timer(0.5, lambda: setattr(Answers, "status", 200)).start()
    assert wait_until_ready(url, 10, interval=0.05) == {"ok": True}


def test_a_4xx_fails_at_once_and_silence_times_out(http_server):
    url = f"http://127.0.0.1:{http_server.server_address[1]}/health"
    Answers.status = 404
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="HTTP 404"):
        wait_until_ready(url, 10)
    assert time.monotonic() - start < 2
    Answers.status = 503
    with pytest.raises(TimeoutError, match="HTTP 503"):
        wait_until_ready(url, 0.5, interval=0.1)


def test_a_child_that_exits_first_is_reported_with_its_log(tmp_path):
    log = tmp_path / "child.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-c", "print('bad config'); raise SystemExit(3)"], stdout=out)
    with pytest.raises(ProcessExited, match=r"(?s)status 3.*bad config"):
        wait_until_ready("http://127.0.0.1:9/never", 30, process=process, log_path=log)
