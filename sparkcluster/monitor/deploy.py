"""What `monitor up`, `down` and `status` do at each place: each node's exporter, and the distribution's Prometheus
(and, with --notify, its Alertmanager) on the head (or this machine). Each piece is checked first (read-only: what is there, what runs), then changed
only where it differs, so a second `up` changes nothing; `--check` stops after the check. Everything started is
detached (setsid nohup, stdin from /dev/null, a pid file), as the host runtime starts vLLM (serving/runtime.py),
so the SSH session closing never stops it. Prometheus' data folder is kept by `down` unless purged.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .bundle import exporter_sha256, exporter_zip
from .place import Place

MONITOR_DIR = ".local/share/sparkcluster/monitor"  # under the login user's home, at each place
EXPORTER = f"{MONITOR_DIR}/sparkcluster-exporter.pyz"
PROMETHEUS_DIR = f"{MONITOR_DIR}/prometheus"
ALERTMANAGER_DIR = f"{MONITOR_DIR}/alertmanager"
DEFAULT_LISTEN = "127.0.0.1:9095"  # loopback: `status` asks it over SSH; Debian's own service keeps 9090
ALERTMANAGER_LISTEN = "127.0.0.1:9096"  # beside Prometheus, which alone talks to it; Debian's own keeps 9093
RETENTION = "30d"
READY_S = 15
Status = Literal["ok", "changed", "failed", "would change"]


@dataclass(frozen=True)
class Outcome:
    place: str
    piece: str  # "exporter", "prometheus"
    status: Status
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"place": self.place, "piece": self.piece, "status": self.status, "reason": self.reason}


def _state(place: Place, prefix: str, files: Mapping[str, str], tools: tuple[str, ...] = ()) -> dict[str, str]:
    """`key=value` lines: each file's sha256 (empty: absent), the args it was started with, whether it runs."""
    lines = [f"d={shlex.quote(MONITOR_DIR)}"]
    for key, path in files.items():
        lines.append(f"echo \"{key}=$(sha256sum {shlex.quote(path)} 2>/dev/null | cut -d' ' -f1)\"")
    lines += [f"echo \"args=$(cat {shlex.quote(prefix)}.args 2>/dev/null)\"",
              f"if kill -0 \"$(cat {shlex.quote(prefix)}.pid 2>/dev/null)\" 2>/dev/null; then echo running=yes; "
              "else echo running=no; fi",
              f"for t in {' '.join(tools)}; do command -v $t >/dev/null 2>&1 && echo have_$t=yes; done; true"]
    ran = place.run("\n".join(lines), timeout=30)
    return dict(line.split("=", 1) for line in ran.stdout.splitlines() if "=" in line)


def _stop(prefix: str) -> str:
    """Stop the process group a pid file names: TERM, up to 10 s, then KILL; the pid file goes."""
    p = shlex.quote(prefix)
    return (f"p=$(cat {p}.pid 2>/dev/null); if [ -n \"$p\" ] && kill -0 \"$p\" 2>/dev/null; then "
            f"kill -TERM -- -\"$p\" 2>/dev/null || kill -TERM \"$p\"; i=0; "
            f"while kill -0 \"$p\" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.2; i=$((i+1)); done; "
            f"kill -KILL -- -\"$p\" 2>/dev/null; echo stopped; fi; rm -f {p}.pid")


def _start(prefix: str, argv: str, ready_url: str, python: str) -> str:
    """Started detached, its args remembered; ready once `ready_url` answers (within READY_S), else its log's tail."""
    p = shlex.quote(prefix)
    probe = f"{python} -c 'import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2).read()'"
    return (f"umask 077; {_stop(prefix)} >/dev/null\n"
            f"printf '%s\\n' {shlex.quote(argv)} > {p}.args\n"
            f"setsid nohup {argv} > {p}.log 2>&1 < /dev/null &\necho $! > {p}.pid\n"
            f"i=0; while [ $i -lt {READY_S * 5} ]; do {probe} {shlex.quote(ready_url)} >/dev/null 2>&1 && exit 0; "
            f"kill -0 \"$(cat {p}.pid)\" 2>/dev/null || break; sleep 0.2; i=$((i+1)); done\n"
            f"echo 'did not answer at {ready_url}:' >&2; tail -n 5 {p}.log >&2; exit 1")


def _folders(*paths: str) -> str:
    return f"umask 077; mkdir -p {' '.join(shlex.quote(p) for p in paths)} && chmod 700 {shlex.quote(MONITOR_DIR)}"


# ---- a node's exporter ---------------------------------------------------------------------------------------

def exporter_argv(python: str, listen: str, port: int) -> str:
    return f"{shlex.quote(python)} {EXPORTER} --listen {shlex.quote(listen)} --port {port}"


def exporter_up(place: Place, python: str, listen: str, port: int, check: bool) -> Outcome:
    argv = exporter_argv(python, listen, port)
    state = _state(place, f"{MONITOR_DIR}/exporter", {"sha": EXPORTER})
    current = state.get("sha") == exporter_sha256()
    if current and state.get("args") == argv and state.get("running") == "yes":
        return Outcome(place.name, "exporter", "ok", f"serving {listen}:{port}, current")
    why = ("not installed" if not state.get("sha") else "a different version" if not current
           else "started with other settings" if state.get("args") != argv else "not running")
    if check:
        return Outcome(place.name, "exporter", "would change", f"would start it ({why})")
    ran = place.run(_folders(MONITOR_DIR))
    if ran.ok and not current:
        place.write(EXPORTER, exporter_zip(), 0o600)
    here = "127.0.0.1" if listen == "0.0.0.0" else listen  # asked from the node itself
    ran = ran if not ran.ok else place.run(
        _start(f"{MONITOR_DIR}/exporter", argv, f"http://{_host_port(here, port)}/metrics", python), timeout=60)
    if not ran.ok:
        return Outcome(place.name, "exporter", "failed", f"{why}; starting it failed: {_tail(ran.stderr)}")
    return Outcome(place.name, "exporter", "changed", f"started ({why}), serving {listen}:{port}")


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _tail(text: str) -> str:
    return " ".join(text.strip().splitlines()[-3:])[:300] or "no message"


# ---- Prometheus and Alertmanager -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Daemon:
    """One of the distribution's servers, as `up` installs, configures, checks, starts and reloads it."""

    piece: str  # "prometheus", "alertmanager": what outcomes and `down` call it
    package: str  # the Debian/Ubuntu package
    tools: tuple[str, ...]  # what must be on PATH: the server and its config checker
    folder: str  # its configuration and data, under the home
    main_file: str  # its configuration's name in the folder
    check_line: str  # the checker's shell line, run from the home
    argv: str
    listen: str

    @property
    def prefix(self) -> str:
        return f"{self.folder}/{self.piece}"


def prometheus(listen: str) -> Daemon:
    d = f"\"$HOME\"/{PROMETHEUS_DIR}"
    return Daemon("prometheus", "prometheus", ("prometheus", "promtool"), PROMETHEUS_DIR, "prometheus.yml",
                  f"promtool check config {PROMETHEUS_DIR}/prometheus.yml",
                  f"prometheus --config.file={d}/prometheus.yml --storage.tsdb.path={d}/data "
                  f"--web.listen-address={shlex.quote(listen)} --storage.tsdb.retention.time={RETENTION}", listen)


def alertmanager(listen: str = ALERTMANAGER_LISTEN) -> Daemon:
    d = f"\"$HOME\"/{ALERTMANAGER_DIR}"
    # --cluster.listen-address= (empty): one Alertmanager, no gossip port opened to the LAN
    return Daemon("alertmanager", "prometheus-alertmanager", ("prometheus-alertmanager", "amtool"), ALERTMANAGER_DIR,
                  "alertmanager.yml", f"amtool check-config {ALERTMANAGER_DIR}/alertmanager.yml",
                  f"prometheus-alertmanager --config.file={d}/alertmanager.yml --storage.path={d}/data "
                  f"--web.listen-address={shlex.quote(listen)} --cluster.listen-address=", listen)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _install(package: str) -> str:
    return ("if [ \"$(id -u)\" = 0 ]; then s=; else s='sudo -n'; fi; "
            f"DEBIAN_FRONTEND=noninteractive $s apt-get install -y -q {package}")


def daemon_up(place: Place, daemon: Daemon, files: Mapping[str, bytes], check: bool) -> Outcome:
    """`files`: name under the daemon's folder (prometheus.yml, rules/...) -> content, private to the login user
    (alertmanager.yml holds the --notify URL, which may carry a token)."""
    state = _state(place, daemon.prefix, {name: f"{daemon.folder}/{name}" for name in files}, daemon.tools)
    stale = [name for name, data in files.items() if state.get(name) != _sha(data)]
    installed = all(state.get(f"have_{tool}") == "yes" for tool in daemon.tools)
    running, same_args = state.get("running") == "yes", state.get("args") == daemon.argv
    name = daemon.piece
    if installed and not stale and running and same_args:
        return Outcome(place.name, name, "ok", f"serving {daemon.listen}, configuration current")
    todo = ([] if installed else [f"install the distribution's {daemon.package}"]) + \
        ([f"write {', '.join(stale)}"] if stale else []) + \
        (["reload it"] if running and same_args else ["restart it"] if running else ["start it"])
    if check:
        return Outcome(place.name, name, "would change", f"would {', '.join(todo)}")
    if not installed:
        ran = place.run(_install(daemon.package), timeout=600)
        if not ran.ok:
            return Outcome(place.name, name, "failed",
                           f"apt-get install {daemon.package} failed: {_tail(ran.stderr)}; install it there "
                           f"(`sudo apt-get install {daemon.package}`) and run `sparkcluster monitor up` again")
    folders = {f"{daemon.folder}/{n.rpartition('/')[0]}" for n in files if "/" in n} | {f"{daemon.folder}/data"}
    ran = place.run(_folders(*sorted(folders)))
    if not ran.ok:
        return Outcome(place.name, name, "failed", f"could not make {daemon.folder}: {_tail(ran.stderr)}")
    for file in stale:
        place.write(f"{daemon.folder}/{file}", files[file], 0o600)
    checked = place.run(daemon.check_line, timeout=60)
    if not checked.ok:
        return Outcome(place.name, name, "failed", f"{daemon.tools[1]} rejects the configuration: "
                       f"{_tail(checked.stdout + checked.stderr)}")
    if running and same_args:
        ran = place.run(f"kill -HUP \"$(cat {daemon.prefix}.pid)\"")  # both reread their files on SIGHUP
    else:
        ran = place.run(_start(daemon.prefix, daemon.argv, f"http://{daemon.listen}/-/ready", "python3"), timeout=90)
    if not ran.ok:
        return Outcome(place.name, name, "failed", f"{', '.join(todo)}: {_tail(ran.stderr)}")
    return Outcome(place.name, name, "changed", f"{', '.join(todo)}; serving {daemon.listen}")


def prometheus_up(place: Place, files: Mapping[str, bytes], listen: str, check: bool) -> Outcome:
    return daemon_up(place, prometheus(listen), files, check)


# ---- down and status ----------------------------------------------------------------------------------------

PREFIXES = {"prometheus": f"{PROMETHEUS_DIR}/prometheus", "alertmanager": f"{ALERTMANAGER_DIR}/alertmanager",
            "exporter": f"{MONITOR_DIR}/exporter"}
DATA = {"prometheus": PROMETHEUS_DIR, "alertmanager": ALERTMANAGER_DIR}


def stop(place: Place, piece: str, purge: bool) -> Outcome:
    prefix = PREFIXES[piece]
    gone = (f"; rm -rf {DATA[piece]}" if piece in DATA else f"; rm -f {EXPORTER} {prefix}.args {prefix}.log"
            ) if purge else ""
    ran = place.run(_stop(prefix) + gone, timeout=30)
    if not ran.ok:
        return Outcome(place.name, piece, "failed", _tail(ran.stderr))
    said = "stopped" if "stopped" in ran.stdout else "not running"
    kept = (", its data removed" if purge else ", its data kept (--purge removes it)") if piece in DATA else ""
    return Outcome(place.name, piece, "changed" if "stopped" in ran.stdout or purge else "ok", said + kept)


def running(place: Place, piece: str) -> bool:
    return _state(place, PREFIXES[piece], {}).get("running") == "yes"


TARGETS_SCRIPT = ("python3 -c 'import sys,urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], "
                  "timeout=10).read().decode())' {url}")


def targets_health(place: Place, listen: str) -> list[dict[str, Any]] | str:
    """Prometheus' own view of its targets (/api/v1/targets), or why it gave none."""
    ran = place.run(TARGETS_SCRIPT.format(url=shlex.quote(f"http://{listen}/api/v1/targets?state=active")))
    if not ran.ok:
        return f"Prometheus did not answer at {listen}: {_tail(ran.stderr)}"
    try:
        active = json.loads(ran.stdout)["data"]["activeTargets"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return "Prometheus' answer was not its targets API"
    return [{"job": t.get("labels", {}).get("job"), "node": t.get("labels", {}).get("node"),
             "replica": t.get("labels", {}).get("replica"), "url": t.get("scrapeUrl"), "health": t.get("health"),
             "error": t.get("lastError") or None} for t in active]
