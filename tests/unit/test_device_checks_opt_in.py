"""tests/device/ is kept, as shared/DESIGN.md promises it: the probe's checks that need a GPU (probe_vs_graph,
tune_candidates), run by hand on a GPU machine; the suite collects none of them (a CI machine has no GPU), and each
says so and how it is run. Their captures are fixtures the unit tests read (tests/fixtures/nccl/real/)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "tests" / "device"


def test_the_device_checks_are_there_and_each_says_it_is_gpu_only_and_run_by_hand():
    files = sorted(p.name for p in DEVICE.iterdir() if p.is_file())
    assert files == ["probe_vs_graph.py", "probe_vs_graph.sh", "tune_candidates.py", "tuner_plugin.py"]
    for name in files:
        head = (DEVICE / name).read_text(encoding="utf-8")[:1200]
        assert "GPU" in head and "by hand" in head, name


def test_the_suite_collects_nothing_from_tests_device():
    collected = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                str(DEVICE)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert collected.returncode == 5, collected.stdout + collected.stderr  # 5: no tests collected
