"""What a round reads, as data: token progress while requests run (the wedge /health cannot see), and the probe
judged against a real HTTP server on loopback by the usage's count, never the text."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from sparkcluster.supervise.policy import ProbeResult
from sparkcluster.supervise.watch import Progress, probe


def test_a_count_that_stands_still_while_requests_run_is_a_stall_and_an_idle_one_is_not():
    progress = Progress()
    assert not progress.stalled("vLLM", 0, 100, 0, 60)  # idle for ten minutes: nothing to say
    assert not progress.stalled("vLLM", 0, 100, 600, 60)
    assert not progress.stalled("vLLM", 1, 100, 615, 60)  # a request begins: its clock starts now, not at 0
    assert not progress.stalled("vLLM", 1, 100, 660, 60)
    assert progress.stalled("vLLM", 1, 100, 675, 60)  # 60 s running, no token
    assert not progress.stalled("vLLM", 1, 101, 690, 60) and progress.advancing("vLLM")
    assert not progress.stalled("vLLM", 1, 101, 700, 60) and not progress.advancing("vLLM")


@pytest.fixture
def engine() -> Iterator[tuple[str, dict]]:
    """An endpoint whose answer to /v1/completions the test sets."""
    answer: dict = {"status": 200, "body": {}}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps(answer["body"]).encode()
            self.send_response(answer["status"])
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", answer
    finally:
        server.shutdown()


def test_the_probe_counts_tokens_never_text_and_a_refused_key_is_its_own_result(engine):
    url, answer = engine
    # A reasoning model's first token may be no text at all (NVIDIA/NemoClaw#9736): one token counted is alive.
    answer["body"] = {"choices": [{"text": ""}], "usage": {"completion_tokens": 1}}
    assert probe(url, "m", None, 5) is ProbeResult.OK
    answer["body"] = {"choices": [{"text": "hello"}], "usage": {"completion_tokens": 0}}
    assert probe(url, "m", None, 5) is ProbeResult.FAILED
    answer["body"] = {"choices": [{"text": "hello"}]}
    assert probe(url, "m", None, 5) is ProbeResult.FAILED
    for status, result in ((401, ProbeResult.UNAUTHORIZED), (403, ProbeResult.UNAUTHORIZED),
                           (429, ProbeResult.BUSY), (503, ProbeResult.BUSY), (500, ProbeResult.FAILED)):
        answer["status"] = status
        assert probe(url, "m", "sk-x", 5) is result
    assert probe("http://127.0.0.1:9", "m", None, 2) is ProbeResult.TIMED_OUT  # nothing answered
