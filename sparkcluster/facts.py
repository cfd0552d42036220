"""Host facts: one batched probe per host (a single remote command), parsed into typed HostFacts.

The parsers are pure functions tested on outputs captured on real Sparks (reference/spark-captures.md).
Facts cover what does not change during a run; a step probes what it mutates itself, inside check().
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

from .command import Command
from .transport import Transport

SECTION = "@@sparkcluster@@"

# POSIX sh, run as the login user. Every section prints even when its tool is missing, so one round trip
# always yields a complete picture; "@missing" marks an absent tool.
PROBE_SCRIPT = r"""
sec() { printf '%s %s\n' '@@sparkcluster@@' "$1"; }
have() { command -v "$1" >/dev/null 2>&1; }
PATH="$PATH:/usr/sbin:/sbin"
sec uname; uname -m; uname -r; hostname
sec os; ( . /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" )
sec id; id -un; id -u; id -Gn; echo "$HOME"
sec nvidia-smi
if have nvidia-smi; then nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>&1; echo "rc=$?"
else echo "@missing"; fi
sec ibdev2netdev
if have ibdev2netdev; then ibdev2netdev 2>&1; else echo "@missing"; fi
sec sys-infiniband
for d in /sys/class/infiniband/*; do
  [ -d "$d" ] || continue
  for p in "$d"/ports/*; do
    echo "${d##*/}|${p##*/}|$(ls "$d/device/net" 2>/dev/null | head -n 1)|$(cat "$p/state" 2>/dev/null)"
  done
done
sec gids
for d in /sys/class/infiniband/*; do
  [ -d "$d" ] || continue
  for p in "$d"/ports/*; do
    for g in "$p"/gids/*; do
      i=${g##*/}; t=$(cat "$p/gid_attrs/types/$i" 2>/dev/null) || continue
      echo "${d##*/} ${p##*/} $i $(cat "$g") $(cat "$p/gid_attrs/ndevs/$i" 2>/dev/null) $t"
    done
  done
done
sec ip-addr
if have ip; then ip -j addr 2>/dev/null; else echo "@missing"; fi
sec speeds
for i in /sys/class/net/*; do
  n=${i##*/}
  s=$(ethtool "$n" 2>/dev/null | sed -n 's/^[[:space:]]*Speed: //p')
  echo "$n ${s:--} $(cat "$i/speed" 2>/dev/null || echo -)"
done
sec docker
echo "cli=$(command -v docker)"
echo "dockerd=$(command -v dockerd)"
if [ -S /var/run/docker.sock ] || [ -S /run/docker.sock ]; then echo socket=yes; else echo socket=no; fi
echo "nvidia=$(command -v nvidia-container-runtime-hook nvidia-container-runtime nvidia-ctk | head -n 1)"
if have docker; then v=$(docker version --format '{{.Server.Version}}' 2>&1); echo "server_rc=$?"; echo "server=$v" | head -n 3; fi
sec hf
hf=${HF_HOME:-$HOME/.cache/huggingface}
echo "$hf"
d=$hf; while [ ! -e "$d" ]; do d=$(dirname "$d"); done
df -Pk "$d" 2>/dev/null | tail -n 1
"""


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
    ipv4: tuple[str, ...] = ()  # "a.b.c.d/prefix"
    speed_mbps: int | None = None


@dataclass(frozen=True)
class Docker:
    installed: bool
    daemon_up: bool
    usable: bool  # the login user can talk to the daemon without sudo
    server_version: str | None = None
    nvidia_runtime: bool = False
    error: str | None = None


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
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def gpu(self) -> Gpu | None:
        return self.gpus[0] if self.gpus else None

    def interface(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)

    def to_json(self) -> dict:
        return asdict(self)


PROBE = Command(PROBE_SCRIPT, timeout=60)


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
    """`nvidia-smi --query-gpu=name,driver_version[,compute_cap] --format=csv[,noheader]` -> GPUs, or an error."""
    rc_lines = [l for l in lines if re.fullmatch(r"rc=\d+", l.strip())]
    rc = int(rc_lines[-1].strip()[3:]) if rc_lines else 0
    body = [l for l in lines if l.strip() and l not in rc_lines]
    if body == ["@missing"]:
        return (), "nvidia-smi not found (no NVIDIA driver installed?)"
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


def parse_sys_infiniband(lines: list[str]) -> tuple[RdmaDevice, ...]:
    """`<hca>|<port>|<netdev>|<state file>` lines, e.g. `rocep1s0f1|1|enp1s0f1np1|4: ACTIVE` (netdev may be empty)."""
    devices = []
    for line in lines:
        parts = line.split("|")
        if len(parts) == 4 and parts[1].isdigit():
            devices.append(RdmaDevice(parts[0], int(parts[1]), parts[2], "ACTIVE" in parts[3]))
    return tuple(devices)


def parse_gids(lines: list[str]) -> tuple[Gid, ...]:
    gids = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[1].isdigit() and parts[2].isdigit():
            if set(parts[3].replace(":", "")) == {"0"}:
                continue  # an empty slot of the GID table
            gids.append(Gid(parts[0], int(parts[1]), int(parts[2]), parts[3], parts[4], parts[5]))
    return tuple(gids)


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
        ipv4 = tuple(f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet")
        out.append(Interface(name, link.get("operstate", "UNKNOWN"), int(link.get("mtu", 0)), ipv4, speeds.get(name)))
    return tuple(out)


def parse_docker(lines: list[str]) -> Docker:
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


def parse_df_free_bytes(line: str) -> int | None:
    """Last line of `df -Pk PATH`: the 4th column is the available KiB."""
    parts = line.split()
    return int(parts[3]) * 1024 if len(parts) >= 6 and parts[3].isdigit() else None


def parse_probe(text: str) -> HostFacts:
    s = split_sections(text)

    def line(section: str, index: int, default: str = "") -> str:
        lines = s.get(section, [])
        return lines[index].strip() if len(lines) > index else default

    gpus, gpu_error = parse_nvidia_smi_csv(s.get("nvidia-smi", ["@missing"]))
    rdma = parse_ibdev2netdev(s.get("ibdev2netdev", ["@missing"]))
    source = "ibdev2netdev"
    if rdma is None:  # ibdev2netdev ships with MLNX OFED only; sysfs is always there
        rdma, source = parse_sys_infiniband(s.get("sys-infiniband", [])), "sysfs"
    if not rdma:
        source = "none"
    speeds = parse_speeds(s.get("speeds", []))
    hf_lines = s.get("hf", [])
    uid = line("id", 1)
    return HostFacts(
        arch=line("uname", 0),
        kernel=line("uname", 1),
        hostname=line("uname", 2),
        os=line("os", 0),
        user=line("id", 0),
        uid=int(uid) if uid.isdigit() else -1,
        groups=tuple(line("id", 2).split()),
        home=line("id", 3),
        gpus=gpus,
        gpu_error=gpu_error,
        rdma=tuple(rdma),
        rdma_source=source,
        gids=parse_gids(s.get("gids", [])),
        interfaces=parse_ip_addr("\n".join(s.get("ip-addr", [])), speeds),
        docker=parse_docker(s.get("docker", [])),
        hf_cache=hf_lines[0].strip() if hf_lines else "",
        hf_free_bytes=parse_df_free_bytes(hf_lines[-1]) if len(hf_lines) > 1 else None,
    )


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
