"""The first mile on simulated Sparks fresh from the box (`sim up --no-fabric-addresses`): the cabled QSFP twins
are up but have no addresses and MTU 1500, and bootstrap's fabric.addresses gives them theirs (netplan file,
live addresses, MTU 9000), refuses collisions before changing anything, and rolls a node back by itself when the
change cuts it off."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from sparkcluster.sim import SimCluster, UpOptions
from tests.support.helpers import require_sim, run_cli, ssh, unique_name

pytestmark = [pytest.mark.sim, pytest.mark.slow]

NETPLAN_FILE = "/etc/netplan/40-sparkcluster-fabric.yaml"


def fresh(count: int, tag: str, **kwargs: object) -> SimCluster:
    require_sim(docker=False)
    return SimCluster.up(UpOptions(count=count, name=unique_name(tag), docker=False, fabric_addresses=False,
                                   **kwargs))  # type: ignore[arg-type]


def bootstrap(c: SimCluster, config_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli("bootstrap", str(c.inventory_path), "--runtime", "host", *args,
                   env={"XDG_CONFIG_HOME": str(config_dir)})


def twins(c: SimCluster, host: str) -> dict[str, tuple[list[str], int]]:
    """netdev -> (IPv4 addresses, MTU) of the host's cabled QSFP twins, read inside the host."""
    spec = c.host(host)
    links = json.loads(c.exec_in(host, ["ip", "-j", "addr"], capture_output=True, text=True).stdout)
    cabled = {n.netdev for n in spec.nics if n.hca and n.cabled}
    return {link["ifname"]: ([f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["family"] == "inet"],
                             link["mtu"]) for link in links if link["ifname"] in cabled}


def changed(output: str) -> list[int]:
    return [int(n) for n in re.findall(r"changed=(\d+)", output)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    c = fresh(2, "fab2")
    try:
        yield c, tmp_path_factory.mktemp("cfg")
    finally:
        c.down()


def test_a_fresh_pair_is_addressed_then_nothing_changes(pair):
    c, cfg = pair
    before = {h.name: twins(c, h.name) for h in c.topology.hosts}
    assert all(addrs == [] and mtu == 1500 for t in before.values() for addrs, mtu in t.values()), before
    mgmt = {h.name: h.mgmt_ip for h in c.topology.hosts}

    # --check first, as a careful user does: exit 0 with the whole plan. The addresses fabric.addresses would give
    # are what the QSFP preflight and the comm env check against (before, the preflight failed on the bare twins
    # and told the user to add by hand what bootstrap would add); nothing changes on the nodes.
    dry = bootstrap(c, cfg, "--check")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    subnets = [ipaddress.IPv4Network(n) for n in yaml.safe_load(c.inventory_path.read_text())["vars"]["fabric"]["subnets"]]
    for host, number in (("spark-1", 11), ("spark-2", 12)):
        plan = [line for line in dry.stdout.splitlines() if f" {host} | " in line]
        assert any(f"fabric.addresses | would address port 1: enp1s0f1np1 {subnets[0][number]}/24 (new)" in line
                   for line in plan), dry.stdout
        assert any(f"preflight.qsfp | enp1s0f1np1 {subnets[0][number]}/24" in line and "MTU 9000" in line
                   for line in plan), dry.stdout
        assert any("preflight.fabric | " in line and "planned, not applied" in line for line in plan), dry.stdout
        assert any("comm.env | would create" in line for line in plan), dry.stdout
    assert "PLAY ssh mesh" in dry.stdout and "PLAY models" in dry.stdout  # every play ran
    assert changed(dry.stdout) == [3, 3] and "failed=0" in dry.stdout and "failed=1" not in dry.stdout
    assert {h.name: twins(c, h.name) for h in c.topology.hosts} == before  # check mode changed nothing

    first = bootstrap(c, cfg)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "fabric.addresses | address port 1" in first.stdout

    for number, host in enumerate(("spark-1", "spark-2"), start=11):
        got = twins(c, host)
        assert got == {"enp1s0f1np1": ([f"{subnets[0][number]}/24"], 9000),
                       "enP2p1s0f1np1": ([f"{subnets[1][number]}/24"], 9000)}, got
        mode = c.exec_in(host, ["stat", "-c", "%a %U", NETPLAN_FILE], capture_output=True, text=True).stdout.split()
        assert mode == ["600", "root"]
        generate = c.exec_in(host, ["netplan", "generate"], capture_output=True, text=True)
        assert generate.returncode == 0, generate.stderr
        assert ssh(c, host, "ip -4 -o addr show enP7s7").stdout.split()[3] == f"{mgmt[host]}/24"
    # The head reaches each worker over each subnet, with jumbo frames unfragmented.
    for twin, subnet in (("enp1s0f1np1", subnets[0]), ("enP2p1s0f1np1", subnets[1])):
        ssh(c, "spark-1", f"ping -c 1 -W 2 -M do -s 8972 -I {twin} {subnet[12]}")
    # The comm env binds to the new addresses, with the RoCE v2 GID the kernel (emulated) added for them.
    env = ssh(c, "spark-2", "cat ~/.config/sparkcluster/comm.env").stdout
    assert f"VLLM_HOST_IP={subnets[0][12]}" in env and "NCCL_IB_GID_INDEX=3" in env

    second = bootstrap(c, cfg)
    assert second.returncode == 0, second.stdout + second.stderr
    assert changed(second.stdout) == [0, 0], second.stdout
    assert "already addressed" in second.stdout


def test_stage_and_verify_run_on_the_new_addresses(pair):
    pytest.importorskip("torch")
    c, cfg = pair
    if bootstrap(c, cfg).returncode != 0:
        pytest.fail("bootstrap failed before this test")
    out = run_cli("verify", str(c.inventory_path), "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 0 and doc["verdict"]["status"] == "PASS", out.stdout + out.stderr
    fabric = {h: twins(c, h)["enp1s0f1np1"][0][0].split("/")[0] for h in ("spark-1", "spark-2")}
    for node, lines in doc["carried_by"].items():
        assert lines and all(line.split()[:2] == ["enp1s0f1np1", fabric[node]] for line in lines)


def test_four_nodes_cabled_on_either_port(tmp_path):
    c = fresh(4, "fab4", port0_hosts=frozenset({"spark-3"}))
    try:
        result = bootstrap(c, tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "port 0" in result.stdout  # the mix works, and is reported
        assert set(twins(c, "spark-3")) == {"enp1s0f0np0", "enP2p1s0f0np0"}
        for host in ("spark-1", "spark-2", "spark-3", "spark-4"):
            assert all(len(addrs) == 1 and mtu == 9000 for addrs, mtu in twins(c, host).values())
        target = twins(c, "spark-3")["enp1s0f0np0"][0][0].split("/")[0]
        ssh(c, "spark-4", f"ping -c 1 -W 2 -I enp1s0f1np1 {target}")
    finally:
        c.down()


def test_collisions_are_refused_before_anything_changes(tmp_path):
    c = fresh(2, "fabdup")
    bridge_a = next(b for b in c.topology.bridges if b.endswith("fa"))
    planned = str(c.topology.subnets.fabric[0][12])  # what spark-2 would get
    subprocess.run(["ip", "addr", "add", f"{planned}/32", "dev", bridge_a], check=True)  # a stranger holds it
    try:
        result = bootstrap(c, tmp_path)
        assert result.returncode == 1
        assert f"{planned} is already in use on the fabric" in result.stdout
        assert all(addrs == [] for addrs, _ in twins(c, "spark-2").values())
        assert c.exec_in("spark-2", ["test", "-e", NETPLAN_FILE]).returncode == 1
        assert all(len(addrs) == 1 for addrs, _ in twins(c, "spark-1").values())  # the healthy node goes on

        # A fabric subnet on the management LAN is refused on every node, before anything changes.
        subprocess.run(["ip", "addr", "del", f"{planned}/32", "dev", bridge_a], check=True)
        doc = yaml.safe_load(c.inventory_path.read_text())
        doc["vars"]["fabric"]["subnets"] = [str(c.topology.subnets.lan), "10.254.77.0/24"]
        clash = tmp_path / "clash.yml"
        clash.write_text(yaml.safe_dump(doc))
        result = run_cli("bootstrap", str(clash), "--runtime", "host", env={"XDG_CONFIG_HOME": str(tmp_path)})
        assert result.returncode == 1
        assert f"overlaps {c.topology.subnets.lan} on enP7s7" in result.stdout
        assert all(addrs == [] for addrs, _ in twins(c, "spark-2").values())
    finally:
        subprocess.run(["ip", "addr", "del", f"{planned}/32", "dev", bridge_a], capture_output=True)
        c.down()


# Stands in for a change that cuts the node off: the first `netplan generate` after the marker appears takes the
# management link down for 25 s, longer than the confirmation window, then brings it back.
CUT_OFF_NETPLAN = """#!/bin/sh
if [ "$1" = generate ] && rm /run/cut-me-off 2>/dev/null; then
  setsid sh -c "sleep 1; ip link set enP7s7 down; sleep 25; ip link set enP7s7 up" </dev/null >/dev/null 2>&1 &
fi
exec /usr/sbin/netplan "$@"
"""


def test_a_node_cut_off_by_the_change_rolls_back_and_the_others_finish(tmp_path):
    c = fresh(2, "fabcut")
    try:
        doc = yaml.safe_load(c.inventory_path.read_text())
        doc["vars"]["fabric"]["confirm_timeout"] = 8
        c.inventory_path.write_text(yaml.safe_dump(doc))
        c.exec_in("spark-2", ["sh", "-c", f"cat > /usr/local/sbin/netplan <<'EOF'\n{CUT_OFF_NETPLAN}EOF\n"
                                          "chmod 755 /usr/local/sbin/netplan; touch /run/cut-me-off"], check=True)
        result = bootstrap(c, tmp_path)
        assert result.returncode == 1, result.stdout + result.stderr
        assert re.search(r"spark-2 \| fabric\.addresses \| spark-2 stopped answering over SSH after its fabric "
                         r"addresses changed; it rolled back", result.stdout), result.stdout
        assert all(addrs == [] and mtu == 1500 for addrs, mtu in twins(c, "spark-2").values())
        assert c.exec_in("spark-2", ["test", "-e", NETPLAN_FILE]).returncode == 1
        assert all(len(addrs) == 1 and mtu == 9000 for addrs, mtu in twins(c, "spark-1").values())
        assert "spark-1 : ok=" in result.stdout and "failed=0" in result.stdout.split("spark-1 : ")[-1].splitlines()[0]
    finally:
        c.down()


def test_a_node_cabled_to_itself_behind_a_switch_is_refused_and_named(tmp_path):
    """README audit round 3, item 3: `--miscable self` on an addressed switch passed `topology` and bootstrap went
    on. Nobody answers on that node's twins and nobody sees it: the head names it, and nothing is changed."""
    require_sim(docker=False)
    c = SimCluster.up(UpOptions(count=3, name=unique_name("swself"), docker=False, topology="switch", miscable="self"))
    try:
        before = {h: twins(c, h) for h in ("spark-1", "spark-2", "spark-3")}
        shown = run_cli("topology", "-i", str(c.inventory_path))
        assert shown.returncode == 1 and "Traceback" not in shown.stderr, shown.stdout + shown.stderr
        out = bootstrap(c, tmp_path)
        said = " ".join(out.stdout.split())
        assert out.returncode == 1 and "spark-3 looks cabled to itself" in said, said
        assert {h: twins(c, h) for h in before} == before  # nothing was changed
    finally:
        c.down()
