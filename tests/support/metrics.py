"""vLLM /metrics captures and a server on loopback that serves them, for top's and serve's replica tests."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "metrics"
CAPTURES = [(FIXTURES / name).read_text() for name in ("vllm-0.32-cpu-busy.txt", "vllm-0.32-cpu-busy2.txt")]
RUNNING = 'vllm:num_requests_running{engine="0",model_name="local/tiny-llama"} 8.0'
WAITING = 'vllm:num_requests_waiting{engine="0",model_name="local/tiny-llama"} 0.0'
PREEMPTED = 'vllm:num_preemptions_total{engine="0",model_name="local/tiny-llama"} 0.0'


def busier(text: str) -> str:
    """The second replica: 3 running, 2 waiting, 4 preemptions, in vLLM's own lines."""
    assert all(exact in text for exact in (RUNNING, WAITING, PREEMPTED))
    return (text.replace(RUNNING, RUNNING.replace("8.0", "3.0")).replace(WAITING, WAITING.replace("0.0", "2.0"))
            .replace(PREEMPTED, PREEMPTED.replace("0.0", "4.0")))


@contextmanager
def metrics_server(captures: list[str]) -> Iterator[tuple[str, http.server.ThreadingHTTPServer]]:
    """A /metrics server on loopback answering the captures in turn (the last one from then on)."""
    served = [0]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            body = captures[min(served[0], len(captures) - 1)].encode()
            served[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", server
    finally:
        server.shutdown()
        server.server_close()
