"""What the ring files share (test_ring3.py, test_ring4.py): one simulated ring per size, up from unaddressed
cables with the real CPU vLLM, so that discovery, bootstrap, verify and a real serve all run on the same cluster
(each real serve costs 1-3 minutes; a second cluster of one size would cost its start and bootstrap again); the
checks every ring passes; and a local registry in eugr/spark-vllm-docker's layout, whose 3x- and 4x-spark-cluster
recipes serve the tiny Llama."""

from __future__ import annotations

import ipaddress
import json
import re
import subprocess
from pathlib import Path

import yaml

from sparkcluster.sim import SimCluster, UpOptions, tinymodel
from tests.support import vllm_model_info
from tests.support.helpers import require_sim, run_cli, ssh, unique_name
from tests.support.sim_serving import VLLM_ENV

COMM_ENV = "/home/spark/.config/sparkcluster/comm.env"
SYSCTL_FILE = "/etc/sysctl.d/60-sparkcluster-fabric.conf"
MGMT_NETDEV = "enP7s7"


def ring(count: int, tag: str, miscable: str = "", vllm: bool = True) -> SimCluster:
    """A ring of `count` nodes cabled crosswise (port 1 of one node to port 0 of the next), nothing addressed."""
    require_sim(docker=False)
    return SimCluster.up(UpOptions(count=count, name=unique_name(tag), docker=False, fabric_addresses=False,
                                   topology="ring", miscable=miscable, vllm_env=str(VLLM_ENV) if vllm else None))


def bootstrap(c: SimCluster, cfg: Path) -> subprocess.CompletedProcess:
    return run_cli("bootstrap", str(c.inventory_path), "--runtime", "host", env={"XDG_CONFIG_HOME": str(cfg)})


def ready_to_serve(c: SimCluster) -> None:
    """The tiny Llama on the head: serve stages it node to node along the cables. (The inventory `sim up --vllm-env`
    wrote turns on the simulator's CPU plugin, whose eager helper spares g++ at the first request.)"""
    tinymodel.generate_on(c, "spark-1", str(VLLM_ENV / "bin" / "python"))
    vllm_model_info.lay_on(c, VLLM_ENV)  # each node's first vLLM start skips its model-class inspection


def topology(c: SimCluster) -> tuple[int, dict]:
    out = run_cli("topology", "-i", str(c.inventory_path), "--json")
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


def cables(doc: dict) -> set[tuple[str, int, str, int]]:
    return {(l["a"]["node"], l["a"]["port"], l["b"]["node"], l["b"]["port"]) for l in doc["links"]}


def ipv4(c: SimCluster, host: str) -> dict[str, str]:
    links = json.loads(c.exec_in(host, ["ip", "-j", "-4", "addr"], capture_output=True, text=True).stdout)
    return {l["ifname"]: f"{a['local']}/{a['prefixlen']}" for l in links for a in l["addr_info"]
            if l["ifname"].startswith("en") and "np" in l["ifname"]}


def found_before_addressing(c: SimCluster, code: int, before: dict) -> None:
    """`topology` on unaddressed cables (discovery on IPv6 link-local alone) finds every crosswise cable."""
    n = len(c.topology.hosts)
    assert code == 0 and before["kind"] == "ring" and before["problems"] == []
    crosswise = {("spark-1", 1, "spark-2", 0), *{(f"spark-{i}", 1, f"spark-{i + 1}", 0) for i in range(2, n)},
                 ("spark-1", 0, f"spark-{n}", 1)}
    assert cables(before) == crosswise
    assert len(before["links"]) == 2 * n and all(l["subnet"] is None for l in before["links"])
    assert {l["a"]["netdev"][:4] for l in before["links"]} == {"enp1", "enP2"}  # both twins of every cable


def each_cable_its_own_subnets(c: SimCluster, first: subprocess.CompletedProcess, cfg: Path) -> None:
    """Four addresses per node on four subnets, each subnet holding exactly the two ends of one cable; a second
    bootstrap changes nothing."""
    assert first.returncode == 0, first.stdout + first.stderr
    subnets: dict[str, set[str]] = {}
    for host in c.topology.hosts:
        twins = ipv4(c, host.name)
        assert len(twins) == 4 and len({a.rsplit(".", 1)[0] for a in twins.values()}) == 4
        for address in twins.values():
            subnets.setdefault(address.rsplit(".", 1)[0], set()).add(host.name)
    assert len(subnets) == 2 * len(c.topology.hosts) and all(len(ends) == 2 for ends in subnets.values())
    second = bootstrap(c, cfg)
    assert second.returncode == 0 and set(re.findall(r"changed=(\d+)", second.stdout)) == {"0"}, second.stdout
    code, after = topology(c)
    assert code == 0 and all(l["subnet"] for l in after["links"])


def node_address(c: SimCluster, host: str) -> str:
    """The routed control-plane address bootstrap gives a ring node (fabric.node_subnet's .11, .12 ...)."""
    return f"10.177.0.{10 + [h.name for h in c.topology.hosts].index(host) + 1}"


def comm_env_is_the_rings(c: SimCluster, first: subprocess.CompletedProcess) -> None:
    assert "preflight.fabric" in first.stdout
    env = dict(line.split("=", 1) for line in ssh(c, "spark-2", f"cat {COMM_ENV}").stdout.splitlines()
               if "=" in line and not line.startswith("#"))
    assert len(env["NCCL_IB_HCA"].split(",")) == 4 and env["NCCL_IB_SUBNET_AWARE_ROUTING"] == "1"
    # The control plane on the node's routed address (fabric.control_plane: routed, the default on a ring).
    assert env["VLLM_HOST_IP"] == node_address(c, "spark-2") and env["NCCL_SOCKET_IFNAME"] == "scnode"
    everyone = [node_address(c, h.name) for h in c.topology.hosts]
    for host in c.topology.hosts:
        # Each node reaches every other node's address over the cables (on a 4-ring the diagonal through a
        # neighbour, which forwards it), and its netplan and sysctl.d files keep the routes and forwarding.
        pings = " ".join(f"(ping -c 1 -W 2 -q {a} >/dev/null || echo unreached {a}) &" for a in everyone)
        assert ssh(c, host.name, f"{pings} wait").stdout.strip() == "", host.name
        netplan = yaml.safe_load(c.exec_in(host.name, ["cat", "/etc/netplan/40-sparkcluster-fabric.yaml"],
                                           capture_output=True, text=True).stdout)["network"]
        assert netplan["bridges"]["scnode"]["addresses"] == [f"{node_address(c, host.name)}/32"]
        routes = sorted(r["to"] for e in netplan["ethernets"].values() for r in e.get("routes", []))
        assert routes == sorted(f"{a}/32" for a in everyone if a != node_address(c, host.name))
        # Forwarding only where a diagonal crosses the node (none on a 3-ring), per twin, never ip_forward.
        values = forwarding_state(c, host.name)
        assert values["ip_forward"] == "0" and values[f"{MGMT_NETDEV}/forwarding"] == "0", host.name
        on = sorted(k.split("/")[0] for k, v in values.items() if k.endswith("/forwarding") and v == "1")
        assert on == (["enp1s0f0np0", "enp1s0f1np1"] if host.name in forwarders(c) else []), (host.name, on)
        sysctl = ssh(c, host.name, f"cat {SYSCTL_FILE}", check=False)
        assert (sysctl.returncode == 0) == (host.name in forwarders(c)) and "ip_forward" not in sysctl.stdout
    four = len(c.topology.hosts) == 4
    assert (env.get("NCCL_ALGO"), env.get("NCCL_SKIP_TREE_CONNECT")) == (("Ring", "1") if four else (None, None))
    # spark-1's port 1 is cabled to spark-2's port 0: their addresses on that cable answer each other.
    peer = ipv4(c, "spark-2")["enp1s0f0np0"].split("/")[0]
    assert ssh(c, "spark-1", f"ping -c 1 -W 2 -I enp1s0f1np1 {peer}").returncode == 0


def forwarders(c: SimCluster) -> set[str]:
    """The nodes a diagonal walk crosses: on a 4-ring spark-1 <-> spark-3 crosses spark-2 both ways, spark-2 <->
    spark-4 crosses spark-1; on a 3-ring every walk is one cable."""
    return {"spark-1", "spark-2"} if len(c.topology.hosts) == 4 else set()


def forwarding_state(c: SimCluster, host: str) -> dict[str, str]:
    """A node's IPv4 forwarding and rp_filter values: `ip_forward` and `<netdev>/forwarding`, `<netdev>/rp_filter`."""
    out = c.exec_in(host, ["sh", "-c", "cd /proc/sys/net/ipv4 && grep -H . ip_forward conf/*/forwarding "
                                       "conf/*/rp_filter"], capture_output=True, text=True, check=True).stdout
    return {key.removeprefix("conf/"): value for key, value in (line.rsplit(":", 1) for line in out.splitlines())}


def forwarded(c: SimCluster, host: str) -> int:
    """The datagrams a node has forwarded (Ip ForwDatagrams of /proc/net/snmp)."""
    names, values = [line.split() for line in c.exec_in(host, ["cat", "/proc/net/snmp"], capture_output=True,
                                                             text=True).stdout.splitlines() if line.startswith("Ip:")][:2]
    return int(values[names.index("ForwDatagrams")])


def lan_host_reaches(c: SimCluster, lan_host: str, router: str, address: str) -> tuple[bool, int]:
    """Round 5's S4 reproduction: `lan_host`'s management port stands for any host of the management LAN; it routes
    the /24 of a cable `address` through `router`'s LAN address and pings it. (answered, datagrams `router`
    forwarded meanwhile)."""
    subnet = str(ipaddress.ip_interface(address).network)
    before = forwarded(c, router)
    c.exec_in(lan_host, ["ip", "route", "add", subnet, "via", c.host(router).mgmt_ip, "dev", MGMT_NETDEV], check=True)
    try:
        ping = c.exec_in(lan_host, ["ping", "-c", "2", "-W", "1", address.split("/")[0]], capture_output=True)
    finally:
        c.exec_in(lan_host, ["ip", "route", "del", subnet], check=True)
    return ping.returncode == 0, forwarded(c, router) - before


# eugr/spark-vllm-docker's layout: recipes/<N>x-spark-cluster/*.yaml in its v1 format, mods/<name>/run.sh, and the
# manifest sparkrun reads. The command is eugr's own shape (Ray named as its cluster recipes name it; the tests
# serve with --launcher native, which the CPU build runs without the Ray plugin's extra minute).
EUGR_RECIPE = """\
# Recipe: the tiny Llama across {count} Sparks ({shape})
recipe_version: "1"
name: Tiny-Llama ({shape})
description: the simulator's tiny Llama on a {count}-node mesh, {shape}
model: local/tiny-llama
cluster_only: true
container: vllm-node
mods:
  - mods/stage-marker
defaults:
  port: 8000
  host: 0.0.0.0
  tensor_parallel: {tp}
  pipeline_parallel: {pp}
  max_model_len: 256
  # Not --enforce-eager: vLLM's CPU worker then skips its warm-up run, which is where a later pipeline stage
  # allocates the buffer for the activations it receives (eager torch.compile warms up without g++).
  compilation_config: '{{"mode": 1, "backend": "eager"}}'
env:
  SPARKCLUSTER_EUGR_RECIPE: "{count}x"
command: |
  vllm serve local/tiny-llama \\
    --max-model-len {{max_model_len}} \\
    --port {{port}} \\
    --host {{host}} \\
    --served-model-name tiny-{count}x \\
    --compilation-config '{{compilation_config}}' \\
    -tp {{tensor_parallel}} \\
    -pp {{pipeline_parallel}} \\
    --distributed-executor-backend ray
"""
MARKER_MOD = '#!/bin/sh\necho "stage ready" > "$WORKSPACE_DIR/eugr-mod-ran"\n'


def eugr_clone(cache: Path, config: Path) -> Path:
    """A local clone of eugr's registry where sparkrun keeps it, trusted in sparkrun's config (as `sparkrun
    registry add` leaves it): `@eugr/...` finds its recipes, as on a machine with sparkrun set up."""
    clone = cache / "sparkrun" / "registries" / "eugr"
    (clone / ".sparkrun").mkdir(parents=True)
    (clone / ".sparkrun" / "registry.yaml").write_text(
        "registries:\n  - name: eugr\n    recipes: recipes\n    mods: mods\n    visible: true\n")
    for count, tp, pp in ((3, 1, 3), (4, 2, 2)):
        shape = f"TP={tp} x PP={pp}" if tp > 1 else f"PP={pp}"
        folder = clone / "recipes" / f"{count}x-spark-cluster"
        folder.mkdir(parents=True)
        (folder / "tiny-llama.yaml").write_text(EUGR_RECIPE.format(count=count, tp=tp, pp=pp, shape=shape))
    (clone / "mods" / "stage-marker").mkdir(parents=True)
    (clone / "mods" / "stage-marker" / "run.sh").write_text(MARKER_MOD)
    (config / "sparkrun").mkdir(parents=True, exist_ok=True)
    (config / "sparkrun" / "registries.yaml").write_text("registries:\n  - {name: eugr, trusted: true}\n")
    return clone


def vllm_lines(c: SimCluster) -> list[str]:
    """Each node's `vllm serve` line, in host order (full width: ps cuts long lines at 80 columns)."""
    found = []
    for host in c.topology.hosts:
        full = c.exec_in(host.name, ["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout
        lines = [p for p in full.splitlines() if "vllm serve" in p]
        assert lines, f"{host.name} runs no vllm serve"
        found.append(lines[0])
    return found


def node_logs(c: SimCluster) -> str:
    """Every rank's own log (the head's alone seldom says why a pipeline stage stalled)."""
    return "".join(f"\n== {h.name} ==\n" + ssh(c, h.name, "tail -n 25 ~/.cache/sparkcluster/serve/main.log",
                                                   check=False).stdout for h in c.topology.hosts)
