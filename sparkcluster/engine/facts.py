"""Host facts: one batched probe per host (a single remote command), parsed into typed HostFacts.

The parsers are pure functions tested on outputs captured on real Sparks (tests/fixtures/).
Facts cover what does not change during a run; a step probes what it mutates itself, inside check().
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from ipaddress import IPv4Interface
from typing import Any

from .command import Command
from .nodetext import printable
from .parallel import parallel_map
from .remote import HF_HOME
from .transport import Transport, Unreachable

SECTION = "@@sparkcluster@@"

# POSIX sh, run as the login user. Every section prints even when its tool is missing, so one round trip
# always yields a complete picture; "@missing" marks an absent tool.
PROBE_SCRIPT = r"""
sec() { printf '%s %s\n' '@@sparkcluster@@' "$1"; }
have() { command -v "$1" >/dev/null 2>&1; }
PATH="$PATH:/usr/sbin:/sbin"
sec uname; uname -m; uname -r; uname -n
sec os; while IFS='=' read -r k v; do [ "$k" = PRETTY_NAME ] && { v=${v#\"}; echo "${v%\"}"; }; done < /etc/os-release
sec id; id; echo "$HOME"
sec nvidia-smi
if have nvidia-smi; then timeout -k 1 20 nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1; echo "rc=$?"
else echo "@missing"; fi
sec ibdev2netdev
if have ibdev2netdev; then ibdev2netdev 2>&1; else echo "@missing"; fi
sec sysfs
# One process reads every RDMA port state and GID slot (empty GID slots fail to read; -s hides that).
grep -s -H . /sys/class/infiniband/*/ports/*/state /sys/class/infiniband/*/ports/*/gids/* \
  /sys/class/infiniband/*/ports/*/gid_attrs/types/* /sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*
ls -d /sys/class/infiniband/*/device/net/* 2>/dev/null
sec ip-addr
if have ip; then ip -j addr 2>/dev/null; else echo "@missing"; fi
sec speeds
# ethtool only where a link is up: a down port has no speed, and each call is a process.
for i in /sys/class/net/*; do
  n=${i##*/}; read -r state < "$i/operstate" || state=
  [ "$state" = up ] || continue
  out=$(ethtool "$n" 2>/dev/null); s=
  case $out in *"Speed: "*) s=${out#*Speed: }; s=${s%%[[:space:]]*} ;; esac
  read -r sysfs < "$i/speed" 2>/dev/null || sysfs=-
  echo "$n ${s:--} ${sysfs:--}"
done
sec link-health
# Each RDMA device's PCIe link as negotiated against what it can do, and the kernel's ConnectX power and link
# messages (a re-plugged ConnectX-7 on a power-limited slot runs at a few GB/s until a reboot).
# Shell built-ins only (read, case): a process per value cost a node about 0.1 s of a probe that every run makes.
for d in /sys/class/infiniband/*/device; do
  n=; for x in "$d"/net/*; do [ -e "$x" ] && { n=${x##*/}; break; }; done; [ -n "$n" ] || continue
  line="pcie $n"
  for f in current_link_speed current_link_width max_link_speed max_link_width; do
    v=; { IFS= read -r v || [ -n "$v" ]; } 2>/dev/null < "$d/$f" || v=-; [ -n "$v" ] || v=-
    w=; while :; do case $v in *' '*) w="$w${v%% *}_"; v=${v#* } ;; *) w="$w$v"; break ;; esac; done
    line="$line $w"
  done
  echo "$line"
done
{ dmesg 2>/dev/null || sudo -n dmesg 2>/dev/null; } | grep -i -E 'mlx5.*(insufficient power|limited by|degraded)' \
  | tail -n 20 | sed 's/^/kmsg /'
sec docker
echo "cli=$(command -v docker)"
echo "dockerd=$(command -v dockerd)"
if [ -S /var/run/docker.sock ] || [ -S /run/docker.sock ]; then echo socket=yes; else echo socket=no; fi
echo "nvidia=$(command -v nvidia-container-runtime-hook nvidia-container-runtime nvidia-ctk | head -n 1)"
if have docker; then v=$(docker version --format '{{.Server.Version}}' 2>&1); echo "server_rc=$?"; echo "server=$v" | head -n 3; fi
sec hf
hf="@HF_HOME@"
echo "$hf"
d=$hf; while [ ! -e "$d" ]; do d=${d%/*}; d=${d:-/}; done
df -Pk "$d" 2>/dev/null | tail -n 1
""".replace("@HF_HOME@", HF_HOME)


@dataclass(frozen=True)
class Gpu:
    name: str
    driver_version: str
    compute_cap: str | None = None


@dataclass(frozen=True)
class RdmaDevice:
    hca: str
    port: int
    netdev: str
    up: bool


@dataclass(frozen=True)
class Gid:
    hca: str
    port: int
    index: int
    gid: str
    netdev: str
    type: str  # "RoCE v2", "IB/RoCE v1"

    @property
    def ipv4_mapped(self) -> bool:
        return self.gid.startswith("0000:0000:0000:0000:0000:ffff:")


@dataclass(frozen=True)
class Interface:
    name: str
    state: str  # UP, DOWN, UNKNOWN ...
    mtu: int
    ipv4: tuple[IPv4Interface, ...] = ()  # address and prefix; "a.b.c.d/prefix" text is parsed here, once
    speed_mbps: int | None = None
    mac: str = ""  # link/ether: who a neighbour is on the fabric, before any address (node/discovery.py)
    ipv6_link_local: tuple[str, ...] = ()  # fe80:: addresses without prefix: what a neighbour sees answering

    def __post_init__(self) -> None:
        object.__setattr__(self, "ipv4", tuple(IPv4Interface(a) for a in self.ipv4))

    def has_ip(self, ip: str) -> bool:
        return any(str(a.ip) == ip for a in self.ipv4)


@dataclass(frozen=True)
class Docker:
    installed: bool
    daemon_up: bool
    usable: bool  # the login user can talk to the daemon without sudo
    server_version: str | None = None
    nvidia_runtime: bool = False
    error: str | None = None


@dataclass(frozen=True)
class PcieLink:
    """An RDMA device's PCIe link: negotiated and possible speed ("32.0_GT/s_PCIe") and width ("4")."""

    netdev: str
    speed: str
    width: str
    max_speed: str
    max_width: str

    @property
    def degraded(self) -> bool:
        known = "-" not in (self.speed, self.width, self.max_speed, self.max_width)
        return known and (self.speed != self.max_speed or self.width != self.max_width)


@dataclass(frozen=True)
class HostFacts:
    arch: str
    kernel: str
    hostname: str
    os: str
    user: str
    uid: int
    groups: tuple[str, ...]
    home: str
    gpus: tuple[Gpu, ...]
    gpu_error: str | None
    rdma: tuple[RdmaDevice, ...]
    rdma_source: str  # "ibdev2netdev", "sysfs" or "none"
    gids: tuple[Gid, ...]
    interfaces: tuple[Interface, ...]
    docker: Docker
    hf_cache: str
    hf_free_bytes: int | None = None
    pcie_links: tuple[PcieLink, ...] = ()
    kernel_link_messages: tuple[str, ...] = ()  # mlx5 power / PCIe bandwidth / degradation lines of the kernel log

    @property
    def gpu(self) -> Gpu | None:
        return self.gpus[0] if self.gpus else None

    def interface(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for interface in doc["interfaces"]:
            interface["ipv4"] = [str(a) for a in interface["ipv4"]]
        return doc


PROBE = Command(PROBE_SCRIPT, timeout=60, name="the facts probe")


# ---- parsers (pure) ---------------------------------------------------------------------------------
def split_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith(SECTION + " "):
            current = sections.setdefault(line[len(SECTION) + 1 :].strip(), [])
        elif current is not None:
            current.append(line)
    return sections


def parse_nvidia_smi_csv(lines: list[str]) -> tuple[tuple[Gpu, ...], str | None]:
    """`nvidia-smi --query-gpu=name,driver_version[,compute_cap] --format=csv[,noheader]` -> GPUs, or an error.
    Read as a terminal shows it: escape sequences around a value (a wrapped nvidia-smi's) are no part of it."""
    lines = [printable(line) for line in lines]
    rc_lines = [l for l in lines if re.fullmatch(r"rc=\d+", l.strip())]
    rc = int(rc_lines[-1].strip()[3:]) if rc_lines else 0
    body = [l for l in lines if l.strip() and l not in rc_lines]
    if body == ["@missing"]:
        return (), "nvidia-smi not found (no NVIDIA driver installed?)"
    if rc in (124, 137):  # its own deadline in the probe: a wedged driver must not hold the facts (or a node) up
        return (), "nvidia-smi gave no answer within 20 s (a hung GPU driver?)"
    if rc != 0:
        return (), " ".join(body).strip() or f"nvidia-smi exited {rc}"
    gpus = []
    for line in body:
        parts = [p.strip() for p in line.split(",")]
        if parts[:2] == ["name", "driver_version"]:
            continue  # a header line
        if len(parts) < 2:
            continue
        cap = parts[2] if len(parts) > 2 and parts[2] not in ("[N/A]", "N/A", "") else None
        gpus.append(Gpu(parts[0], parts[1], cap))
    return tuple(gpus), None if gpus else "nvidia-smi listed no GPU"


IBDEV_LINE = re.compile(r"^(\S+) port (\d+) ==> (\S+) \((\w+)\)")


def parse_ibdev2netdev(lines: list[str]) -> tuple[RdmaDevice, ...] | None:
    """`rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)` lines; None when the tool is missing."""
    if [l for l in lines if l.strip()] == ["@missing"]:
        return None
    devices = []
    for line in lines:
        m = IBDEV_LINE.match(line.strip())
        if m:
            devices.append(RdmaDevice(m[1], int(m[2]), m[3], m[4] == "Up"))
    return tuple(devices)


SYSFS_PORT = re.compile(r"^/sys/class/infiniband/([^/]+)/ports/(\d+)/(state|gids/\d+|gid_attrs/types/\d+|gid_attrs/ndevs/\d+):(.*)$")
SYSFS_NETDEV = re.compile(r"^/sys/class/infiniband/([^/]+)/device/net/([^/]+)$")


def parse_sysfs(lines: list[str]) -> tuple[tuple[RdmaDevice, ...], tuple[Gid, ...]]:
    """`grep -H .` over /sys/class/infiniband (`<path>:<content>`) plus `ls -d .../device/net/*` lines ->
    RDMA devices (state `4: ACTIVE` = up) and the populated GID table entries."""
    states: dict[tuple[str, int], bool] = {}
    netdevs: dict[str, str] = {}
    slots: dict[tuple[str, int, int], dict[str, str]] = {}
    for line in lines:
        if m := SYSFS_NETDEV.match(line):
            netdevs.setdefault(m[1], m[2])
        elif m := SYSFS_PORT.match(line):
            hca, port, what, value = m[1], int(m[2]), m[3], m[4].strip()
            if what == "state":
                states[(hca, port)] = "ACTIVE" in value
            else:
                kind, index = what.rsplit("/", 1)
                slots.setdefault((hca, port, int(index)), {})[kind] = value
    devices = tuple(RdmaDevice(hca, port, netdevs.get(hca, ""), up) for (hca, port), up in sorted(states.items()))
    gids = tuple(
        Gid(hca, port, index, s["gids"], s.get("gid_attrs/ndevs", netdevs.get(hca, "")), s["gid_attrs/types"])
        for (hca, port, index), s in sorted(slots.items())
        # An unused slot reads as all zeros and has no type.
        if "gids" in s and "gid_attrs/types" in s and set(s["gids"].replace(":", "")) != {"0"}
    )
    return devices, gids


def parse_ethtool_speed(value: str) -> int | None:
    """`200000Mb/s` -> 200000; `Unknown!` or anything else -> None."""
    m = re.fullmatch(r"(\d+)Mb/s", value.strip())
    return int(m[1]) if m else None


def parse_speeds(lines: list[str]) -> dict[str, int | None]:
    """`<netdev> <ethtool speed or -> <sysfs speed or ->`; ethtool wins, sysfs -1 (no link) means unknown."""
    speeds: dict[str, int | None] = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 3:
            continue
        name, ethtool, sysfs = parts
        speed = parse_ethtool_speed(ethtool)
        if speed is None and sysfs.isdigit() and int(sysfs) > 0:
            speed = int(sysfs)
        speeds[name] = speed
    return speeds


def parse_ip_addr(text: str, speeds: dict[str, int | None]) -> tuple[Interface, ...]:
    """`ip -j addr` JSON -> interfaces with their IPv4 addresses."""
    try:
        links = json.loads(text)
    except json.JSONDecodeError:
        return ()
    out = []
    for link in links:
        name = link.get("ifname", "")
        ipv4 = tuple(IPv4Interface(f"{a['local']}/{a['prefixlen']}") for a in link.get("addr_info", []) if a.get("family") == "inet")
        link_local = tuple(str(a["local"]) for a in link.get("addr_info", [])
                           if a.get("family") == "inet6" and str(a.get("local", "")).startswith("fe80:"))
        out.append(Interface(name, link.get("operstate", "UNKNOWN"), int(link.get("mtu", 0)), ipv4, speeds.get(name),
                             str(link.get("address", "")), link_local))
    return tuple(out)


def parse_docker(lines: list[str]) -> Docker:
    lines = [printable(line) for line in lines]
    kv: dict[str, str] = {}
    server_lines: list[str] = []
    for line in lines:
        key, _, value = line.partition("=")
        if key in ("cli", "dockerd", "socket", "nvidia", "server_rc") and key not in kv:
            kv[key] = value.strip()
        elif key == "server" and "server" not in kv:
            kv["server"] = value.strip()
        else:
            server_lines.append(line)
    installed = bool(kv.get("cli") or kv.get("dockerd"))
    usable = kv.get("server_rc") == "0"
    error = None if usable else (" ".join([kv.get("server", ""), *server_lines]).strip() or None)
    return Docker(
        installed=installed,
        daemon_up=kv.get("socket") == "yes",
        usable=usable,
        server_version=kv.get("server") if usable else None,
        nvidia_runtime=bool(kv.get("nvidia")),
        error=error if installed else "docker is not installed",
    )


ID_PART = re.compile(r"(\w+)=(\d+)\(([^)]*)\)")


def parse_id(line: str) -> tuple[str, int, tuple[str, ...]]:
    """`uid=1000(spark) gid=1000(spark) groups=1000(spark),27(sudo),998(docker)` -> user, uid, group names."""
    user, uid, groups = "", -1, []
    for m in ID_PART.finditer(line):
        if m[1] == "uid":
            user, uid = m[3], int(m[2])
    if "groups=" in line:
        groups = [g.split("(")[1].rstrip(")") for g in line.split("groups=", 1)[1].split(",") if "(" in g]
    return user, uid, tuple(groups)


def parse_df_free_bytes(line: str) -> int | None:
    """Last line of `df -Pk PATH`: the 4th column is the available KiB."""
    parts = line.split()
    return int(parts[3]) * 1024 if len(parts) >= 6 and parts[3].isdigit() else None


def parse_probe(text: str) -> HostFacts:
    s = split_sections(text)

    def line(section: str, index: int, default: str = "") -> str:
        lines = s.get(section, [])
        return lines[index].strip() if len(lines) > index else default

    def shown(section: str, index: int) -> str:  # a value only ever shown or compared, never used as a name
        return printable(line(section, index)).strip()

    gpus, gpu_error = parse_nvidia_smi_csv(s.get("nvidia-smi", ["@missing"]))
    sysfs_rdma, gids = parse_sysfs(s.get("sysfs", []))
    rdma = parse_ibdev2netdev(s.get("ibdev2netdev", ["@missing"]))
    source = "ibdev2netdev"
    if rdma is None:  # ibdev2netdev ships with MLNX OFED only; sysfs is always there
        rdma, source = sysfs_rdma, "sysfs"
    if not rdma:
        source = "none"
    speeds = parse_speeds(s.get("speeds", []))
    hf_lines = s.get("hf", [])
    ident = parse_id(line("id", 0))
    return HostFacts(
        arch=shown("uname", 0),
        kernel=shown("uname", 1),
        hostname=shown("uname", 2),
        os=shown("os", 0),
        user=ident[0],
        uid=ident[1],
        groups=ident[2],
        home=line("id", 1),
        gpus=gpus,
        gpu_error=gpu_error,
        rdma=tuple(rdma),
        rdma_source=source,
        gids=gids,
        interfaces=parse_ip_addr("\n".join(s.get("ip-addr", [])), speeds),
        docker=parse_docker(s.get("docker", [])),
        hf_cache=hf_lines[0].strip() if hf_lines else "",
        hf_free_bytes=parse_df_free_bytes(hf_lines[-1]) if len(hf_lines) > 1 else None,
        **parse_link_health(s.get("link-health", [])),
    )


def parse_link_health(lines: list[str]) -> dict[str, Any]:
    """`pcie NETDEV SPEED WIDTH MAX_SPEED MAX_WIDTH` and `kmsg LINE` lines."""
    links, messages = [], []
    for raw in lines:
        kind, _, rest = raw.strip().partition(" ")
        if kind == "pcie" and len(fields := rest.split()) == 5:
            links.append(PcieLink(*fields))
        elif kind == "kmsg" and rest:
            messages.append(printable(rest))
    return {"pcie_links": tuple(links), "kernel_link_messages": tuple(messages)}


def driver_tuple(version: str) -> tuple[int, ...]:
    """'580.95.05' -> (580, 95, 5); '590.44' -> (590, 44). Non-numeric parts end the tuple."""
    out = []
    for part in version.split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)


def gather(transport: Transport) -> HostFacts:
    """All facts of one host in a single round trip. Raises Unreachable like any other command."""
    return parse_probe(transport.run(PROBE).stdout)


def gather_all(transports: Mapping[str, Transport], forks: int,
               on_abort: Callable[[], None]) -> dict[str, HostFacts | Unreachable]:
    """Every host's facts in parallel; an unreachable host's entry is its Unreachable error. `on_abort` closes
    the connections, so an interrupt does not wait for threads blocked on a remote command."""
    def one(name: str) -> tuple[str, HostFacts | Unreachable]:
        try:
            return name, gather(transports[name])
        except Unreachable as e:
            return name, e

    return dict(parallel_map(one, transports, workers=forks, on_abort=on_abort))
