"""What NCCL prints on multi-node fabrics (rings of 3 and 4 Sparks, switches), read one message at a time, and what
those lines mean for the cabling.

- `Connected all rings[, use ring PXN p GDR g]`: the ring connect finished, so init got past it (a 4-ring that then
  serves prints no later connection line it needs); `GDR 0` is how every GB10 runs (no GPUDirect RDMA: NCCL stages
  through host memory) and is RDMA all the same.
- `Connected all trees` missing after the rings, then an error: the tree connect failed. A ring of 4 has no
  diagonal RoCE path, so NCCL's tree (rank 0 to rank 2) cannot connect: force the ring algorithm.
- `Call to ibv_modify_qp failed with 110 ..., local GID ::ffff:A, remote GID ::ffff:B` (with NCCL's hint that the
  NICs are "not cross-rail connected"): NCCL paired two ports; when A and B are on different links no cable joins
  them, and the fix depends on how many nodes there are and how they are cabled.

Pure parsing and the typed facts it yields; verdict.py turns them into findings.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

_RINGS = re.compile(r"Connected all rings(?:, use ring PXN (\d+) GDR (\d+))?")
_TREES = re.compile(r"Connected all trees")
_NODES = re.compile(r"\bnRanks (\d+) nNodes (\d+)")
# NCCL >= 2.19 (misc/ibvwrap.cc): "Call to ibv_modify_qp failed with 110 Connection timed out, on dev rocep1s0f0:1,
# curr state INIT, next state RTR, local GID index 3, local GID ::ffff:10.0.0.1, remote GID ::ffff:10.0.1.2".
_MODIFY_QP = re.compile(r"Call to ibv_modify_qp failed with (?:error )?(\d+)?[^,]*(?:, on dev ([\w.-]+)(?::\d+)?)?"
                        r"(?:,.*?local GID ::ffff:([\d.]+), remote GID ::ffff:([\d.]+))?")
_CROSS_RAIL = re.compile(r"not cross-rail connected")
_TREE_CONNECT = re.compile(r"\bncclTransportTreeConnect\b")
_GDR_OFF = re.compile(r"GPU Direct RDMA Disabled|NCCL_NET_GDR_LEVEL set by environment to (?:0|LOC)\b")
ETIMEDOUT = 110
DEFAULT_LINK_PREFIX = 24  # one /24 per link and twin: the field's ring scheme and NVIDIA's per-twin subnets


@dataclass(frozen=True)
class QpFailure:
    """One failed queue-pair transition: the two ports NCCL tried to join."""

    errno: int | None  # 110: timed out, the far port never answered
    device: str | None  # the local HCA ("rocep1s0f0")
    local_ip: str | None  # from the IPv4-mapped RoCE v2 GIDs
    remote_ip: str | None
    line: int


@dataclass(frozen=True)
class Endpoint:
    """Where an address lives on the fabric, as the cluster's facts say: to name a GID's node and port."""

    node: str
    netdev: str
    network: ipaddress.IPv4Network

    def __str__(self) -> str:
        return f"{self.node} {self.netdev}"


@dataclass
class RingLines:
    """What one process printed about its rings, trees and queue pairs (filled line by line)."""

    rings_connected: bool = False
    trees_connected: bool = False
    gdr: bool | None = None  # None: the log does not say
    n_nodes: int | None = None
    qp_failures: list[QpFailure] | None = None
    cross_rail_hint: bool = False
    tree_connect_named: bool = False

    def read(self, msg: str, line_no: int) -> None:
        if m := _RINGS.search(msg):
            self.rings_connected = True
            if m[2] is not None:
                self.gdr = m[2] != "0"
        elif _TREES.search(msg):
            self.trees_connected = True
        elif m := _NODES.search(msg):
            self.n_nodes = int(m[2])
        elif _GDR_OFF.search(msg):
            self.gdr = False
        self.read_error(msg, line_no)

    def read_error(self, text: str, line_no: int) -> None:
        """Also for lines outside NCCL's prefix (torch's "Last error:" repeats the WARN)."""
        if _CROSS_RAIL.search(text):
            self.cross_rail_hint = True
        if _TREE_CONNECT.search(text):
            self.tree_connect_named = True
        if (m := _MODIFY_QP.search(text)) is not None:
            # Older NCCL prints the message without the number ("failed with error Connection timed out").
            errno = int(m[1]) if m[1] else ETIMEDOUT if "timed out" in text else None
            failure = QpFailure(errno, m[2], m[3], m[4], line_no)
            known = self.qp_failures or []
            if not any((f.device, f.local_ip, f.remote_ip) == (failure.device, failure.local_ip, failure.remote_ip)
                       for f in known):
                self.qp_failures = [*known, failure]


def same_link(local_ip: str, remote_ip: str, endpoints: dict[str, Endpoint] | None = None) -> bool:
    """Whether two ports' addresses are on one link (one cable's subnet). With the cluster's addresses the subnet is
    the one configured there; without them, the field's /24 per link and twin."""
    local = (endpoints or {}).get(local_ip)
    if local is not None:
        return ipaddress.ip_address(remote_ip) in local.network
    network = ipaddress.ip_network(f"{local_ip}/{DEFAULT_LINK_PREFIX}", strict=False)
    return ipaddress.ip_address(remote_ip) in network
