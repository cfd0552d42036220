"""`sparkcluster verify` on simulated Sparks: the probe runs for real (gloo on CPU, one rank per node, in the
node's comm env), and the connections it held show which network carried the data."""

from __future__ import annotations

import json
import re

import pytest

from sparkcluster.bench.receipt_sources import comm_env
from sparkcluster.engine.inventory import load_inventory
from sparkcluster.engine.session import connect
from sparkcluster.nccl.logs import PROBE_RESULT
from sparkcluster.nccl.tune import tuned_settings
from sparkcluster.nccl.tunerun import PROBE_DOUBLE_ENV
from sparkcluster.serving.nodes import node_env
from sparkcluster.serving.runtime import HostRuntime
from sparkcluster.sim import SimCluster, UpOptions
from tests.support.helpers import bootstrapped, require_sim, run_cli, ssh, unique_name

pytestmark = [pytest.mark.sim, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster4(tmp_path_factory):
    pytest.importorskip("torch")
    require_sim(docker=True)
    c = SimCluster.up(UpOptions(count=4, name=unique_name("verify"), ssh_mesh=False))
    try:
        yield bootstrapped(c, tmp_path_factory.mktemp("cfg"))
    finally:
        c.down()


def verify(c: SimCluster, *args: str) -> tuple[int, dict]:
    # One run of the whole collective: each link alone is proven on the 3-ring in test_ring3.py, with the code a
    # switch's links run (their probes: tests/unit/nccl/test_nccl_links.py); a 4-node switch's 8 links cost a minute here.
    out = run_cli("verify", str(c.inventory_path), "--json", "--no-links", *args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize("limit", [["--limit", "spark-1,spark-2"], []], ids=["2 nodes", "4 nodes"])
def test_probe_runs_across_nodes_on_the_qsfp_link(cluster4, limit):
    code, doc = verify(cluster4, *limit)
    assert code == 0, doc
    assert doc["backend"] == "gloo" and doc["verdict"]["status"] == "PASS"
    nodes = 2 if limit else 4
    assert len(doc["carried_by"]) == nodes
    for node, lines in doc["carried_by"].items():
        assert lines and all(line.split()[0] == "enp1s0f1np1" for line in lines)
        fabric = cluster4.host(node).fabric_ips[0]
        assert all(line.split()[1] == fabric for line in lines)
    ops = {(r["op"], r["size_bytes"]) for r in doc["rows"]}
    assert ("all_reduce", 16 << 20) in ops and ("all_gather", 16 << 20) in ops
    assert all(r["busbw_gbps"] > 0 for r in doc["rows"])


def test_misbound_to_the_management_port_is_a_failure_naming_it(cluster4):
    misbind = "sed -i 's/^GLOO_SOCKET_IFNAME=.*/GLOO_SOCKET_IFNAME=enP7s7/' ~/.config/sparkcluster/comm.env"
    for h in ("spark-1", "spark-2"):
        ssh(cluster4, h, misbind)
    try:
        code, doc = verify(cluster4, "--limit", "spark-1,spark-2")
        assert code == 1
        assert doc["verdict"]["status"] == "FAIL" and "enP7s7" in doc["verdict"]["cause"]
        lan = cluster4.host("spark-1").mgmt_ip
        assert any(line.startswith(f"enP7s7 {lan} ") for line in doc["carried_by"]["spark-1"])
        assert "comm.env" in doc["verdict"]["fix"]
    finally:
        for h in ("spark-1", "spark-2"):  # bootstrap's comm env file is the fix, and it converges back
            ssh(cluster4, h, "sed -i 's/^GLOO_SOCKET_IFNAME=.*/GLOO_SOCKET_IFNAME=enp1s0f1np1/' ~/.config/sparkcluster/comm.env")


def test_one_worker_misbound_fails_naming_it_whatever_the_traffic_showed(cluster4):
    """Only spark-2's env names enP7s7: a two-node run may still cross the fabric (spark-1 opens the connections),
    but a third node or the other connect order would not, so verify reads every node's env and names it."""
    ssh(cluster4, "spark-2", "sed -i 's/^GLOO_SOCKET_IFNAME=.*/GLOO_SOCKET_IFNAME=enP7s7/' ~/.config/sparkcluster/comm.env")
    try:
        code, doc = verify(cluster4, "--limit", "spark-1,spark-2")
        assert code == 1 and doc["verdict"]["status"] == "FAIL"
        assert doc["verdict"]["cause"] == ("spark-2 binds off the QSFP link: GLOO_SOCKET_IFNAME=enP7s7 names enP7s7 "
                                           "(the management port; the QSFP link is enp1s0f1np1)")
        assert "spark-1" not in " ".join(d for d in doc["verdict"]["details"] if "binds" in d or "names" in d)
    finally:
        ssh(cluster4, "spark-2", "sed -i 's/^GLOO_SOCKET_IFNAME=.*/GLOO_SOCKET_IFNAME=enp1s0f1np1/' "
                                 "~/.config/sparkcluster/comm.env")


def test_verify_without_bootstrap_names_the_fix(cluster4):
    ssh(cluster4, "spark-4", "mv ~/.config/sparkcluster/comm.env ~/comm.env.bak")
    try:
        out = run_cli("verify", str(cluster4.inventory_path))
        assert out.returncode == 1 and "spark-4" in out.stderr and "bootstrap" in out.stderr
    finally:
        ssh(cluster4, "spark-4", "mv ~/comm.env.bak ~/.config/sparkcluster/comm.env")


def test_tune_measures_every_candidate_under_gloo_keeps_the_default_and_says_why(cluster4):
    """verify --tune on the simulator (issue 50): each candidate's probe runs across two nodes for real, every sum
    checked; under gloo NCCL's settings change nothing, so the comm env stays as bootstrap wrote it."""
    inventory, pair = str(cluster4.inventory_path), ["--limit", "spark-1,spark-2"]
    before = {n: ssh(cluster4, n, "cat ~/.config/sparkcluster/comm.env").stdout for n in ("spark-1", "spark-2")}
    out = run_cli("verify", inventory, "--json", *pair, "--tune", "--hidden-size", "64", "--concurrency", "1,8")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    doc = json.loads(out.stdout)
    assert doc["backend"] == "gloo" and doc["transport"] == "gloo" and doc["decode_bytes"] == {"1": 128, "8": 1024}
    assert doc["chosen"]["name"] == "default" and "NCCL's settings change nothing" in doc["chosen"]["reason"]
    assert len(doc["candidates"]) >= 9 and all(c["decode_us"] > 0 for c in doc["candidates"])
    assert not any(c["verdict"].startswith("wrong sum") for c in doc["candidates"])
    for node in ("spark-1", "spark-2"):
        assert ssh(cluster4, node, "cat ~/.config/sparkcluster/comm.env").stdout == before[node]
        record = json.loads(ssh(cluster4, node, "cat ~/.config/sparkcluster/last-verify.json").stdout)
        assert record["comm_tuned"]["name"] == "default" and record["comm_tuned"]["settings"] == {}
    reset = run_cli("verify", inventory, "--json", *pair, "--reset")
    assert reset.returncode == 0 and json.loads(reset.stdout)["before"] == {}
    assert "comm_tuned" not in json.loads(ssh(cluster4, "spark-1", "cat ~/.config/sparkcluster/last-verify.json").stdout)


# verify --tune's probe double (tunerun.PROBE_DOUBLE_ENV): it runs on every node in the probe's place, with the
# probe's arguments, in the env each candidate's probe gets, and rank 0 prints the probe's result line with timings
# chosen by that env: NCCL_PROTO=LL makes decode 24% faster at the same busbw; the tuner plugin 40%, where the env
# names a plugin the node really built (an ELF file at that path) and a table that really says Ring + LL, so the
# choice per size wins; anything else is the default's, 2% slower. What the candidate's env and files really were
# on the node decide the timings.
PROBE_DOUBLE = """
import json, os, sys
args = sys.argv[1:]
def read(path, n=-1):
    try:
        with open(path, "rb") as f:
            return f.read(n)
    except (OSError, TypeError):
        return b""
if args[args.index("--rank") + 1] == "0":
    lat = [int(s) for s in args[args.index("--latency-sizes") + 1].split(",")]
    proto, tuned = os.environ.get("NCCL_PROTO"), any(k in os.environ for k in ("NCCL_ALGO", "NCCL_MAX_NCHANNELS"))
    steered = read(os.environ.get("NCCL_TUNER_PLUGIN"), 4) == b"\\x7fELF" and \\
        b",ring,ll," in read(os.environ.get("NCCL_TUNER_CONFIG_FILE"))
    us = 30.0 if steered else 38.0 if proto == "LL" else 51.0 if proto or tuned else 50.0
    latency = [{"op": "all_reduce", "size_bytes": s, "median_us": us * (i + 1), "p99_us": us * 1.3 * (i + 1),
                "iters": 100, "per_sample": 10, "timing": "graph", "sum_ok": True} for i, s in enumerate(lat)]
    rows = [{"op": "all_reduce", "size_bytes": 64 << 20, "time_us": 6000.0, "algbw_gbps": 20.0, "busbw_gbps": 20.0}]
    print(MARKER + " " + json.dumps({"backend": "nccl", "world": int(args[args.index("--world") + 1]),
                                     "rows": rows, "latency": latency}))
"""


def serving_env(c: SimCluster, node: str) -> dict[str, str]:
    """The environment the next serve's vLLM gets on `node`: the host runtime's own entry into the serving env (the
    one its vLLM start runs under: the comm env, then the inventory's serve_env), running `env` instead of vLLM."""
    inventory = load_inventory(c.inventory_path)
    host = next(h for h in inventory.hosts if h.name == node)
    command = HostRuntime(python_env="/usr", node=node).run_in_env(["env"], node_env(inventory, host))
    out = ssh(c, node, command.script).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_tune_with_a_winning_candidate_sets_it_everywhere_and_reset_removes_it(cluster4, tmp_path):
    """verify --tune on the simulator with a candidate that wins (issue 50): the probe's double times the tuner
    plugin's table fastest where the node really built the plugin and wrote the table, so every node's comm env
    carries its own paths to them, the next serve's vLLM gets it, bench's receipt records it, a re-run
    of bootstrap keeps it, and --reset takes it away again."""
    double = tmp_path / "probe_double.py"
    double.write_text(f"MARKER = {PROBE_RESULT!r}\n{PROBE_DOUBLE}")
    inventory, nodes = str(cluster4.inventory_path), [h.name for h in cluster4.topology.hosts]
    read = "cat ~/.config/sparkcluster/comm.env"
    before = {n: ssh(cluster4, n, read).stdout for n in nodes}
    # The model tuned for, as staged on the head: its config.json gives the decode sizes (hidden 64, bf16).
    config = json.dumps({"hidden_size": 64, "num_hidden_layers": 2, "torch_dtype": "bfloat16"})
    ssh(cluster4, nodes[0], 'repo="${HF_HOME:-$HOME/.cache/huggingface}/hub/models--sim--tiny" && mkdir -p '
                            '"$repo/refs" "$repo/snapshots/abc" && echo abc > "$repo/refs/main" && '
                            f"echo '{config}' > \"$repo/snapshots/abc/config.json\"")
    out = run_cli("verify", inventory, "--json", "--tune", "--backend", "nccl", "--model", "sim/tiny",
                  env={PROBE_DOUBLE_ENV: str(double)})
    try:
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        doc = json.loads(out.stdout)
        assert doc["written"] and doc["chosen"]["name"] == "per size (tuner plugin)", doc
        assert doc["model"] == "sim/tiny" and doc["decode_bytes"] == {"1": 128, "8": 1024}
        assert doc["per_size_table"] == "Ring + LL up to 2 KiB, NCCL's own choice above" and not doc["per_size_refused"]
        assert "40% faster" in doc["chosen"]["reason"]
        verdicts = {c["name"]: c["verdict"] for c in doc["candidates"]}
        assert verdicts["LL protocol"] == "faster" and verdicts["Simple protocol"] == "no faster beyond noise"
        folder = "/.config/sparkcluster/nccl-tuner/"
        for node in nodes:
            env, home = ssh(cluster4, node, read).stdout, ssh(cluster4, node, "printf %s \"$HOME\"").stdout
            plugin = f"{home}{folder}libnccl-tuner-sparkcluster.so"  # built on the node, at its own home's path
            tuned = tuned_settings(env)
            assert env.startswith(before[node]) and tuned["NCCL_TUNER_PLUGIN"] == plugin, node
            assert re.fullmatch(f"{home}{folder}sizes-[0-9a-f]{{12}}\\.csv", tuned["NCCL_TUNER_CONFIG_FILE"]), node
            assert ssh(cluster4, node, f"cat {tuned['NCCL_TUNER_CONFIG_FILE']}").stdout.endswith(
                "allreduce,0,2048,ring,ll,-1,-1,-1\n"), node
            assert "ncclTunerPlugin_v4" in ssh(cluster4, node, f"nm -D --defined-only {plugin}").stdout.split(), node
            assert serving_env(cluster4, node)["NCCL_TUNER_PLUGIN"] == plugin, node
            record = json.loads(ssh(cluster4, node, "cat ~/.config/sparkcluster/last-verify.json").stdout)
            assert record["comm_tuned"]["settings"]["NCCL_TUNER_PLUGIN"] == f"~{folder}libnccl-tuner-sparkcluster.so"
        with connect(load_inventory(cluster4.inventory_path)) as session:
            receipts = {h.name: comm_env(session, h) for h in session.hosts}  # what bench's receipt records
        assert all(env["NCCL_TUNER_PLUGIN"].endswith(".so") for env in receipts.values()) and len(receipts) == len(nodes)
        tuned = {n: ssh(cluster4, n, read).stdout for n in nodes}
        bootstrapped(cluster4, tmp_path / "cfg")  # a re-run rewrites the comm env: the tuned block stays
        assert {n: ssh(cluster4, n, read).stdout for n in nodes} == tuned
    finally:
        reset = run_cli("verify", inventory, "--json", "--reset")
    assert reset.returncode == 0, reset.stderr
    assert set(json.loads(reset.stdout)["before"]) == {"NCCL_TUNER_CONFIG_FILE", "NCCL_TUNER_PLUGIN"}
    for node in nodes:
        assert ssh(cluster4, node, read).stdout == before[node], node
        assert "NCCL_TUNER_PLUGIN" not in serving_env(cluster4, node), node
        assert ssh(cluster4, node, "test -e ~/.config/sparkcluster/nccl-tuner && echo kept || echo gone").stdout \
            .strip() == "gone", node  # the plugin and its tables went with the block
