"""A 3-ring of simulated Sparks from unaddressed cables, one cluster for the whole file (no Docker; the real CPU
vLLM): `topology` finds every cable before anything is addressed; bootstrap gives each cable its own subnets and a
second run changes nothing; the runtime `bootstrap --runtime host` is given is recorded in the user's inventory, and
doctor, status, logs and down follow it with no --runtime; `verify` measures the whole collective and each of the six twin links alone (a matrix),
names a link held down by `sim degrade`, and refuses a control-plane address some node cannot reach (a re-run of
bootstrap puts a lost route back); no node forwards, so a management-LAN host routed through one reaches no cable
subnet; the management LAN chosen retires the routed plane, the default restores it; no
route into an untrusted registry runs its mod on a node; and eugr's 3x-spark-cluster recipe, from a registry in
eugr's layout by `@eugr/...`, renders and serves the tiny Llama as TP 1 x PP 3, one pipeline stage per node along the
ring, a completion answering."""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import yaml

from sparkcluster.serving.readiness import http
from sparkcluster.sim import SimCluster
from tests.support.helpers import git_repo, run_cli, ssh
from tests.support.ring_cluster import Ring, TestEveryRing, ring_fixture  # noqa: F401 (TestEveryRing: collected here)
from tests.support.rings import (
    bootstrap,
    eugr_clone,
    forwarded,
    forwarding_state,
    ipv4,
    lan_host_reaches,
    node_address,
    node_logs,
    ready_to_serve,
    vllm_lines,
)
from tests.support.sim_serving import processes

pytestmark = [pytest.mark.sim, pytest.mark.slow]
COMM_ENV = "~/.config/sparkcluster/comm.env"
HOSTS = ("spark-1", "spark-2", "spark-3")


ring_cluster = ring_fixture(3, "ring3", needs_torch=True)  # the cluster block both ring files share


@pytest.fixture
def c3(ring_cluster: Ring) -> SimCluster:
    """The ring, bootstrapped (the tests after TestEveryRing's three)."""
    return ring_cluster.bootstrapped


# ---- the runtime bootstrap was given -------------------------------------------------------------------------

def test_the_runtime_bootstrap_was_given_is_what_every_later_command_follows(c3, tmp_path):
    """Issue 43: after `bootstrap --runtime host` on an inventory naming no runtime, `logs` said "permission denied
    ... docker.sock" and doctor failed four Docker and image checks. bootstrap records `runtime: host` in the user's
    file (its comment kept); doctor (exit 0), status, logs and down follow it with no --runtime and no Docker error."""
    doc = yaml.safe_load(c3.inventory_path.read_text())
    del doc["vars"]["runtime"]  # `sim up --vllm-env` writes it; a newcomer's own inventory does not
    inventory = tmp_path / "inventory.yml"
    inventory.write_text("# the newcomer's own file\n" + yaml.safe_dump(doc, sort_keys=False))
    user = {"XDG_CONFIG_HOME": str(tmp_path)}
    boot = run_cli("bootstrap", str(inventory), "--runtime", "host", env=user)
    assert boot.returncode == 0, boot.stdout + boot.stderr
    assert f"runtime: host, recorded in {inventory}" in boot.stderr, boot.stderr
    text = inventory.read_text()
    assert text.startswith("# the newcomer's own file\n") and yaml.safe_load(text)["vars"]["runtime"] == "host"

    doctor = run_cli("doctor", "-i", str(inventory), "--json", env=user, timeout=300)
    report = json.loads(doctor.stdout)
    failed = [f["summary"] for f in report["findings"] if f["severity"] == "fail"]
    assert doctor.returncode == 0 and report["ok"] and not failed, failed
    assert (report["runtime"], report["image"]) == ("host", "")
    docker = [f["summary"] for f in report["findings"] if f["severity"] != "ok" and "docker" in f["summary"].lower()]
    assert not docker, docker
    for command, code in (("status", 1), ("logs", 0), ("down", 0)):  # status: nothing is served yet
        out = run_cli(command, "-i", str(inventory), env=user, timeout=120)
        said = out.stdout + out.stderr
        assert out.returncode == code and "Traceback" not in said, (command, said)
        assert "docker" not in said.lower(), (command, said)
        assert f"runtime: host (the inventory's runtime, in {inventory})" in out.stderr or command == "down", said


# ---- verify --------------------------------------------------------------------------------------------------

def test_an_address_two_nodes_hold_is_named_a_duplicate_not_a_switch(c3):
    """Round 5's M3: spark-2's address on the spark-1 <-> spark-2 cable, also on spark-3's port toward spark-1 (one
    `ip addr add`): `topology` names the duplicate address and the removal that fixes it, and reads no switch."""
    stray = ipv4(c3, "spark-2")["enp1s0f0np0"]  # its end of the cable from spark-1's port 1, twin 0
    c3.exec_in("spark-3", ["ip", "addr", "add", stray, "dev", "enp1s0f1np1"], check=True)
    try:
        out = run_cli("topology", "-i", str(c3.inventory_path))
        text = " ".join(out.stdout.split())
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert (f"x duplicate address {stray.split('/')[0]}: spark-3 (enp1s0f1np1) and spark-2 (enp1s0f0np0) both "
                "hold it") in text, text
        assert f"on spark-3: `sudo ip addr del {stray} dev enp1s0f1np1`" in text and "switch" not in text, text
        assert "fabric: ring of 3 node(s)" in text, text
    finally:
        c3.exec_in("spark-3", ["ip", "addr", "del", stray, "dev", "enp1s0f1np1"], check=True)


def verify(c: SimCluster, *args: str) -> tuple[int, dict, str]:
    out = run_cli("verify", str(c.inventory_path), "--json", *args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout), out.stderr


RING_CABLES = {"spark-1 port 0 <-> spark-3 port 1", "spark-1 port 1 <-> spark-2 port 0",
               "spark-2 port 1 <-> spark-3 port 0"}


def test_verify_passes_on_the_ring_with_its_link_matrix_and_lists_the_control_plane(c3):
    """The whole collective (on the control plane) and the matrix: each of the six twin links alone, its two ranks
    bound to the twins at its ends on that link's own subnet: PASS. Every address each node advertises is its
    routed node address, which every node reaches over the cables."""
    code, doc, _ = verify(c3)
    assert code == 0 and doc["verdict"]["status"] == "PASS", doc["verdict"]
    assert doc["topology"] == "ring"
    assert {(link["cable"], link["twin"]) for link in doc["links"]} == {(c, t) for c in RING_CABLES for t in (0, 1)}
    for link in doc["links"]:
        a, b = link["a"], link["b"]
        assert {a["port"], b["port"]} == {0, 1} and a["netdev"][:3] == b["netdev"][:3]  # crosswise, one twin
        assert link["ips"][0].rsplit(".", 1)[0] == link["ips"][1].rsplit(".", 1)[0]
        assert link["busbw_gbps"] > 0 and not link["error"]
    advertised = {(a["node"], a["source"]): a for a in doc["control_plane"]}
    for node in HOSTS:
        vllm = advertised[(node, "VLLM_HOST_IP")]
        assert vllm["address"] == node_address(c3, node) and vllm["interface"] == "scnode" and not vllm["problem"]
        assert (node, "GLOO_SOCKET_IFNAME=scnode") in advertised
    assert advertised[("spark-1", "verify's rendezvous (the probe's MASTER_ADDR)")]["address"] == "10.177.0.11"


def test_each_link_is_measured_alone_and_a_degraded_one_is_named(c3):
    """spark-2's port 1, twin 0 (enp1s0f1np1) held to 300 Mbit/s (the simulator's links carry 2-3 Gbit/s of gloo;
    slower would only lengthen the run): the whole collective runs on the control plane and cannot see it; its
    link's own run does, and the five others hold."""
    netdev = c3.degrade("spark-2", "enp1s0f1np1", "300mbit")
    try:
        code, doc, _ = verify(c3)
    finally:
        c3.degrade("spark-2", netdev, None)
    assert {(link["cable"], link["twin"]) for link in doc["links"]} == {(c, t) for c in RING_CABLES for t in (0, 1)}
    assert all(link["busbw_gbps"] > 0 and not link["error"] for link in doc["links"])
    assert code == 1 and doc["verdict"]["status"] == "FAIL"
    slow = next(link for link in doc["links"] if link["cable"] == "spark-2 port 1 <-> spark-3 port 0"
                and link["twin"] == 0)
    assert doc["verdict"]["cause"].startswith(
        f"link spark-2 port 1 <-> spark-3 port 0 twin 0 ({netdev}) is degraded: {slow['busbw_gbps']:.3f} GB/s alone")
    assert "spark-2 enp1s0f1np1, spark-3 enp1s0f0np0" in doc["verdict"]["fix"]
    others = [link["busbw_gbps"] for link in doc["links"] if link is not slow]
    assert len(others) == 5 and min(others) > 2 * slow["busbw_gbps"]


def test_a_control_plane_address_one_node_cannot_reach_fails_naming_it(c3, tmp_path):
    """Two ways to advertise what some node cannot reach, in one run: spark-2's route to spark-3's node address is
    gone (its pings, and spark-3's answers to it, go nowhere), and spark-3 advertises its address on the link to
    spark-1 (spark-2 has no interface on that subnet). As the user reads it (text), with --no-links: the control
    plane listed, each problem named, no link measured, no probe left waiting on an address it cannot reach."""
    link_ip = next(a for a in ssh(c3, "spark-3", "ip -4 -o addr show enp1s0f1np1").stdout.split()
                   if a.count(".") == 3 and "/" in a).split("/")[0]
    route = c3.exec_in("spark-2", ["ip", "-4", "route", "show", "10.177.0.13"], capture_output=True,
                       text=True).stdout.split()
    assert route[:1] == ["10.177.0.13"], route
    c3.exec_in("spark-2", ["ip", "route", "del", "10.177.0.13"], check=True)
    ssh(c3, "spark-3", f"sed -i.bak 's/^VLLM_HOST_IP=.*/VLLM_HOST_IP={link_ip}/' {COMM_ENV}")
    try:
        out = run_cli("verify", str(c3.inventory_path), "--no-links")
        text = " ".join(out.stdout.split())
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert "control plane (the addresses each node advertises):" in text and "links of the" not in text
        assert ("FAIL (gloo) spark-2 advertises a control-plane address some node cannot use: spark-2 VLLM_HOST_IP "
                "10.177.0.12 on scnode: spark-3 has no interface on 10.177.0.12/32 and no route to it that answers "
                "ping") in text, text
        assert (f"spark-3 {link_ip} on enp1s0f1np1: VLLM_HOST_IP <- spark-2 has no interface on ") in text, text
        assert "spark-1 10.177.0.11 on scnode:" in text and "<- spark-1" not in text  # spark-1 reaches and is reached
        assert "routed address (scnode" in text.split(" fix: ")[-1]
        # A re-run of bootstrap puts the lost route back (and the comm env as it was).
        again = bootstrap(c3, tmp_path)
        assert again.returncode == 0, again.stdout + again.stderr
        assert c3.exec_in("spark-2", ["ip", "-4", "route", "show", "10.177.0.13"], capture_output=True,
                          text=True).stdout.split() == route
        assert f"VLLM_HOST_IP={node_address(c3, 'spark-3')}\n" in ssh(c3, "spark-3", f"cat {COMM_ENV}").stdout
    finally:
        c3.exec_in("spark-2", ["ip", "route", "replace", *route], check=True)
        ssh(c3, "spark-3", f"[ ! -e {COMM_ENV}.bak ] || mv {COMM_ENV}.bak {COMM_ENV}")


def test_a_lan_host_routed_through_a_node_reaches_no_cable_subnet(c3):
    """Round 5's S4 on the 3-ring: every walk is one cable, so no node forwards (ip_forward and every interface's
    forwarding stay 0). spark-3's LAN port, standing for any management-LAN host, routes the spark-1 <-> spark-2
    cable's subnet through spark-1's LAN address: the ping goes unanswered and spark-1 forwards nothing."""
    spark2 = ipv4(c3, "spark-2")["enp1s0f0np0"]  # its end of the cable from spark-1's port 1, twin 0
    assert ssh(c3, "spark-3", f"ping -c 1 -W 1 {spark2.split('/')[0]}", check=False).returncode != 0  # no route
    assert lan_host_reaches(c3, "spark-3", "spark-1", spark2) == (False, 0)
    assert forwarded(c3, "spark-1") == 0
    for host in HOSTS:
        values = forwarding_state(c3, host)
        assert all(v == "0" for k, v in values.items() if k == "ip_forward" or k.endswith("/forwarding")), values
        assert "SPARKCLUSTER" not in ssh(c3, host, "sudo iptables -w -S").stdout, host


def routed_plane(c: SimCluster, host: str) -> tuple[bool, list[str], bool]:
    """What a node holds of the routed control plane: its bridge, its /32 routes to node addresses, the sysctl file."""
    bridge = c.exec_in(host, ["ip", "link", "show", "scnode"], capture_output=True).returncode == 0
    routes = [line for line in c.exec_in(host, ["ip", "-4", "route", "show"], capture_output=True,
                                         text=True).stdout.splitlines() if line.startswith("10.177.0.")]
    sysctl = ssh(c, host, "test -e /etc/sysctl.d/60-sparkcluster-fabric.conf", check=False).returncode == 0
    return bridge, routes, sysctl


def test_choosing_the_lan_retires_the_routed_plane_and_routed_brings_it_back(c3, tmp_path):
    """`fabric.control_plane: lan` on a routed ring: --check --diff shows the bridge and the sysctl file going;
    bootstrap removes the bridge, its routes and the file on every node and binds the comm env to the management
    address; the default again restores the routed plane, every node reaching every node address."""
    doc = yaml.safe_load(c3.inventory_path.read_text())
    doc["vars"].setdefault("fabric", {})["control_plane"] = "lan"
    lan = tmp_path / "lan.yml"
    lan.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        check = run_cli("bootstrap", str(lan), "--runtime", "host", "--check", "--diff",
                        env={"XDG_CONFIG_HOME": str(tmp_path)})
        assert check.returncode == 0, check.stdout + check.stderr
        assert "the routed control plane retired (scnode bridge, 2 routes)" in " ".join(check.stdout.split())
        assert re.search(r"^-\s+scnode:", check.stdout, re.M)
        assert all(routed_plane(c3, h)[0] for h in HOSTS)  # --check changed nothing
        done = run_cli("bootstrap", str(lan), "--runtime", "host", env={"XDG_CONFIG_HOME": str(tmp_path)})
        assert done.returncode == 0, done.stdout + done.stderr
        for host in HOSTS:
            assert routed_plane(c3, host) == (False, [], False), host
            env = ssh(c3, host, f"cat {COMM_ENV}").stdout
            assert f"VLLM_HOST_IP={c3.host(host).mgmt_ip}\n" in env and "scnode" not in env, env
    finally:
        back = bootstrap(c3, tmp_path)
    assert back.returncode == 0, back.stdout + back.stderr
    for host in HOSTS:
        bridge, routes, sysctl = routed_plane(c3, host)
        assert bridge and len(routes) == 2 and not sysctl, (host, routes)  # a 3-ring forwards nothing: no file
        for other in HOSTS:
            ssh(c3, host, f"ping -c 1 -W 2 {node_address(c3, other)} >/dev/null")


# ---- registries and serve ------------------------------------------------------------------------------------

CANARY = '#!/bin/sh\ntouch "$HOME/pwned-by-mod"\n'
V2 = "recipe_version: '2'\nmodel: /nowhere/tiny\n"  # a path: nothing to stage, so a mod would run at once


def test_no_route_into_an_untrusted_registry_runs_its_mod_on_a_node(c3, tmp_path):
    """Round 4's trust reproductions end to end: a trusted registry `good`, an untrusted `evil` whose mod touches a
    canary in each node's home, sparkrun's eugr clone trusted in sparkrun's config. Every route by which evil's mod
    ran without --trust (and good's mod that links a control-machine secret) is refused with exit 2, and no node
    holds the canary or the secret; the same mod served with --trust does run, so the canary would have shown."""
    user = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    secret = tmp_path / "control-secret.txt"
    secret.write_text("the control machine's secret")
    secret.chmod(0o600)
    good = git_repo(tmp_path / "good", {"recipes/looted.yaml": V2 + "mods: [loot-mod]\n",
                                        "mods/loot-mod/run.sh": "#!/bin/sh\ntrue\n"}, {"mods/loot-mod/loot": secret})
    evil = git_repo(tmp_path / "evil", {
        "mods/pwn/run.sh": CANARY, "recipes/direct.yaml": V2 + "mods: [pwn]\n", "recipes/base.yaml": V2 + "mods: [pwn]\n",
        "recipes/viaat.yaml": V2 + "mods: ['@good/../../evil/mods/pwn']\n",
        "recipes/viainclude.yaml": "recipe_version: '2'\ninclude: '@good/../../evil/recipes/base'\nmodel: /nowhere/x\n",
        "recipes/viaeugr.yaml": V2 + "mods: ['fix-a/../../../../../sparkcluster/registries/evil/mods/pwn']\n"})
    eugr = tmp_path / "cache" / "sparkrun" / "registries" / "eugr"
    (eugr / "mods" / "fix-a").mkdir(parents=True)
    (eugr / "mods" / "fix-a" / "run.sh").write_text("#!/bin/sh\ntrue\n")
    (tmp_path / "config" / "sparkrun").mkdir(parents=True)
    (tmp_path / "config" / "sparkrun" / "registries.yaml").write_text("registries:\n  - {name: eugr, trusted: true}\n")
    for name, repo, trust in (("good", good, ["--trust"]), ("evil", evil, [])):
        added = run_cli("recipes", "add-registry", name, str(repo), *trust, env=user)
        assert added.returncode == 0, added.stderr

    def serve(recipe: str, *more: str) -> subprocess.CompletedProcess:
        return run_cli("serve", "-i", str(c3.inventory_path), "--tp", "3", "--runtime", "host", "--launcher",
                       "native", "--no-verify", "--recipe", recipe, *more, env=user)

    def on_nodes(path: str) -> list[str]:
        return [h for h in HOSTS if ssh(c3, h, f"test -e {path}", check=False).returncode == 0]

    clone = tmp_path / "cache" / "sparkcluster" / "registries" / "evil" / "recipes" / "direct.yaml"
    for recipe in ("@evil/viaat", "@evil/viainclude", "@good/../../evil/recipes/direct", "@evil/viaeugr",
                   str(clone), "@good/looted"):
        refused = serve(recipe)
        err = " ".join(refused.stderr.split())
        assert refused.returncode == 2 and "registry '" in err, (recipe, err)
        assert on_nodes("~/pwned-by-mod") == [] and on_nodes("~/.cache/sparkcluster/mods/loot-mod") == [], recipe
    # the control: the same mod, served as the user chose to (--trust), does reach every node (the mods run before
    # vLLM starts; vLLM, given no model, is not waited for)
    try:
        ran = serve("@evil/direct", "--trust", "--ready-timeout", "5")
        assert on_nodes("~/pwned-by-mod") == list(HOSTS), ran.stderr[-2000:]
    finally:
        for host in HOSTS:
            ssh(c3, host, "rm -f ~/pwned-by-mod", check=False)
        run_cli("down", "-i", str(c3.inventory_path), env=user)


def test_eugrs_3x_recipe_serves_pp3_one_stage_per_node_along_the_ring(c3, tmp_path):
    """eugr's 3x-spark-cluster recipe from a registry in its layout (sparkrun's clone, trusted there): by path it
    renders (`serve --check`), by `@eugr/3x-spark-cluster/...` it serves, its mod run on every node first. The mod
    folder and the recipe's `-pp {pipeline_parallel}` are eugr's shape."""
    ready_to_serve(c3)
    user = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    clone = eugr_clone(tmp_path / "cache", tmp_path / "config")

    def serve(recipe: str, *more: str) -> subprocess.CompletedProcess:
        return run_cli("serve", "-i", str(c3.inventory_path), "--runtime", "host", "--launcher", "native",
                       "--no-verify", "--recipe", recipe, *more, env=user)

    # The file renders (the 4-ring's test serves its 4x recipe by file); the registry's name then serves.
    check = serve(str(clone / "recipes" / "3x-spark-cluster" / "tiny-llama.yaml"), "--check")
    assert check.returncode == 0, check.stderr
    assert "would serve local/tiny-llama (host, native)" in check.stdout, check.stdout
    assert check.stdout.count("--tensor-parallel-size 1 --pipeline-parallel-size 3") == 3, check.stdout
    result = serve("@eugr/3x-spark-cluster/tiny-llama", "--ready-timeout", "400", "--json")
    try:
        assert result.returncode == 0, result.stderr[-2000:] + node_logs(c3)
        doc = json.loads(result.stdout)
        assert doc["launcher"] == "native" and doc["served_name"] == "tiny-3x"
        head = c3.host("spark-1").mgmt_ip
        code, text = http(f"http://{head}:8000/v1/completions",
                          {"model": "tiny-3x", "prompt": "Three stages of", "max_tokens": 8, "temperature": 0},
                          timeout=60)
        assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 8, text
        code, text = http(f"http://{head}:8000/v1/models", None, timeout=30)
        assert json.loads(text)["data"][0]["max_model_len"] == 256, text
        for rank, line in enumerate(vllm_lines(c3)):
            assert "--pipeline-parallel-size 3" in line and "--tensor-parallel-size 1" in line, line
            assert f"--node-rank {rank}" in line, line
        for host in HOSTS:
            assert ssh(c3, host, "cat ~/eugr-mod-ran").stdout.strip() == "stage ready"
    finally:
        down = run_cli("down", "-i", str(c3.inventory_path), "--json", env=user)
    assert down.returncode == 0, down.stderr
    assert all("vllm serve" not in processes(c3, h) for h in HOSTS)
