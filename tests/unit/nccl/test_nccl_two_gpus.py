"""Real NCCL between two ranks, one per GPU, on two H100s of one host (NVLink NV18, no RDMA device): verify's probe
and nccl-tests' all_reduce_perf in each transport NCCL can choose, captured by tests/fixtures/nccl/real/
capture-two-gpus.sh. Intra-node transports are no network verdict, sockets are the fallback, each with its figure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkcluster.nccl.logs import read_log
from sparkcluster.nccl.report import report
from sparkcluster.nccl.verdict import judge

REAL = Path(__file__).resolve().parents[2] / "fixtures" / "nccl" / "real"
NOT_NETWORK = "not a network verdict: it says nothing about the QSFP link"
NEVER_IB = "NET/IB was never tried (NCCL_NET=Socket, or a NET plugin without IB)"


def run_report(name: str, min_busbw: float | None = None) -> tuple[int, dict]:
    code, doc = report([str(REAL / name)], json_output=True, min_busbw=min_busbw)
    return code, json.loads(doc)


def best_busbw(doc: dict) -> float:
    return max(max(r["busbw_gbps"], r["in_place_busbw_gbps"] or 0.0) for r in doc["rows"]
               if r["size_bytes"] >= 64 << 20)


# name, exit code, status, cause, best busbw at 64 MiB and above (GB/s), channel transport
CASES = [
    ("h100x2-p2p.log", 0, "WARN", f"intra-node only (P2P): {NOT_NETWORK}; best busbw 327.87 GB/s at 64 MiB and above",
     327.8665, "P2P"),
    ("h100x2-shm.log", 0, "WARN", f"intra-node only (SHM): {NOT_NETWORK}; best busbw 26.86 GB/s at 64 MiB and above",
     26.863, "SHM"),
    ("h100x2-net.log", 1, "FAIL", "socket fallback over eth0: NET/IB found no device (is /dev/infiniband in the "
     "container?); best busbw 2.92 GB/s at 64 MiB and above", 2.9195, "NET/Socket"),
    ("h100x2-socket-pinned.log", 1, "FAIL", f"socket fallback over eth0: {NEVER_IB}; best busbw 2.75 GB/s at 64 MiB "
     "and above", 2.755, "NET/Socket"),
    ("h100x2-socket-slow.log", 1, "FAIL", f"socket fallback over eth0: {NEVER_IB}; best busbw 0.50 GB/s at 64 MiB "
     "and above", 0.4996, "NET/Socket"),
    # nccl-tests' all_reduce_perf in the same configurations, one process driving both GPUs
    ("h100x2-nccl-tests-p2p.log", 0, "WARN", f"intra-node only (P2P): {NOT_NETWORK}; best busbw 328.73 GB/s at 64 MiB "
     "and above", 328.73, "P2P"),
    ("h100x2-nccl-tests-shm.log", 0, "WARN", f"intra-node only (SHM): {NOT_NETWORK}; best busbw 26.92 GB/s at 64 MiB "
     "and above", 26.92, "SHM"),
    ("h100x2-nccl-tests-net.log", 1, "FAIL", "socket fallback over eth0: NET/IB found no device (is /dev/infiniband "
     "in the container?); best busbw 3.02 GB/s at 64 MiB and above", 3.02, "NET/Socket"),
    ("h100x2-nccl-tests-socket-pinned.log", 1, "FAIL", f"socket fallback over eth0: {NEVER_IB}; best busbw 3.11 GB/s "
     "at 64 MiB and above", 3.11, "NET/Socket"),
]


@pytest.mark.parametrize("name, code, status, cause, best, transport", CASES)
def test_each_capture_gets_its_verdict_and_figure(name, code, status, cause, best, transport):
    got_code, doc = run_report(name)
    assert (got_code, doc["status"], doc["cause"]) == (code, status, cause)
    assert len(doc["runs"]) == 1  # both ranks (or both GPUs of one process) are one run
    assert best_busbw(doc) == pytest.approx(best)
    assert {t for r in doc["ranks"] for t in r["transports"]} == {transport}


@pytest.mark.parametrize("name", ["h100x2-p2p.log", "h100x2-shm.log", "h100x2-nccl-tests-p2p.log"])
def test_intra_node_is_never_a_pass_whatever_the_bandwidth(name):
    # 327 GB/s over NVLink clears any floor, yet it proves nothing about a network: still no PASS, never RDMA.
    code, doc = run_report(name, min_busbw=1.0)
    assert (code, doc["status"], doc["intra_node_only"], doc["transports"]) == (0, "WARN", True, [])
    assert "RDMA" not in doc["cause"] and doc["fix"] == "run one rank on each of two Sparks to test the QSFP link"
    # NCCL picked sockets as its network at init: between hosts this run would have fallen back to TCP.
    assert any("between nodes it would fall back to TCP sockets" in d for d in doc["details"])


def test_the_probes_rows_are_both_collectives_at_every_size():
    _, doc = run_report("h100x2-p2p.log")
    assert [(r["op"], r["size_bytes"]) for r in doc["rows"]] == [
        (op, size << 20) for op in ("all_reduce", "all_gather") for size in (1, 64, 256, 1024)]
    assert [p["rank"] for p in doc["probe_ranks"]] == [0, 1]
    assert {p["device"] for p in doc["probe_ranks"]} == {"cuda:0", "cuda:1"}


def test_nccl_net_socket_is_told_apart_from_a_missing_rdma_device():
    # With NCCL_NET=Socket NCCL 2.28 initialises only the Socket plugin: no NET/IB line at all.
    pinned = read_log((REAL / "h100x2-socket-pinned.log").read_text(), "pinned")
    assert all(r.ib_never_tried and not r.no_ib_device for r in pinned)
    verdict = judge(pinned)
    assert verdict.fix.startswith("unset NCCL_NET and NCCL_NET_PLUGIN where NCCL runs")
    # The network run without NCCL_NET tried NET/IB first and found no device: the F1 cause, not NCCL_NET.
    net = read_log((REAL / "h100x2-net.log").read_text(), "net")
    assert all(r.no_ib_device and not r.ib_never_tried for r in net)
    assert "--device=/dev/infiniband" in judge(net).fix


def test_the_slow_socket_run_is_the_pinned_one_held_down():
    _, pinned = run_report("h100x2-socket-pinned.log")
    _, slow = run_report("h100x2-socket-slow.log")
    assert best_busbw(slow) < best_busbw(pinned) / 4  # tc tbf at 8 Gbit/s on lo, both directions
