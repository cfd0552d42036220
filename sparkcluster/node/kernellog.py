"""The kernel log of this boot, read in the doctor's round trip, and what its lines mean: NVRM Xid errors and
NV_ERR_NO_MEMORY, mlx5 firmware command timeouts and QSFP link flaps, PCIe AER errors on the ConnectX, and the
OOM killer taking vLLM.

On the node (KERNEL_LOG_SCRIPT): `journalctl -k -b` (the journal, ISO times), else `dmesg`, each as the login
user and then through passwordless sudo (Ubuntu restricts dmesg, and the journal wants group adm); only the
lines that can mean one of the above come back, the last MAX_LINES of them, each cut at MAX_LINE_BYTES, the whole
at most MAX_BYTES; each reader gets 10 s. Here (pure): `parse_kernel_log` reads those lines into events, `kernel_log_findings` names
each kind once per node, with the count, the last time, the meaning and the fix.

A node that hung or rebooted (an Xid 79, NV_ERR_NO_MEMORY, an OOM kill, a stuck ConnectX) leaves its evidence in
the PREVIOUS boot's log, so the same script also reads `journalctl -k -b -1` (the journal only: dmesg holds this
boot alone), bounded the same way, its lines prefixed `previous`; its findings rank as this boot's do and say "in
the previous boot". Where journalctl answers that it keeps no persistent journal, that is said with the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Literal

from .finding import Finding, Severity
from .platform_known import Component, Symptom, matches

MAX_LINES = 2000
MAX_BYTES = 256 * 1024
MAX_LINE_BYTES = 400
# What a line must hold to be worth reading here (an awk regular expression, kept loose: the parser decides).
WORTH = r"NVRM|mlx5|AER:|Out of memory"
READERS = (  # (source, command): the first that reads any line wins
    ("journalctl", "journalctl -k -b -o short-iso --no-pager -q"),
    ("journalctl (sudo)", "sudo -n journalctl -k -b -o short-iso --no-pager -q"),
    ("dmesg", "dmesg --time-format iso"),
    ("dmesg (sudo)", "sudo -n dmesg --time-format iso"),
)
# The previous boot is the journal's alone; journalctl's own words where it has none (systemd's journalctl.c):
# "Data from the specified boot (-1) is not available: No such boot ID in journal" (the journal begins with this
# boot), and "Specifying boot ID or boot offset has no effect, no persistent journal was found." (exit 0: the journal
# lives in /run and every reboot empties it).
PREVIOUS_READERS = (
    ("journalctl", "journalctl -k -b -1 -o short-iso --no-pager -q"),
    ("journalctl (sudo)", "sudo -n journalctl -k -b -1 -o short-iso --no-pager -q"),
)
NO_SUCH_BOOT = "No such boot ID in journal"
NOT_PERSISTENT = "no persistent journal was found"
KERNEL_LOG_SCRIPT = rf"""
klog_src=
for klog_try in {' '.join(f"'{src}|{cmd}'" for src, cmd in READERS)}; do
  klog_out=$(timeout 10 ${{klog_try#*|}} 2>/dev/null | awk -v pat='{WORTH}' \
    '{{ n++ }} $0 ~ pat {{ print "line " substr($0, 1, {MAX_LINE_BYTES}) }} END {{ print "read " n+0 }}' \
    | tail -n {MAX_LINES + 1} | tail -c {MAX_BYTES})
  case "$klog_out" in *"read 0") continue ;; esac
  klog_src=${{klog_try%%|*}}; echo "source $klog_src"; printf '%s\n' "$klog_out"; break
done
[ -n "$klog_src" ] || echo unreadable
klog_prev= klog_said=
for klog_try in {' '.join(f"'{src}|{cmd}'" for src, cmd in PREVIOUS_READERS)}; do
  # journalctl's stderr is kept: its words tell "no earlier boot" from "no persistent journal" (both print no line)
  klog_out=$(timeout 10 ${{klog_try#*|}} 2>&1 | awk -v pat='{WORTH}' '
    /^[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T/ {{ n++; last = $1
      if ($0 ~ pat) print "previous line " substr($0, 1, {MAX_LINE_BYTES}); next }}
    /[^ ]/ && s++ < 3 {{ said = said "previous said " substr($0, 1, {MAX_LINE_BYTES}) "\n" }}
    END {{ printf "%s", said; if (n) print "previous last " last; print "previous read " n+0 }}' \
    | tail -n {MAX_LINES + 5} | tail -c {MAX_BYTES})
  case "$klog_out" in *"previous read 0")
    case "$klog_out" in *'{NO_SUCH_BOOT}'*|*'{NOT_PERSISTENT}'*) ;;
      *) klog_said="$klog_said$(printf '%s\n' "$klog_out" | grep '^previous said')
"; continue ;; esac ;;
  esac
  klog_prev=${{klog_try%%|*}}; echo "previous source $klog_prev"; printf '%s\n' "$klog_out"; break
done
[ -n "$klog_prev" ] || {{ echo "previous unreadable"; printf '%s' "$klog_said"; }}
"""

Kind = Literal["xid", "nv-no-memory", "mlx5-timeout", "link-down", "link-up", "aer", "oom-kill"]


@dataclass(frozen=True)
class KernelEvent:
    kind: Kind
    time: str  # as the log prints it: ISO from the journal and dmesg --time-format iso, else seconds after boot
    text: str  # the line without its time stamp and host
    device: str = ""  # the PCI address (or netdev) it concerns
    xid: int | None = None
    process: str = ""  # OOM kill: "4242 (python3)"
    severity: str = ""  # AER: corrected, non-fatal or fatal


@dataclass(frozen=True)
class KernelLog:
    source: str | None = None  # "journalctl", "dmesg (sudo)", ...; None: unread
    lines_read: int = 0  # every line of this boot's log that the reader printed, before the filter
    events: tuple[KernelEvent, ...] = field(default_factory=tuple)
    connectx: tuple[str, ...] = ()  # the PCI addresses mlx5_core spoke for: an AER error there is the ConnectX's
    previous_boot: PreviousBoot | None = None  # None: not looked at (a node answering an older probe)


# read: its lines came back; none: the journal begins with this boot; not kept: the journal lives in memory only
# (journalctl: no persistent journal); unreadable: journalctl printed nothing we could read, even through sudo -n
PreviousState = Literal["read", "none", "not kept", "unreadable"]


@dataclass(frozen=True)
class PreviousBoot:
    """The previous boot's kernel log: where a node that hung or rebooted left its evidence."""
    state: PreviousState
    source: str | None = None
    lines_read: int = 0
    events: tuple[KernelEvent, ...] = field(default_factory=tuple)
    connectx: tuple[str, ...] = ()
    ended: str = ""  # the time of its last line: when the node went down (crashed, hung or shut down)
    said: tuple[str, ...] = ()  # journalctl's own words where it printed no line

    @property
    def log(self) -> KernelLog:
        return KernelLog(self.source, self.lines_read, self.events, self.connectx)


# ---- parser (pure) ----------------------------------------------------------------------------------
STAMPS = (
    re.compile(r"^(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z)?)\s+\S+\s+kernel:\s?(?P<m>.*)$"),
    re.compile(r"^(?P<t>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d)\s+\S+\s+kernel:\s?(?P<m>.*)$"),  # journalctl's short
    re.compile(r"^(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d+)?(?:[+-]\d\d:?\d\d|Z))\s+(?P<m>.*)$"),  # dmesg iso
    re.compile(r"^\[(?P<t>[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \d{4})\]\s*(?P<m>.*)$"),  # dmesg -T
    re.compile(r"^\[\s*(?P<t>\d+\.\d+)\]\s*(?P<m>.*)$"),  # plain dmesg
)
PRINTK_TIME = re.compile(r"^\[\s*\d+\.\d+\]\s*")  # a syslog line that kept the kernel's own stamp
XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<dev>[0-9a-fA-F:.]+)\): (?P<xid>\d+)\b")
NV_NO_MEMORY = re.compile(r"NVRM: .*NV_ERR_NO_MEMORY")
MLX5 = re.compile(r"^mlx5_core (?P<dev>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)(?::| (?P<netdev>\S+):)")
MLX5_TIMEOUT = re.compile(r"\btimeout\b|No done completion", re.IGNORECASE)
LINK = re.compile(r": Link (?P<state>up|down)\b")
AER_SEVERITY = re.compile(r"AER: (?:Multiple )?(?P<sev>Corrected|Correctable|Uncorrected \((?:Non-Fatal|Fatal)\)|"
                          r"Uncorrectable \((?:Non-Fatal|Fatal)\))? ?error(?: message)? received(?: from|:) "
                          r"(?P<dev>[0-9a-fA-F:.]+)")
OOM = re.compile(r"Out of memory: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)")
VLLM_PROCESS = re.compile(r"^(python3?(\.\d+)?|vllm|VLLM::.*|ray::.*|pt_main_thread)$")


def _stamp(line: str) -> tuple[str, str]:
    for pattern in STAMPS:
        if m := pattern.match(line):
            t = m["t"]
            return (f"{t} s after boot" if re.fullmatch(r"\d+\.\d+", t) else t), PRINTK_TIME.sub("", m["m"])
    return "", line


def _aer_severity(text: str) -> str:
    t = text.lower()
    return "fatal" if "(fatal)" in t or "=fatal" in t else "non-fatal" if "non-fatal" in t or "uncorrect" in t \
        else "corrected"


def parse_event(line: str) -> KernelEvent | None:
    """One kernel log line, in any of the formats journalctl and dmesg print, as an event; None: not one of ours."""
    time, text = _stamp(line.rstrip("\n"))
    if m := XID.search(text):
        return KernelEvent("xid", time, text, m["dev"], xid=int(m["xid"]))
    if NV_NO_MEMORY.search(text):
        return KernelEvent("nv-no-memory", time, text)
    if m := OOM.search(text):
        return KernelEvent("oom-kill", time, text, process=f"{m['pid']} ({m['name']})")
    if m := AER_SEVERITY.search(text):  # one header per error; the `PCIe Bus Error` lines after it detail it
        return KernelEvent("aer", time, text, m["dev"], severity=_aer_severity(m["sev"] or text))
    if m := MLX5.match(text):
        if link := LINK.search(text):
            return KernelEvent("link-up" if link["state"] == "up" else "link-down", time, text, m["netdev"] or m["dev"])
        if MLX5_TIMEOUT.search(text):
            return KernelEvent("mlx5-timeout", time, text, m["dev"])
    return None


def parse_kernel_log(lines: Iterable[str]) -> KernelLog:
    """The d-kernel-log section: `source S`, `line L`..., `read N`; or `unreadable`; then the previous boot's, each
    line prefixed `previous ` (with its `last T` and journalctl's `said W`)."""
    this: list[str] = []
    previous: list[str] = []
    for raw in lines:
        kind, _, rest = raw.partition(" ")
        (previous if kind == "previous" else this).append(rest if kind == "previous" else raw)
    log, _, _ = _parse_boot(this)
    return replace(log, previous_boot=_previous_boot(previous)) if previous else log


def _parse_boot(lines: Iterable[str]) -> tuple[KernelLog, str, tuple[str, ...]]:
    """One boot's lines: the log, the time of its last line (`last T`) and what the reader said (`said W`)."""
    source: str | None = None
    read = 0
    last = ""
    said: list[str] = []
    events: list[KernelEvent] = []
    connectx: dict[str, None] = {}
    for raw in lines:
        kind, _, rest = raw.partition(" ")
        if kind == "source":
            source = rest.strip() or None
        elif kind == "read" and rest.strip().isdigit():
            read = int(rest)
        elif kind == "last":
            last = rest.strip()
        elif kind == "said":
            said.append(rest.strip())
        elif kind == "line":
            if event := parse_event(rest):
                events.append(event)
            if m := MLX5.match(_stamp(rest)[1]):
                connectx[m["dev"]] = None
    return KernelLog(source, read, tuple(events), tuple(connectx)), last, tuple(said)


def _previous_boot(lines: list[str]) -> PreviousBoot:
    log, last, said = _parse_boot(lines)
    words = " ".join(said)
    state: PreviousState = ("read" if log.source and log.lines_read else "not kept" if NOT_PERSISTENT in words
                            else "none" if NO_SUCH_BOOT in words else "unreadable")
    return PreviousBoot(state, log.source, log.lines_read, log.events, log.connectx, last, said)


# ---- meanings and findings (pure) -------------------------------------------------------------------
# NVIDIA's Xid catalog, for the numbers a serving node meets; (meaning, severity, fix)
APP_FAULT = "an application fault: check the vLLM/FlashInfer build in the image (a newer image often fixes it)"
RESET = "reboot the node; if it comes back, power-cycle it with AC removed and report it to NVIDIA support"
XIDS: dict[int, tuple[str, Severity, str]] = {
    13: ("Graphics Engine Exception: a kernel hit an illegal instruction or address", Severity.WARN, APP_FAULT),
    31: ("GPU memory page fault: a kernel read or wrote an address it does not own", Severity.WARN, APP_FAULT),
    43: ("GPU stopped processing: a channel was stopped after a fault (follows Xid 13/31)", Severity.WARN, APP_FAULT),
    45: ("preemptive cleanup: the GPU's work was torn down after an earlier error or a killed process",
         Severity.WARN, "look for the error before it (an Xid 13/31/43, an OOM kill); on its own it is harmless"),
    48: ("double-bit ECC error: memory returned data it could not correct", Severity.FAIL, RESET),
    62: ("internal micro-controller halt: the GPU's firmware stopped", Severity.FAIL, RESET),
    63: ("ECC page retirement or row remapping recorded: memory is wearing", Severity.WARN,
         "reboot to apply the remapping; if it repeats, report it to NVIDIA support"),
    64: ("ECC page retirement or row remapping failed: memory is failing", Severity.FAIL, RESET),
    74: ("NVLink error (on GB10: the NVLink-C2C between the Grace CPU and the GPU)", Severity.FAIL, RESET),
    79: ("GPU has fallen off the bus: it no longer answers", Severity.FAIL,
         "power-cycle the node with AC removed (a reboot may not bring it back); check its airflow and power, and "
         "cap the GPU clock if it repeats (sudo nvidia-smi -lgc 0,2000)"),
    92: ("high single-bit ECC error rate", Severity.WARN, "if it repeats, report it to NVIDIA support"),
    94: ("contained ECC error: the application that hit it must restart", Severity.WARN,
         "restart vLLM (sparkcluster down, then serve); if it repeats, report it to NVIDIA support"),
    95: ("uncontained ECC error: every application on the GPU must stop and the GPU be reset", Severity.FAIL, RESET),
    109: ("context switch timeout", Severity.WARN, APP_FAULT),
    119: ("GSP RPC timeout: the GPU System Processor stopped answering the driver", Severity.FAIL,
          "reboot the node (power-cycle with AC removed if the GPU stays lost); keep the driver DGX OS ships"),
    120: ("GSP error: the GPU System Processor reported a fault", Severity.FAIL, RESET),
    154: ("GPU recovery action changed: the driver asks for a GPU reset or a node reboot", Severity.FAIL,
          "reboot the node"),
}
UNKNOWN_XID = ("see NVIDIA's Xid catalog for this number", Severity.WARN, "")


def _when(events: list[KernelEvent]) -> str:
    last = events[-1].time or "an unknown time"
    return f"at {last}" if len(events) == 1 else f"{len(events)} times, last at {last}"


@dataclass(frozen=True)
class Boot:
    """Which boot a finding speaks of: its check's suffix, the words before its summary, and after "N lines"."""
    check: str = ""
    where: str = ""
    of: str = " of this boot"


THIS_BOOT = Boot()
PREVIOUS_BOOT = Boot(" (previous boot)", "", "")
UNREADABLE_FIX = ("add the login user to group adm (sudo usermod -aG adm $USER, then log in again), or allow it "
                  "passwordless sudo")
# systemd-journald.service(8): the journal is kept on disk once /var/log/journal exists; journalctl --flush moves
# this boot's log there at once (so a crash from now on is read after the reboot). A journald.conf that says
# Storage=volatile (or none) keeps it in memory whatever the folder: that line must go first.
KEEP_JOURNAL_FIX = ("keep the journal on disk: sudo mkdir -p /var/log/journal && sudo systemd-tmpfiles --create "
                    "--prefix /var/log/journal && sudo journalctl --flush (where /etc/systemd/journald.conf or a "
                    "journald.conf.d file sets Storage=volatile or none, set Storage=persistent and sudo systemctl "
                    "restart systemd-journald); from then on a crash's kernel log is still there after the reboot")


def _previous(boot: PreviousBoot) -> Boot:
    """Its findings open with the boot and when its log ends: about when the node went down."""
    ended = f" (its log ends at {boot.ended})" if boot.ended else ""
    return replace(PREVIOUS_BOOT, where=f"in the previous boot{ended}: ")


def _finding(name: str, check: str, severity: Severity, what: str, fix: str = "", source: str = "",
             boot: Boot = THIS_BOOT) -> Finding:
    return Finding("kernel log", check + boot.check, severity, f"{name}: {boot.where}{what}", fix, (name,),
                   source=source)


def kernel_log_findings(name: str, log: KernelLog, driver: str | None = None) -> list[Finding]:
    """One finding per kind of trouble (per Xid number, per twin) in this boot and then in the previous one,
    naming the node, the time and the meaning; an OK one where a boot's log was read and holds none; a WARN
    where it could not be read; an INFO where the journal keeps no previous boot."""
    if log.source is None:
        return [_finding(name, "kernel log", Severity.WARN,
                         "the kernel log could not be read (journalctl -k and dmesg printed nothing, and sudo -n "
                         "was refused): Xid errors, link flaps and OOM kills stay unseen", UNREADABLE_FIX)]
    return _boot_findings(name, log, driver, THIS_BOOT) + _previous_boot_findings(name, log.previous_boot, driver)


def _previous_boot_findings(name: str, previous: PreviousBoot | None, driver: str | None) -> list[Finding]:
    if previous is None:
        return []
    check = "kernel log"  # _finding adds the previous boot's suffix
    said = f" (journalctl: {previous.said[0]})" if previous.said else ""
    boot = PREVIOUS_BOOT
    if previous.state == "read":
        return _boot_findings(name, previous.log, driver, _previous(previous))
    if previous.state == "none":
        return [_finding(name, check, Severity.OK, f"the journal holds no boot before this one{said}", boot=boot)]
    if previous.state == "not kept":
        return [_finding(name, check, Severity.INFO,
                         f"the previous boot's kernel log is not kept{said}: the journal lives in memory and every "
                         "reboot empties it, so a node that hung or crashed leaves no evidence", KEEP_JOURNAL_FIX,
                         boot=boot)]
    return [_finding(name, check, Severity.WARN,
                     f"the previous boot's kernel log could not be read{said}: an Xid or OOM kill before the last "
                     "reboot stays unseen", UNREADABLE_FIX, boot=boot)]


def _boot_findings(name: str, log: KernelLog, driver: str | None, boot: Boot) -> list[Finding]:
    found: list[Finding] = []
    say = partial(_finding, boot=boot)

    def by(kind: Kind) -> list[KernelEvent]:
        return [e for e in log.events if e.kind == kind]

    for xid in sorted({e.xid for e in by("xid") if e.xid is not None}):
        events = [e for e in by("xid") if e.xid == xid]
        meaning, severity, fix = XIDS.get(xid, UNKNOWN_XID)
        found.append(say(name, f"Xid {xid}", severity,
                              f"NVRM Xid {xid} {_when(events)} ({meaning}): {events[-1].text}", fix))
    if nomem := by("nv-no-memory"):
        reported = [k for k in matches(Component.DRIVER, driver) if k.shows is Symptom.NV_NO_MEMORY]
        known = f"; driver {driver} {reported[0].symptom}" if reported else ""
        found.append(say(
            name, "NV_ERR_NO_MEMORY", Severity.WARN,
            f"NVRM could not allocate memory (NV_ERR_NO_MEMORY) {_when(nomem)}: unified memory ran short for the "
            f"GPU{known}",
            "leave unified memory headroom: a lower vLLM --gpu-memory-utilization (or a shorter --max-model-len); a "
            "node that stops answering comes back only with a power cycle", "NVIDIA/open-gpu-kernel-modules#1358"))
    for device in dict.fromkeys(e.device for e in by("mlx5-timeout")):
        events = [e for e in by("mlx5-timeout") if e.device == device]
        found.append(say(
            name, "mlx5 command timeout", Severity.FAIL,
            f"the ConnectX at {device} did not answer a driver command {_when(events)} (its firmware is stuck): "
            f"{events[-1].text}",
            "reload the driver (sudo rmmod mlx5_ib mlx5_core; sudo modprobe mlx5_core) or power-cycle the node; if it "
            "repeats, update the ConnectX firmware (sudo fwupdmgr refresh && sudo fwupdmgr update)"))
    for netdev in dict.fromkeys(e.device for e in by("link-down")):
        downs = [e for e in by("link-down") if e.device == netdev]
        if len(downs) >= 2:  # one down is a peer rebooting; more is a link that flaps
            found.append(say(
                name, "link flaps", Severity.WARN,
                f"{netdev} went down {_when(downs)}: the QSFP link flaps (a loose or failing cable, or a peer "
                "rebooting again and again)", "reseat the QSFP cable at both ends; if it keeps flapping, try another "
                "cable"))
    for severity_word in ("fatal", "non-fatal", "corrected"):
        events = [e for e in by("aer") if e.severity == severity_word]
        if events:
            devices = ", ".join(f"{d} (ConnectX)" if d in log.connectx else d for d in dict.fromkeys(e.device for e in events))
            bad = severity_word != "corrected"
            found.append(say(
                name, "PCIe AER", Severity.FAIL if bad else Severity.WARN,
                f"PCIe {severity_word} errors on {devices} {_when(events)}: the device's PCIe link "
                f"{'lost data' if bad else 'is retrying (signal trouble; a slot short of power degrades so)'}",
                "power-cycle the node with AC removed; if the errors return, update the BIOS and ConnectX firmware "
                "(sudo fwupdmgr refresh && sudo fwupdmgr update) and report it to NVIDIA support",
                "graham33/nixos-dgx-spark#165"))
    for e in by("oom-kill"):
        name_only = e.process.split("(", 1)[-1].rstrip(")")
        is_vllm = bool(VLLM_PROCESS.match(name_only))
        found.append(say(
            name, "OOM kill", Severity.WARN,
            f"the kernel's OOM killer killed {'vLLM ' if is_vllm else ''}process {e.process} at {e.time or 'an unknown time'}: "
            "unified memory (weights, KV cache and every process share the 128 GB) ran out",
            "lower vLLM's --gpu-memory-utilization (e.g. 0.8) or --max-model-len, give the container a 10 GB shm_size "
            "rather than 64, and stop what else holds memory on the node" if is_vllm else
            "find what grew (the process named) and stop it, or leave vLLM more headroom"))
    if not found:
        found.append(say(name, "kernel log", Severity.OK,
                              f"{log.lines_read} lines{boot.of} read ({log.source}), none of the known errors"))
    return found
