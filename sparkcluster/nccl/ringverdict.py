"""The findings of rings and switches (rings.py reads their lines): a tree connect that failed after the rings
connected, and a queue pair that timed out between two ports, with the fix for this many nodes cabled this way."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .finding import Finding, VerdictStatus
from .logs import RankLog
from .rings import Endpoint, QpFailure, same_link


@dataclass(frozen=True)
class RunFacts:
    """What the ranks of one run say together about the fabric: the tree or the cabling fails on one rank's lines,
    while another rank printed how many nodes there are."""

    nodes: int | None
    rings_connected: bool
    trees_connected: bool
    tree_named: bool
    cross_rail_hint: bool
    endpoints: Mapping[str, Endpoint]
    topology: str | None

    @classmethod
    def of(cls, ranks: Sequence[RankLog], endpoints: Mapping[str, Endpoint] | None, topology: str | None) -> RunFacts:
        nodes = max((r.n_nodes for r in ranks if r.n_nodes), default=None)
        return cls(nodes, any(r.rings_connected for r in ranks), any(r.trees_connected for r in ranks),
                   any(r.tree_connect_named for r in ranks), any(r.cross_rail_hint for r in ranks),
                   endpoints or {}, topology)

    @property
    def kind(self) -> str | None:
        if self.topology:
            return self.topology
        return None if self.nodes is None else "pair" if self.nodes == 2 else "ring" if self.nodes >= 3 else None


_RING_ONLY = "NCCL_ALGO=Ring NCCL_SKIP_TREE_CONNECT=1"


def tree_finding(rank: RankLog, run: RunFacts) -> Finding | None:
    """The rings connected, the tree did not: on a ring of 4 the tree joins opposite nodes, which no cable does."""
    completion = any(re.search(r"Got completion|IBV_WC_", e) for e in rank.errors)
    after_rings = (run.rings_connected and not run.trees_connected and (run.nodes or 0) >= 4
                   and (bool(rank.qp_failures) or any("unhandled system error" in e for e in rank.errors)))
    if completion or not (run.tree_named or after_rings):
        return None
    where = f"a ring of {run.nodes}" if run.nodes else "this ring"
    if run.kind == "switch":
        return Finding(VerdictStatus.FAIL, f"NCCL's tree connect failed on {run.nodes or 'these'} nodes behind a switch "
                                            "(the rings connected): some node's port does not reach another's",
                        "every node's twin k on the switch's subnet for twin k, NCCL_IB_HCA in the same order on every "
                        "node; `sparkcluster verify` measures each link to name the one that fails")
    qp = next(iter(rank.qp_failures), None)
    between = f" ({_ends(qp, run)} timed out)" if qp and qp.local_ip and qp.remote_ip else ""
    return Finding(VerdictStatus.FAIL, f"NCCL's tree connect (ncclTransportTreeConnect) failed on {where}: the rings "
                                        f"connected, but the tree joins opposite nodes and a ring has no diagonal RoCE "
                                        f"path{between}",
                    f"force the ring algorithm: {_RING_ONLY} (with NCCL_IB_SUBNET_AWARE_ROUTING=1) where NCCL runs; "
                    "sparkcluster's comm env for a ring of 4 sets them: re-run `sparkcluster bootstrap`")


def _describe(ip: str, run: RunFacts) -> str:
    end = run.endpoints.get(ip)
    return f"{end} ({ip})" if end else ip


def _ends(qp: QpFailure, run: RunFacts) -> str:
    device = f" on {qp.device}" if qp.device else ""
    return f"{_describe(qp.local_ip or '?', run)}{device} -> {_describe(qp.remote_ip or '?', run)}"


def qp_finding(qp: QpFailure, run: RunFacts, generic_fix: str) -> Finding:
    """A queue pair that timed out: between ports no cable joins (the cabling or the HCA pinning), or on one link
    that does not carry RoCE. The fix is the one for this many nodes cabled this way."""
    if not (qp.local_ip and qp.remote_ip):
        return Finding(VerdictStatus.FAIL, f"NCCL error: ibv_modify_qp timed out{f' on {qp.device}' if qp.device else ''}",
                        _cabling_fix(qp, run, generic_fix))
    linked = same_link(qp.local_ip, qp.remote_ip, dict(run.endpoints))
    if linked and run.kind != "pair":
        return Finding(VerdictStatus.FAIL, f"ibv_modify_qp timed out between {_ends(qp, run)}, two ports of one link: "
                                            "that link does not carry RoCE",
                        "check the cable of that link: `ibdev2netdev` shows both ends (Up), MTU 9000 and the same FEC on "
                        "both ends, NCCL_IB_GID_INDEX on the RoCE v2 IPv4 GID of each HCA (F7)")
    # Two nodes with addresses on an uncabled port (both on one subnet) fail the same way: the port is not the cable.
    why = ("the port NCCL took does not reach the peer's" if linked
           else "no cable joins these two ports (their addresses are on different links)")
    hint = ", and NCCL hints the NICs are not cross-rail connected" if run.cross_rail_hint else ""
    return Finding(VerdictStatus.FAIL, f"ibv_modify_qp timed out between {_ends(qp, run)}: {why}{hint}",
                    _cabling_fix(qp, run, generic_fix))


def _cabling_fix(qp: QpFailure, run: RunFacts, generic_fix: str) -> str:
    device = qp.device or "that HCA"
    if run.kind == "pair":
        return ("two nodes: cable the same QSFP port on both, and set NCCL_IB_HCA to that port's two twins only, in "
                f"the same order on both nodes ({device} is not on the cable); `sparkcluster topology` shows the "
                "cabled port")
    if run.kind == "ring":
        nodes = f"a ring of {run.nodes}" if run.nodes else "a ring"
        four = f"; a ring of 4 also needs {_RING_ONLY}" if run.nodes in (None, 4) else ""
        return (f"{nodes}: cable it crosswise, port 0 of each node to port 1 of the next (cabled port 0 to port 0, "
                "NCCL pairs ports that no cable joins), each link on its own subnet per twin, and set "
                f"NCCL_IB_SUBNET_AWARE_ROUTING=1 NCCL_IB_MERGE_NICS=0{four}; then re-run `sparkcluster bootstrap` "
                "(`sparkcluster topology` names a miscabled link)")
    if run.kind == "switch":
        return ("behind a switch: twin k of every node on the one subnet of twin k, and NCCL_IB_HCA in the same order "
                f"on every node ({device} reached a port on another twin's subnet)")
    return generic_fix
