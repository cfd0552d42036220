"""A node's exporter: a small HTTP server (standard library only) that renders the node's readings on each
scrape (collect.py). `/metrics` is the node's, `/supervisor` the supervisor's files (on the head). One scrape at a
time: a second waits for the first, so a scraper retrying never runs two nvidia-smi at once.

    python3 -m sparkcluster.monitor.exporter --listen 10.0.0.11 --port 9839
    python3 -m sparkcluster.monitor.exporter --once [--supervisor]     # one rendering on stdout (a textfile)

Why its own exporter rather than node_exporter's textfile collector: benchmarks/monitor_exporter.py measures both
(docs/monitoring.md has the figures): the readings cost the same either way, and a textfile is as old as the
timer that wrote it, where a scrape here is the node as it is now.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, HTTPServer

from .collect import Collector
from .exposition import CONTENT_TYPE, render

DEFAULT_PORT = 9839


class _Handler(BaseHTTPRequestHandler):
    server: ExporterServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        path = self.path.split("?", 1)[0]
        if path not in ("/metrics", "/supervisor"):
            self.send_error(404, "try /metrics or /supervisor")
            return
        with self.server.lock:
            collector = self.server.collector
            body = render(collector.node() if path == "/metrics" else collector.supervisor()).encode()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's signature
        pass  # a scrape every 15 s would fill the log with nothing worth reading


class ExporterServer(HTTPServer):
    def __init__(self, address: tuple[str, int], collector: Collector | None = None) -> None:
        super().__init__(address, _Handler)
        self.collector = collector or Collector()
        self.lock = threading.Lock()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sparkcluster-exporter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", default="127.0.0.1", help="the address to serve on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--once", action="store_true", help="print one rendering and exit")
    parser.add_argument("--supervisor", action="store_true", help="with --once: the supervisor's files")
    args = parser.parse_args(argv)
    if args.once:
        collector = Collector()
        sys.stdout.write(render(collector.supervisor() if args.supervisor else collector.node()))
        return 0
    server = ExporterServer((args.listen, args.port))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
