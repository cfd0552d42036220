"""The support bundle's scrubber (sparkcluster/engine/scrub) on hostile node text, as round 5's H3 found it: N
private-key BEGIN lines without an END (each followed by 200 characters). The baseline is the pattern the scrubber
used before (a lazy `.*?` to the END, which reads to the end of the text for every BEGIN without one: time N
squared), measured in the same run; then the whole scrubber (every pass) on the same text and on other shapes
that never close (quotes, brackets, URLs, a megabyte line of names), to show each grows with N, not N squared.

Run:  nice .venv/bin/python benchmarks/scrub_scaling.py
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkcluster.engine.scrub import Scrubber  # noqa: E402

OLD_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----", re.S)
SHAPES: dict[str, Callable[[int], str]] = {
    "BEGIN without END": lambda n: ("-----BEGIN RSA PRIVATE KEY-----\n" + "A" * 200 + "\n") * n,
    "END without BEGIN": lambda n: ("-----END RSA PRIVATE KEY-----\n" + "A" * 200 + "\n") * n,
    "unclosed quotes": lambda n: ('password: "' + "a" * 200 + "\n") * n,
    "unclosed brackets": lambda n: ("password: [" + "a" * 200 + "\n") * n,
    "URL without @": lambda n: ("https://u:" + "p" * 200 + "\n") * n,
    "one line of names": lambda n: ("a:" * 116) * n,
}


def seconds(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> int:
    scrubber = Scrubber(["hf_" + "q" * 34])
    print("N unterminated BEGIN lines: the old pattern (baseline) and the scrubber's passes, CPU seconds")
    for n in (250, 500, 1000, 2000):
        text = SHAPES["BEGIN without END"](n)
        old = seconds(lambda: OLD_PRIVATE_KEY.sub("", text))
        new = seconds(lambda: scrubber.scrub(text))
        print(f"  N={n:5} ({len(text) / 1e6:.2f} MB): old {old:7.3f} s, new {new:7.4f} s, old/new {old / max(new, 1e-6):8.0f}x")
    print("each shape at N and 8N: the time's ratio (8 is linear, 64 quadratic)")
    for name, make in SHAPES.items():
        small, large = make(2000), make(16000)
        t_small = seconds(lambda: scrubber.scrub(small))
        t_large = seconds(lambda: scrubber.scrub(large))
        print(f"  {name:20} {len(large) / 1e6:5.2f} MB in {t_large:6.3f} s; 8N/N = {t_large / max(t_small, 1e-6):5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
