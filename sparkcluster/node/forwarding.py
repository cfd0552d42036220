"""What a ring node forwards for the others, and nothing more.

Where the walk between two nodes crosses this node (a 4-ring's diagonal, `routed.Forward`), it forwards their node
addresses' traffic from one twin to the other. Only that:
- forwarding is turned on per twin (`net.ipv4.conf.<twin>.forwarding`, on the twins such flows arrive on), never
  with `net.ipv4.ip_forward`, which would also make the management NIC route the LAN into the fabric;
- an iptables chain (jumped to first from FORWARD) accepts exactly those flows and drops anything else forwarded
  into or out of the node's fabric twins: also where Docker turned ip_forward on for every interface, and it lets
  the diagonal through where Docker set the FORWARD policy to DROP. iptables, not nft: Docker writes its rules with
  iptables, and only a rule in the same chain can accept what that chain's policy drops;
- rp_filter is strict (1) on a forwarding twin where the route back to every source arriving there leaves by that
  twin (always so on a ring: a walk and its reverse cross the same neighbours), loose (2) otherwise.
A 3-ring, a pair and a switch forward nothing. The runtime values found before sparkcluster first changed a key are
kept on the node (`saved`) and put back when forwarding is no longer needed (`fabric.control_plane: lan`, another
cabling); the sysctl.d file keeps the per-twin values across a reboot (udev applies them as each twin appears).
Pure functions: fabric.addresses (steps/addresses.py) reads the node and runs the lines, in its live change and its
rollback.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .routed import NodeAddress

CHAIN = "SPARKCLUSTER-FABRIC"
IP_FORWARD = "net.ipv4.ip_forward"
IPTABLES_FIX = "install iptables on the node (sudo apt-get install iptables): a 4-ring node forwards its diagonal"
SYSCTL_HEADER = ("# Written by `sparkcluster bootstrap`: this ring node forwards the control-plane traffic of the\n"
                 "# two nodes whose walk crosses it (a 4-ring's diagonal), between these fabric twins only.\n")
# Read in check(): every interface's forwarding and rp_filter (the twins' names are in the facts, not in reads()).
VALUES = ("grep -H . /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv4/conf/*/forwarding "
          "/proc/sys/net/ipv4/conf/*/rp_filter")
RULES = (f"command -v iptables >/dev/null || {{ echo no-iptables; exit 0; }}; iptables -w -S FORWARD; "
         f"iptables -w -S {CHAIN} 2>/dev/null || true")

Rule = tuple[str, ...]  # what follows `-A CHAIN` in `iptables -S CHAIN`


def sysctl_key(netdev: str, name: str) -> str:
    """sysctl swaps `.` and `/` inside a key's component, so a twin named with a dot (a VLAN) is written with a
    slash (sysctl.d(5))."""
    return f"net.ipv4.conf.{netdev.replace('.', '/')}.{name}"


@dataclass(frozen=True)
class Wanted:
    """What the node must hold: sysctl keys and their values, and the chain's rules (none: no chain at all)."""

    values: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()

    @property
    def text(self) -> str:
        """The sysctl.d file ("" when nothing forwards: no file)."""
        return SYSCTL_HEADER + "".join(f"{k} = {v}\n" for k, v in self.values.items()) if self.values else ""


@dataclass(frozen=True)
class Now:
    """What the node holds now (read fresh in check)."""

    values: Mapping[str, str]  # sysctl key -> value: ip_forward, every interface's forwarding and rp_filter
    sysctl: str  # the sysctl.d file's text ("" when absent)
    saved: Mapping[str, str]  # key -> the value found before sparkcluster first changed it
    rules: tuple[Rule, ...] | None  # the chain's rules; None: no chain
    jump: bool  # FORWARD jumps to the chain
    iptables: bool = True  # installed


def wanted(plan: NodeAddress | None, twins: Sequence[str]) -> Wanted:
    """From the node's plan (None: no routed control plane) and all its fabric twins."""
    if plan is None or not plan.forwards:
        return Wanted()
    inbound = list(dict.fromkeys(f.inbound for f in plan.forwards))
    values = {}
    for twin in inbound:
        values[sysctl_key(twin, "forwarding")] = "1"
        values[sysctl_key(twin, "rp_filter")] = rp_filter(plan, twin)
    accept = tuple(("-s", f"{f.src}/32", "-d", f"{f.dst}/32", "-i", f.inbound, "-o", f.outbound, "-j", "ACCEPT")
                   for f in plan.forwards)
    drops = tuple(("-i", t, "-j", "DROP") for t in twins) + tuple(("-o", t, "-j", "DROP") for t in twins)
    return Wanted(values, accept + drops)


def rp_filter(plan: NodeAddress, twin: str) -> str:
    """Strict where our route to every source forwarded in on `twin` leaves by `twin` (its answers come back the
    way it went), loose otherwise (an asymmetric walk would have strict mode drop it)."""
    leaves = {r.to: r.netdev for r in plan.routes}
    return "1" if all(leaves.get(f.src) == twin for f in plan.forwards if f.inbound == twin) else "2"


def converged(want: Wanted, now: Now) -> bool:
    return (all(now.values.get(k) == v for k, v in want.values.items()) and set(now.saved) == set(want.values)
            and now.sysctl == want.text and (now.rules or ()) == want.rules and now.jump == bool(want.rules))


def live(want: Wanted, now: Now, saved_file: str) -> list[str]:
    """Root shell lines, each idempotent: keep the values found before the first change, set the wanted ones, put
    back those no longer wanted, and the chain as wanted."""
    keep = {k: v for k, v in now.saved.items() if k in want.values}
    keep.update({k: now.values[k] for k in want.values if k not in now.saved and k in now.values})
    lines = [f"sysctl -qw {shlex.quote(f'{k}={v}')}" for k, v in want.values.items() if now.values.get(k) != v]
    # -e: a twin gone since (renamed, unplugged) has no key to put back
    lines += [f"sysctl -qew {shlex.quote(f'{k}={v}')}" for k, v in now.saved.items() if k not in want.values]
    if keep != now.saved:
        lines.insert(0, _write_saved(keep, saved_file))
    if (now.rules or ()) != want.rules or now.jump != bool(want.rules):
        lines += chain_lines(want.rules, now)
    return lines


def rollback(want: Wanted, now: Now, saved_file: str) -> list[str]:
    """Back to `now`: the values, the saved file and the chain as they were before this change."""
    keys = dict.fromkeys([*want.values, *now.saved])
    lines = [f"sysctl -qew {shlex.quote(f'{k}={now.values[k]}')}" for k in keys if k in now.values]
    after = Now(now.values, now.sysctl, {}, want.rules or None, bool(want.rules))
    return [*lines, _write_saved(dict(now.saved), saved_file), *chain_lines(now.rules or (), after, now.jump)]


def chain_lines(rules: Sequence[Rule], now: Now, jump: bool = True) -> list[str]:
    """The chain holding `rules` (none: the chain and FORWARD's jump to it gone), from the state `now`; `jump`: FORWARD
    jumps to it (a rollback puts back a chain as it was, jumped to or not)."""
    ipt = "iptables -w"
    if not rules:
        if now.rules is None:
            return []
        return ([f"{ipt} -D FORWARD -j {CHAIN}"] if now.jump else []) + [f"{ipt} -F {CHAIN}", f"{ipt} -X {CHAIN}"]
    lines = [f"{ipt} -N {CHAIN} 2>/dev/null || {ipt} -F {CHAIN}"]
    lines += [f"{ipt} -A {CHAIN} {shlex.join(rule)}" for rule in rules]
    if jump:
        # First in FORWARD: ahead of a DROP policy, and of rules that would accept what the chain drops.
        lines.append(f"{ipt} -C FORWARD -j {CHAIN} 2>/dev/null || {ipt} -I FORWARD 1 -j {CHAIN}")
    return lines


def _write_saved(saved: Mapping[str, str], saved_file: str) -> str:
    if not saved:
        return f"rm -f {saved_file}"
    text = "".join(f"{k} = {v}\n" for k, v in saved.items())
    return f"printf '%s' {shlex.quote(text)} > {saved_file}.tmp && mv {saved_file}.tmp {saved_file}"


def parse_values(text: str) -> dict[str, str]:
    """`grep -H . /proc/sys/...` -> sysctl key -> value."""
    out = {}
    for line in text.splitlines():
        path, _, value = line.rpartition(":")
        parts = path.split("/")  # /proc/sys/net/ipv4/conf/<netdev>/<name>
        if path == "/proc/sys/net/ipv4/ip_forward":
            out[IP_FORWARD] = value.strip()
        elif len(parts) == 8 and parts[:6] == ["", "proc", "sys", "net", "ipv4", "conf"]:
            out[sysctl_key(parts[6], parts[7])] = value.strip()
    return out


def parse_saved(text: str) -> dict[str, str]:
    """The saved file (sysctl's own `key = value` lines)."""
    pairs = (line.partition("=") for line in text.splitlines() if "=" in line and not line.startswith("#"))
    return {k.strip(): v.strip() for k, _, v in pairs}


def parse_rules(text: str) -> tuple[bool, tuple[Rule, ...] | None, bool]:
    """`RULES`' output -> (iptables installed, the chain's rules or None, FORWARD jumps to it)."""
    if text.strip() == "no-iptables":
        return False, None, False
    lines = [line.split() for line in text.splitlines()]
    jump = ["-A", "FORWARD", "-j", CHAIN] in lines
    if ["-N", CHAIN] not in lines:
        return True, None, jump
    return True, tuple(tuple(w[2:]) for w in lines if w[:2] == ["-A", CHAIN]), jump


def describe(want: Wanted, now: Now) -> str:
    """The change in words, for the plan's reason."""
    twins = [k.split(".")[3] for k in want.values if k.endswith(".forwarding")]
    if twins:
        return f"; forwarding between {' and '.join(twins)} only ({sum(r[-1] == 'ACCEPT' for r in want.rules)} flows)"
    if now.saved or now.rules is not None:
        return "; forwarding put back as it was found"
    return ""
