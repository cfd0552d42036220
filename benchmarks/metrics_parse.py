"""The /metrics reader `top` and `bench` share (sparkcluster/observe/prometheus.py) against prometheus_client's
text parser, on a real vLLM 0.32 scrape (tests/fixtures/metrics, 619 lines, 83 KB): CPU time per scrape, and what
each does with one malformed line. prometheus_client is not a dependency of sparkcluster: install it to compare
(`pip install prometheus_client`); without it only our reader is timed.

Run:  .venv/bin/python benchmarks/metrics_parse.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkcluster.observe.prometheus import parse  # noqa: E402

TEXT = (ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.32-cpu-busy2.txt").read_text()
ROUNDS = 200


def cpu_per_call(fn, text: str) -> float:
    start = time.process_time()
    for _ in range(ROUNDS):
        fn(text)
    return (time.process_time() - start) / ROUNDS


def ours(text: str) -> float:
    return parse(text).total("vllm:generation_tokens_total") or 0.0


def main() -> int:
    mine = cpu_per_call(ours, TEXT)
    print(f"sparkcluster reader: {mine * 1e3:.2f} ms CPU per scrape ({len(TEXT.splitlines())} lines)")
    broken = TEXT.replace("vllm:num_requests_waiting{engine=\"0\"", "vllm:num_requests_waiting{engine=0", 1)
    kept = parse(broken)
    print(f"  one malformed line: {len(kept.samples)} samples kept, {kept.skipped} skipped")
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        print("prometheus_client not installed: no comparison")
        return 0

    def theirs(text: str) -> float:
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:generation_tokens_total":
                    total += sample.value
        return total

    assert theirs(TEXT) == ours(TEXT)
    other = cpu_per_call(theirs, TEXT)
    print(f"prometheus_client:   {other * 1e3:.2f} ms CPU per scrape; ratio prometheus_client/ours {other / mine:.2f}")
    try:
        count = sum(len(f.samples) for f in text_string_to_metric_families(broken))
        print(f"  one malformed line: {count} samples kept")
    except ValueError as e:
        print(f"  one malformed line: the whole scrape is lost ({type(e).__name__}: {str(e)[:60]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
