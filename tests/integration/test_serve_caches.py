"""The per-node compile/JIT caches on simulated Sparks with real Docker: `up` starts every node's vllm_node with
the node's cache directory mounted and each library pointed into it; a real torch.compile (Inductor, CPU) in the
container compiles once, and a new container after `down` and `up` finds the compiled graph in the cache; status
shows each node's cache size; `down --purge-caches` deletes it; `--no-cache-dirs` removes the mount. The same
image serves with the NCCL probe run inside the containers (it needs PyTorch), and `doctor --bundle` gathers it.

Cost: one 2-node cluster, the test image with PyTorch imported on both nodes (~1 min), two torch.compile runs
(~50 s cold, a few s warm). The image holds no C++ compiler, which Inductor needs on a CPU (a Spark's image has
one): the test mounts the simulated host's /usr read-only over the container's (the image's binaries came
from it) with --docker-arg."""

from __future__ import annotations

import json
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sparkcluster.doctor.bundle import HEAD_ITEMS, NODE_FILES
from sparkcluster.serving.caches import CACHE_VARIABLES, CONTAINER_CACHE_DIR
from sparkcluster.sim import SimCluster, UpOptions, image
from sparkcluster.sim.fakemodel import generate
from tests.support.helpers import bootstrapped, require_sim, run_cli, ssh, unique_name
from tests.support.sim_serving import running_anywhere

pytestmark = [pytest.mark.sim, pytest.mark.docker, pytest.mark.slow]
RAY_ENV = Path(__file__).resolve().parents[2] / ".venv-ray"
TAG = "vllm-node"
MODEL = "acme/tiny"
COMPILER = "--docker-arg=--volume=/usr:/usr:ro"
PROBE = """
import json, time
import torch
from torch._dynamo.utils import counters
start = time.monotonic()
f = torch.compile(lambda x, y: torch.nn.functional.gelu(x @ y + 1).sum(dim=-1))
f(torch.randn(64, 64), torch.randn(64, 64))
print(json.dumps({"seconds": time.monotonic() - start, "hits": counters["inductor"]["fxgraph_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"]}))
"""


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Iterator[SimCluster]:
    require_sim(docker=True)
    if not (RAY_ENV / "bin" / "ray").exists():
        pytest.fail(f"{RAY_ENV} is missing: run scripts/setup.sh")
    c = SimCluster.up(UpOptions(count=2, name=unique_name("caches")))
    try:
        bootstrapped(c, tmp_path_factory.mktemp("cfg"))
        tar = image.build(TAG, ray_env=RAY_ENV)  # with PyTorch
        image.import_into(c, ["spark-1", "spark-2"], TAG, tar)
        generate(c, "spark-1", MODEL, 1 << 20, shards=1)  # on the head only: serve stages it
        yield c
    finally:
        c.down()


def sc(c: SimCluster, *args: str, timeout: float = 300, ok: bool = True) -> subprocess.CompletedProcess:
    result = run_cli(args[0], "-i", str(c.inventory_path), *args[1:], timeout=timeout)
    assert result.returncode == 0 or not ok, f"{' '.join(args)} exited {result.returncode}:\n{result.stderr[-3000:]}"
    return result


def mounts(c: SimCluster, host: str) -> dict[str, str]:
    doc = json.loads(ssh(c, host, "docker inspect vllm_node").stdout)[0]
    return {m["Destination"]: m["Source"] for m in doc["Mounts"]}


def env(c: SimCluster, host: str) -> dict[str, str]:
    doc = json.loads(ssh(c, host, "docker inspect vllm_node").stdout)[0]
    return dict(e.split("=", 1) for e in doc["Config"]["Env"])


def compile_in_container(c: SimCluster) -> dict:
    result = subprocess.run(c.ssh_argv("spark-1", None, "mgmt") + ["docker exec -i vllm_node python3 - 2>&1"],
                            input=PROBE, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_node_mounts_its_cache_and_a_new_container_finds_the_compiled_graph(two):
    sc(two, "up", COMPILER)
    home = {h: ssh(two, h, "echo $HOME").stdout.strip() for h in ("spark-1", "spark-2")}
    for host in ("spark-1", "spark-2"):
        assert mounts(two, host)[CONTAINER_CACHE_DIR] == f"{home[host]}/.cache/sparkcluster/jit"
        e = env(two, host)
        assert all(e[name] == f"{CONTAINER_CACHE_DIR}/{sub}" for name, (sub, _) in CACHE_VARIABLES.items())
    cold = compile_in_container(two)
    assert cold["misses"] >= 1 and cold["hits"] == 0

    sc(two, "down")  # the container is removed (--rm): only the mounted cache survives
    sc(two, "up", COMPILER)
    top = run_cli("top", "-i", str(two.inventory_path), "--once", "--json", "--interval", "0.5", timeout=120)
    assert top.returncode == 0, top.stderr
    doc = json.loads(top.stdout)
    assert doc["endpoint"] is None and doc["note"].startswith("nothing is served")  # `up` only
    for host in ("spark-1", "spark-2"):  # the emulated GB10 reads memory [N/A]: the node's own, said so
        node = doc["nodes"][host]
        assert node["answered"] and node["memory_source"] == "unified" and node["processes"]["main"] == "running"
    warm = compile_in_container(two)
    assert warm["hits"] >= 1 and warm["misses"] == 0
    print(f"torch.compile in a new container: cold {cold['seconds']:.1f} s, warm {warm['seconds']:.1f} s, "
          f"warm/cold {warm['seconds'] / cold['seconds']:.2f}")

    status = sc(two, "status", "--json")
    nodes = json.loads(status.stdout)["nodes"]
    assert nodes["spark-1"]["cache_bytes"] > 100_000 and nodes["spark-2"]["cache_bytes"] >= 0

    purged = sc(two, "down", "--purge-caches", "--json")
    assert purged.returncode == 0, purged.stderr
    assert json.loads(purged.stdout)["purged_caches"]["spark-1"].startswith("purged ")
    for host in ("spark-1", "spark-2"):
        assert ssh(two, host, "test -e ~/.cache/sparkcluster/jit", check=False).returncode == 1


def test_serve_again_reuses_what_is_unchanged_and_no_cache_dirs_removes_the_mount(two):
    """A second serve skips stage, image and ray, and names them; a changed comm env starts Ray afresh. The serves run
    with --no-cache-dirs: no node's container has the cache mount or the variables (checked on the first one's, not
    on an `up` of its own: that was one more start of the PyTorch image on both nodes, ~50 s)."""
    args = ("serve", "--model", MODEL, "--no-verify", "--no-cache-dirs", "--ready-timeout", "60", "--up-timeout", "90",
            "--json")
    try:
        first = sc(two, *args)
        assert first.returncode == 0, first.stderr
        assert "stage" not in json.loads(first.stdout)["skipped"]  # the worker lacked the model
        for host in ("spark-1", "spark-2"):
            assert CONTAINER_CACHE_DIR not in mounts(two, host)
            assert not set(CACHE_VARIABLES) & set(env(two, host))
        again = json.loads(sc(two, *args).stdout)
        assert set(again["skipped"]) == {"stage", "image", "ray"} and again["reused_ray"]
        ssh(two, "spark-2", "echo '# edited' >> ~/.config/sparkcluster/comm.env")
        changed = json.loads(sc(two, *args).stdout)
        assert "ray" not in changed["skipped"] and not changed["reused_ray"]
    finally:
        sc(two, "down", ok=False)


def bundle_holds_every_item_and_no_secret(c: SimCluster, tmp_path: Path, secrets: tuple[str, ...]) -> None:
    """`doctor --bundle` of the served cluster, with -K's password: every item from every node, and none of the
    planted secrets anywhere in the unpacked archive (the manifest says what was scrubbed)."""
    path = tmp_path / "support.tar.gz"
    result = run_cli("doctor", "-i", str(c.inventory_path), "--bundle", str(path), "-K", stdin=secrets[1] + "\n")
    assert path.is_file(), result.stdout + result.stderr
    with tarfile.open(path) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    root = tmp_path / "unpacked" / "support"
    for host in c.topology.hosts:
        names = {p.name for p in (root / "nodes" / host.name).iterdir()}
        assert set(NODE_FILES) <= names, set(NODE_FILES) - names
    assert set(HEAD_ITEMS) <= {p.name for p in (root / "nodes" / "spark-1").iterdir()}
    manifest = json.loads((root / "MANIFEST.json").read_text())
    for host in ("spark-1", "spark-2"):
        items = manifest["items"][host]
        for item in ("comm.env", "ibdev2netdev.txt", "ethtool.txt", "nvidia-smi-q.txt", "versions.txt",
                     "last-verify.json", "logs.txt", "ray-logs.txt", "facts.json", "health.json"):
            assert items[item] == "present", (host, item, items[item])
    assert manifest["items"]["spark-1"]["serve.json"] == "present"
    assert "Active FEC encoding: RS" in (root / "nodes" / "spark-2" / "ethtool.txt").read_text()
    assert json.loads((root / "nodes" / "spark-2" / "last-verify.json").read_text())["status"] == "PASS"
    for host in ("spark-1", "spark-2"):  # the probe's own output, kept by verify on each node
        assert manifest["items"][host]["last-verify.log"] == "present"
        assert "# sparkcluster verify: the probe of" in (root / "nodes" / host / "last-verify.log").read_text()
    # nccl-report reads the bundle as it reads log files: each node's rank, from the logs inside it
    report = run_cli("nccl-report", str(path), "--json")
    assert report.returncode in (0, 1) and len(json.loads(report.stdout)["probe_ranks"]) == 2, report.stderr
    assert manifest["scrubbed"]["files"]["inventory.yml"]  # the planted token was there, and is counted
    leaks = [(p.relative_to(root), s) for p in root.rglob("*") if p.is_file()
             for s in secrets if s.encode() in p.read_bytes()]
    assert not leaks, leaks


def test_the_probe_runs_inside_the_containers_and_a_fallback_is_refused(two, tmp_path):
    """The image with PyTorch: the probe runs in the running vllm_node containers, in their env. While it serves,
    with an HF token in the inventory's serve_env, `doctor --bundle` gathers every node's state and no secret.
    (Here, not in test_serve_docker.py, whose image leaves PyTorch out: this cluster has it on both nodes already,
    where its 1.1 GB took ~50 s to import on the head and copy to the worker.)"""
    head, worker = two.topology.hosts
    inventory = two.inventory_path.read_text()
    secrets = ("hf_" + "PlantedBundleToken" + "x" * 16, "sudo-" + "planted-password")
    doc = yaml.safe_load(inventory)
    doc.setdefault("vars", {}).setdefault("serve_env", {})["HF_TOKEN"] = secrets[0]
    two.inventory_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        result = sc(two, "serve", "--model", MODEL, "--json", "--ready-timeout", "60")
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["verify"]["backend"] == "gloo" and doc["verify"]["verdict"]["status"] == "PASS"
        assert doc["verify"]["carried_by"]["spark-2"] == [f"enp1s0f1np1 {worker.fabric_ips[0]} -> {head.fabric_ips[0]}"]
        bundle_holds_every_item_and_no_secret(two, tmp_path, secrets)
    finally:
        two.inventory_path.write_text(inventory)
        assert sc(two, "down").returncode == 0
    misbind = "sed -i 's/^GLOO_SOCKET_IFNAME=.*/GLOO_SOCKET_IFNAME=enP7s7/' ~/.config/sparkcluster/comm.env"
    for host in ("spark-1", "spark-2"):
        ssh(two, host, misbind)
    try:
        refused = sc(two, "serve", "--model", MODEL, "--ready-timeout", "60", ok=False)
        err = " ".join(refused.stderr.split())
        assert refused.returncode == 1, err
        assert "refusing to serve: the NCCL probe found a fallback" in err and "enP7s7" in err
        assert running_anywhere(two) == []
    finally:
        bootstrapped(two, tmp_path)  # rewrites the comm env


def test_top_shows_a_node_that_stops_answering(two):
    """Last in the module: it powers a node off."""
    two.power_off("spark-2")
    top = run_cli("top", "-i", str(two.inventory_path), "--once", "--json", "--interval", "0.5", timeout=180)
    assert top.returncode == 1 and "Traceback" not in top.stderr, top.stderr
    nodes = json.loads(top.stdout)["nodes"]
    assert nodes["spark-1"]["answered"] and not nodes["spark-2"]["answered"] and nodes["spark-2"]["error"]
