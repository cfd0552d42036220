"""The verdict over what the logs say: did NCCL run over RDMA on the QSFP link? Each finding names its cause and
its fix (docs/failure-modes.md F1-F8). Bandwidth alone is not proof of RDMA (a socket run over a fast link can
look plausible at small sizes): the transport lines decide and the bandwidth only adds to them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from .finding import Finding as _Finding
from .finding import Verdict as Verdict
from .finding import VerdictStatus as VerdictStatus
from .logs import BandwidthRow, RankLog
from .rings import ETIMEDOUT, Endpoint
from .ringverdict import RunFacts, qp_finding, tree_finding
from .thresholds import PAIR, floor_for

# NVIDIA's pass mark is 21.875 GB/s (175 Gb/s) for a 16 GB all_gather on two Sparks (§2.5), where per-call overhead
# vanishes. The probe stops at 1 GiB (16 GB froze Sparks, F4), which costs a few GB/s, and MTU 1500 alone already
# gives 18.9-21 GB/s at 16 GB. One twin cannot exceed 12.5 GB/s (100 Gb/s), so 18 still separates "both twins" from
# "one twin" (≈11-12) with margin while leaving ~4 GB/s for the smaller sizes.
DEFAULT_MIN_BUSBW_GBPS = PAIR.min_busbw_gbps  # thresholds.py: the floor of every topology
ONE_TWIN_MAX_GBPS = 12.5
MISCONFIGURED_MAX_GBPS = 4.0  # F3: about 3 GB/s at every size with NCCL_IB_HCA unset, MTU 1500 or a dev-branch NCCL
LARGE_BYTES = 64 << 20  # below this, per-call latency dominates and busbw says little about the link
MANAGEMENT_INTERFACES = ("enP7s7",)

_RDMA = frozenset({"NET/IB", "NET/IBext"})
# The two twins (PCIe functions) of QSFP port N are rocep1s0fN and roceP2p1s0fN (as `ibdev2netdev` on a Spark prints them).
_SPARK_HCA = re.compile(r"roce(?:P2)?p1s0f([01])")
# Kernels that name RDMA devices by PCI order call the same four mlx5_0..mlx5_3 (mlx5_1 and mlx5_3: port 1).
_MLX5_HCA = re.compile(r"mlx5_[0-3]")

_F1_FIX = ("give the container the RDMA devices: --privileged, or --device=/dev/infiniband --ulimit memlock=-1 "
           "--ulimit stack=67108864 (F1); `ls /dev/infiniband` inside it must list uverbs*")
_F6_FIX = ("NCCL_IB_HCA must list only the Up HCAs of the cabled port, in the same order on every node (F6); for a "
           "ring of three: NCCL_IB_MERGE_NICS=0 NCCL_NET_PLUGIN=none NCCL_IB_SUBNET_AWARE_ROUTING=1")
_F7_FIX = ("an RDMA transfer failed on a collective (F7): fix the fabric config (MTU 9000 on both ends, "
           "NCCL_IB_GID_INDEX on the RoCE v2 IPv4 GID of each HCA), then rerun the probe")


def judge(ranks: Sequence[RankLog], *, expected_hcas: Sequence[str] = (), qsfp_interfaces: Sequence[str] = (),
          management_interfaces: Sequence[str] = MANAGEMENT_INTERFACES, rows: Sequence[BandwidthRow] = (),
          min_busbw_gbps: float | None = None, require_network: bool = True,
          table_hosts: Sequence[str] = (), endpoints: Mapping[str, Endpoint] | None = None,
          topology: str | None = None) -> Verdict:
    """PASS only when every inter-node channel is NET/IB(ext) on the expected HCAs and the bandwidth holds.

    Findings are gathered in order of how much they explain, so the verdict's cause is the root one: an error
    before the fallback it caused, a fallback before the truncated log or low bandwidth it explains.
    `endpoints` (address -> node and port) and `topology` ("pair", "ring", "switch": the fabric graph's kind) let a
    failed connection name the ports and get the fix for this cabling; logs alone fall back on NCCL's node count.
    """
    if not ranks and rows:
        nodes = len(set(table_hosts)) or None
        return _bandwidth_only(rows, _threshold(min_busbw_gbps, topology, nodes), table_hosts)
    transports = tuple(dict.fromkeys(t for r in ranks for t in r.inter_node))
    run = RunFacts.of(ranks, endpoints, topology)
    threshold = _threshold(min_busbw_gbps, run.kind, run.nodes or len(set(table_hosts)) or None)
    intra_only = not transports and any(r.channels for r in ranks)
    qsfp_hint = ",".join(qsfp_interfaces) or "<the QSFP interface, e.g. enp1s0f1np1>"
    # A socket fallback comes before the errors and the truncated log it explains: a run on the management port
    # that then timed out or was cut short failed because of where it ran.
    per_rank = (
        lambda r: _socket_findings(r, expected_hcas, management_interfaces, qsfp_hint, require_network, rows),
        lambda r: _error_findings(r, run),
        lambda r: _interface_findings(r, qsfp_interfaces, management_interfaces, qsfp_hint),
        _silence_findings,
        lambda r: _hca_findings(r, expected_hcas),
    )
    found: list[tuple[str, _Finding]] = []
    if intra_only and require_network:  # first, so that it is the cause unless something FAILs
        # P2P (NVLink, PCIe) and SHM never leave the host: whatever their speed, they prove nothing about a network.
        intra = "/".join(dict.fromkeys(t for r in ranks for t in r.transports))
        found.append(("all ranks", _Finding(VerdictStatus.WARN, f"intra-node only ({intra}): not a network verdict: it "
                                            f"says nothing about the QSFP link{_measured(rows)}",
                                            "run one rank on each of two Sparks to test the QSFP link")))
    found += [(r.source, f) for check in per_rank for r in ranks for f in check(r)]
    if not ranks:
        found.append(("input", _no_lines("the given logs")))
    found += [("all ranks", f) for f in _transport_findings(transports)]
    if transports and set(transports) <= _RDMA:
        found += [("bandwidth", f) for f in _bandwidth_findings(ranks, rows, threshold, expected_hcas)]
    details = (*(_summary(r) for r in ranks), *(f"{source}: {f.status} {f.cause}" for source, f in found))
    worst = next((f for _, f in found if f.status is VerdictStatus.FAIL), None) or next((f for _, f in found), None)
    if worst:
        return Verdict(worst.status, worst.cause, worst.fix, details, transports, intra_only)
    return Verdict(VerdictStatus.PASS, _pass_cause(ranks, transports, intra_only, rows), "", details, transports, intra_only)


def _no_lines(where: str) -> _Finding:
    return _Finding(VerdictStatus.FAIL, f"no NCCL INFO lines in {where}",
                    "run with NCCL_DEBUG=INFO (e.g. `-e NCCL_DEBUG=INFO` on the container) and keep every "
                    "rank's output")


def _error_findings(rank: RankLog, run: RunFacts) -> list[_Finding]:
    lines = rank.errors or rank.warnings
    if not lines:
        return []
    if (tree := tree_finding(rank, run)) is not None:
        return [tree]
    if (qp := next((q for q in rank.qp_failures if q.errno == ETIMEDOUT), None)) is not None:
        return [qp_finding(qp, run, _F6_FIX)]
    return [_error_finding(lines[0])]


def _silence_findings(rank: RankLog) -> list[_Finding]:
    """Logs that cannot tell the transport: no NCCL lines, or no connection made yet."""
    if rank.nccl_lines == 0 and not rank.errors:
        return [_no_lines(rank.source)]
    if not rank.truncated:
        return []
    if rank.init_complete:
        # NCCL >= 2.22 connects channels lazily, at the first collective that needs them.
        return [_Finding(VerdictStatus.FAIL, "NCCL init completed but no channel was connected yet: the log does not show the "
                                 "transport", "capture the log after a collective has run (the probe, or after the "
                                              "first request to vLLM)")]
    return [_Finding(VerdictStatus.FAIL, "truncated: the log stops before NCCL connected any channel (init never finished)",
                     "look for the error that stopped init in every rank's log, or capture again after init")]


def _error_finding(line: str) -> _Finding:
    cause = f"NCCL error: {line[:240]}"
    if re.search(r"Got completion|IBV_WC_", line):
        return _Finding(VerdictStatus.FAIL, cause, _F7_FIX)
    if re.search(r"ibv_\w+ failed|unhandled system error", line):
        return _Finding(VerdictStatus.FAIL, cause, _F6_FIX)
    if "remote process exited" in line:
        return _Finding(VerdictStatus.FAIL, cause, "another rank died first: its log holds the first NCCL WARN")
    return _Finding(VerdictStatus.FAIL, cause, "read the NCCL WARN above; rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "
                                   "for its context")


def _socket_findings(rank: RankLog, expected_hcas: Sequence[str], management: Sequence[str], qsfp_hint: str,
                     require_network: bool, rows: Sequence[BandwidthRow]) -> list[_Finding]:
    uses_socket = (rank.network == "Socket" or rank.sockets_only or rank.no_ib_device or rank.ib_disabled
                   or "NET/Socket" in rank.transports)
    if not uses_socket:
        return []
    # NCCL picks its network at init even when every peer is on this host: then no data went over it, but
    # between Sparks it would have.
    if rank.channels and not rank.inter_node:
        if not require_network:
            return []
        return [_Finding(VerdictStatus.WARN, f"NCCL chose network {rank.network or 'Socket'} here: between nodes it would fall "
                                 "back to TCP sockets", _socket_reason(rank, expected_hcas)[1])]
    why, fix = _socket_reason(rank, expected_hcas)
    on_management = [i for i in rank.socket_interfaces if i in management]
    if on_management:
        both_twins = ",".join(expected_hcas) or "rocep1s0f1,roceP2p1s0f1"
        unconnected = "" if rank.channels or rank.rings_connected else "; no channel connected yet"
        return [_Finding(VerdictStatus.FAIL, f"socket fallback on the management interface {on_management[0]} (10 GbE, about "
                                 f"1 GB/s): {why}{unconnected}{_measured(rows)}",
                         f"bind NCCL to the QSFP link: NCCL_SOCKET_IFNAME={qsfp_hint} NCCL_IB_HCA={both_twins} where "
                         "NCCL runs (`sparkcluster bootstrap` writes both into every node's comm env: run it and start "
                         f"NCCL in that env); then {fix}")]
    over = f" over {','.join(rank.socket_interfaces)}" if rank.socket_interfaces else ""
    return [_Finding(VerdictStatus.FAIL, f"socket fallback{over}: {why}{_measured(rows)}", fix)]


def _measured(rows: Sequence[BandwidthRow]) -> str:
    """What the run carried, for a verdict the transport decides: the figure says how far it is from RDMA's."""
    large = [r for r in rows if r.size_bytes >= LARGE_BYTES]
    if not large:
        return ""
    return f"; best busbw {max(r.best_busbw_gbps for r in large):.2f} GB/s at {LARGE_BYTES >> 20} MiB and above"


def _socket_reason(rank: RankLog, expected_hcas: Sequence[str]) -> tuple[str, str]:
    """Why NCCL took sockets, and the fix, from the lines NCCL printed before choosing."""
    hca_names = [n.split(":")[0] for n in (rank.ib_hca_env or "").lstrip("^=").split(",") if n]
    both_twins = ",".join(expected_hcas) or "rocep1s0f1,roceP2p1s0f1"
    if rank.ib_disabled:
        return "NCCL_IB_DISABLE=1", "unset NCCL_IB_DISABLE (or set it to 0) where NCCL runs"
    if rank.no_ib_device and rank.ib_hca_env is not None and not _known_hcas(hca_names, expected_hcas):
        return (f"NCCL_IB_HCA={rank.ib_hca_env or '(empty)'} matches no RDMA device",
                f"set NCCL_IB_HCA to both twins of the cabled port: {both_twins} (F2)")
    if rank.no_ib_device:
        return "NET/IB found no device (is /dev/infiniband in the container?)", _F1_FIX
    if rank.ib_never_tried:
        return ("NET/IB was never tried (NCCL_NET=Socket, or a NET plugin without IB)",
                "unset NCCL_NET and NCCL_NET_PLUGIN where NCCL runs (NCCL_NET=IB makes NCCL fail instead of falling "
                f"back); then NCCL_IB_HCA={both_twins}")
    return ("NCCL chose NET/Socket (TCP) over NET/IB",
            f"check `ls /dev/infiniband` where NCCL runs (F1), NCCL_IB_DISABLE unset and NCCL_IB_HCA={both_twins}; "
            "NCCL_NET=IB makes NCCL fail instead of falling back")


def _known_hcas(names: Sequence[str], expected: Sequence[str]) -> bool:
    if not names:
        return False
    if expected:
        return all(n in expected for n in names)
    return all(_SPARK_HCA.fullmatch(n) or _MLX5_HCA.fullmatch(n) for n in names)


def _interface_findings(rank: RankLog, qsfp: Sequence[str], management: Sequence[str],
                        qsfp_hint: str) -> list[_Finding]:
    """Where NCCL's own TCP connections (bootstrap, IB connection setup) run; socket data is _socket_findings'."""
    findings = []
    for role, interface in (("bootstrap", rank.bootstrap_interface), ("OOB (IB connection setup)", rank.oob_interface)):
        if interface is None:
            continue
        if interface in management:
            findings.append(_Finding(VerdictStatus.FAIL, f"NCCL {role} on the management interface {interface} (10 GbE)",
                                     f"set NCCL_SOCKET_IFNAME={qsfp_hint}: everything binds to the QSFP link, so a "
                                     "management link flap cannot break the communicator"))
        elif qsfp and interface not in qsfp:
            findings.append(_Finding(VerdictStatus.WARN, f"NCCL {role} on {interface}, not the QSFP interface ({qsfp_hint})",
                                     f"set NCCL_SOCKET_IFNAME={qsfp_hint}"))
    return findings


def _hca_findings(rank: RankLog, expected: Sequence[str]) -> list[_Finding]:
    used = rank.ib_devices
    if not used or not (rank.network in ("IB", "IBext") or set(rank.inter_node) & _RDMA):
        return []
    findings = []
    if expected:
        unexpected = [d for d in used if d not in expected]
        if unexpected:
            findings.append(_Finding(VerdictStatus.WARN, f"NCCL uses {', '.join(unexpected)}, not in the expected HCAs "
                                             f"({', '.join(expected)})",
                                     f"set NCCL_IB_HCA={','.join(expected)}: an HCA not cabled to the peer fails or "
                                     "pairs wrongly (F6)"))
        on_expected = [d for d in used if d in expected]
        alone = on_expected[0] if len(expected) >= 2 and len(on_expected) == 1 else None
        pair = ",".join(expected)
    else:
        twin = _SPARK_HCA.fullmatch(used[0]) if len(used) == 1 else None
        alone = used[0] if twin else None
        pair = f"rocep1s0f{twin[1]},roceP2p1s0f{twin[1]}" if twin else ""
    if alone:
        findings.append(_Finding(VerdictStatus.WARN, f"one twin only: about half bandwidth (≈11-12 GB/s); NCCL uses {alone} "
                                         "alone", f"NCCL_IB_HCA={pair} (both twins of the cabled port, F2)"))
    return findings


def _transport_findings(transports: Sequence[str]) -> list[_Finding]:
    other = [t for t in transports if t not in _RDMA and t != "NET/Socket"]  # sockets are _socket_findings'
    if not other:
        return []
    return [_Finding(VerdictStatus.WARN, f"inter-node transport {', '.join(other)}, not NET/IB",
                     "between Sparks NCCL should use NET/IB (or NET/IBext with the HPC-X plugin): check NCCL_NET and "
                     "NCCL_NET_PLUGIN")]


# What owners of Spark pairs actually hit when every channel is NET/IB and the bandwidth is still low, and how each
# shows itself (docs/failure-modes.md F2, F3, F21, F24, F25).
DEGRADED_CAUSES = (
    "one twin only: about half (11-12 GB/s); `NET/IB : Using` lists one HCA: set NCCL_IB_HCA to both twins",
    "hot re-plug or PCIe power: a few GB/s (2-4) on every size; `sudo dmesg | grep -i mlx5` shows 'insufficient "
    "power' or a degraded PCIe link: reboot both nodes (a re-seated cable needs it)",
    "FEC or speed mismatch on a direct cable: `ethtool <twin>` shows Speed other than 200000Mb/s or "
    "`ethtool --show-fec <twin>` differs between the ends: set the same FEC, reseat or replace the cable",
    "MTU: `ip link show <twin>` says mtu 1500 on either end: set 9000 on both ends (it costs 10-20%)",
)


def _large(rows: Sequence[BandwidthRow]) -> list[BandwidthRow]:
    """The rows that say something about the link: 64 MiB and above, or nccl-tests' average alone (size 0)."""
    large = [r for r in rows if r.size_bytes >= LARGE_BYTES]
    return large or [r for r in rows if r.size_bytes == 0]


def _threshold(min_busbw: float | None, topology: str | None, nodes: int | None) -> float:
    return floor_for(topology, nodes).min_busbw_gbps if min_busbw is None else min_busbw


def _bandwidth_findings(ranks: Sequence[RankLog], rows: Sequence[BandwidthRow], threshold: float,
                        expected_hcas: Sequence[str]) -> list[_Finding]:
    if not rows:
        return []
    large = _large(rows)
    if not large:
        return [_Finding(VerdictStatus.WARN, f"no measurement at {LARGE_BYTES >> 20} MiB or more: bandwidth not judged",
                         "run the probe with --sizes up to 1G (nccl-tests: -e 1G or more)")]
    best = max(r.best_busbw_gbps for r in large)
    if best >= threshold:
        return []
    return [_Finding(VerdictStatus.FAIL, f"RDMA, but the link delivers {best:.2f} GB/s of an expected >= {threshold:g}"
                                         f"{_degraded_hint(ranks, best, expected_hcas)}", _degraded_fix())]


def _degraded_hint(ranks: Sequence[RankLog], best: float, expected_hcas: Sequence[str]) -> str:
    """The cause the numbers point at, so that the headline already tells the cases apart."""
    one = {d for r in ranks for d in r.ib_devices}
    if len(one) == 1 and (len(expected_hcas) != 1):
        return f" (one twin only: NCCL uses {next(iter(one))} alone)"
    if best <= MISCONFIGURED_MAX_GBPS:
        return (" (a few GB/s at every size with both twins on NET/IB: a hot re-plug or PCIe power limit; "
                "`dmesg | grep -i mlx5`, then reboot; or F3: MTU 1500 / NCCL_IB_HCA)")
    if best <= ONE_TWIN_MAX_GBPS:
        return " (one twin's ceiling: is only one twin carrying traffic? verify measures each twin)"
    return " (MTU 1500, FEC/speed mismatch, or other GPU work)"


def _degraded_fix() -> str:
    return "tell the causes apart: " + "; ".join(f"({i}) {c}" for i, c in enumerate(DEGRADED_CAUSES, 1))


def _bandwidth_only(rows: Sequence[BandwidthRow], threshold: float, hosts: Sequence[str]) -> Verdict:
    """nccl-tests without NCCL_DEBUG: the speed is known, the transport is not."""
    large = _large(rows)
    unknown = "transport unknown: no NCCL INFO lines (rerun with NCCL_DEBUG=INFO to see it)"
    details = tuple(f"{r.op} {r.size_bytes} B: busbw {r.busbw_gbps:.2f}"
                    + (f" / in-place {r.in_place_busbw_gbps:.2f}" if r.in_place_busbw_gbps is not None else "")
                    + " GB/s" for r in rows)
    if len(set(hosts)) == 1:
        return Verdict(VerdictStatus.WARN, f"every rank on one host ({hosts[0]}): the table says nothing about the "
                                           "QSFP link", "run one rank on each of two Sparks", details, (), True)
    if not large:
        return Verdict(VerdictStatus.WARN, f"no measurement at {LARGE_BYTES >> 20} MiB or more: bandwidth not judged; "
                                           f"{unknown}", "run nccl-tests with -e 1G or more", details, (), False)
    best = max(r.best_busbw_gbps for r in large)
    if best < threshold:
        hint = _degraded_hint((), best, ())
        return Verdict(VerdictStatus.FAIL, f"the link delivers {best:.2f} GB/s of an expected >= {threshold:g}{hint}; "
                                           f"{unknown}", _degraded_fix() + "; and rerun with NCCL_DEBUG=INFO: NET/Socket "
                                           "would explain it first", details, (), False)
    return Verdict(VerdictStatus.PASS, f"busbw {best:.2f} GB/s >= {threshold:g}; {unknown}", "", details, (), False)


def _pass_cause(ranks: Sequence[RankLog], transports: Sequence[str], intra_only: bool,
                rows: Sequence[BandwidthRow]) -> str:
    if intra_only:
        return "intra-node only (P2P/SHM), and no network transport was required"
    devices = ", ".join(dict.fromkeys(d for r in ranks for d in r.ib_devices)) or "RDMA"
    cause = f"RDMA: {'/'.join(transports)} on {devices} for {len(ranks)} rank(s)"
    if any(r.gdr is False for r in ranks):
        # GB10 has no GPUDirect RDMA: the HCA reads and writes host memory, still without the CPU copying the data.
        cause += " (GDR off: GB10 has no GPUDirect RDMA, NCCL stages through host memory)"
    large = _large(rows)
    if large:
        return f"{cause}; best busbw {max(r.best_busbw_gbps for r in large):.1f} GB/s"
    return f"{cause}; transport proven, bandwidth not in this log: run `sparkcluster verify`"


def _summary(rank: RankLog) -> str:
    if rank.nccl_lines == 0:
        return f"{rank.source}: no NCCL lines; {len(rank.errors)} error line(s)"
    parts = [f"NCCL {rank.nccl_version}"] if rank.nccl_version else []  # only rank 0 prints the version
    if rank.rank is not None:
        parts.append(f"rank {rank.rank}")
    if rank.network:
        parts.append(f"network {rank.network}")
    if rank.ib_devices:
        parts.append(f"HCAs {','.join(rank.ib_devices)}")
    if rank.socket_interfaces:
        parts.append(f"sockets on {','.join(rank.socket_interfaces)}")
    if rank.oob_interface:
        parts.append(f"OOB {rank.oob_interface}")
    parts.append(f"channels via {','.join(rank.transports)}" if rank.channels else "no channels")
    return f"{rank.source}: {'; '.join(parts)}"
