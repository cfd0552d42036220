"""The order in which the simulated-cluster files start: the slowest first.

scripts/test.sh runs these files in two processes, a file at a time each (`--dist loadfile`), and hands the next
file to whichever process frees up. A long file handed out last keeps one process busy while the other idles, so
the long ones go first and the short ones fill in the end (with `--no-loadscope-reorder`: pytest-xdist would
otherwise order the files by their number of tests, which says nothing of their time).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Slowest first, in seconds of a clean-clone CI run (two processes side by side; a file alone under the
# integration lock takes about 2/3 of that): each runs a real CPU vLLM, holds an image with PyTorch, or stages a
# 1 GiB model. A file not named here runs after them.
SLOWEST_FIRST = (
    "test_supervise.py",  # ~510 s: a real vLLM restarted four times by the supervisor, two hosts power-cycled
    "test_serve_caches.py",  # ~500 s: the PyTorch image on two nodes, torch.compile twice, five serves
    "test_serve_host_vllm.py",  # ~480 s: four real vLLM starts on two nodes (the mlx5 link-local pair)
    "test_staging.py",  # ~330 s: a 1 GiB model staged, re-staged, repaired across four nodes; TP 4 served in Docker
    "test_ring3.py",  # ~280 s: a real vLLM served as three pipeline stages
    "test_ring4.py",  # ~260 s: a real vLLM served as TP 2 x PP 2
    "test_serve_docker.py",  # ~220 s: a two-node cluster, the image copied to the worker
    "test_monitor.py",  # ~180 s alone: Prometheus on the head waits for four alerts to fire (each under 2 min)
    "test_sim_variants.py",  # ~130 s: bootstrap and verify on the mlx5 link-local pair, then a degraded twin's
    "test_monitor_serving.py",  # ~100 s: two replicas served and scraped under a bench
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    # sort() is stable: a file's tests keep their order (they share the file's cluster, some build on the last)
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
