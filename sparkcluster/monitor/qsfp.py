"""Each QSFP twin as sysfs shows it on the node: its netdev's operstate, speed and carrier count
(/sys/class/net/<netdev>), and its RDMA device's RoCE counters (/sys/class/infiniband/<hca>/ports/<n>/counters and
hw_counters). Read in-process with open() (no process per value): the exporter reads these on every scrape.

Which netdevs are QSFP twins is node/network.py's rule (qsfp_port); which twin the node uses is
node/linkstate.py's (a twin whose carrier came up since boot, or that is up): a twin no cable ever lit is not down.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..node.network import qsfp_port

# RoCE counters by what they mean. `counters/` are the IB port counters (port_*_data in 4-octet words, as the IB
# spec counts), `hw_counters/` the mlx5 driver's own (out_of_buffer, ECN and CNP).
DATA_WORDS = {"port_xmit_data": "transmit", "port_rcv_data": "receive"}
PACKETS = {"port_xmit_packets": "transmit", "port_rcv_packets": "receive"}
ERRORS = ("port_rcv_errors", "port_xmit_discards", "symbol_error", "link_downed", "local_link_integrity_errors",
          "excessive_buffer_overrun_errors", "port_rcv_remote_physical_errors", "out_of_buffer", "out_of_sequence",
          "packet_seq_err", "local_ack_timeout_err", "rx_icrc_encapsulated")
CONGESTION = ("np_ecn_marked_roce_packets", "np_cnp_sent", "rp_cnp_handled", "rp_cnp_ignored")
COUNTER_NAMES = (*DATA_WORDS, *PACKETS, *ERRORS, *CONGESTION)


@dataclass(frozen=True)
class QsfpTwin:
    netdev: str
    port: int  # the physical QSFP port (0 or 1) the twin belongs to
    state: str  # the kernel's operstate: up, down, lowerlayerdown, unknown
    speed_mbps: int | None  # None: no link (sysfs reads -1) or unreadable
    carrier_ups: int | None
    hca: str | None = None  # its RDMA device (rocep1s0f1), None: none bound
    counters: dict[str, int] = field(default_factory=dict)  # RoCE counter name -> value, those the driver has

    @property
    def up(self) -> bool:
        return self.state == "up"

    @property
    def used(self) -> bool:
        """Lit since boot or up now: a twin the node is meant to use (linkstate.any_down's rule without addresses)."""
        return self.up or bool(self.carrier_ups)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:  # absent, or EINVAL (speed of a down link)
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _hca_of(sys_root: Path) -> dict[str, str]:
    """netdev -> its RDMA device, from /sys/class/infiniband/<hca>/device/net/<netdev>."""
    out = {}
    for hca in sorted((sys_root / "class/infiniband").glob("*")):
        for net in (hca / "device/net").glob("*"):
            out[net.name] = hca.name
    return out


def _counters(sys_root: Path, hca: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for port in sorted((sys_root / "class/infiniband" / hca / "ports").glob("*")):
        for folder in ("counters", "hw_counters"):
            for name in COUNTER_NAMES:
                value = _int(_read(port / folder / name))
                if value is not None:
                    out[name] = out.get(name, 0) + value
    return out


def read_twins(sys_root: Path = Path("/sys")) -> list[QsfpTwin]:
    """The node's QSFP twins, sorted by netdev; none where it has no Spark-named QSFP netdev."""
    hcas = _hca_of(sys_root)
    twins = []
    for net in sorted((sys_root / "class/net").glob("*"), key=lambda p: p.name):
        port = qsfp_port(net.name)
        if port is None:
            continue
        speed = _int(_read(net / "speed"))
        hca = hcas.get(net.name)
        twins.append(QsfpTwin(net.name, port, (_read(net / "operstate") or "unknown").lower(),
                              speed if speed is not None and speed > 0 else None,
                              _int(_read(net / "carrier_up_count")), hca,
                              _counters(sys_root, hca) if hca else {}))
    return twins


def root_from_env(name: str, default: str) -> Path:
    """Where a kernel file system is (/sys, /proc), or the tree an environment variable names instead: the tests'
    and benchmarks' fixture nodes (SPARKCLUSTER_SYS_ROOT, SPARKCLUSTER_PROC_ROOT)."""
    return Path(os.environ.get(name) or default)


def sys_root_from_env() -> Path:
    return root_from_env("SPARKCLUSTER_SYS_ROOT", "/sys")
