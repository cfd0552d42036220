"""`bench --explain` on results whose receipts list N nodes (name and kernel only), as round 6's B11 built them: a
17 KB file of 500 nodes took 148 s while `receipt.unknown()` was recomputed per fact. The baseline is that old
per-fact call, measured in the same run on the same receipt; then the whole explanation (both files read, lined up
and rendered) at N and 10N, whose ratio is about 10 where it grows with N, 100 where it grows with N squared.

Run:  nice .venv/bin/python benchmarks/explain_scaling.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkcluster.bench.explain.facts import _applies, receipt_facts  # noqa: E402
from sparkcluster.bench.explain.lineup import explain, render  # noqa: E402
from sparkcluster.bench.explain.sides import sides  # noqa: E402
from sparkcluster.bench.receipt import Receipt  # noqa: E402


def result(nodes: int) -> dict[str, object]:
    return {"config": {}, "rows": [{"concurrency": 1, "generation_tps": 10.0}],
            "receipt": {"version": 1, "sparkcluster": "x", "created": "y", "endpoint": "http://e/v1", "engine": {},
                        "bench": {"method": "sustained", "parameters": {}},
                        "nodes": [{"name": f"spark-{i}", "kernel": "6.11"} for i in range(nodes)]}}


def seconds(fn: Callable[[], object]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def explained(folder: Path, nodes: int) -> float:
    a, b = folder / f"a{nodes}.json", folder / f"b{nodes}.json"
    for path in (a, b):
        path.write_text(json.dumps(result(nodes)))
    return seconds(lambda: render(explain(*sides([str(a), str(b)], None))))


def main() -> int:
    print("the facts of one receipt of N nodes: per-fact unknown() (the old code, baseline) and once, CPU seconds")
    for n in (50, 100, 200):
        receipt = Receipt.from_json(result(n)["receipt"])
        facts, _ = receipt_facts(receipt)
        old = seconds(lambda: [_applies(f, set(receipt.unknown())) for f in facts])  # noqa: B023
        new = seconds(lambda: receipt_facts(receipt))  # noqa: B023
        print(f"  N={n:4}: old {old:7.3f} s, now {new:7.4f} s, old/now {old / max(new, 1e-6):6.0f}x")
    print("bench --explain A B, both of N nodes, at N and 10N: the time's ratio (10 is linear, 100 quadratic)")
    with tempfile.TemporaryDirectory() as folder:
        for small in (50, 100):
            t_small, t_large = explained(Path(folder), small), explained(Path(folder), 10 * small)
            print(f"  N={small:4}: {t_small:6.3f} s, 10N: {t_large:6.3f} s; 10N/N = {t_large / max(t_small, 1e-6):5.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
