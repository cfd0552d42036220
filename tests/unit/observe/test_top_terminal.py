"""`sparkcluster top` full-screen in a real terminal (tmux): it draws the endpoint's figures from a /metrics
server on loopback (serving two real vLLM captures in turn, so the interval has tokens), keeps drawing when the
server goes away (the endpoint shown as not answering), and Ctrl-C ends it with exit 0 and no traceback. About
5 s; skipped where tmux is not installed."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parents[2] / "fixtures" / "metrics"
CAPTURE = (FIXTURES / "vllm-0.32-cpu-busy2.txt").read_text()
GENERATED = 'vllm:generation_tokens_total{engine="0",model_name="local/tiny-llama"} 1675.0'
ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Metrics(http.server.BaseHTTPRequestHandler):
    """The real capture, its generation counter 100 tokens further at each scrape (a server generating)."""

    served = 0

    def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
        assert GENERATED in CAPTURE
        body = CAPTURE.replace(GENERATED, GENERATED.replace("1675.0", f"{1675 + 100 * Metrics.served}.0")).encode()
        Metrics.served += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", "-L", "sparkcluster-top-test", *args], capture_output=True, text=True,
                          check=True).stdout


def pane_until(text: str, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", "top")
        if text in screen:
            return screen
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared; the pane shows:\n{screen}")


def test_the_live_view_in_a_real_terminal(tmp_path: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    done = tmp_path / "exit"
    # COLUMNS/LINES from a parent would override the terminal's real size.
    command = (f"cd {ROOT} && unset COLUMNS LINES && {sys.executable} -m sparkcluster top --url http://127.0.0.1:{port}/v1 --interval 0.5 "
               f"2> {tmp_path}/stderr; echo $? > {done}; sleep 30")
    tmux("new-session", "-d", "-s", "top", "-x", "150", "-y", "24", command)
    try:
        screen = pane_until("(last 0.5 s")  # the second sample: rates over the interval
        assert "running" in screen and "KV cache" in screen and "TTFT p50 / p90" in screen and "gen tok/s" in screen
        row = next(line for line in screen.splitlines() if line.startswith("│ 8 "))  # 8 requests running
        gen = float(row.split("│")[6].replace(",", ""))
        assert 100 < gen < 220  # 100 tokens a scrape, one scrape each 0.5 s or a little more
        print(screen)  # the pane, as a user sees it (pytest -s shows it)
        server.shutdown()
        server.server_close()
        pane_until("did not answer")  # the server went away: shown, and the view goes on
        tmux("send-keys", "-t", "top", "C-c")
        deadline = time.monotonic() + 10
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.read_text().strip() == "0"
        assert "Traceback" not in (tmp_path / "stderr").read_text()
    finally:
        subprocess.run(["tmux", "-L", "sparkcluster-top-test", "kill-server"], capture_output=True)
