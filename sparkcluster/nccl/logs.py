"""Reading NCCL_DEBUG=INFO logs and the probe's output: what each rank's own lines say it used.

Pure functions over text. The line shapes are those NCCL prints on real Sparks (tests/fixtures/nccl holds them),
and the failures they reveal are docs/failure-modes.md F1-F8. Bandwidth alone is not proof of RDMA, so the
transport lines decide and the bandwidth only adds to them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..engine.nodetext import without_escapes

# The probe imports only the standard library at load time, so its arithmetic and table serve here too.
from . import probe
from .rings import QpFailure, RingLines

PROBE_RESULT = "SPARKCLUSTER_PROBE_RESULT"
PROBE_RANK = "SPARKCLUSTER_PROBE_RANK"
# NCCL's and the probe's lines are short; a longer one is a binary or mangled file, kept to its first part so that
# one 200 MB "line" costs no more memory than any other.
MAX_LINE_CHARS = 64 * 1024
Lines = str | Iterable[str]  # a whole text, or its lines as a file yields them (read once, never held whole)

_INTRA_NODE = frozenset({"P2P", "SHM", "NVLS"})

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
_COMM_ID = re.compile(r"\bcommId (0x[0-9a-fA-F]+)")
# NCCL >= 2.27 names the plugin it took ("Assigned NET plugin Socket to comm") before, or instead of, "Using network".
_ASSIGNED = re.compile(r"Assigned NET plugin (\S+) to comm")
_IB_INIT_FAILED = re.compile(r"Failed to initialize NET plugin IB\b")
# Any line of NCCL's IB plugin: with NCCL_NET=Socket, NCCL >= 2.27 loads the Socket plugin alone and prints none.
_IB_TRIED = re.compile(r"NET/IB|NET plugin IB|NCCL_IB_")
_PLUGINS_LOGGED = re.compile(r"(?:Initialized|Assigned) NET plugin ")
# nccl-tests starts a run with these; between them and the next run's lines, unprefixed NCCL lines are another run.
_NCCL_FRAME = "ncclTransport"  # a plain substring: every non-NCCL line of a 20,000-file bundle is tested for it
_TESTS_START = re.compile(r"^(?:\S*\s)?# (?:nThread \d+|Collective test starting)")
_ERRORS = re.compile(r"unhandled (?:system|cuda) error|ibv_\w+ failed|Got completion .*status=|IBV_WC_\w+_ERR"
                     r"|remote process exited|\bNCCL error\b|\bnccl(?:System|Remote|Internal)Error\b")


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
    comm_ids: tuple[str, ...] = ()  # the communicators this process joined: ranks sharing one are one run
    first_line: int = 0  # where this process's lines start and end in its file
    last_line: int = 0
    rings_connected: bool = False  # "Connected all rings": init got past the ring connect (rings.py)
    trees_connected: bool = False
    gdr: bool | None = None  # "GDR 0": no GPUDirect RDMA (every GB10), still RDMA; None: not said
    n_nodes: int | None = None  # "nRanks N nNodes M"
    qp_failures: tuple[QpFailure, ...] = ()
    cross_rail_hint: bool = False  # NCCL's hint after a timed-out QP: "NICs are not cross-rail connected"
    tree_connect_named: bool = False  # an error names ncclTransportTreeConnect
    ib_never_tried: bool = False  # NCCL (>= 2.27) logged its NET plugins, none IB: NCCL_NET (or a plugin) chose sockets

    @property
    def transports(self) -> tuple[str, ...]:
        if not self.channels and self.rings_connected and self.network and self.n_nodes != 1:
            # Rings connected with the channel lines filtered out (NCCL_DEBUG_SUBSYS) or scrolled away: they ran
            # over the network NCCL chose.
            return (f"NET/{self.network}",)
        return tuple(dict.fromkeys(c.transport for c in self.channels))

    @property
    def sockets_only(self) -> bool:
        """The only network line is NET/Socket listing its interfaces: NCCL initialises its Socket plugin only when
        IB found no device, so it chose sockets even where the log stops before saying so."""
        return bool(self.socket_interfaces) and not self.ib_devices and self.network is None

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
    comm_ids: list[str] = field(default_factory=list)
    first_line: int = 0
    last_line: int = 0
    ib_listed: bool = False  # a "NET/IB : Using [0]dev:1/RoCE" line named devices: NCCL took IB
    assigned: str | None = None
    ib_tried: bool = False
    plugins_logged: bool = False
    ring: RingLines = field(default_factory=RingLines)

    def nccl(self, level: str, msg: str, line_no: int) -> None:
        self.first_line = self.first_line or line_no
        self.last_line = line_no
        if m := _COMM_ID.search(msg):
            self._add(self.comm_ids, [m[1]])
        if m := _VERSION.search(msg):
            self.nccl_version = self.nccl_version or m[1]
        else:
            self.nccl_lines += 1
        self.ib_tried = self.ib_tried or bool(_IB_TRIED.search(msg))
        self.plugins_logged = self.plugins_logged or bool(_PLUGINS_LOGGED.search(msg))
        if level == "WARN":
            self.warnings.append(f"NCCL WARN {msg.strip()}")
        if _ERRORS.search(msg):
            self.error(f"NCCL {level} {msg.strip()}", line_no)
        if m := _CHANNEL.search(msg):
            self.channels.append(Channel(int(m["src"]), int(m["dst"]), _transport(m["via"]), line_no))
        elif m := _NETWORK.search(msg):
            self.network = _strip_version(m[1])
        elif m := _IB_USING.search(msg):
            listed = _IB_DEVICE.findall(m[1])
            self.ib_listed = self.ib_listed or bool(listed)
            self._add(self.ib_devices, listed)
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
        elif _NO_IB_DEVICE.search(msg) or _IB_INIT_FAILED.search(msg):
            self.no_ib_device = True
        elif m := _ASSIGNED.search(msg):
            self.assigned = _strip_version(m[1])
        elif "Init COMPLETE" in msg:
            self.init_complete = True
        if self.rank is None and (m := _RANK.search(msg)):
            self.rank = int(m[1])
        self.ring.read(msg, line_no)

    def error(self, line: str, line_no: int = 0) -> None:
        self._add(self.errors, [line])
        self.ring.read_error(line, line_no)

    @staticmethod
    def _add(values: list[str], new: Sequence[str]) -> None:
        values.extend(v for v in new if v not in values)

    def freeze(self) -> RankLog:
        # A log cut before "Using network X" still says which network NCCL took: the plugin it assigned, or the
        # IB devices NET/IB listed (NCCL prefers IB whenever it found one).
        network = self.network or self.assigned or ("IB" if self.ib_listed and not self.no_ib_device else None)
        return RankLog(
            source=self.source, host=self.host, rank=self.rank, nccl_lines=self.nccl_lines,
            nccl_version=self.nccl_version, network=network, ib_devices=tuple(self.ib_devices),
            socket_interfaces=tuple(self.socket_interfaces), socket_addresses=tuple(self.socket_addresses),
            oob_interface=self.oob_interface, bootstrap_interface=self.bootstrap_interface,
            ib_hca_env=self.ib_hca_env, no_ib_device=self.no_ib_device, ib_disabled=self.ib_disabled,
            init_complete=self.init_complete, channels=tuple(self.channels), warnings=tuple(self.warnings),
            errors=tuple(self.errors),
            truncated=self.nccl_lines > 0 and not self.channels and not self.ring.rings_connected,
            comm_ids=tuple(self.comm_ids), first_line=self.first_line, last_line=self.last_line,
            rings_connected=self.ring.rings_connected, trees_connected=self.ring.trees_connected, gdr=self.ring.gdr,
            n_nodes=self.ring.n_nodes, qp_failures=tuple(self.ring.qp_failures or ()),
            cross_rail_hint=self.ring.cross_rail_hint, tree_connect_named=self.ring.tree_connect_named,
            ib_never_tried=self.plugins_logged and not self.ib_tried,
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


def split_lines(text: Lines) -> Iterator[str]:
    """Each line without its end, cut to MAX_LINE_CHARS."""
    for line in text.splitlines() if isinstance(text, str) else text:
        yield line.rstrip("\r\n")[:MAX_LINE_CHARS]


def read_capped_lines(readline: Callable[[int], str]) -> Iterator[str]:
    """The lines of a text stream, each cut to MAX_LINE_CHARS: the rest of a longer line is read and dropped, piece by
    piece, so memory stays bounded however long it is."""
    while line := readline(MAX_LINE_CHARS):
        if not line.endswith("\n"):
            while (rest := readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass
        yield line.rstrip("\r\n")


def read_log(text: Lines, source: str = "log") -> list[RankLog]:
    """One RankLog per process (host:pid) for prefixed lines, else one for the whole text (one per nccl-tests run
    when unprefixed NCCL lines of several runs follow each other)."""
    whole = _Builder(source)
    earlier: list[RankLog] = []
    by_process: dict[tuple[str, str], _Builder] = {}
    for line_no, raw in enumerate(split_lines(text), 1):
        # Ray's log forwarding colours its prefix: an escape sequence would split it from the NCCL line.
        line = without_escapes(raw)
        if whole.nccl_lines and _TESTS_START.search(line):
            earlier.append(whole.freeze())
            whole = _Builder(f"{source} (run {len(earlier) + 1})")
        if m := _PREFIXED.search(line):
            key = (m["host"], m["pid"])
            if key not in by_process:
                by_process[key] = _Builder(f"{source} {m['host']}:{m['pid']}", host=m["host"])
            by_process[key].nccl(m["level"], m["msg"], line_no)
        elif m := _BARE.search(line):
            whole.nccl(m["level"], m["msg"], line_no)
        elif _ERRORS.search(line):
            # A Python traceback ("NCCL error in: ...") belongs to the process Ray names, when it names one.
            _owner(line, by_process, whole).error(line.strip(), line_no)
        elif _NCCL_FRAME in line:
            # A native frame of the traceback ("ncclTransportTreeConnect(ncclComm*)") names where init failed.
            _owner(line, by_process, whole).ring.read_error(line, line_no)
    ranks = [*earlier, *(b.freeze() for b in by_process.values())]
    # Unprefixed lines next to prefixed ones are mostly tracebacks that follow the ranks' own WARN lines.
    if (not by_process and not earlier) or whole.nccl_lines or whole.errors:
        ranks.append(whole.freeze())
    return ranks


def _owner(line: str, by_process: dict[tuple[str, str], _Builder], whole: _Builder) -> _Builder:
    ray = _RAY_PID.search(line)
    return next((b for (_, pid), b in by_process.items() if ray and pid == ray[1]), whole)


# ---- the probe's output ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BandwidthRow:
    op: str
    size_bytes: int
    time_us: float
    algbw_gbps: float  # GB/s (1e9 bytes), as nccl-tests prints
    busbw_gbps: float  # out-of-place where nccl-tests prints both
    in_place_busbw_gbps: float | None = None

    @property
    def best_busbw_gbps(self) -> float:
        return max(self.busbw_gbps, self.in_place_busbw_gbps or 0.0)


def busbw(op: str, size_bytes: int, seconds: float, world: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s with nccl-tests' factors (all_gather: `size_bytes` is the gathered size)."""
    try:
        return probe.bus_bandwidth(op, size_bytes, seconds, world)
    except KeyError:
        raise ValueError(f"unknown collective {op!r} (all_reduce, all_gather, reduce_scatter)") from None


def format_table(rows: Sequence[BandwidthRow]) -> str:
    """nccl-tests' layout, one block per collective, ending in its "# Avg bus bandwidth" line."""
    return probe.format_table([asdict(r) for r in rows])


def read_probe_output(text: Lines) -> tuple[list[BandwidthRow], list[dict[str, Any]]]:
    """The rows of the last SPARKCLUSTER_PROBE_RESULT line, and every rank's SPARKCLUSTER_PROBE_RANK dict by rank.
    A marker line of another shape (a hand-edited or foreign log) is skipped like a line cut short."""
    rows: list[BandwidthRow] = []
    ranks: dict[int, dict[str, Any]] = {}
    for line in split_lines(text):
        if (doc := _marked_json(line, PROBE_RESULT)) is not None:
            rows = _rows(found) if isinstance(found := doc.get("rows"), list) else rows
        elif (doc := _marked_json(line, PROBE_RANK)) is not None and _is_int(doc.get("rank")):
            ranks[doc["rank"]] = doc
    return rows, [ranks[r] for r in sorted(ranks)]


def _rows(docs: list[Any]) -> list[BandwidthRow]:
    try:
        return [BandwidthRow(str(r["op"]), int(r["size_bytes"]), float(r["time_us"]), float(r["algbw_gbps"]),
                             float(r["busbw_gbps"])) for r in docs]
    except (KeyError, TypeError, ValueError):
        return []


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _marked_json(line: str, marker: str) -> dict[str, Any] | None:
    # torchrun and Ray put their own prefixes before the marker; a line cut short by a killed rank is skipped.
    _, found, rest = line.partition(marker + " ")
    if not found:
        return None
    try:
        doc = json.loads(rest)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
