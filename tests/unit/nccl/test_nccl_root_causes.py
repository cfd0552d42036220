"""nccl-report's root causes for two published log shapes (issue 42): a log whose only network line is NCCL choosing
sockets on the management port, connecting no channel, is that and not "truncated"; a ring whose rings connected and
whose traceback names ncclTransportTreeConnect after `RuntimeError: NCCL error: unhandled system error` is told to
force the ring algorithm. The fixtures are written in the issue's shapes (tests/fixtures/nccl/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.nccl.logs import read_log
from sparkcluster.nccl.report import report
from sparkcluster.nccl.verdict import VerdictStatus, judge

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "nccl"


def verdict_of(name: str):
    return judge(read_log((FIXTURES / name).read_text(), name))


@pytest.mark.parametrize("name", ["socket-management-only.log", "socket-management-only-prefixed.log"])
def test_sockets_on_the_management_port_are_the_headline_not_a_truncated_log(name):
    verdict = verdict_of(name)
    assert verdict.status is VerdictStatus.FAIL
    assert verdict.cause.startswith("socket fallback on the management interface enP7s7 (10 GbE"), verdict.cause
    assert "truncated" not in verdict.cause
    assert verdict.transports == ()  # no channel was connected: nothing ran yet
    for bind in ("NCCL_SOCKET_IFNAME=", "NCCL_IB_HCA=", "sparkcluster bootstrap"):
        assert bind in verdict.fix, (bind, verdict.fix)
    assert any("truncated" in d for d in verdict.details)  # still listed, below the root cause


def test_the_issue_shape_through_nccl_report(tmp_path):
    log = tmp_path / "published.log"  # the issue's four lines, values varied
    log.write_text("NCCL INFO NCCL version 2.27.7+cuda13.0\n"
                   "NCCL INFO NET/Socket : Using [0]enP7s7:192.168.50.7<0>\n"
                   "NCCL INFO comm 0xffff9c0a rank 1 nRanks 2 nNodes 2\n"
                   "NCCL INFO Ring 00 : 1 -> 0 -> 1\n")
    code, text = report([str(log)], json_output=False, min_busbw=None)
    assert code == 1
    assert text.splitlines()[0].startswith("FAIL  socket fallback on the management interface enP7s7"), text


def test_a_socket_line_beside_ib_devices_is_not_read_as_sockets():
    """NCCL initialises its Socket plugin only when IB found nothing: with IB listed, IB is the network."""
    ranks = read_log("NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:192.168.100.10<0>\n"
                     "NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.100.10<0>\n")
    assert ranks[0].network == "IB" and not ranks[0].sockets_only


def test_a_tree_connect_named_in_the_traceback_forces_the_ring_algorithm():
    verdict = verdict_of("ring4-tree-connect-runtimeerror.log")
    assert verdict.status is VerdictStatus.FAIL
    assert verdict.cause.startswith("NCCL's tree connect (ncclTransportTreeConnect) failed"), verdict.cause
    assert "force the ring algorithm: NCCL_ALGO=Ring NCCL_SKIP_TREE_CONNECT=1" in verdict.fix
    assert "ring of 4" in verdict.fix and "sparkcluster bootstrap" in verdict.fix

