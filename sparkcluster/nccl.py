"""Reading NCCL_DEBUG=INFO logs and the probe's output, and the verdict: did NCCL run over RDMA on the QSFP link?

Pure functions over text (report() only reads the files it is given). The line shapes and the bandwidth figures
are those of reference/spark-captures.md ("NCCL log lines") and dual-node-spec.md §2.5, §2.6, §3.4 and §4 (F1-F8).
Bandwidth alone is not proof of RDMA (§2.6), so the transport lines decide and the bandwidth only adds to them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The probe imports only the standard library at load time, so its arithmetic and table serve here too.
from . import nccl_probe as probe
from .errors import EXIT_FAILED, EXIT_OK, UsageError

# NVIDIA's pass mark is 21.875 GB/s (175 Gb/s) for a 16 GB all_gather on two Sparks (§2.5), where per-call overhead
# vanishes. The probe stops at 1 GiB (16 GB froze Sparks, F4), which costs a few GB/s, and MTU 1500 alone already
# gives 18.9-21 GB/s at 16 GB. One twin cannot exceed 12.5 GB/s (100 Gb/s), so 18 still separates "both twins" from
# "one twin" (≈11-12) with margin while leaving ~4 GB/s for the smaller sizes.
DEFAULT_MIN_BUSBW_GBPS = 18.0
ONE_TWIN_MAX_GBPS = 12.5
MISCONFIGURED_MAX_GBPS = 4.0  # F3: about 3 GB/s at every size with NCCL_IB_HCA unset, MTU 1500 or a dev-branch NCCL
LARGE_BYTES = 64 << 20  # below this, per-call latency dominates and busbw says little about the link
MANAGEMENT_INTERFACES = ("enP7s7",)

PROBE_RESULT = "SPARKCLUSTER_PROBE_RESULT"
PROBE_RANK = "SPARKCLUSTER_PROBE_RANK"

_INTRA_NODE = frozenset({"P2P", "SHM", "NVLS"})
_RDMA = frozenset({"NET/IB", "NET/IBext"})

# Color codes from Ray's log forwarding would split the prefix from the NCCL line.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "host:pid:tid [cudaDev] NCCL INFO msg"; WARN lines carry "file.cc:line" before "NCCL WARN". Anything may precede
# it (a Ray "(RayWorkerWrapper pid=123, ip=...)" prefix, a timestamp).
_PREFIXED = re.compile(r"(?:^|\s)(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):\d+ \[\d+\](?: \S+:\d+)? "
                       r"NCCL (?P<level>INFO|WARN) (?P<msg>.*)")
_BARE = re.compile(r"(?:^|\s)(?:\S+:\d+ )?NCCL (?P<level>INFO|WARN) (?P<msg>.*)")
_RAY_PID = re.compile(r"\(\w+ pid=(\d+)")
# "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0" and "Channel 00 : 0[0] -> 1[1] via P2P/CUMEM/read";
# the ring listing "Channel 00/02 :    0   1" has no arrow and is not a connection.
_CHANNEL = re.compile(r"Channel \d+(?:/\d+)? : (?P<src>\d+)\[\w+\] -> (?P<dst>\d+)\[\w+\]"
                      r"(?: \[(?:send|receive)\])? via (?P<via>\S+)")
_VERSION = re.compile(r"NCCL version (\S+)")
_NETWORK = re.compile(r"Using network (\S+)")
_IB_USING = re.compile(r"NET/IB ?: Using (.*)")
_IB_DEVICE = re.compile(r"\[\d+\]([\w.-]+):\d+/(?:IB|RoCE)")
_IB_VIRTUAL = re.compile(r"NET/IB ?: Made virtual device \[\d+\] name=(\S+)")
_GDR_HCA = re.compile(r"GPU Direct RDMA .*enabled for HCA \d+ '([^']+)'")
_SOCKET_USING = re.compile(r"NET/Socket ?: Using (.*)")
_SOCKET_IF = re.compile(r"\[\d+\]([^:\s\]]+):(\S+?)<\d+>")
_OOB = re.compile(r"OOB ([^:\s]+):\S+?<\d+>")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using ([^:\s]+):\S+?<\d+>")
_IB_HCA_ENV = re.compile(r"NCCL_IB_HCA set (?:by environment )?to ?(.*)$")
_IB_DISABLE = re.compile(r"NCCL_IB_DISABLE set by environment to (\d+)")
_NO_IB_DEVICE = re.compile(r"NET/IB ?: No device found")
_RANK = re.compile(r"\brank (\d+) n[Rr]anks \d+")
_ERRORS = re.compile(r"unhandled (?:system|cuda) error|ibv_\w+ failed|Got completion .*status=|IBV_WC_\w+_ERR"
                     r"|remote process exited|\bNCCL error\b|\bnccl(?:System|Remote|Internal)Error\b")
# The two twins (PCIe functions) of QSFP port N are rocep1s0fN and roceP2p1s0fN (spark-captures.md, ibdev2netdev).
_SPARK_HCA = re.compile(r"roce(?:P2)?p1s0f([01])")


@dataclass(frozen=True)
class Channel:
    rank_from: int
    rank_to: int
    transport: str  # normalised: "NET/IB", "NET/IBext", "NET/Socket", "P2P", "SHM", ...
    line: int


@dataclass(frozen=True)
class RankLog:
    """What one process's (or one file's) NCCL lines say."""

    source: str  # the file name, plus "host:pid" when the lines carry NCCL's prefix
    host: str | None
    rank: int | None  # from the first "rank R nranks N" init line
    nccl_lines: int  # NCCL INFO/WARN lines other than the version line
    nccl_version: str | None
    network: str | None  # "IB", "IBext" or "Socket"
    ib_devices: tuple[str, ...]
    socket_interfaces: tuple[str, ...]
    socket_addresses: tuple[str, ...]
    oob_interface: str | None
    bootstrap_interface: str | None
    ib_hca_env: str | None
    no_ib_device: bool
    ib_disabled: bool
    init_complete: bool
    channels: tuple[Channel, ...]
    warnings: tuple[str, ...]  # "NCCL WARN msg", without the host:pid prefix
    errors: tuple[str, ...]  # NCCL lines as "NCCL INFO|WARN msg", other lines (tracebacks) whole
    truncated: bool  # NCCL lines but no Channel line: the log stops before any connection was made

    @property
    def transports(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.transport for c in self.channels))

    @property
    def inter_node(self) -> tuple[str, ...]:
        return tuple(t for t in self.transports if t not in _INTRA_NODE)


@dataclass
class _Builder:
    source: str
    host: str | None = None
    rank: int | None = None
    nccl_lines: int = 0
    nccl_version: str | None = None
    network: str | None = None
    ib_devices: list[str] = field(default_factory=list)
    socket_interfaces: list[str] = field(default_factory=list)
    socket_addresses: list[str] = field(default_factory=list)
    oob_interface: str | None = None
    bootstrap_interface: str | None = None
    ib_hca_env: str | None = None
    no_ib_device: bool = False
    ib_disabled: bool = False
    init_complete: bool = False
    channels: list[Channel] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def nccl(self, level: str, msg: str, line_no: int) -> None:
        if m := _VERSION.search(msg):
            self.nccl_version = self.nccl_version or m[1]
        else:
            self.nccl_lines += 1
        if level == "WARN":
            self.warnings.append(f"NCCL WARN {msg.strip()}")
        if _ERRORS.search(msg):
            self.error(f"NCCL {level} {msg.strip()}")
        if m := _CHANNEL.search(msg):
            self.channels.append(Channel(int(m["src"]), int(m["dst"]), _transport(m["via"]), line_no))
        elif m := _NETWORK.search(msg):
            self.network = _strip_version(m[1])
        elif m := _IB_USING.search(msg):
            self._add(self.ib_devices, _IB_DEVICE.findall(m[1]))
            if oob := _OOB.search(m[1]):
                self.oob_interface = oob[1]
        elif m := _IB_VIRTUAL.search(msg):
            self._add(self.ib_devices, m[1].split("+"))  # NCCL_IB_MERGE_NICS joins twins as "a+b"
        elif m := _GDR_HCA.search(msg):
            self._add(self.ib_devices, [m[1]])
        elif m := _SOCKET_USING.search(msg):
            for name, address in _SOCKET_IF.findall(m[1]):
                self._add(self.socket_interfaces, [name])
                self._add(self.socket_addresses, [address])
        elif m := _BOOTSTRAP.search(msg):
            self.bootstrap_interface = m[1]
        elif m := _IB_HCA_ENV.search(msg):
            self.ib_hca_env = m[1].strip()
        elif m := _IB_DISABLE.search(msg):
            self.ib_disabled = m[1] != "0"
        elif _NO_IB_DEVICE.search(msg):
            self.no_ib_device = True
        elif "Init COMPLETE" in msg:
            self.init_complete = True
        if self.rank is None and (m := _RANK.search(msg)):
            self.rank = int(m[1])

    def error(self, line: str) -> None:
        self._add(self.errors, [line])

    @staticmethod
    def _add(values: list[str], new: Sequence[str]) -> None:
        values.extend(v for v in new if v not in values)

    def freeze(self) -> RankLog:
        return RankLog(
            source=self.source, host=self.host, rank=self.rank, nccl_lines=self.nccl_lines,
            nccl_version=self.nccl_version, network=self.network, ib_devices=tuple(self.ib_devices),
            socket_interfaces=tuple(self.socket_interfaces), socket_addresses=tuple(self.socket_addresses),
            oob_interface=self.oob_interface, bootstrap_interface=self.bootstrap_interface,
            ib_hca_env=self.ib_hca_env, no_ib_device=self.no_ib_device, ib_disabled=self.ib_disabled,
            init_complete=self.init_complete, channels=tuple(self.channels), warnings=tuple(self.warnings),
            errors=tuple(self.errors), truncated=self.nccl_lines > 0 and not self.channels,
        )


def _strip_version(name: str) -> str:
    """IBext_v10 -> IBext: the plugin API version says nothing about the transport."""
    return re.sub(r"_v\d+$", "", name)


def _transport(via: str) -> str:
    """NET/IBext_v10/1 -> NET/IBext, NET/IB/0(1)/GDRDMA -> NET/IB, P2P/CUMEM/read -> P2P, SHM/direct/direct -> SHM."""
    parts = via.split("/")
    if parts[0] == "NET" and len(parts) > 1:
        return "NET/" + _strip_version(parts[1])
    return parts[0]


def read_log(text: str, source: str = "log") -> list[RankLog]:
    """One RankLog per process (host:pid) for prefixed lines, else one for the whole text."""
    whole = _Builder(source)
    by_process: dict[tuple[str, str], _Builder] = {}
    for line_no, raw in enumerate(text.splitlines(), 1):
        line = _ANSI.sub("", raw)
        if m := _PREFIXED.search(line):
            key = (m["host"], m["pid"])
            if key not in by_process:
                by_process[key] = _Builder(f"{source} {m['host']}:{m['pid']}", host=m["host"])
            by_process[key].nccl(m["level"], m["msg"], line_no)
        elif m := _BARE.search(line):
            whole.nccl(m["level"], m["msg"], line_no)
        elif _ERRORS.search(line):
            # A Python traceback ("NCCL error in: ...") belongs to the process Ray names, when it names one.
            ray = _RAY_PID.search(line)
            owner = next((b for (_, pid), b in by_process.items() if ray and pid == ray[1]), whole)
            owner.error(line.strip())
    ranks = [b.freeze() for b in by_process.values()]
    # Unprefixed lines next to prefixed ones are mostly tracebacks that follow the ranks' own WARN lines.
    if not by_process or whole.nccl_lines or whole.errors:
        ranks.append(whole.freeze())
    return ranks


# ---- the probe's output ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BandwidthRow:
    op: str
    size_bytes: int
    time_us: float
    algbw_gbps: float  # GB/s (1e9 bytes), as nccl-tests prints
    busbw_gbps: float


def busbw(op: str, size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s with nccl-tests' factors (all_gather: `size_bytes` is the gathered size)."""
    try:
        return probe.bus_bandwidth(op, size_bytes, seconds, world)
    except KeyError:
        raise ValueError(f"unknown collective {op!r} (all_reduce, all_gather, reduce_scatter)") from None


def format_table(rows: Sequence[BandwidthRow]) -> str:
    """nccl-tests' layout, one block per collective, ending in its "# Avg bus bandwidth" line."""
    return probe.format_table([asdict(r) for r in rows])


def read_probe_output(text: str) -> tuple[list[BandwidthRow], list[dict]]:
    """The rows of the last SPARKCLUSTER_PROBE_RESULT line, and every rank's SPARKCLUSTER_PROBE_RANK dict by rank."""
    rows: list[BandwidthRow] = []
    ranks: dict[int, dict] = {}
    for line in text.splitlines():
        if (doc := _marked_json(line, PROBE_RESULT)) is not None:
            rows = [BandwidthRow(r["op"], int(r["size_bytes"]), float(r["time_us"]), float(r["algbw_gbps"]),
                                 float(r["busbw_gbps"])) for r in doc.get("rows", ())]
        elif (doc := _marked_json(line, PROBE_RANK)) is not None:
            ranks[int(doc["rank"])] = doc
    return rows, [ranks[r] for r in sorted(ranks)]


def _marked_json(line: str, marker: str) -> dict | None:
    # torchrun and Ray put their own prefixes before the marker; a line cut short by a killed rank is skipped.
    _, found, rest = line.partition(marker + " ")
    if not found:
        return None
    try:
        doc = json.loads(rest)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


# ---- the verdict -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    status: str  # "PASS" | "WARN" | "FAIL"
    cause: str
    fix: str
    details: tuple[str, ...]
    transports: tuple[str, ...]  # inter-node transports seen
    intra_node_only: bool


@dataclass(frozen=True)
class _Finding:
    status: str
    cause: str
    fix: str


_F1_FIX = ("give the container the RDMA devices: --privileged, or --device=/dev/infiniband --ulimit memlock=-1 "
           "--ulimit stack=67108864 (F1); `ls /dev/infiniband` inside it must list uverbs*")
_F6_FIX = ("NCCL_IB_HCA must list only the Up HCAs of the cabled port, in the same order on every node (F6); for a "
           "ring of three: NCCL_IB_MERGE_NICS=0 NCCL_NET_PLUGIN=none NCCL_IB_SUBNET_AWARE_ROUTING=1")
_F7_FIX = ("an RDMA transfer failed on a collective (F7): fix the fabric config (MTU 9000 on both ends, "
           "NCCL_IB_GID_INDEX on the RoCE v2 IPv4 GID of each HCA), then rerun the probe")


def judge(ranks: Sequence[RankLog], *, expected_hcas: Sequence[str] = (), qsfp_interfaces: Sequence[str] = (),
          management_interfaces: Sequence[str] = MANAGEMENT_INTERFACES, rows: Sequence[BandwidthRow] = (),
          min_busbw_gbps: float | None = None, require_network: bool = True) -> Verdict:
    """PASS only when every inter-node channel is NET/IB(ext) on the expected HCAs and the bandwidth holds.

    Findings are gathered in order of how much they explain, so the verdict's cause is the root one: an error
    before the fallback it caused, a fallback before the truncated log or low bandwidth it explains.
    """
    transports = tuple(dict.fromkeys(t for r in ranks for t in r.inter_node))
    intra_only = not transports and any(r.channels for r in ranks)
    qsfp_hint = ",".join(qsfp_interfaces) or "<the QSFP interface, e.g. enp1s0f1np1>"
    per_rank = (
        _error_findings,
        lambda r: _socket_findings(r, expected_hcas, management_interfaces, qsfp_hint, require_network),
        lambda r: _interface_findings(r, qsfp_interfaces, management_interfaces, qsfp_hint),
        _silence_findings,
        lambda r: _hca_findings(r, expected_hcas),
    )
    found: list[tuple[str, _Finding]] = []
    if intra_only and require_network:  # first, so that it is the cause unless something FAILs
        found.append(("all ranks", _Finding("WARN", "intra-node only (P2P/SHM): says nothing about the QSFP link",
                                            "run one rank on each of two Sparks to test the QSFP link")))
    found += [(r.source, f) for check in per_rank for r in ranks for f in check(r)]
    if not ranks:
        found.append(("input", _no_lines("the given logs")))
    found += [("all ranks", f) for f in _transport_findings(transports)]
    if transports and set(transports) <= _RDMA:
        found += [("probe", f) for f in _bandwidth_findings(transports, rows, min_busbw_gbps)]
    details = (*(_summary(r) for r in ranks), *(f"{source}: {f.status} {f.cause}" for source, f in found))
    worst = next((f for _, f in found if f.status == "FAIL"), None) or next((f for _, f in found), None)
    if worst:
        return Verdict(worst.status, worst.cause, worst.fix, details, transports, intra_only)
    return Verdict("PASS", _pass_cause(ranks, transports, intra_only, rows), "", details, transports, intra_only)


def _no_lines(where: str) -> _Finding:
    return _Finding("FAIL", f"no NCCL INFO lines in {where}",
                    "run with NCCL_DEBUG=INFO (e.g. `-e NCCL_DEBUG=INFO` on the container) and keep every "
                    "rank's output")


def _error_findings(rank: RankLog) -> list[_Finding]:
    lines = rank.errors or rank.warnings
    return [_error_finding(lines[0])] if lines else []


def _silence_findings(rank: RankLog) -> list[_Finding]:
    """Logs that cannot tell the transport: no NCCL lines, or no connection made yet."""
    if rank.nccl_lines == 0 and not rank.errors:
        return [_no_lines(rank.source)]
    if not rank.truncated:
        return []
    if rank.init_complete:
        # NCCL >= 2.22 connects channels lazily, at the first collective that needs them.
        return [_Finding("FAIL", "NCCL init completed but no channel was connected yet: the log does not show the "
                                 "transport", "capture the log after a collective has run (the probe, or after the "
                                              "first request to vLLM)")]
    return [_Finding("FAIL", "truncated: the log stops before NCCL connected any channel (init never finished)",
                     "look for the error that stopped init in every rank's log, or capture again after init")]


def _error_finding(line: str) -> _Finding:
    cause = f"NCCL error: {line[:240]}"
    if re.search(r"Got completion|IBV_WC_", line):
        return _Finding("FAIL", cause, _F7_FIX)
    if re.search(r"ibv_\w+ failed|unhandled system error", line):
        return _Finding("FAIL", cause, _F6_FIX)
    if "remote process exited" in line:
        return _Finding("FAIL", cause, "another rank died first: its log holds the first NCCL WARN")
    return _Finding("FAIL", cause, "read the NCCL WARN above; rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET "
                                   "for its context")


def _socket_findings(rank: RankLog, expected_hcas: Sequence[str], management: Sequence[str], qsfp_hint: str,
                     require_network: bool) -> list[_Finding]:
    uses_socket = (rank.network == "Socket" or rank.no_ib_device or rank.ib_disabled
                   or "NET/Socket" in rank.transports)
    if not uses_socket:
        return []
    # NCCL picks its network at init even when every peer is on this host: then no data went over it, but
    # between Sparks it would have.
    if rank.channels and not rank.inter_node:
        if not require_network:
            return []
        return [_Finding("WARN", f"NCCL chose network {rank.network or 'Socket'} here: between nodes it would fall "
                                 "back to TCP sockets", _socket_reason(rank, expected_hcas)[1])]
    why, fix = _socket_reason(rank, expected_hcas)
    on_management = [i for i in rank.socket_interfaces if i in management]
    if on_management:
        return [_Finding("FAIL", f"socket fallback on the management interface {on_management[0]} (10 GbE, about "
                                 f"1 GB/s): {why}", f"{fix}; and set NCCL_SOCKET_IFNAME={qsfp_hint}")]
    over = f" over {','.join(rank.socket_interfaces)}" if rank.socket_interfaces else ""
    return [_Finding("FAIL", f"socket fallback{over}: {why}", fix)]


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
    return ("NCCL chose NET/Socket (TCP) over NET/IB",
            f"check `ls /dev/infiniband` where NCCL runs (F1), NCCL_IB_DISABLE unset and NCCL_IB_HCA={both_twins}; "
            "NCCL_NET=IB makes NCCL fail instead of falling back")


def _known_hcas(names: Sequence[str], expected: Sequence[str]) -> bool:
    if not names:
        return False
    if expected:
        return all(n in expected for n in names)
    return all(_SPARK_HCA.fullmatch(n) for n in names)


def _interface_findings(rank: RankLog, qsfp: Sequence[str], management: Sequence[str],
                        qsfp_hint: str) -> list[_Finding]:
    """Where NCCL's own TCP connections (bootstrap, IB connection setup) run; socket data is _socket_findings'."""
    findings = []
    for role, interface in (("bootstrap", rank.bootstrap_interface), ("OOB (IB connection setup)", rank.oob_interface)):
        if interface is None:
            continue
        if interface in management:
            findings.append(_Finding("FAIL", f"NCCL {role} on the management interface {interface} (10 GbE)",
                                     f"set NCCL_SOCKET_IFNAME={qsfp_hint}: everything binds to the QSFP link, so a "
                                     "management link flap cannot break the communicator"))
        elif qsfp and interface not in qsfp:
            findings.append(_Finding("WARN", f"NCCL {role} on {interface}, not the QSFP interface ({qsfp_hint})",
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
            findings.append(_Finding("WARN", f"NCCL uses {', '.join(unexpected)}, not in the expected HCAs "
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
        findings.append(_Finding("WARN", f"one twin only: about half bandwidth (≈11-12 GB/s); NCCL uses {alone} "
                                         "alone", f"NCCL_IB_HCA={pair} (both twins of the cabled port, F2)"))
    return findings


def _transport_findings(transports: Sequence[str]) -> list[_Finding]:
    other = [t for t in transports if t not in _RDMA and t != "NET/Socket"]  # sockets are _socket_findings'
    if not other:
        return []
    return [_Finding("WARN", f"inter-node transport {', '.join(other)}, not NET/IB",
                     "between Sparks NCCL should use NET/IB (or NET/IBext with the HPC-X plugin): check NCCL_NET and "
                     "NCCL_NET_PLUGIN")]


def _bandwidth_findings(transports: Sequence[str], rows: Sequence[BandwidthRow],
                        min_busbw: float | None) -> list[_Finding]:
    if not rows:
        return []
    threshold = DEFAULT_MIN_BUSBW_GBPS if min_busbw is None else min_busbw
    large = [r for r in rows if r.size_bytes >= LARGE_BYTES]
    if not large:
        return [_Finding("WARN", f"no measurement at {LARGE_BYTES >> 20} MiB or more: bandwidth not judged",
                         "run the probe with --sizes up to 1G")]
    best = max(large, key=lambda r: r.busbw_gbps)
    if best.busbw_gbps >= threshold:
        return []
    if best.busbw_gbps <= MISCONFIGURED_MAX_GBPS:
        hint = " (≈3 GB/s at every size is F3)"
    elif best.busbw_gbps <= ONE_TWIN_MAX_GBPS:
        hint = " (one twin's ceiling: is only one HCA in use?)"
    else:
        hint = ""
    return [_Finding("WARN", f"transport is {'/'.join(transports)} but busbw {best.busbw_gbps:.1f} < {threshold:.1f} "
                             f"GB/s{hint}",
                     "check MTU 9000 on both ends, NCCL_IB_HCA = both twins, PFC / packet loss on a switch (F3/F8); "
                     "stop other GPU work and rerun")]


def _pass_cause(ranks: Sequence[RankLog], transports: Sequence[str], intra_only: bool,
                rows: Sequence[BandwidthRow]) -> str:
    if intra_only:
        return "intra-node only (P2P/SHM), and no network transport was required"
    devices = ", ".join(dict.fromkeys(d for r in ranks for d in r.ib_devices)) or "RDMA"
    cause = f"RDMA: {'/'.join(transports)} on {devices} for {len(ranks)} rank(s)"
    large = [r.busbw_gbps for r in rows if r.size_bytes >= LARGE_BYTES]
    return f"{cause}; best busbw {max(large):.1f} GB/s" if large else cause


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


# ---- `sparkcluster nccl-report LOGFILE...` -----------------------------------------------------------------
def report(paths: Sequence[str], *, json_output: bool, min_busbw: float | None) -> tuple[int, str]:
    """(exit code, text to print): 0 for PASS and WARN (the WARN is printed), 1 for FAIL."""
    ranks: list[RankLog] = []
    rows: list[BandwidthRow] = []
    probe_ranks: list[dict] = []
    for path in paths:
        text = _read(path)
        ranks += read_log(text, source=path)
        file_rows, file_ranks = read_probe_output(text)
        rows += file_rows
        probe_ranks += file_ranks
    verdict = judge(ranks, rows=rows, min_busbw_gbps=min_busbw)
    code = EXIT_FAILED if verdict.status == "FAIL" else EXIT_OK
    if json_output:
        doc = {**asdict(verdict), "rows": [asdict(r) for r in rows], "probe_ranks": probe_ranks,
               "ranks": [_rank_doc(r) for r in ranks]}
        return code, json.dumps(doc, indent=2)
    lines = [f"{verdict.status}  {verdict.cause}"]
    if verdict.fix:
        lines.append(f"  fix: {verdict.fix}")
    lines += [f"  {d}" for d in verdict.details]
    if rows:
        lines.append(format_table(rows))
    return code, "\n".join(lines)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file", "pass the NCCL log files (captured with NCCL_DEBUG=INFO)") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror})", "pass readable log files") from None


def _rank_doc(rank: RankLog) -> dict:
    doc = asdict(rank)
    del doc["channels"]  # hundreds of lines in a vLLM log; the transports say what they showed
    doc["transports"] = list(rank.transports)
    return doc
