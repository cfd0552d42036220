"""What `doctor` reads on a node beyond its facts, in the same single round trip: BIOS, CUDA, DGX OS release,
ConnectX firmware, the host's NCCL, /etc/nccl.conf and NCCL_* set outside sparkcluster's comm env, CmaTotal and
CmaFree, the kernel command line, the memlock limit, the serving image's ID with the NCCL and vLLM versions inside
it, and the kernel log of this boot (node/kernellog.py, bounded in lines and bytes).

One SSH exec per node runs the whole script (after the session's facts probe, engine/facts.py, whose section
format it shares). The parsers are pure and tested on outputs in the formats real nodes print.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any

from ..engine.command import Command
from ..engine.facts import split_sections
from .kernellog import KERNEL_LOG_SCRIPT, KernelLog, parse_kernel_log

# Inside the image, with no Python started (an import of vllm takes many seconds): the package folders'
# names carry the versions, and NCCL's library carries its own in its file name.
IMAGE_SCAN = r"""
for d in /usr/lib/python3*/site-packages /usr/lib/python3/dist-packages /usr/local/lib/python3*/dist-packages \
         /usr/local/lib/python3*/site-packages /opt/*/lib/python3*/site-packages /workspace/*/lib/python3*/site-packages; do
  for p in "$d"/vllm-*.dist-info "$d"/nvidia_nccl*-*.dist-info "$d"/torch-*.dist-info; do
    [ -d "$p" ] && echo "dist ${p##*/}"
  done
done
for l in /usr/lib/*-linux-gnu/libnccl.so.* /usr/local/lib/libnccl.so.* /opt/*/lib/libnccl.so.*; do
  [ -e "$l" ] && echo "lib ${l##*/}"
done
[ -f /etc/nccl.conf ] && sed 's/^/conf /' /etc/nccl.conf
echo scanned
"""

HEALTH_SCRIPT = r"""
sec() { printf '%s %s\n' '@@sparkcluster@@' "$1"; }
have() { command -v "$1" >/dev/null 2>&1; }
PATH="$PATH:/usr/sbin:/sbin"
sec d-release
[ -r /etc/dgx-release ] && grep -E '^DGX_(NAME|OTA_VERSION|SWBUILD_VERSION)=' /etc/dgx-release
sec d-bios
for f in bios_vendor bios_version bios_date product_name; do
  v=$(cat "/sys/class/dmi/id/$f" 2>/dev/null) || v=-; echo "$f=$v"
done
sec d-cuda
if have nvidia-smi; then nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1; fi
sec d-host-nccl
for l in /usr/lib/*-linux-gnu/libnccl.so.* /usr/lib64/libnccl.so.* /usr/local/lib/libnccl.so.*; do
  [ -e "$l" ] && echo "lib ${l##*/}"
done
have dpkg-query && dpkg-query -W -f='pkg ${Version}\n' libnccl2 2>/dev/null
sec d-firmware
for d in /sys/class/infiniband/*/device/net/*; do
  [ -e "$d" ] || continue
  n=${d##*/}; ethtool -i "$n" 2>/dev/null | sed "s/^/$n /"
done
sec d-nccl-conf
for f in /etc/nccl.conf "$HOME/.nccl.conf"; do
  [ -f "$f" ] && { echo "file $f"; head -n 50 "$f" | sed 's/^/line /'; }
done
sec d-nccl-env
env | grep '^NCCL_' | sed 's/^/env /'
grep -H -E '^[[:space:]]*(export[[:space:]]+)?NCCL_[A-Z0-9_]*=' /etc/environment /etc/profile /etc/profile.d/*.sh \
  /etc/bash.bashrc "$HOME/.bashrc" "$HOME/.profile" "$HOME/.bash_profile" 2>/dev/null | sed 's/^/rc /'
sec d-meminfo
grep -E '^(MemTotal|CmaTotal|CmaFree):' /proc/meminfo
sec d-cmdline
cat /proc/cmdline 2>/dev/null
sec d-memlock
ulimit -l
sec d-image
img=@IMAGE@
if [ -z "$img" ]; then echo skipped
elif ! have docker; then echo "missing docker"
else
  # Before bootstrap the login user may not be in group docker yet: passwordless sudo reads the same engine.
  d=docker; docker version >/dev/null 2>&1 || { sudo -n docker version >/dev/null 2>&1 && d="sudo -n docker"; }
  if id=$($d image inspect --format '{{.Id}}' "$img" 2>&1); then
    echo "id $id"
    $d image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$img" 2>/dev/null \
      | grep -E '^(NCCL_VERSION|CUDA_VERSION|VLLM_VERSION)=' | sed 's/^/env /'
    timeout 60 $d run --rm --network none --entrypoint sh "$img" -c @SCAN@ 2>&1 | tail -n 60
  # docker's error may begin with an empty line ("\nCannot connect to the Docker daemon..."): its first words
  else echo "absent $(printf '%s\n' "$id" | grep -m 1 .)"; fi
fi
sec d-kernel-log
@KERNEL_LOG@
"""

KNOWN_NCCL_ENV_KEYS = ("NCCL_VERSION", "CUDA_VERSION", "VLLM_VERSION")


@dataclass(frozen=True)
class ImageProbe:
    name: str
    id: str | None = None
    error: str | None = None  # docker missing, image absent, or the scan inside could not run
    absent: bool = False  # docker answered, and this node holds no such image (serve or `image sync` sends it)
    nccl: str | None = None
    vllm: str | None = None
    torch: str | None = None
    nccl_conf: tuple[str, ...] = ()  # /etc/nccl.conf inside the image, line by line
    env: dict[str, str] = field(default_factory=dict)  # NCCL_VERSION, CUDA_VERSION... of the image's config


@dataclass(frozen=True)
class NcclConf:
    path: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class NodeHealth:
    dgx_release: str | None
    bios_vendor: str | None
    bios_version: str | None
    bios_date: str | None  # as the DMI table has it: MM/DD/YYYY
    product: str | None
    cuda: str | None
    host_nccl: str | None
    firmware: dict[str, str]  # netdev -> ConnectX firmware-version
    nic_driver: dict[str, str]  # netdev -> "mlx5_core 24.10-..." (driver and its version)
    nccl_conf: tuple[NcclConf, ...]
    nccl_env: tuple[str, ...]  # "NCCL_X=1 (login environment)" or "NCCL_X=1 (~/.bashrc:12)"
    cma_total_kb: int | None
    mem_total_kb: int | None
    memlock: str | None  # "unlimited" or KiB, as `ulimit -l` prints it
    image: ImageProbe
    cma_free_kb: int | None = None  # above CmaTotal only on a kernel whose CMA accounting kho broke
    cmdline: str = ""  # /proc/cmdline: whether kho=off is in effect
    kernel_log: KernelLog = field(default_factory=KernelLog)

    @property
    def kho_off(self) -> bool:
        return "kho=off" in self.cmdline.split()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def health_command(image: str) -> Command:
    """Every doctor section in one remote command; `image` empty: no image is looked at (a host runtime)."""
    script = (HEALTH_SCRIPT.replace("@IMAGE@", shlex.quote(image))
              .replace("@SCAN@", shlex.quote(IMAGE_SCAN)).replace("@KERNEL_LOG@", KERNEL_LOG_SCRIPT))
    return Command(script, timeout=120)


# ---- parsers (pure) ---------------------------------------------------------------------------------
def _kv(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip().strip('"')
    return out


def _value(v: str | None) -> str | None:
    return v if v and v != "-" else None


def parse_release(lines: list[str]) -> str | None:
    kv = _kv(lines)
    if not kv:
        return None
    name = kv.get("DGX_NAME", "DGX")
    version = kv.get("DGX_OTA_VERSION") or kv.get("DGX_SWBUILD_VERSION")
    return f"{name} {version}" if version else name


NCCL_LIB = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")


def nccl_from_libs(lines: list[str]) -> str | None:
    """`lib libnccl.so.2.28.3` (the fully versioned file name) -> "2.28.3"; else a package's version."""
    for line in lines:
        if m := NCCL_LIB.search(line):
            return m[1]
    for line in lines:
        if line.startswith("pkg ") and line[4:].strip():
            return line[4:].strip().split("-")[0]
    return None


def parse_ethtool_i(lines: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """`NETDEV key: value` lines of `ethtool -i` -> (firmware by netdev, "driver version" by netdev)."""
    fields: dict[str, dict[str, str]] = {}
    for line in lines:
        netdev, _, rest = line.partition(" ")
        key, sep, value = rest.partition(":")
        if sep:
            fields.setdefault(netdev, {})[key.strip()] = value.strip()
    firmware = {n: f["firmware-version"] for n, f in fields.items() if f.get("firmware-version")}
    driver = {n: f"{f.get('driver', '?')} {f.get('version', '')}".strip() for n, f in fields.items() if "driver" in f}
    return firmware, driver


def parse_nccl_conf(lines: list[str]) -> tuple[NcclConf, ...]:
    files: list[NcclConf] = []
    for line in lines:
        if line.startswith("file "):
            files.append(NcclConf(line[5:].strip(), ()))
        elif line.startswith("line ") and files:
            files[-1] = NcclConf(files[-1].path, (*files[-1].lines, line[5:]))
    return tuple(files)


def parse_nccl_env(lines: list[str]) -> tuple[str, ...]:
    out = []
    for line in lines:
        if line.startswith("env "):
            out.append(f"{line[4:].strip()} (login environment)")
        elif line.startswith("rc "):
            where, _, setting = line[3:].partition(":")
            setting = re.sub(r"^\s*export\s+", "", setting).strip()
            out.append(f"{setting} ({where})")
    return tuple(out)


def parse_meminfo(lines: list[str]) -> dict[str, int]:
    """`CmaTotal:        0 kB` -> {"CmaTotal": 0}."""
    out = {}
    for line in lines:
        m = re.match(r"^(\w+):\s+(\d+)\s*kB", line.strip())
        if m:
            out[m[1]] = int(m[2])
    return out


DIST = re.compile(r"^(vllm|torch|nvidia_nccl\w*)-([^-]+)\.dist-info$")


def parse_image(name: str, lines: list[str]) -> ImageProbe:
    lines = [l.rstrip() for l in lines if l.strip()]
    if not lines:
        return ImageProbe(name, error="no answer from docker")
    first = lines[0]
    if first == "skipped":
        return ImageProbe(name)
    if first == "missing docker":
        return ImageProbe(name, error="docker is not installed")
    if first.startswith("absent"):
        why = first[7:].strip()
        if "permission denied" in why:
            return ImageProbe(name, error="the login user cannot use Docker (not in group docker, no passwordless "
                                          "sudo): `sparkcluster bootstrap` adds it")
        if "No such image" in why:
            return ImageProbe(name, error=f"no image {name!r}", absent=True)
        return ImageProbe(name, error=f"no image {name!r}: {why or 'docker gave no reason'}")
    if not first.startswith("id "):
        return ImageProbe(name, error=first)
    image_id = first[3:].strip()
    versions: dict[str, str] = {}
    env: dict[str, str] = {}
    conf: list[str] = []
    scanned = False
    other: list[str] = []
    for line in lines[1:]:
        kind, _, rest = line.partition(" ")
        if kind == "env":
            key, _, value = rest.partition("=")
            env[key] = value
        elif kind == "dist" and (m := DIST.match(rest.strip())):
            package = "nccl" if m[1].startswith("nvidia_nccl") else m[1]
            versions.setdefault(package, m[2])
        elif kind == "lib" and (m := NCCL_LIB.search(rest)):
            versions["nccl"] = m[1]  # the library the image links wins over a wheel beside it
        elif kind == "conf":
            conf.append(rest)
        elif line == "scanned":
            scanned = True
        else:
            other.append(line)
    error = None if scanned else ("could not look inside the image: " + (" ".join(other[-2:]) or "no shell in it?"))
    return ImageProbe(name, id=image_id, error=error, nccl=versions.get("nccl") or env.get("NCCL_VERSION"),
                      vllm=versions.get("vllm") or env.get("VLLM_VERSION"), torch=versions.get("torch"),
                      nccl_conf=tuple(conf), env=env)


def parse_health(text: str, image: str) -> NodeHealth:
    s = split_sections(text)
    bios = _kv(s.get("d-bios", []))
    firmware, driver = parse_ethtool_i(s.get("d-firmware", []))
    mem = parse_meminfo(s.get("d-meminfo", []))
    cuda = next((l.strip() for l in s.get("d-cuda", []) if l.strip()), None)
    memlock = next((l.strip() for l in s.get("d-memlock", []) if l.strip()), None)
    return NodeHealth(
        dgx_release=parse_release(s.get("d-release", [])),
        bios_vendor=_value(bios.get("bios_vendor")),
        bios_version=_value(bios.get("bios_version")),
        bios_date=_value(bios.get("bios_date")),
        product=_value(bios.get("product_name")),
        cuda=cuda,
        host_nccl=nccl_from_libs(s.get("d-host-nccl", [])),
        firmware=firmware,
        nic_driver=driver,
        nccl_conf=parse_nccl_conf(s.get("d-nccl-conf", [])),
        nccl_env=parse_nccl_env(s.get("d-nccl-env", [])),
        cma_total_kb=mem.get("CmaTotal"),
        mem_total_kb=mem.get("MemTotal"),
        memlock=memlock,
        image=parse_image(image, s.get("d-image", [])),
        cma_free_kb=mem.get("CmaFree"),
        cmdline=" ".join(l.strip() for l in s.get("d-cmdline", []) if l.strip()),
        kernel_log=parse_kernel_log(s.get("d-kernel-log", [])),
    )
