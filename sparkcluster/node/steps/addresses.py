"""fabric.addresses: the cabled QSFP twins get their IPv4 addresses and MTU, live and in a netplan file.

A change to a node's network can cut the CLI off from it, so it is applied the way `netplan try` does it: the
node first arms a watchdog that restores the previous netplan file and addresses unless the CLI reaches it again
over a new SSH connection and confirms within `fabric.confirm_timeout` seconds. The interface SSH arrives on is
never touched. check() reads the addresses fresh from the node (facts are from before the change).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, replace
from ipaddress import IPv4Interface

from ...engine.command import Command
from ...engine.facts import HostFacts, parse_ip_addr
from ...engine.steps.base import HostContext, NoArgs, Plan, Step, StepFailed, register
from ...engine.steps.files import unified_diff
from ...engine.transport import Unreachable
from .. import forwarding
from ..addressing import (
    NETPLAN_FILE,
    AddressPlan,
    FabricConfig,
    FabricError,
    check_node_subnet,
    collisions,
    duplicates,
    fabric_config,
    host_number,
    managed_netdevs,
    netplan_yaml,
    plan_addresses,
)
from ..discovery import fabric_of
from ..fabric import Fabric, Kind
from ..network import qsfp_port
from ..planned import planned_facts
from ..routed import (
    NODE_NETDEV,
    SYSCTL_FILE,
    NodeAddress,
    Route,
    missing_routes,
    node_address,
    parse_routes,
    plan_node_address,
    route_fields,
)
from .preflight import facts_of

STATE_DIR = "/var/lib/sparkcluster/fabric"  # root-owned: the previous file, the rollback script, its outcome
NETPLAN_FIX = ("install netplan (DGX OS and Ubuntu ship netplan.io: sudo apt-get install netplan.io), or give the "
               "QSFP twins their addresses yourself: each twin of the cabled port on a /24 of its own, MTU 9000")
RECONNECT_GRACE_S = 60  # after the watchdog's deadline, how long to wait for the node to answer again
LIVE_DELAY_S = 1  # between the session that arms the change and the change itself
ROUTES = Command("ip -4 route show")
SAVED_SYSCTL = f"{STATE_DIR}/sysctl-found.conf"  # the runtime values found before forwarding was first changed
FORWARDING = (Command(forwarding.VALUES), Command(f"cat {SYSCTL_FILE} 2>/dev/null || true"),
              Command(f"cat {SAVED_SYSCTL} 2>/dev/null || true", sudo=True), Command(forwarding.RULES, sudo=True))
KEEP_SYSCTL = (f"if [ -e {SYSCTL_FILE} ]; then cp -p {SYSCTL_FILE} {STATE_DIR}/previous-sysctl.conf; "
               f"else rm -f {STATE_DIR}/previous-sysctl.conf; fi\n")
RESTORE_SYSCTL = (f"if [ -e {STATE_DIR}/previous-sysctl.conf ]; then cp -p {STATE_DIR}/previous-sysctl.conf "
                  f"{SYSCTL_FILE}; else rm -f {SYSCTL_FILE}; fi")


@dataclass(frozen=True)
class NodeNow:
    """What a ring node holds now of its routed control plane (read fresh in check)."""

    exists: bool  # the scnode bridge is there
    held: bool  # with the planned address
    routes: dict[str, str]  # the kernel's /32 routes: destination -> the rest of the line
    missing: tuple[Route, ...]

    @property
    def converged(self) -> bool:
        return self.held and not self.missing


@dataclass(frozen=True)
class Leftover:
    """What an earlier routed run left on a node whose plan now has no node address (`fabric.control_plane: lan`
    chosen, or the cables no longer a ring): the bridge with its addresses, the routes sourced from them.
    Bootstrap retires them, so no node keeps advertising for a plane nobody uses (forwarding.py puts forwarding
    back as it found it, here as wherever it is no longer needed)."""

    bridge: tuple[IPv4Interface, ...]  # scnode's addresses
    routes: tuple[str, ...]  # `ip route` lines (destination first) whose source is one of those addresses


@register
class FabricAddresses(Step):
    name = "fabric.addresses"
    Args = NoArgs
    fix = NETPLAN_FIX

    def reads(self, ctx: HostContext) -> tuple[Command, ...]:
        # One exec for both (engine/batch.py); a retry of `ip -j addr` reads afresh.
        return (Command("ip -j addr"), Command(f"cat {NETPLAN_FILE} 2>/dev/null || true", sudo=True), ROUTES,
                *FORWARDING)

    def check(self, ctx: HostContext) -> Plan:
        if not any(d.up for d in facts_of(ctx).rdma):
            return Plan("no QSFP link to address: preflight.qsfp tells why", skip=True)
        config = _config(ctx)
        plan, current_file, fresh = self._plan(ctx, config)
        wanted = netplan_yaml(plan)
        file_changes = (any(t.managed for t in plan.twins) or plan.node is not None) and current_file != wanted
        node = _node_now(ctx, plan.node, fresh) if plan.node is not None else None
        leftover = _leftover(ctx, fresh) if plan.node is None else None
        found = _forwarding_now(ctx)
        want = forwarding.wanted(plan.node, [t.netdev for t in plan.twins])
        forwarded = forwarding.converged(want, found)
        if (not plan.to_assign and not plan.to_retune and not file_changes and (node is None or node.converged)
                and leftover is None and forwarded):
            return Plan(f"already addressed: {_twins(plan)}{_node_text(plan.node)}", warnings=plan.notes)
        if want.rules and not found.iptables:
            raise StepFailed("iptables is not installed: this node would forward its ring's diagonal with nothing "
                             "to limit what it forwards; nothing was changed", forwarding.IPTABLES_FIX)
        problems = collisions(plan, facts_of(ctx)) + self._taken_on_fabric(ctx, plan)
        if problems:
            raise StepFailed("; ".join(problems) + "; nothing was changed",
                             "choose free subnets: set vars: {fabric: {subnets: [A/24, B/24]}} in the inventory")
        if not ctx.run(Command("command -v netplan >/dev/null", sudo=True)).ok:  # in sudo's PATH (/usr/sbin)
            raise StepFailed("netplan is not installed: the fabric's addresses could not survive a reboot", NETPLAN_FIX)
        diffs = [unified_diff(ctx.host.name, NETPLAN_FILE, current_file or "", wanted) if file_changes else None]
        if found.sysctl != want.text:
            diffs.append(unified_diff(ctx.host.name, SYSCTL_FILE, found.sysctl, want.text))
        ports = f"port {plan.port}" if plan.port is not None else "ports 0 and 1"
        return Plan(f"address {ports}: {_twins(plan)}, MTU {plan.mtu}{_node_text(plan.node)}{_retire_text(leftover)}"
                    f"{forwarding.describe(want, found)}",
                    self._commands(ctx, plan, wanted, config, node, leftover, (want, found)),
                    diff="".join(d for d in diffs if d) or None,
                    warnings=plan.notes + _ip_forward_left_on(found), planned_facts=planned_facts(facts_of(ctx), plan))

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        config = _config(ctx)
        for command in plan.commands:
            ctx.must(command, NETPLAN_FIX)
        if self._confirmed(ctx, config.confirm_s):
            return
        outcome = self._outcome_after_rollback(ctx, config.confirm_s)
        raise StepFailed(f"{ctx.host.name} stopped answering over SSH after its fabric addresses changed; {outcome}",
                         "the fabric subnets must not carry the management traffic: check `ip route` on the node, "
                         "choose other subnets (vars: {fabric: {subnets: [A/24, B/24]}}) and run bootstrap again")

    # ---- check ---------------------------------------------------------------------------------------------
    def _plan(self, ctx: HostContext, config: FabricConfig) -> tuple[AddressPlan, str | None, HostFacts]:
        facts = facts_of(ctx)
        for _ in range(3):
            fresh = ctx.must_read(Command("ip -j addr"), "check that iproute2 runs on the node").stdout
            interfaces = parse_ip_addr(fresh, {i.name: i.speed_mbps for i in facts.interfaces})
            if interfaces:
                break
            # A netlink dump that races an address change (the kernel's own, e.g. IPv6 on a link that just lost
            # its address) is cut off and prints JSON that does not parse (seen once in CI): read it again.
            time.sleep(0.2)
        else:
            raise StepFailed(f"`ip -j addr` printed no interfaces: {fresh.strip()[:200]!r}", "run bootstrap again")
        facts = replace(facts, interfaces=interfaces)
        current = ctx.read(Command(f"cat {NETPLAN_FILE} 2>/dev/null || true", sudo=True)).stdout or None
        fabric = _fabric(ctx)
        try:
            plan = plan_addresses(ctx.inventory, ctx.host, facts, config, managed_netdevs(current), fabric)
        except FabricError as e:
            raise StepFailed(e.message, e.fix) from None
        others = {}
        for other in ctx.inventory.hosts:  # what the others hold or will get; their own problems are theirs to report
            if other.name != ctx.host.name and other.name in ctx.all_facts:
                try:
                    others[other.name] = plan_addresses(ctx.inventory, other, ctx.all_facts[other.name], config,
                                                        fabric=fabric)
                except FabricError:
                    continue
        clashes = [c for c in duplicates({ctx.host.name: plan, **others}) if ctx.host.name in c]
        if clashes:
            raise StepFailed("the same fabric address for two nodes: " + "; ".join(clashes) + "; nothing was changed",
                             "give each node its own fabric_ip, or leave the numbering to sparkcluster")
        if fabric is not None and fabric.kind is Kind.RING and config.control_plane == "routed":
            try:
                check_node_subnet(ctx.inventory, config)
            except FabricError as e:
                raise StepFailed(e.message, e.fix) from None
            addresses = {h.name: node_address(config.node_subnet, host_number(ctx.inventory, h.name))
                         for h in ctx.inventory.hosts}
            twins = {name: {t.netdev: t.address for t in p.twins} for name, p in {ctx.host.name: plan, **others}.items()}
            plan = replace(plan, node=plan_node_address(ctx.host.name, fabric, addresses, twins))
        return plan, current, facts

    def _taken_on_fabric(self, ctx: HostContext, plan: AddressPlan) -> list[str]:
        """Duplicate address detection (RFC 5227) on the wire: a device outside the inventory may hold it."""
        if not plan.to_assign or not ctx.run(Command("command -v arping >/dev/null")).ok:
            return []
        probes = " ".join(f"(arping -D -q -c 2 -w 3 -I {shlex.quote(t.netdev)} {t.address.ip} || "
                          f"echo {t.address.ip}) &" for t in plan.to_assign)
        taken = ctx.run(Command(f"{probes} wait", sudo=True, timeout=30)).stdout.split()
        return [f"{ip} is already in use on the fabric (it answered ARP)" for ip in taken]

    def _commands(self, ctx: HostContext, plan: AddressPlan, wanted: str, config: FabricConfig,
                  node: NodeNow | None = None, leftover: Leftover | None = None,
                  forwards: tuple[forwarding.Wanted, forwarding.Now] | None = None) -> tuple[Command, ...]:
        ssh_netdev = self._ssh_interface(ctx)
        live = []
        changing = tuple(dict.fromkeys((*plan.to_retune, *plan.to_assign)))  # a fresh twin is in both: once
        for twin in changing:
            if twin.netdev == ssh_netdev:
                raise StepFailed(f"{twin.netdev} carries this SSH session: it is never changed",
                                 "connect over the management port (enP7s7), or configure it yourself")
            live.append(f"ip link set {shlex.quote(twin.netdev)} mtu {plan.mtu}")
        live += [f"ip addr add {t.address} dev {shlex.quote(t.netdev)}" for t in plan.to_assign]
        # NVIDIA's link-local addresses go once the twin has its own (in that order: the twin is never left bare).
        live += [f"ip addr del {old} dev {shlex.quote(t.netdev)}" for t in plan.to_assign for old in t.replaces]
        rollback = ["#!/bin/sh", "# Restores what was there before sparkcluster changed the fabric's addresses.",
                    f"if [ -e {STATE_DIR}/previous.yaml ]; then cp -p {STATE_DIR}/previous.yaml {NETPLAN_FILE}; "
                    f"else rm -f {NETPLAN_FILE}; fi"]
        rollback += [f"ip addr del {t.address} dev {shlex.quote(t.netdev)} 2>/dev/null" for t in plan.to_assign]
        rollback += [f"ip addr add {old} dev {shlex.quote(t.netdev)} 2>/dev/null" for t in plan.to_assign
                     for old in t.replaces]
        rollback += [f"ip link set {shlex.quote(t.netdev)} mtu {t.mtu}" for t in changing]
        keep_sysctl = ""
        if plan.node is not None and node is not None:
            # After the twins' addresses: a route's next hop must be on a subnet the node already holds.
            live += _node_live(plan.node)
            rollback += _node_rollback(plan.node, node)
        if leftover is not None:
            live += _retire_live(leftover)
            rollback += _retire_rollback(leftover)
        if forwards is not None:
            want, found = forwards
            live += forwarding.live(want, found, SAVED_SYSCTL)
            rollback += forwarding.rollback(want, found, SAVED_SYSCTL)
            if found.sysctl != want.text:
                keep_sysctl = KEEP_SYSCTL + (f"printf '%s' {shlex.quote(want.text)} > {SYSCTL_FILE}.tmp; chmod 644 "
                                             f"{SYSCTL_FILE}.tmp; mv {SYSCTL_FILE}.tmp {SYSCTL_FILE}\n" if want.text
                                             else f"rm -f {SYSCTL_FILE}\n")
                rollback.append(RESTORE_SYSCTL)
        rollback += ["netplan generate 2>/dev/null", f'echo "rolled-back-$1" > {STATE_DIR}/state']
        # Unless a new session confirms in time, the watchdog (setsid: it outlives this session) rolls back.
        watchdog = (f"sleep {config.confirm_s:g}; [ -e {STATE_DIR}/confirmed ] || "
                    f"[ \"$(cat {STATE_DIR}/state)\" = rolled-back-refused ] || sh {STATE_DIR}/rollback.sh unconfirmed")
        # The live change starts a second after this session ends, so no session ever waits on a change that may
        # cut it off; a change the kernel refuses rolls back at once.
        change = (f"sleep {LIVE_DELAY_S}; ( set -e; {'; '.join(live or ['true'])} ) && echo live > {STATE_DIR}/state "
                  f"|| sh {STATE_DIR}/rollback.sh refused")
        # One root shell: keep the previous file, write the new one atomically (mode 600, as netplan wants), let
        # netplan validate it, and only then arm the watchdog and schedule the live change.
        script = (f"set -e; umask 077; mkdir -p {STATE_DIR}\n"
                  f"if [ -e {NETPLAN_FILE} ]; then cp -p {NETPLAN_FILE} {STATE_DIR}/previous.yaml; "
                  f"else rm -f {STATE_DIR}/previous.yaml; fi\n"
                  f"printf '%s\\n' {shlex.quote(chr(10).join(rollback))} > {STATE_DIR}/rollback.sh\n"
                  f"{keep_sysctl}"
                  f"cat > {NETPLAN_FILE}.tmp; chmod 600 {NETPLAN_FILE}.tmp; mv {NETPLAN_FILE}.tmp {NETPLAN_FILE}\n"
                  f"if ! netplan generate 2> {STATE_DIR}/generate.err; then sh {STATE_DIR}/rollback.sh refused; "
                  f"echo \"netplan refused the file: $(cat {STATE_DIR}/generate.err)\" >&2; exit 3; fi\n"
                  f"rm -f {STATE_DIR}/confirmed; echo armed > {STATE_DIR}/state\n"
                  f"setsid sh -c {shlex.quote(watchdog)} < /dev/null > /dev/null 2>&1 & "
                  f"echo $! > {STATE_DIR}/watchdog.pid\n"
                  f"setsid sh -c {shlex.quote(change)} < /dev/null > /dev/null 2>&1 &")
        return (Command(script, sudo=True, stdin=wanted),)

    def _ssh_interface(self, ctx: HostContext) -> str | None:
        """The interface this SSH session arrives on (SSH_CONNECTION's server address)."""
        out = ctx.run(Command('set -- $SSH_CONNECTION; [ -n "$3" ] && ip -o addr show to "$3" | '
                              "awk '{print $2; exit}'")).stdout.strip()
        return out or None

    # ---- apply -----------------------------------------------------------------------------------------------
    def _confirmed(self, ctx: HostContext, confirm_s: float) -> bool:
        """A new SSH connection reaches the node after the change and disarms its watchdog before the deadline.
        A change the kernel refused has rolled back already: that is a failure with its own message."""
        deadline = time.monotonic() + confirm_s - 3
        time.sleep(LIVE_DELAY_S + 1)
        while time.monotonic() < deadline:
            try:
                state = _node_state(ctx)
                if state == "rolled-back-unconfirmed":
                    return False  # too late: the watchdog already restored the previous state
                if state == "rolled-back-refused":
                    raise StepFailed("the kernel refused the fabric addresses; the node rolled back to its previous "
                                     "netplan file and addresses", "check `ip addr` and `dmesg` on the node")
                if state == "live" and ctx.run(Command(
                        f"touch {STATE_DIR}/confirmed && kill $(cat {STATE_DIR}/watchdog.pid) 2>/dev/null; "
                        f"echo applied > {STATE_DIR}/state", sudo=True, timeout=5)).ok:
                    return True
            except Unreachable:
                pass
            time.sleep(1)
        return False

    def _outcome_after_rollback(self, ctx: HostContext, confirm_s: float) -> str:
        deadline = time.monotonic() + RECONNECT_GRACE_S
        while time.monotonic() < deadline:
            try:
                if _node_state(ctx).startswith("rolled-back"):
                    return "it rolled back to its previous netplan file and addresses, and answers again"
            except Unreachable:
                pass
            time.sleep(2)
        return f"its watchdog restores the previous addresses {confirm_s:g} s after the change"


def _fabric(ctx: HostContext) -> Fabric | None:
    """The graph discovery found, where some node has both ports Up (a ring: each cable its own subnets); a pair
    or a switch is addressed from each node's own facts, without a probe."""
    both = any(len({qsfp_port(d.netdev) for d in f.rdma if d.up}) > 1 for f in ctx.all_facts.values())
    return fabric_of(ctx.session) if both else None


def _node_now(ctx: HostContext, plan: NodeAddress, fresh: HostFacts) -> NodeNow:
    bridge = fresh.interface(NODE_NETDEV)
    routes = parse_routes(ctx.read(ROUTES).stdout)
    return NodeNow(bridge is not None, bridge is not None and plan.address in bridge.ipv4, routes,
                   missing_routes(plan, routes))


def _node_live(plan: NodeAddress) -> list[str]:
    """The node address on its port-less bridge, a route to every other node's; each idempotent."""
    return [f"ip link show {NODE_NETDEV} >/dev/null 2>&1 || ip link add {NODE_NETDEV} type bridge",
            f"ip addr replace {plan.address} dev {NODE_NETDEV}", f"ip link set {NODE_NETDEV} up",
            *(f"ip route replace {r.ip_args()}" for r in plan.routes)]


def _node_rollback(plan: NodeAddress, now: NodeNow) -> list[str]:
    """Back to what the node held: its routes as they were, its bridge."""
    lines = [f"ip link del {NODE_NETDEV} 2>/dev/null" if not now.exists else
             "" if now.held else f"ip addr del {plan.address} dev {NODE_NETDEV} 2>/dev/null"]
    for route in plan.routes:
        before = now.routes.get(str(route.to))
        lines.append(f"ip route replace {route.to} {before} 2>/dev/null" if before else
                     f"ip route del {route.to}/32 2>/dev/null")
    return [line for line in lines if line]


def _leftover(ctx: HostContext, fresh: HostFacts) -> Leftover | None:
    bridge = fresh.interface(NODE_NETDEV)
    if bridge is None:
        return None
    sources = {str(a.ip) for a in bridge.ipv4}
    routes = tuple(f"{to} {rest}" for to, rest in parse_routes(ctx.read(ROUTES).stdout).items()
                   if route_fields(rest).get("src") in sources)
    return Leftover(bridge.ipv4, routes)


def _forwarding_now(ctx: HostContext) -> forwarding.Now:
    values, sysctl, saved, rules = (ctx.read(c).stdout for c in FORWARDING)
    installed, chain, jump = forwarding.parse_rules(rules)
    return forwarding.Now(forwarding.parse_values(values), sysctl, forwarding.parse_saved(saved), chain, jump,
                          installed)


def _ip_forward_left_on(found: forwarding.Now) -> tuple[str, ...]:
    """A node an earlier sparkcluster turned into a router (its sysctl.d file set ip_forward for every interface):
    the value from before is unknown, so it is named, not guessed."""
    if "net.ipv4.ip_forward" not in found.sysctl or found.values.get(forwarding.IP_FORWARD) != "1":
        return ()
    return ("net.ipv4.ip_forward is 1, as an earlier sparkcluster set it for every ring node (the value before is "
            "unknown): unless Docker or another router on this node needs it, turn it off with "
            "`sudo sysctl -w net.ipv4.ip_forward=0`",)


def _retire_live(leftover: Leftover) -> list[str]:
    """The routes first, then the bridge."""
    return [f"ip route del {route.split()[0]}" for route in leftover.routes] + [f"ip link del {NODE_NETDEV}"]


def _retire_rollback(leftover: Leftover) -> list[str]:
    return [f"ip link add {NODE_NETDEV} type bridge 2>/dev/null",
            *(f"ip addr replace {a} dev {NODE_NETDEV}" for a in leftover.bridge), f"ip link set {NODE_NETDEV} up",
            *(f"ip route replace {route} 2>/dev/null" for route in leftover.routes)]


def _retire_text(leftover: Leftover | None) -> str:
    if leftover is None:
        return ""
    return f"; the routed control plane retired ({NODE_NETDEV} bridge, {len(leftover.routes)} routes)"


def _node_text(plan: NodeAddress | None) -> str:
    if plan is None:
        return ""
    return f"; node address {plan.address} on {NODE_NETDEV}, routes to {len(plan.routes)} nodes"


def _config(ctx: HostContext) -> FabricConfig:
    # The facts gathered at the play's start: every check of this run infers the same subnets from them.
    return fabric_config(ctx.inventory, ctx.host, list(ctx.all_facts.values()))


def _node_state(ctx: HostContext) -> str:
    """Where the node's change stands (armed, live, applied, rolled-back-*), over a new SSH connection: the old
    one may have died with the change."""
    ctx.transport.reconnect()
    return ctx.run(Command(f"cat {STATE_DIR}/state", sudo=True, timeout=5)).stdout.strip()


def _twins(plan: AddressPlan) -> str:
    return ", ".join(f"{t.netdev} {t.address}{' (new)' if t.assign else ''}" for t in plan.twins)
