"""What a ring node forwards, as data (round 5's S4): nothing on a pair or a 3-ring; on a 4-ring only the corners
whose diagonal walk crosses them, per twin (never ip_forward), with an iptables chain that accepts exactly those
flows and drops the rest into or out of the twins (first in FORWARD, so Docker's DROP policy does not stop the
diagonal); strict rp_filter where the route back leaves by the same twin; a second check after the change is a
no-op; and retirement puts back the values found before the first change and removes the chain."""

from __future__ import annotations

from ipaddress import IPv4Address, IPv4Interface, IPv4Network

from sparkcluster.engine.transport import Result
from sparkcluster.node import forwarding
from sparkcluster.node.addressing import fabric_config
from sparkcluster.node.fabric import build_fabric
from sparkcluster.node.forwarding import CHAIN, Now, Wanted
from sparkcluster.node.routed import Forward, NodeAddress, Route, node_address, plan_node_address
from sparkcluster.node.steps.addresses import SAVED_SYSCTL, FabricAddresses, NodeNow, _ip_forward_left_on
from tests.support.fabric import NODES3, NODES4, RING3, RING4, cabled, ring_plans

TWINS = ["enp1s0f0np0", "enP2p1s0f0np0", "enp1s0f1np1", "enP2p1s0f1np1"]
P0, P1 = "enp1s0f0np0", "enp1s0f1np1"  # twin 0 of port 0 and of port 1: the control plane's
# Captured on a network namespace of this machine (iptables v1.8.9, nf_tables) after the live change's lines.
IPTABLES_S = f"""-P FORWARD DROP
-A FORWARD -j {CHAIN}
-A FORWARD -j DOCKER-USER
-N {CHAIN}
-A {CHAIN} -s 10.177.0.11/32 -d 10.177.0.13/32 -i {P0} -o {P1} -j ACCEPT
-A {CHAIN} -s 10.177.0.13/32 -d 10.177.0.11/32 -i {P1} -o {P0} -j ACCEPT
"""


def wanted_of(nodes: list[str], cables: list[tuple[str, int, str, int]]) -> dict[str, Wanted]:
    _, _, plans = ring_plans(nodes, cables)
    return {n: forwarding.wanted(p.node, [t.netdev for t in p.twins]) for n, p in plans.items()}


def after(want: Wanted, values: dict[str, str]) -> Now:
    """The node as the live change leaves it."""
    return Now({**values, **want.values}, want.text, {k: values[k] for k in want.values}, want.rules or None,
               bool(want.rules))


def test_a_3_ring_forwards_nothing():
    """The report's 3-ring: every walk is one cable, so no node forwards, no sysctl file, no chain."""
    for node, want in wanted_of(NODES3, RING3).items():
        assert want == Wanted() and want.text == "", node
    found = Now({"net.ipv4.ip_forward": "0", f"net.ipv4.conf.{P0}.forwarding": "0"}, "", {}, None, False)
    assert forwarding.converged(Wanted(), found) and forwarding.live(Wanted(), found, SAVED_SYSCTL) == []


def test_a_pair_and_a_switch_forward_nothing():
    facts, answers = cabled([("spark-1", 1, "spark-2", 0)], NODES3[:2])
    graph = build_fabric(NODES3[:2], facts, answers)
    addresses = {n: IPv4Interface(f"10.177.0.{11 + i}/32") for i, n in enumerate(NODES3[:2])}
    twins = {"spark-1": {P1: IPv4Interface("10.0.0.1/24")}, "spark-2": {P0: IPv4Interface("10.0.0.2/24")}}
    assert plan_node_address("spark-1", graph, addresses, twins).forwards == ()
    assert forwarding.wanted(None, TWINS) == Wanted()  # a pair's and a switch's plan has no node address


def test_on_a_4_ring_only_the_corners_the_diagonals_cross_forward_per_twin_between_node_addresses():
    wants = wanted_of(NODES4, RING4)
    # spark-1 <-> spark-3 crosses spark-2 both ways, spark-2 <-> spark-4 crosses spark-1: spark-3 and spark-4
    # forward nothing.
    assert wants["spark-3"] == wants["spark-4"] == Wanted()
    want = wants["spark-2"]
    assert dict(want.values) == {f"net.ipv4.conf.{P0}.forwarding": "1", f"net.ipv4.conf.{P0}.rp_filter": "1",
                                 f"net.ipv4.conf.{P1}.forwarding": "1", f"net.ipv4.conf.{P1}.rp_filter": "1"}
    assert want.text.endswith(f"net.ipv4.conf.{P0}.forwarding = 1\nnet.ipv4.conf.{P0}.rp_filter = 1\n"
                              f"net.ipv4.conf.{P1}.forwarding = 1\nnet.ipv4.conf.{P1}.rp_filter = 1\n")
    assert "ip_forward" not in want.text
    accepts = [r for r in want.rules if r[-1] == "ACCEPT"]
    assert accepts == [("-s", "10.177.0.11/32", "-d", "10.177.0.13/32", "-i", P0, "-o", P1, "-j", "ACCEPT"),
                       ("-s", "10.177.0.13/32", "-d", "10.177.0.11/32", "-i", P1, "-o", P0, "-j", "ACCEPT")]
    # after them, anything else forwarded into or out of any of the four twins is dropped (the LAN's too)
    assert want.rules[2:] == (*(("-i", t, "-j", "DROP") for t in TWINS), *(("-o", t, "-j", "DROP") for t in TWINS))
    assert [r[:4] for r in wants["spark-1"].rules[:2]] == [("-s", "10.177.0.12/32", "-d", "10.177.0.14/32"),
                                                           ("-s", "10.177.0.14/32", "-d", "10.177.0.12/32")]


def test_the_change_sets_the_twins_saves_what_it_found_and_a_second_check_is_a_no_op():
    want = wanted_of(NODES4, RING4)["spark-2"]
    # Docker turned ip_forward on (every interface forwards) and set FORWARD's policy to DROP
    found = Now({"net.ipv4.ip_forward": "1", f"net.ipv4.conf.{P0}.forwarding": "1", f"net.ipv4.conf.{P0}.rp_filter":
                 "0", f"net.ipv4.conf.{P1}.forwarding": "1", f"net.ipv4.conf.{P1}.rp_filter": "0"}, "", {}, None, False)
    assert not forwarding.converged(want, found)
    lines = forwarding.live(want, found, SAVED_SYSCTL)
    assert lines[0] == (f"printf '%s' 'net.ipv4.conf.{P0}.forwarding = 1\nnet.ipv4.conf.{P0}.rp_filter = 0\n"
                        f"net.ipv4.conf.{P1}.forwarding = 1\nnet.ipv4.conf.{P1}.rp_filter = 0\n' > {SAVED_SYSCTL}.tmp"
                        f" && mv {SAVED_SYSCTL}.tmp {SAVED_SYSCTL}")
    assert lines[1:3] == [f"sysctl -qw net.ipv4.conf.{P0}.rp_filter=1", f"sysctl -qw net.ipv4.conf.{P1}.rp_filter=1"]
    assert lines[3] == f"iptables -w -N {CHAIN} 2>/dev/null || iptables -w -F {CHAIN}"
    assert lines[4] == f"iptables -w -A {CHAIN} -s 10.177.0.11/32 -d 10.177.0.13/32 -i {P0} -o {P1} -j ACCEPT"
    # the jump goes first in FORWARD: ahead of Docker's DROP policy and its own chains
    assert lines[-1] == f"iptables -w -C FORWARD -j {CHAIN} 2>/dev/null || iptables -w -I FORWARD 1 -j {CHAIN}"
    assert not any("ip_forward" in line for line in lines)
    done = after(want, dict(found.values))
    assert forwarding.converged(want, done) and forwarding.live(want, done, SAVED_SYSCTL) == []
    # the saved values are those found, not those set: a later run keeps them
    assert done.saved[f"net.ipv4.conf.{P0}.rp_filter"] == "0"


def test_retirement_puts_back_the_values_found_and_removes_the_chain_and_the_rollback_undoes_that():
    want = wanted_of(NODES4, RING4)["spark-2"]
    done = after(want, {"net.ipv4.ip_forward": "0", f"net.ipv4.conf.{P0}.forwarding": "0",
                        f"net.ipv4.conf.{P0}.rp_filter": "2", f"net.ipv4.conf.{P1}.forwarding": "0",
                        f"net.ipv4.conf.{P1}.rp_filter": "2"})
    lines = forwarding.live(Wanted(), done, SAVED_SYSCTL)
    assert lines == [f"rm -f {SAVED_SYSCTL}",
                     f"sysctl -qew net.ipv4.conf.{P0}.forwarding=0", f"sysctl -qew net.ipv4.conf.{P0}.rp_filter=2",
                     f"sysctl -qew net.ipv4.conf.{P1}.forwarding=0", f"sysctl -qew net.ipv4.conf.{P1}.rp_filter=2",
                     f"iptables -w -D FORWARD -j {CHAIN}", f"iptables -w -F {CHAIN}", f"iptables -w -X {CHAIN}"]
    back = forwarding.rollback(Wanted(), done, SAVED_SYSCTL)
    assert f"sysctl -qew net.ipv4.conf.{P0}.forwarding=1" in back and f"iptables -w -A {CHAIN} -i {P0} -j DROP" in back
    assert back[-1] == f"iptables -w -C FORWARD -j {CHAIN} 2>/dev/null || iptables -w -I FORWARD 1 -j {CHAIN}"
    retired = Now(done.values, "", {}, None, False)
    assert forwarding.converged(Wanted(), retired)


def test_rp_filter_is_loose_only_where_the_route_back_leaves_by_another_twin():
    a, b, me = IPv4Address("10.177.0.11"), IPv4Address("10.177.0.13"), IPv4Address("10.177.0.12")
    symmetric = NodeAddress(IPv4Interface(f"{me}/32"), (Route(a, a, P0, me), Route(b, b, P1, me)),
                            (Forward(a, b, P0, P1), Forward(b, a, P1, P0)))
    assert forwarding.rp_filter(symmetric, P0) == forwarding.rp_filter(symmetric, P1) == "1"
    # our route to a leaves by P1, yet a's traffic arrives on P0: strict mode would drop it
    skew = NodeAddress(symmetric.address, (Route(a, b, P1, me), Route(b, b, P1, me)), symmetric.forwards)
    assert forwarding.rp_filter(skew, P0) == "2" and forwarding.rp_filter(skew, P1) == "1"


def test_the_node_state_is_read_from_proc_sysctl_and_iptables():
    values = forwarding.parse_values(f"/proc/sys/net/ipv4/ip_forward:0\n/proc/sys/net/ipv4/conf/{P0}/forwarding:1\n"
                                     "/proc/sys/net/ipv4/conf/enp1s0.100/rp_filter:2\n")
    assert values == {"net.ipv4.ip_forward": "0", f"net.ipv4.conf.{P0}.forwarding": "1",
                      "net.ipv4.conf.enp1s0/100.rp_filter": "2"}  # sysctl's own spelling of a dotted name
    assert forwarding.parse_saved(f"net.ipv4.conf.{P0}.forwarding = 0\n") == {f"net.ipv4.conf.{P0}.forwarding": "0"}
    installed, rules, jump = forwarding.parse_rules(IPTABLES_S)
    assert installed and jump and rules == (
        ("-s", "10.177.0.11/32", "-d", "10.177.0.13/32", "-i", P0, "-o", P1, "-j", "ACCEPT"),
        ("-s", "10.177.0.13/32", "-d", "10.177.0.11/32", "-i", P1, "-o", P0, "-j", "ACCEPT"))
    assert forwarding.parse_rules("-P FORWARD ACCEPT\n") == (True, None, False)
    assert forwarding.parse_rules("no-iptables\n") == (False, None, False)


def test_on_a_3_ring_node_an_earlier_version_made_a_router_the_file_goes_and_ip_forward_is_named():
    """The step's commands: the legacy sysctl file (ip_forward = 1 for every interface) removed, no sysctl write,
    and a warning that names ip_forward, whose value from before that version is unknown."""
    inv, _, plans = ring_plans(NODES3, RING3)
    plan = plans["spark-1"]
    assert plan.node is not None and plan.node.forwards == ()
    legacy = "# Written by `sparkcluster bootstrap`\nnet.ipv4.ip_forward = 1\n"
    found = Now({"net.ipv4.ip_forward": "1"}, legacy, {}, None, False)

    class Ctx:
        host = inv.hosts[0]

        def run(self, command):  # the SSH session arrives on the management port
            return Result(command, 0, "enP7s7\n", "", 0.0)

    now = NodeNow(True, True, {}, ())
    (command,) = FabricAddresses(None)._commands(Ctx(), plan, "", fabric_config(inv, inv.hosts[0]),  # type: ignore[arg-type]
                                                 now, None, (Wanted(), found))
    script = command.display()
    assert "rm -f /etc/sysctl.d/60-sparkcluster-fabric.conf\n" in script
    assert "sysctl -q" not in script.split("rollback.sh")[-1] and "iptables" not in script
    (warning,) = _ip_forward_left_on(found)
    assert "`sudo sysctl -w net.ipv4.ip_forward=0`" in warning
    assert _ip_forward_left_on(Now({"net.ipv4.ip_forward": "1"}, "", {}, None, False)) == ()  # Docker's, not ours


def test_the_node_addresses_name_the_4_rings_diagonal_forwards():
    _, _, plans = ring_plans(NODES4, RING4)
    node = plans["spark-2"].node
    assert node is not None and node.address == node_address(IPv4Network("10.177.0.0/24"), 12)
    assert node.forwards == (Forward(IPv4Address("10.177.0.11"), IPv4Address("10.177.0.13"), P0, P1),
                             Forward(IPv4Address("10.177.0.13"), IPv4Address("10.177.0.11"), P1, P0))
