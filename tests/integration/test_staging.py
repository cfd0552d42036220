"""`sparkcluster stage` on a bootstrapped 4-node simulated cluster, with a generated 1 GiB model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from sparkcluster.engine.modelref import ModelRef
from sparkcluster.sim import SimCluster, UpOptions, image
from sparkcluster.sim.fakemodel import generate
from sparkcluster.sim.topology import MGMT_NETDEV
from tests.support.helpers import bootstrapped, require_sim, run_cli, ssh, unique_name
from tests.support.sim_serving import RAY_ENV, TAG, running_anywhere

pytestmark = [pytest.mark.sim, pytest.mark.slow]

MODEL = "acme/fake-1b"
MODEL_DIR = "home/spark/.cache/huggingface/hub/models--acme--fake-1b"


def cli(cluster: SimCluster, *args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, "-i", str(cluster.inventory_path))


def stage_json(cluster: SimCluster, *args: str) -> tuple[int, dict]:
    out = cli(cluster, "stage", MODEL, "--json", *args)
    assert "Traceback" not in out.stderr, out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture(scope="module")
def staged_cluster(tmp_path_factory):
    require_sim(docker=True)
    c = SimCluster.up(UpOptions(count=4, name=unique_name("stage"), ssh_mesh=False))
    try:
        bootstrapped(c, tmp_path_factory.mktemp("cfg"))
        generate(c, "spark-1", MODEL, 1 << 30, shards=5)
        source_sums(c)
        yield c
    finally:
        c.down()


def sums(cluster: SimCluster, host: str) -> str:
    """Each snapshot file's BLAKE2b digest (a cryptographic hash like SHA-256; coreutils' b2sum reads a GiB in
    ~1.4 s of CPU here, its sha256sum in ~6 s: the module compares two dozen copies)."""
    return ssh(cluster, host, f"cd ~/{MODEL_DIR[len('home/spark/'):]}/snapshots/* && b2sum $(find . -type l | sort)").stdout


_SOURCE_SUMS: dict[str, str] = {}  # by the cluster's directory


def source_sums(cluster: SimCluster) -> str:
    """spark-1's copy as generate() wrote it, read once: every copy must equal that, and spark-1's own copy is the
    source that no test changes (were it changed, comparing a copy against it now would hide that)."""
    key = str(cluster.dir)
    if key not in _SOURCE_SUMS:
        _SOURCE_SUMS[key] = sums(cluster, "spark-1")
    return _SOURCE_SUMS[key]


class RefWatcher:
    """Samples every node's disk (its overlay upper layer, read from outside) while staging runs: whenever
    refs/main exists, every snapshot link must reach a blob of its full size."""

    def __init__(self, cluster: SimCluster, sizes: dict[str, int]) -> None:
        self.cluster, self.sizes = cluster, sizes
        self.violations: list[str] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RefWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for h in self.cluster.topology.hosts:
                root = self.cluster.host_dir(h) / "upper" / MODEL_DIR
                ref = root / "refs" / "main"
                if not ref.exists():
                    continue
                snap = root / "snapshots" / ref.read_text().strip()
                for path, size in self.sizes.items():
                    blob = snap / path
                    try:
                        actual = os.path.getsize(os.path.realpath(blob))
                    except OSError:
                        actual = -1
                    if actual != size:
                        self.violations.append(f"{h.name}: ref present but {path} is {actual} bytes, not {size}")
            self.samples += 1
            time.sleep(0.05)


def model_sizes(cluster: SimCluster) -> dict[str, int]:
    root = cluster.host_dir(cluster.host("spark-1")) / "upper" / MODEL_DIR
    snap = next((root / "snapshots").iterdir())
    return {str(p.relative_to(snap)): os.path.getsize(os.path.realpath(p)) for p in snap.rglob("*") if p.is_symlink()}


def received_bytes(cluster: SimCluster, host: str) -> dict[str, int]:
    """The kernel's receive counter of each of the host's interfaces."""
    out = ssh(cluster, host, "for d in /sys/class/net/*; do echo ${d##*/} $(cat $d/statistics/rx_bytes); done").stdout
    return {name: int(count) for name, count in (line.split() for line in out.splitlines())}


def test_stage_fans_out_identically_and_a_rerun_sends_nothing(staged_cluster):
    c = staged_cluster
    sizes = model_sizes(c)
    assert sum(sizes.values()) >= 1 << 30
    workers = ("spark-2", "spark-3", "spark-4")
    before = {w: received_bytes(c, w) for w in workers}
    with RefWatcher(c, sizes) as watcher:
        code, doc = stage_json(c)  # the default transport: plain TCP between the fabric addresses
    assert code == 0, doc
    assert watcher.samples > 10 and watcher.violations == []
    assert doc["source"] == "spark-1"
    assert {n: r["state"] for n, r in doc["nodes"].items()} == dict.fromkeys(["spark-1", "spark-2", "spark-3", "spark-4"], "complete")
    assert all(doc["nodes"][w]["bytes"] == sum(sizes.values()) for w in ("spark-2", "spark-3", "spark-4"))
    reference = source_sums(c)
    assert reference.count("safetensors") == 5
    # The copies came over the fabric: each worker's QSFP interfaces received the model, its management port
    # only the control traffic (ssh from this machine).
    for w in workers:
        grew = {name: count - before[w].get(name, 0) for name, count in received_bytes(c, w).items()}
        assert sum(n for name, n in grew.items() if name.startswith(("enp1s0f", "enP2p1s0f"))) >= sum(sizes.values())
        assert grew[MGMT_NETDEV] < sum(sizes.values()) // 20, grew
    for w in ("spark-2", "spark-3", "spark-4"):
        assert sums(c, w) == reference
        assert ssh(c, w, f"stat -c %U ~/{MODEL_DIR[len('home/spark/'):]}/blobs/*| sort -u").stdout == "spark\n"
    started = time.monotonic()
    code, again = stage_json(c)
    assert code == 0 and sum(r["bytes"] for r in again["nodes"].values()) == 0
    assert time.monotonic() - started < 10


def test_huggingface_hub_loads_the_snapshot_offline_on_every_node(staged_cluster):
    c = staged_cluster
    load = (f"HF_HUB_OFFLINE=1 {sys.executable} -c \"from huggingface_hub import snapshot_download; "
            f"print(snapshot_download('{MODEL}', local_files_only=True))\"")
    for h in c.topology.hosts:
        assert ssh(c, h.name, load).stdout.strip().endswith("/snapshots/0123456789abcdef0123456789abcdef01234567")


def test_corrupt_blob_is_found_and_repaired(staged_cluster):
    c = staged_cluster
    reference = source_sums(c)
    ssh(c, "spark-3", f"cd ~/{MODEL_DIR[len('home/spark/'):]}/blobs && f=$(ls -S | head -n 1) && "
                      "printf XXXX | dd of=$f bs=1 seek=4096 conv=notrunc 2>/dev/null && touch -r config.json $f 2>/dev/null; true")
    status = json.loads(cli(c, "stage", MODEL, "--status", "--verify", "full", "--json").stdout)
    assert status["nodes"]["spark-3"]["state"] == "corrupt" and len(status["nodes"]["spark-3"]["corrupt"]) == 1
    assert status["nodes"]["spark-2"]["state"] == "complete"
    # Repaired over rsync and ssh, the transport for encryption on the wire: it goes between the nodes' QSFP
    # addresses, never their LAN ones (the worker's sshd logs each connection's address).
    code, doc = stage_json(c, "--verify", "full", "--transport", "ssh")
    assert code == 0 and doc["nodes"]["spark-3"]["state"] == "complete" and doc["nodes"]["spark-3"]["bytes"] > 0
    assert sums(c, "spark-3") == reference
    log = (c.host_dir(c.host("spark-3")) / "boot.log").read_text()
    peers = [h for h in c.topology.hosts if h.name != "spark-3"]
    assert any(f"Connection from {h.fabric_ips[0]} " in log for h in peers)
    assert not any(f"Connection from {h.mgmt_ip} " in log for h in peers)


def _drop_copies(c: SimCluster, hosts: list[str]) -> None:
    for h in hosts:
        ssh(c, h, f"rm -rf ~/{MODEL_DIR[len('home/spark/'):]}")


def power_off_once_receiving(c: SimCluster, host: str, powered_off: threading.Event, timeout: float = 120) -> None:
    """Power `host` off once a MiB of the model has landed on its disk (read from outside): mid-transfer however
    long the run takes to get there. A fixed delay fell before the transfer when two test processes shared the
    cores: the node was gone already at stage's facts probe."""
    root = c.host_dir(c.host(host)) / "upper" / MODEL_DIR
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        landed = 0
        for path in root.rglob("*") if root.exists() else ():
            try:
                landed += path.stat().st_size if path.is_file() else 0
            except FileNotFoundError:  # renamed or replaced by rsync as we read
                pass
        if landed >= 1 << 20:
            c.power_off(host)
            powered_off.set()
            return
        time.sleep(0.05)


def test_worker_powered_off_mid_transfer_then_rerun_completes(staged_cluster):
    c = staged_cluster
    sizes = model_sizes(c)
    _drop_copies(c, ["spark-3", "spark-4"])
    powered_off = threading.Event()
    try:
        with RefWatcher(c, sizes) as watcher:
            killer = threading.Thread(target=power_off_once_receiving, args=(c, "spark-3", powered_off))
            killer.start()
            code, doc = stage_json(c)
            killer.join()
        assert powered_off.is_set(), "no model bytes reached spark-3"
        assert code == 1 and "nodes" in doc, doc
        assert doc["nodes"]["spark-3"]["state"] == "failed"
        # spark-4 followed spark-3 in the chain: it re-routed to the node before it and still completed
        assert doc["nodes"]["spark-4"]["state"] == "complete"
    finally:
        if not c.is_running(c.host("spark-3")):  # the module's later tests need it, whatever failed here
            c.boot("spark-3")
    # Blobs under their final name are whole (rsync renames only a finished file; partial data waits in a
    # hidden dir): the re-run must send exactly the rest.
    kept = ssh(c, "spark-3", f"cd ~/{MODEL_DIR[len('home/spark/'):]}/blobs && stat -c %s * 2>/dev/null; true").stdout
    kept_bytes = sum(int(x) for x in kept.split())
    with RefWatcher(c, sizes) as watcher2:
        code, doc = stage_json(c)
    assert code == 0 and doc["nodes"]["spark-3"]["state"] == "complete"
    assert watcher.violations == [] and watcher2.violations == []
    assert doc["nodes"]["spark-3"]["bytes"] == sum(sizes.values()) - kept_bytes
    assert sums(c, "spark-3") == source_sums(c)


def test_cli_interrupted_then_rerun_completes(staged_cluster):
    c = staged_cluster
    sizes = model_sizes(c)
    _drop_copies(c, ["spark-2", "spark-3", "spark-4"])
    with RefWatcher(c, sizes) as watcher:
        proc = subprocess.Popen([sys.executable, "-m", "sparkcluster", "stage", MODEL, "-i", str(c.inventory_path),
                                 "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(3)
        proc.send_signal(signal.SIGKILL)  # the harshest interruption: no cleanup at all
        proc.wait()
        time.sleep(1)
        code, doc = stage_json(c)
    assert code == 0, doc
    assert watcher.violations == []
    for w in ("spark-2", "spark-3", "spark-4"):
        assert sums(c, w) == source_sums(c)


def test_a_second_stage_of_the_same_model_is_refused_with_the_first_ones_command_and_pid(staged_cluster):
    """Round 3: two stages at once each failed a node, stepping on each other's partial blobs. Now the second
    is refused at once, naming the first, and the first completes untouched; after a SIGKILLed run (above)
    the lock was free again, since it lives only as long as its run's SSH channel."""
    c = staged_cluster
    _drop_copies(c, ["spark-2", "spark-3", "spark-4"])
    first = subprocess.Popen([sys.executable, "-m", "sparkcluster", "stage", MODEL, "-i", str(c.inventory_path),
                              "--json"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lock = f"~/.cache/huggingface/hub/.locks/sparkcluster/stage-{ModelRef.parse(MODEL).dir_name}.lock"
    deadline = time.monotonic() + 30
    while f"pid {first.pid} " not in ssh(c, "spark-4", f"cat {lock} 2>/dev/null; true").stdout:
        assert time.monotonic() < deadline and first.poll() is None, "the first run never took the lock"
        time.sleep(0.2)
    code, doc = stage_json(c)
    first_out, _ = first.communicate(timeout=600)
    assert code == 1 and f"a stage of {MODEL} is already running" in doc["error"], doc
    assert f"pid {first.pid} " in doc["error"], doc
    assert first.returncode == 0, first_out
    assert all(n["state"] == "complete" for n in json.loads(first_out)["nodes"].values())
    for w in ("spark-2", "spark-3", "spark-4"):
        assert sums(c, w) == source_sums(c)
    code, doc = stage_json(c)  # the first run's lock went with it
    assert code == 0 and all(n["bytes"] == 0 for n in doc["nodes"].values()), doc


def test_bad_model_names_fail_before_any_connection(staged_cluster):
    for name in ("a/b/c", "acme/../etc", "acme/x@bad rev", "acme/x@", "-rf"):
        out = cli(staged_cluster, "stage", name)
        assert out.returncode == 2 and "Traceback" not in out.stderr
    missing = cli(staged_cluster, "stage", "acme/never-downloaded")
    assert missing.returncode == 1
    assert "huggingface_hub" in missing.stderr or "download failed" in missing.stderr
    assert ModelRef.parse("Qwen/Qwen3-0.6B@main").dir_name == "models--Qwen--Qwen3-0.6B"


def test_bootstrap_stages_the_inventorys_models(staged_cluster, tmp_path):
    import yaml

    c = staged_cluster
    _drop_copies(c, ["spark-2"])
    doc = yaml.safe_load(c.inventory_path.read_text())
    doc["models"] = [MODEL]
    inventory = tmp_path / "inventory.yml"
    inventory.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "sparkcluster", "bootstrap", str(inventory), "--json"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "XDG_CONFIG_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stdout
    step = next(s for s in json.loads(out.stdout)["steps"] if s["step"] == "models.stage")
    assert step["status"] == "changed" and not step["commands"] and "spark-2" in step["notes"][0]
    assert sums(c, "spark-2") == source_sums(c)


def test_serve_shows_each_nodes_staging_progress(staged_cluster, tmp_path):
    """serve stages a model the nodes lack and shows the copy per node as `stage` does. This cluster's python_env
    holds no Ray, so serve stops right after its stage phase, naming Ray."""
    c = staged_cluster
    _drop_copies(c, ["spark-2"])
    inventory = tmp_path / "inventory.yml"  # a missing python_env would be refused before staging (exit 2)
    inventory.write_text(c.inventory_path.read_text().replace("\nvars:\n", "\nvars:\n  python_env: /nonexistent\n", 1))
    # Ray never comes up there: the head's port is waited on for --up-timeout (180 s by default) before serve says why.
    out = run_cli("serve", "--runtime", "host", "--tp", "4", "--model", MODEL, "--no-verify", "--up-timeout", "5",
                  "-i", str(inventory))
    # Ray missing from python_env is each node's failure (exit 1), found when the runtime starts, after staging.
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert "stage ..." in lines
    staged = [line for line in lines if line.startswith("spark-2 <- ")]
    # Every file of the snapshot, counted as it lands: 1/N .. N/N, the 5 weight shards among them.
    assert [line.split()[2] for line in staged] == [f"{i}/{len(staged)}" for i in range(1, len(staged) + 1)], staged
    assert sum(".safetensors " in line for line in staged) == 5, staged
    assert "why Ray did not start" in out.stderr  # the phase after staging names what failed
    assert sums(c, "spark-2") == source_sums(c)


@pytest.mark.docker
def test_four_nodes_serve_in_docker_and_tp_must_match_the_selection(staged_cluster):
    """`serve` with the docker runtime (test_serve_docker.py's image: a real Ray, a stand-in vLLM) on four nodes: a TP
    that does not cover the selection is refused; TP 4 serves with a rank on every node's fabric address, the image
    copied from the head to the three others. Here, on this module's four bootstrapped nodes, which hold the model
    by now, rather than on four of its own (~30 s of bring-up and teardown)."""
    c = staged_cluster
    if not (RAY_ENV / "bin" / "ray").exists():
        pytest.fail(f"{RAY_ENV} is missing: run scripts/setup.sh")
    tar = image.build(TAG, ray_env=RAY_ENV, with_torch=False)  # cached
    image.import_into(c, ["spark-1"], TAG, tar)  # only the head: serve must copy it to the others

    def sc(*args: str) -> subprocess.CompletedProcess:
        return run_cli(args[0], "-i", str(c.inventory_path), *args[1:], timeout=300)

    refused = sc("serve", "--model", MODEL, "--tp", "2")
    assert refused.returncode == 2
    assert "choose them with --limit (e.g. --limit spark-1,spark-2)" in " ".join(refused.stderr.split())
    result = sc("serve", "--model", MODEL, "--no-verify", "--ready-timeout", "60", "--up-timeout", "90", "--tp", "4",
                "--json")
    assert result.returncode == 0, result.stderr
    try:
        fabric = {h.fabric_ips[0] for h in c.topology.hosts}
        status = json.loads(sc("status", "--json").stdout)
        assert status["ray"]["nodes"] == 4 and status["ray"]["gpus"] == 4 and status["ray"]["problems"] == []
        assert {n["ray"]["address"] for n in status["nodes"].values()} == fabric
        record = json.loads(ssh(c, "spark-1", "docker exec vllm_node cat /tmp/vllm-standin.json").stdout)
        assert "--tensor-parallel-size 4 --distributed-executor-backend ray" in " ".join(record["argv"])
        assert set(record["ranks_on"]) == fabric
        ids = {ssh(c, h.name, f"docker image inspect --format '{{{{.Id}}}}' {TAG}").stdout.strip()
               for h in c.topology.hosts}
        assert len(ids) == 1
    finally:
        assert sc("down").returncode == 0
    assert running_anywhere(c) == []
