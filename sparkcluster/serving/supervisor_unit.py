"""The supervisor as a process of the served cluster: a systemd unit on the head (`Restart=always`, enabled, so that
after the head boots it brings the serve back), installed by `serve`, stopped first by `down` and by the next
`serve`, shown by `status`. Its loop is supervise/; what it needs on the head is put there here:
- sparkcluster itself, this very version, as files (it is pure Python) under ~/.local/share/sparkcluster/lib/DIGEST,
  run by the head's own python3 with the distribution's paramiko, PyYAML, Jinja2 and rich (bootstrap installs them);
- an inventory as the head reaches the nodes (their addresses, the head's own SSH key: the mesh NVIDIA's setup and
  bootstrap leave), and the serve as it was asked (its flags), in the supervisor's private folder;
- the endpoint's API key, for its probe, in a 0600 environment file systemd reads (never in the unit or argv).
A restart is exactly a serve: the supervisor runs `sparkcluster serve` with those flags (supervise/act.py)."""

from __future__ import annotations

import hashlib
import io
import json
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host, Inventory
from ..engine.session import Session
from ..engine.transport import Unreachable
from .apikey import API_KEY_ENV
from .incidents import EVENTS_FILE, STATE_FILE, SUPERVISOR_DIR, Incident, SupervisorState, parse_events, parse_state

UNIT = "sparkcluster-supervisor.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
SPEC_FILE = f"{SUPERVISOR_DIR}/serve.json"
INVENTORY_FILE = f"{SUPERVISOR_DIR}/inventory.yml"
SECRETS_FILE = f"{SUPERVISOR_DIR}/secrets.env"
KNOWN_HOSTS_FILE = f"{SUPERVISOR_DIR}/known_hosts"
HEAD_KEY = "~/.ssh/id_ed25519"  # the head's own key: bootstrap's SSH mesh authorizes it on every other node
LIB_ROOT = ".local/share/sparkcluster/lib"
HEAD_PYTHON = "/usr/bin/python3"
# What the supervisor imports beyond the standard library, as the distribution packages them (python3-paramiko ...).
NEEDS = ("paramiko", "yaml", "jinja2", "rich")
SUPERVISED_ENV = "SPARKCLUSTER_SUPERVISED"  # set in the serve the supervisor runs: it must not reinstall itself
# Flags of the control machine's serve that mean nothing on the head: the head's inventory replaces -i, and output
# is the supervisor's.
_DROPPED_WITH_VALUE = ("-i", "--inventory", "--forks", "--notify")
_DROPPED = ("--json", "--check", "--trust-new-host-keys", "--no-supervise", "--supervise")


@dataclass(frozen=True)
class SupervisorSpec:
    """What the supervisor serves and how it judges: the serve's own flags (the head's inventory in place of -i),
    what follows `--`, where incidents are posted, and the policy's settings that differ from its defaults."""

    serve_argv: tuple[str, ...]
    remote: tuple[str, ...] = ()
    notify: str | None = None
    policy: Mapping[str, Any] = field(default_factory=dict)
    ready_timeout_s: float = 1800.0
    version: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "serve_argv": list(self.serve_argv), "remote": list(self.remote),
                "notify": self.notify, "policy": dict(self.policy), "ready_timeout_s": self.ready_timeout_s}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SupervisorSpec:
        return cls(tuple(doc["serve_argv"]), tuple(doc.get("remote", ())), doc.get("notify"),
                   dict(doc.get("policy") or {}), float(doc.get("ready_timeout_s", 1800.0)), int(doc.get("version", 1)))


def serve_argv_for_head(own: Sequence[str]) -> tuple[str, ...]:
    """The serve's flags as given, without those the head's serve must not repeat (-i, --json, --check ...)."""
    return tuple(without_flags([w for w in own if w != "serve" and w not in _DROPPED], _DROPPED_WITH_VALUE))


def without_flags(argv: Sequence[str], names: Sequence[str]) -> list[str]:
    """`argv` less each of the flags `names` and its value (`--flag VALUE` or `--flag=VALUE`)."""
    kept: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            continue
        if word.split("=", 1)[0] in names:
            skip = "=" not in word
            continue
        kept.append(word)
    return kept


def package_archive() -> tuple[str, bytes]:
    """(digest, tar.gz) of this sparkcluster's own files, byte-for-byte reproducible: the digest names the folder on
    the head, so a serve from the same version copies nothing."""
    root = Path(__file__).resolve().parents[1]
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                   and p.suffix not in (".pyc",))
    buffer = io.BytesIO()
    digest = hashlib.sha256()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for path in files:
            name = f"sparkcluster/{path.relative_to(root).as_posix()}"
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + data)
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755 if path.stat().st_mode & 0o111 else 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return digest.hexdigest()[:16], buffer.getvalue()


def head_inventory_doc(inventory: Inventory, secrets: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The inventory as the head reaches the nodes: the same hosts and vars, with the head's own key and known_hosts
    (the control machine's key never leaves it); `secrets` (given to serve by flag) join its serve_env, which hands
    them to vLLM on stdin, as serve does."""
    def host_doc(h: Host) -> dict[str, Any]:
        doc: dict[str, Any] = {"address": h.address, "role": h.role, "port": h.port}
        if h.user:
            doc["user"] = h.user
        for pin in ("qsfp_interface", "fabric_ip"):
            if getattr(h, pin):
                doc[pin] = getattr(h, pin)
        if h.hcas:
            doc["hcas"] = list(h.hcas)
        own = {k: v for k, v in h.vars.items() if inventory.vars.get(k) != v}
        if own:
            doc["vars"] = _plain(own)
        return doc
    shared = {k: _plain(v) for k, v in inventory.vars.items() if k not in ("key", "known_hosts")}
    shared.update({"key": HEAD_KEY, "known_hosts": f"~/{KNOWN_HOSTS_FILE}"})
    if secrets:
        shared["serve_env"] = {**dict(shared.get("serve_env") or {}), **secrets}
    doc: dict[str, Any] = {"name": inventory.name, "vars": shared,
                           "hosts": {h.name: host_doc(h) for h in inventory.every_host}}
    if inventory.models:
        doc["models"] = list(inventory.models)
    return doc


def _plain(value: Any) -> Any:
    """A var as YAML writes it: mappings and sequences as dicts and lists (the loaded inventory holds read-only ones)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def unit_text(user: str, home: str, lib: str) -> str:
    """The systemd unit. Stopping it (systemd's default KillMode, control-group) ends the supervisor and a serve it
    is running, so that `down` or a serve by hand never races a recovery; the engines are not in its group (they
    are started over SSH, in sshd's sessions), so stopping the supervisor leaves the cluster serving."""
    run = shlex.join([HEAD_PYTHON, "-m", "sparkcluster", "supervise", "run"])
    return (f"[Unit]\nDescription=sparkcluster supervisor: keeps the serve on this head answering\n"
            f"After=network-online.target docker.service\nWants=network-online.target\n\n"
            f"[Service]\nType=simple\nUser={user}\nWorkingDirectory={home}\n"
            f"Environment=PYTHONPATH={home}/{lib}\nEnvironment=PYTHONUNBUFFERED=1\n"
            f"EnvironmentFile=-{home}/{SECRETS_FILE}\nExecStart={run}\n"
            f"Restart=always\nRestartSec=5\nTimeoutStopSec=20\n\n"
            f"[Install]\nWantedBy=multi-user.target\n")


def needs_command() -> Command:
    """Exits 0 where the head's python3 can run the supervisor; else prints what it lacks."""
    probe = ("import sys\nif sys.version_info < (3, 11): print('python3 is older than 3.11'); sys.exit(1)\n"
             f"missing = []\nfor m in {list(NEEDS)!r}:\n    try: __import__(m)\n"
             "    except ImportError: missing.append(m)\nif missing: print(' '.join(missing)); sys.exit(1)\n")
    return Command.argv([HEAD_PYTHON, "-c", probe], timeout=60)


@dataclass(frozen=True)
class Installed:
    lib: str
    copied_bytes: int  # 0: this version was already on the head


def known_hosts_text(session: Session) -> str:
    """known_hosts lines for every connected node at the address the inventory gives it, with the key this machine
    verified when it connected."""
    lines = []
    for host in session.hosts:
        kind, key = session.transport(host).host_key()
        name = host.address if host.port == 22 else f"[{host.address}]:{host.port}"
        lines.append(f"{name} {kind} {key}\n")
    return "".join(lines)


def forget_spec(session: Session) -> None:
    """The serve the supervisor would watch, removed (its unit stays stopped): `supervise on` then refuses."""
    try:
        session.run(session.head, Command(f"rm -f {SPEC_FILE} {SECRETS_FILE}"))
    except Unreachable:
        pass


def environment_line(name: str, value: str) -> str:
    """NAME="VALUE" as systemd's EnvironmentFile reads it back unchanged (quotes and backslashes escaped)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{name}="{escaped}"\n'


def install(session: Session, spec: SupervisorSpec, api_key: str | None,
            secrets: Mapping[str, str] | None = None) -> Installed:
    """Everything the supervisor needs on the head, then its unit enabled and started. SparkclusterError (with the
    fix) where the head cannot run it."""
    head = session.head
    needs = session.run(head, needs_command())
    if not needs.ok:
        lacking = (needs.stdout or needs.stderr).strip()[-200:]
        raise SparkclusterError(f"{head.name}: {HEAD_PYTHON} cannot run the supervisor (missing: {lacking})",
                                "run `sparkcluster bootstrap` (it installs python3-paramiko, python3-yaml, "
                                "python3-jinja2 and python3-rich on the head), or serve with --no-supervise")
    transport = session.transport(head)
    digest, archive = package_archive()
    lib = f"{LIB_ROOT}/{digest}"
    copied = 0
    if not session.run(head, Command(f"test -f {lib}/sparkcluster/__init__.py")).ok:
        tmp = f"{LIB_ROOT}/.{digest}.tar.gz"
        session.run(head, Command(f"mkdir -p {LIB_ROOT}"))
        transport.write_file_atomic(tmp, archive, 0o600)
        # Unpacked beside, then renamed: a copy cut short never looks like a complete one.
        unpack = session.run(head, Command(f"rm -rf {lib}.part && mkdir -p {lib}.part && tar -xzf {tmp} -C {lib}.part "
                                           f"&& rm -f {tmp} && rm -rf {lib} && mv {lib}.part {lib}", timeout=120))
        if not unpack.ok:
            raise SparkclusterError(f"{head.name}: unpacking sparkcluster for the supervisor failed: "
                                    f"{unpack.stderr_tail(3)}", f"check the free space in ~/{LIB_ROOT}")
        copied = len(archive)
    # A new serve starts the supervisor's count afresh: the breaker's restarts and a degraded layout were the last one's.
    session.run(head, Command(f"mkdir -p {SUPERVISOR_DIR} && chmod 700 {SUPERVISOR_DIR} && "
                              f"rm -f {SUPERVISOR_DIR}/breaker.json {SUPERVISOR_DIR}/degraded.json"))
    # The head reaches each node as this machine does, trusting the host keys this machine verified (never on first
    # use), with its own key, which the mesh authorized on the others and which is authorized here on itself.
    transport.write_file_atomic(KNOWN_HOSTS_FILE, known_hosts_text(session).encode(), 0o600)
    own = session.run(head, Command(f"k={HEAD_KEY}.pub; [ -f \"$k\" ] || exit 3; umask 077; touch ~/.ssh/authorized_keys "
                                    "&& { grep -qxF \"$(cat \"$k\")\" ~/.ssh/authorized_keys || cat \"$k\" >> "
                                    "~/.ssh/authorized_keys; }"))
    if not own.ok:
        raise SparkclusterError(f"{head.name}: it has no SSH key ({HEAD_KEY}) to reach the nodes with",
                                "run `sparkcluster bootstrap`: its SSH mesh gives the head a key every node accepts")
    transport.write_file_atomic(INVENTORY_FILE, yaml.safe_dump(head_inventory_doc(session.inventory, secrets),
                                                               sort_keys=False).encode(), 0o600)
    transport.write_file_atomic(SPEC_FILE, json.dumps(spec.to_json(), indent=2).encode(), 0o600)
    transport.write_file_atomic(SECRETS_FILE, environment_line(API_KEY_ENV, api_key).encode() if api_key else b"",
                                0o600)
    who = session.run(head, Command("id -un; printf %s \"$HOME\"")).stdout.splitlines()
    user, home = who[0], who[1]
    unit = unit_text(user, home, lib)
    tmp_unit = f"{SUPERVISOR_DIR}/.{UNIT}.tmp"
    transport.write_file_atomic(tmp_unit, unit.encode(), 0o644)
    enable = session.run(head, Command(f"install -m 644 {home}/{tmp_unit} {UNIT_PATH} && rm -f {home}/{tmp_unit} && "
                                       f"systemctl daemon-reload && systemctl enable --now {UNIT} && "
                                       f"systemctl restart {UNIT}", sudo=True, timeout=60))
    if not enable.ok:
        raise SparkclusterError(f"{head.name}: the supervisor's unit could not be installed: {enable.stderr_tail(3)}",
                                "check sudo on the head (`sparkcluster bootstrap -K` sets it up), or serve with "
                                "--no-supervise")
    return Installed(lib, copied)


def stop_command() -> Command:
    """Stops the supervisor and keeps it from starting at the next boot (idempotent; prints `supervisor` when it
    stopped one). Its files stay: `supervise on` starts it again on the same serve."""
    return Command(f"if [ -e {UNIT_PATH} ]; then if systemctl is-active --quiet {UNIT}; then echo supervisor; fi; "
                   f"systemctl disable --now {UNIT} >/dev/null 2>&1; fi; true", sudo=True, timeout=60)


def start_command() -> Command:
    return Command(f"test -e {UNIT_PATH} && systemctl enable --now {UNIT}", sudo=True, timeout=60)


@dataclass(frozen=True)
class SupervisorView:
    """The supervisor as `status` shows it: whether its unit runs, its state, its last incidents."""

    installed: bool
    active: bool
    state: SupervisorState | None
    incidents: tuple[Incident, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"installed": self.installed, "active": self.active,
                "state": None if self.state is None else self.state.to_json(),
                "incidents": [i.to_json() for i in self.incidents]}


VIEW_MARK = "@@sparkcluster-supervisor@@"


def view_command(last: int = 3) -> Command:
    """One command on the head printing the supervisor as status shows it: installed, active, state.json, the last
    `last` incidents, each part after a mark line."""
    return Command(f"echo {VIEW_MARK}; test -e {UNIT_PATH} && echo yes; echo {VIEW_MARK}; systemctl is-active {UNIT} "
                   f"2>/dev/null; echo {VIEW_MARK}; cat {STATE_FILE} 2>/dev/null; echo {VIEW_MARK}; "
                   f"tail -n {last} {EVENTS_FILE} 2>/dev/null; true", timeout=30)


def parse_view(stdout: str) -> SupervisorView | None:
    parts = stdout.split(f"{VIEW_MARK}\n")
    if len(parts) != 5:
        return None
    _, installed, active, state, events = parts
    return SupervisorView(installed.strip() == "yes", active.strip() == "active", parse_state(state),
                          tuple(parse_events(events)))


def read_view(session: Session, last: int = 3) -> SupervisorView | None:
    """The head's supervisor (one command), or None where the head cannot be asked."""
    try:
        return parse_view(session.run(session.head, view_command(last)).stdout)
    except Unreachable:
        return None


def read_events(session: Session) -> list[Incident]:
    data = session.transport(session.head).read_file(EVENTS_FILE)
    return parse_events((data or b"").decode(errors="replace"))
