"""The order in which the simulated-cluster files start: the slowest first.

scripts/test.sh runs these files in two processes, a file at a time each (`--dist loadfile`), and hands the next
file to whichever process frees up. A long file handed out last keeps one process busy while the other idles, so
the long ones go first and the short ones fill in the end (with `--no-loadscope-reorder`: pytest-xdist would
otherwise order the files by their number of tests, which says nothing of their time).
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Slowest first (longest-processing-time first: of two processes, the one that frees up takes the longest file
# left, so the short ones fill in the end), with each file's seconds (setup + tests + teardown) as measured in a
# run of all of them in two processes on a 2-core machine (`--durations=0`, 2026-12-02; other jobs shared the
# cores, so CI's are somewhat lower). In the order of the file before it, test_verify.py (134 s) was not named:
# it ran last, alone, and the run took 2027 s where this order takes 1962 s of the same figures (3918 s of
# files in all: 1959 s each). A process takes its next file while its current one has two tests left, not when
# it is idle, so the list keeps the long ones well ahead of the end. Run in this order (other jobs slowing the
# files 1.2-1.45x), the two processes ended 2 s apart, where they had ended 136 s apart. A file not named here
# runs after them.
SLOWEST_FIRST = (
    "test_supervise.py",  # 744 s (465 s alone; its polls now cost less CPU): a real vLLM restarted four times by
    # the supervisor, two hosts power-cycled
    "test_serve_host_vllm.py",  # 706 s: four real vLLM starts on two nodes (the mlx5 link-local pair)
    "test_serve_caches.py",  # 504 s: the PyTorch image on two nodes, torch.compile twice, five serves
    "test_ring3.py",  # 341 s: a real vLLM served as three pipeline stages
    "test_staging.py",  # 238 s: a 1 GiB model staged, re-staged, repaired across four nodes; TP 4 served in Docker
    "test_sim_variants.py",  # 191 s: bootstrap and verify on the mlx5 link-local pair, a degraded and a delayed twin
    "test_serve_docker.py",  # 185 s: a two-node cluster, the image copied to the worker
    "test_ring4.py",  # 180 s: a real vLLM served as TP 2 x PP 2
    "test_verify.py",  # 134 s: verify's probe, --tune's candidates, misbound nodes
    "test_fabric_addresses.py",  # 117 s: fabric addresses changed, and rolled back on a node cut off
    "test_monitor.py",  # 104-111 s (172 s before its four alerts waited side by side): Prometheus on the head
    "test_hardening.py",  # 90 s
    "test_monitor_serving.py",  # 88 s: two replicas served and scraped under a bench
    "test_bootstrap.py",  # 57 s
    "test_doctor.py",  # 56 s
    "test_install.py",  # 22 s
    "test_platform_guards.py",  # 19 s
    "test_sim_lifecycle.py",  # 16 s
    "test_engine.py",  # 15 s
    "test_engine_access.py",  # 15 s
    "test_sim_hosts.py",  # 10 s
    "test_sim_docker.py",  # 9 s
    "test_sim_cli.py",  # 7 s
    "test_sim_network.py",  # 4 s
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    # sort() is stable: a file's tests keep their order (they share the file's cluster, some build on the last)
    items.sort(key=lambda item: rank.get(Path(str(item.fspath)).name, len(rank)))
