"""`doctor --bundle FILE.tar.gz`: what a stranger needs to diagnose the cluster, from every node, in one archive:
the doctor's report and facts, the comm env, the netplan file sparkcluster wrote, ibdev2netdev, ethtool (settings,
FEC, driver and firmware) of each twin, the mlx5 lines of this boot's and the previous boot's kernel log,
`nvidia-smi -q`, versions, the last verify verdict and its log, the serve record, and the tail of vLLM's and Ray's
logs.

Every file passes the scrubber before it is written; MANIFEST.json lists each item per node (present or why not)
and what was scrubbed where, by kind and count, never by value."""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .. import __version__
from ..engine.command import Command, shell_path
from ..engine.facts import split_sections
from ..engine.inventory import Host
from ..engine.localfiles import replacing
from ..engine.scrub import ITEM_CAP_BYTES, Scrubber, capped, secrets_in
from ..engine.session import Session
from ..engine.transport import Unreachable
from ..nccl.lastlog import LAST_VERIFY_LOG
from ..nccl.lastverify import LAST_VERIFY_PATH
from ..node.addressing import NETPLAN_FILE
from ..node.kernellog import NO_SUCH_BOOT, NOT_PERSISTENT
from ..node.network import COMM_ENV_PATH
from ..serving.launch import CONTAINER
from ..serving.record import RECORD_FILE, read_record
from ..serving.runtime import RuntimeChoice
from ..serving.status import logs_command
from .run import DoctorReport

LOG_LINES = 200

ABSENT = "@absent "
RAY_LOGS = "/tmp/ray/session_latest/logs"

# file in the node's folder -> the shell that prints it (as the login user; `@absent WHY` when there is none)
NODE_ITEMS: dict[str, str] = {
    "comm.env": f"f={shell_path(COMM_ENV_PATH)}; if [ -f \"$f\" ]; then cat \"$f\"; else echo '{ABSENT}no comm env: "
                "bootstrap writes it'; fi",
    "ibdev2netdev.txt": f"if command -v ibdev2netdev >/dev/null; then ibdev2netdev 2>&1; else echo '{ABSENT}no "
                        "ibdev2netdev (MLNX OFED tools)'; fi",
    "ethtool.txt": "for d in /sys/class/infiniband/*/device/net/*; do [ -e \"$d\" ] || continue; n=${d##*/}; "
                   "echo \"== ethtool $n\"; ethtool \"$n\" 2>&1; echo \"== ethtool --show-fec $n\"; "
                   "ethtool --show-fec \"$n\" 2>&1; echo \"== ethtool -i $n\"; ethtool -i \"$n\" 2>&1; done",
    "nvidia-smi-q.txt": f"if command -v nvidia-smi >/dev/null; then nvidia-smi -q 2>&1; else echo '{ABSENT}no "
                        "nvidia-smi'; fi",
    "versions.txt": "uname -a; cat /etc/os-release 2>/dev/null; cat /etc/dgx-release 2>/dev/null; "
                    "echo \"== docker\"; docker version 2>&1 | head -n 30; echo \"== nvidia-ctk\"; "
                    "nvidia-ctk --version 2>&1 | head -n 3; echo \"== python\"; python3 --version 2>&1",
    "last-verify.json": f"f={shell_path(LAST_VERIFY_PATH)}; if [ -f \"$f\" ]; then cat \"$f\"; else "
                        f"echo '{ABSENT}never verified: run sparkcluster verify'; fi",
    "last-verify.log": f"f={shell_path(LAST_VERIFY_LOG)}; if [ -f \"$f\" ]; then tail -n 2000 \"$f\"; else "
                       f"echo '{ABSENT}verify kept no log on this node'; fi",
    "ray-logs.txt": f"T='for f in {RAY_LOGS}/raylet.out {RAY_LOGS}/gcs_server.out; do [ -f \"$f\" ] && "
                    f"{{ echo \"== $f\"; tail -n {LOG_LINES} \"$f\"; }}; done; true'; "
                    f"if docker exec {CONTAINER} true 2>/dev/null; then docker exec {CONTAINER} sh -c \"$T\"; "
                    "else sh -c \"$T\"; fi",
}
# Read as root (sudo; with -K's password where one was given): the netplan file is root's, and dmesg may be.
PRIVILEGED_ITEMS: dict[str, str] = {
    "netplan.yaml": f"if [ -f {NETPLAN_FILE} ]; then cat {NETPLAN_FILE}; else echo '{ABSENT}sparkcluster wrote no "
                    f"netplan file here ({NETPLAN_FILE}): the addresses were there before bootstrap'; fi",
    "kernel-mlx5.txt": "{ dmesg 2>/dev/null || journalctl -k --no-pager 2>/dev/null; } | grep -i mlx5 | tail -n 300; true",
    # The previous boot's too (the journal alone keeps it): a node that hung or rebooted left its evidence there;
    # journalctl's own words where it holds no such boot, or keeps no journal on disk, say why the file is empty.
    "kernel-mlx5-previous-boot.txt": "journalctl -k -b -1 -o short-iso --no-pager 2>&1 | grep -i -e mlx5 "
                                     f"-e '{NO_SUCH_BOOT}' -e '{NOT_PERSISTENT}' | tail -n 300; true",
}
HEAD_ITEMS = ("serve.json",)
NODE_FILES = (*NODE_ITEMS, *PRIVILEGED_ITEMS, "logs.txt", "facts.json", "health.json")


def _script(items: dict[str, str]) -> str:
    # Each marker starts on a line of its own: a file without a final newline (a JSON record) would hide it.
    return "\n".join(f"printf '\\n%s %s\\n' '@@sparkcluster@@' {name!r}\n{{ {shell} ; }} 2>&1"
                     for name, shell in items.items())


def sections(stdout: str) -> dict[str, str]:
    """Each item's text, as the node printed it (the blank line each marker's own newline adds is dropped)."""
    out = {}
    for name, lines in split_sections(stdout).items():
        if lines and lines[-1] == "":
            lines = lines[:-1]
        out[name] = "\n".join(lines) + "\n" if lines else ""
    return out


@dataclass
class Bundle:
    files: dict[str, str] = field(default_factory=dict)  # path in the archive -> text (scrubbed before it is added)
    items: dict[str, dict[str, str]] = field(default_factory=dict)  # node -> item -> "present" or why not
    scrubbed: dict[str, dict[str, int]] = field(default_factory=dict)  # path -> kind -> count
    capped: dict[str, int] = field(default_factory=dict)  # path -> bytes cut from its end


def _collect(session: Session, host: Host, head: Host, runtime: RuntimeChoice, record: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        plain = session.run(host, Command(_script(NODE_ITEMS), timeout=120))
        root = session.run(host, Command(_script(PRIVILEGED_ITEMS), sudo=True, timeout=60))
        logs = session.run(host, replace(logs_command(record, runtime, host, head, LOG_LINES, False), timeout=60))
    except Unreachable as e:
        return {name: f"{ABSENT}{host.name} unreachable: {e.message}" for name in (*NODE_ITEMS, *PRIVILEGED_ITEMS)}
    for result in (plain, root):
        out.update(sections(result.stdout))
    if not root.ok and not split_sections(root.stdout):
        for name in PRIVILEGED_ITEMS:
            out[name] = f"{ABSENT}sudo refused ({root.stderr_tail(2)}): pass -K for the sudo password\n"
    out["logs.txt"] = logs.stdout if logs.stdout.strip() else f"{ABSENT}no vLLM or Ray log (nothing served here)\n"
    return out


def collect(session: Session, report: DoctorReport) -> Bundle:
    bundle = Bundle()
    head = session.inventory.head
    record = read_record(session) if head.name in report.nodes else None
    if record is not None:
        chosen = RuntimeChoice(record.runtime, image=record.image)
    else:
        chosen = RuntimeChoice("host" if session.inventory.vars.get("runtime") == "host" else "docker")
    hosts = [h for h in session.hosts if h.name in report.nodes]
    collected = dict(zip((h.name for h in hosts), session.each(lambda h: _collect(session, h, head, chosen, record), hosts)))
    for host in session.hosts:
        got = collected.get(host.name, {})
        node = report.nodes.get(host.name)
        if node is not None:
            got["facts.json"] = json.dumps(node.facts.to_json(), indent=2) + "\n"
            got["health.json"] = json.dumps(node.health.to_json(), indent=2) + "\n"
        why = report.unreachable.get(host.name, "not collected")
        items = bundle.items.setdefault(host.name, {})
        for name in NODE_FILES:
            text = got.get(name, f"{ABSENT}{why}\n")
            items[name] = (text[len(ABSENT):].strip() if text.startswith(ABSENT) else
                           "present" if text.strip() else "empty: the node printed nothing for it")
            bundle.files[f"nodes/{host.name}/{name}"] = text
    if head.name in report.nodes:
        serve = session.transport(head).read_file(RECORD_FILE) if record is not None else None
        text = serve.decode(errors="replace") if serve else f"{ABSENT}no serve record on the head: nothing served\n"
        bundle.items[head.name]["serve.json"] = "present" if serve else text[len(ABSENT):].strip()
        bundle.files[f"nodes/{head.name}/serve.json"] = text
    bundle.files["doctor.json"] = json.dumps(report.to_json(), indent=2) + "\n"
    if session.inventory.path.is_file():
        bundle.files["inventory.yml"] = session.inventory.path.read_text(errors="replace")
    return bundle


def known_secrets(session: Session) -> list[str]:
    """The values the inventory holds under secret names (serve_env's HF_TOKEN...) and the sudo password."""
    found = secrets_in(session.inventory.vars)
    for host in session.hosts:
        found += secrets_in(host.vars)
    found += [t.sudo_password for t in session.transports.values() if t.sudo_password]
    return found


def write(bundle: Bundle, path: Path, scrubber: Scrubber) -> None:
    """The archive, every file capped and scrubbed, with MANIFEST.json; written to a temporary file, then renamed."""
    root = path.name.removesuffix(".tar.gz").removesuffix(".tgz") or "sparkcluster-bundle"
    texts: dict[str, str] = {}
    for name, text in bundle.files.items():
        text, cut = capped(text)
        if cut:
            bundle.capped[name] = cut
        clean, found = scrubber.scrub(text)
        texts[name] = clean
        if found:
            bundle.scrubbed[name] = dict(found)
    total: Counter[str] = Counter()
    for counts in bundle.scrubbed.values():
        total.update(counts)
    manifest = {
        "sparkcluster": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "items": bundle.items,
        "scrubbed": {"note": "secret values were replaced by [scrubbed]; counted here by kind, never shown",
                     "total": dict(total), "files": bundle.scrubbed},
        "capped": {"note": f"each file is cut to its first {ITEM_CAP_BYTES} bytes; bytes cut per file",
                   "files": bundle.capped},
    }
    texts["MANIFEST.json"] = json.dumps(manifest, indent=2) + "\n"
    _archive(path, root, texts)


def _archive(path: Path, root: str, texts: dict[str, str]) -> None:
    """Through engine/localfiles.py's writer (never through a link planted at the temporary's name or the target),
    private (0600): the scrubber removes the secrets it knows, not every one a log may hold."""
    with replacing(path, 0o600) as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for name, text in sorted(texts.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{root}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
