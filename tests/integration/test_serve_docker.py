"""`sparkcluster serve` with the docker runtime on simulated Sparks: real Docker engines, a test image with a
real Ray and a stand-in vLLM (it records its arguments and environment and reserves a real Ray placement
group), real HTTP. Checks eugr's exact container and what sparkcluster does better."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkcluster.serving.readiness import http
from sparkcluster.sim import SimCluster, UpOptions, image
from sparkcluster.sim.fakemodel import generate
from tests.support.helpers import bootstrapped, require_sim, run_cli, ssh, unique_name
from tests.support.sim_serving import RAY_ENV, TAG, running_anywhere

pytestmark = [pytest.mark.sim, pytest.mark.docker, pytest.mark.slow]
KEPT = "~/.cache/sparkcluster/serve"  # where a container's output is kept after it is gone (serving/keptlog.py)
GONE = "the container is gone; its last output, kept by sparkcluster:"
MODEL = "acme/tiny"


def _cluster(count: int, tag: str, config: Path) -> Iterator[SimCluster]:
    """A bootstrapped cluster whose head alone holds the test image and a small model."""
    require_sim(docker=True)
    if not (RAY_ENV / "bin" / "ray").exists():
        pytest.fail(f"{RAY_ENV} is missing: run scripts/setup.sh")
    c = SimCluster.up(UpOptions(count=count, name=unique_name(tag)))
    try:
        bootstrapped(c, config)
        tar = image.build(TAG, ray_env=RAY_ENV, with_torch=False)  # cached; without torch: 3x faster to copy
        image.import_into(c, ["spark-1"], TAG, tar)  # only the head: serve must copy it to the others
        generate(c, "spark-1", MODEL, 1 << 20, shards=1)
        yield c
    finally:
        c.down()


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> Iterator[SimCluster]:
    yield from _cluster(2, "serve2", tmp_path_factory.mktemp("cfg"))


def sc(c: SimCluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_cli(args[0], "-i", str(c.inventory_path), *args[1:], timeout=timeout)  # before any `--`


def serve(c: SimCluster, *args: str) -> subprocess.CompletedProcess:
    return sc(c, "serve", "--model", MODEL, "--no-verify", "--ready-timeout", "60", "--up-timeout", "90", *args)


def inspect(c: SimCluster, host: str) -> dict:
    return json.loads(ssh(c, host, "docker inspect vllm_node").stdout)[0]


def container_env(c: SimCluster, host: str) -> dict[str, str]:
    out = ssh(c, host, "docker exec vllm_node bash -i -c env 2>/dev/null").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def test_doctor_passes_the_fresh_cluster_and_says_how_the_image_gets_to_each_node(two):
    """Issue 43: on a freshly bootstrapped Docker cluster doctor FAILed "no image 'vllm-node': " (an empty reason),
    though serve sends the image itself. With no image anywhere (the head's tag moved aside) and with the head's
    alone, doctor warns how it gets there and exits 0; an image --image names must be there (exit 1)."""
    def doctor(*args: str) -> tuple[int, list[dict]]:
        out = sc(two, "doctor", "--json", *args)
        assert "Traceback" not in out.stderr, out.stderr
        return out.returncode, [f for f in json.loads(out.stdout)["findings"] if f["check"] == "image"]

    ssh(two, "spark-1", f"docker tag {TAG} {TAG}:aside && docker rmi {TAG} >/dev/null")
    try:
        code, image = doctor()
    finally:
        ssh(two, "spark-1", f"docker tag {TAG}:aside {TAG} && docker rmi {TAG}:aside >/dev/null")
    assert code == 0 and [(f["severity"], f["nodes"]) for f in image] == [("warn", ["spark-1", "spark-2"])], image
    assert "needs to be on spark-1 first" in image[0]["summary"] and "build-and-copy.sh" in image[0]["fix"], image
    code, image = doctor()
    assert code == 0 and [(f["severity"], f["nodes"]) for f in image] == [("warn", ["spark-2"])], image
    assert "serve copies the head's over the fabric" in image[0]["summary"], image
    code, image = doctor("--image", f"{TAG}:nowhere")
    assert code == 1 and {f["severity"] for f in image} == {"fail"} and "which --image names" in image[0]["summary"]


def test_check_shows_the_plan_and_starts_nothing(two):
    result = serve(two, "--check", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    head, worker = two.topology.hosts
    assert doc["image_copies"] == [{"node": "spark-2", "over": worker.fabric_ips[0]}]
    assert f"ray start --block --address={head.fabric_ips[0]}:6379" in doc["commands"]["spark-2"][0]
    assert "vllm serve acme/tiny --tensor-parallel-size 2" in doc["commands"]["spark-1"][1]
    assert running_anywhere(two) == []
    assert ssh(two, worker.name, f"docker image inspect {TAG}", check=False).returncode != 0  # not copied


def test_two_nodes_reproduce_eugrs_container_and_serve(two):
    result = serve(two, "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    head, worker = two.topology.hosts
    head_ip, worker_ip = head.fabric_ips[0], worker.fabric_ips[0]
    assert doc["endpoint"] == f"http://{head.mgmt_ip}:8000/v1"

    for host, ip in ((head, head_ip), (worker, worker_ip)):
        info = inspect(two, host.name)
        hc = info["HostConfig"]
        assert (hc["Privileged"], hc["NetworkMode"], hc["IpcMode"], hc["AutoRemove"]) == (True, "host", "host", True)
        assert hc["DeviceRequests"][0]["Count"] == -1 and hc["DeviceRequests"][0]["Capabilities"] == [["gpu"]]
        assert f"/home/{two.state.user}/.cache/huggingface:/root/.cache/huggingface" in hc["Binds"]
        assert info["Config"]["Image"] == TAG
        # §3.2 item 14: the node's own values (eugr gives every node the head's interface names).
        env = container_env(two, host.name)
        iface = "enp1s0f1np1"
        for key in ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS"):
            assert env[key] == ip
        for key in ("MN_IF_NAME", "UCX_NET_DEVICES", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include",
                    "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            assert env[key] == iface, key
        assert env["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
        assert (env["NCCL_IB_DISABLE"], env["RAY_memory_monitor_refresh_ms"], env["NCCL_IGNORE_CPU_AFFINITY"]) == ("0", "0", "1")
        # §3.2 item 15: Ray is the container's main process, with eugr's exact arguments.
        pid1 = ssh(two, host.name, "docker exec vllm_node cat /proc/1/cmdline").stdout.replace("\0", " ")
        if host is head:
            assert (f"ray start --block --head --port 6379 --node-ip-address {head_ip} --include-dashboard=True "
                    "--dashboard-host 127.0.0.1 --dashboard-port 8265 --disable-usage-stats") in pid1
        else:
            assert f"ray start --block --address={head_ip}:6379 --node-ip-address {worker_ip}" in pid1
    listening = ssh(two, head.name, "ss -ltn").stdout
    assert ":6379 " in listening and ":8000 " in listening
    # Ray's dashboard takes jobs from whoever reaches it: the head's loopback only (an SSH tunnel), not the LAN.
    assert "127.0.0.1:8265 " in listening and "0.0.0.0:8265 " not in listening and "*:8265 " not in listening

    # Ray: every node on its fabric address with one GPU; the TP ranks' bundles on distinct nodes.
    status = json.loads(sc(two, "status", "--json").stdout)
    assert status["ray"]["nodes"] == 2 and status["ray"]["gpus"] == 2 and status["ray"]["problems"] == []
    assert {n["ray"]["address"] for n in status["nodes"].values()} == {head_ip, worker_ip}
    record = json.loads(ssh(two, head.name, "docker exec vllm_node cat /tmp/vllm-standin.json").stdout)
    argv = " ".join(record["argv"])
    assert "--tensor-parallel-size 2 --distributed-executor-backend ray" in argv
    assert sorted(record["ranks_on"]) == sorted([head_ip, worker_ip])
    assert record["env"]["HF_HUB_OFFLINE"] == "1" and record["env"]["VLLM_HOST_IP"] == head_ip

    # The image was copied from the head: the same ID everywhere.
    ids = {h.name: ssh(two, h.name, f"docker image inspect --format '{{{{.Id}}}}' {TAG}").stdout.strip()
           for h in two.topology.hosts}
    assert len(set(ids.values())) == 1 and all(ids.values())

    # Served over real HTTP from this machine to the head's management address.
    code, text = http(f"http://{head.mgmt_ip}:8000/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert code == 200 and json.loads(text)["choices"][0]["text"]

    # A second serve reuses the Ray cluster that is up as it must be, and replaces vLLM.
    again = serve(two, "--json", "--served-model-name", "tiny")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["reused_ray"] is True
    assert http(f"http://{head.mgmt_ip}:8000/v1/models")[1].count('"tiny"') == 1

    logs = sc(two, "logs", "-n", "20")
    assert logs.returncode == 0 and "== spark-2 ==" in logs.stdout and "Starting vLLM API server" in logs.stdout

    down = sc(two, "down", "--json")
    assert down.returncode == 0, down.stderr
    assert running_anywhere(two) == []
    assert http(f"http://{head.mgmt_ip}:8000/health")[0] == 0
    # The container and vLLM's log inside it are gone; both were kept on the head, each under its role.
    kept = sc(two, "logs", "--node", head.name, "-n", "200").stdout
    ray, vllm = kept.split("== vllm ==")
    assert GONE in ray and "Ray runtime started" in ray, kept
    assert GONE in vllm and vllm.count("Starting vLLM API server") == 2, kept  # both serves' vLLM, as in the container
    again = sc(two, "down", "--json")  # idempotent
    assert again.returncode == 0 and set(json.loads(again.stdout)["stopped"].values()) == {""}


def test_killing_the_cli_leaves_the_model_serving(two):
    head = two.topology.hosts[0]
    process = subprocess.Popen([sys.executable, "-m", "sparkcluster", "serve", "-i", str(two.inventory_path),
                                "--model", MODEL, "--no-verify", "--ready-timeout", "60"],
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith("ready"):  # vLLM launched; the CLI now only waits
                break
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        deadline = time.monotonic() + 60
        while http(f"http://{head.mgmt_ip}:8000/health")[0] != 200:
            assert time.monotonic() < deadline, "vLLM stopped with the CLI"
            time.sleep(1)
        assert len(running_anywhere(two)) == 2
    finally:
        process.kill()
        assert sc(two, "down").returncode == 0
    assert running_anywhere(two) == []


def test_native_launcher_runs_one_rank_per_node(two):
    result = serve(two, "--launcher", "native", "--json", "--no-supervise")  # its worker dies on purpose below
    assert result.returncode == 0, result.stderr
    head, worker = two.topology.hosts
    try:
        for host in (head, worker):
            record = json.loads(ssh(two, host.name, "docker exec vllm_node cat /tmp/vllm-standin.json").stdout)
            argv = " ".join(record["argv"])
            rank = 0 if host is head else 1
            assert (f"--distributed-executor-backend mp --nnodes 2 --node-rank {rank} "
                    f"--master-addr {head.fabric_ips[0]} --master-port 29501") in argv
            assert ("--headless" in argv) == (host is worker)
            assert record["env"]["VLLM_HOST_IP"] == host.fabric_ips[0]
        assert http(f"http://{head.mgmt_ip}:8000/health")[0] == 200
        # The worker's rank dies: eugr's --rm removes its container and `docker logs` with it, but not its output.
        keepers = {h.name: ssh(two, h.name, f"cat {KEPT}/main.keeper.pid").stdout.strip() for h in (head, worker)}
        ssh(two, worker.name, "docker kill vllm_node >/dev/null && i=0; while docker inspect vllm_node >/dev/null 2>&1 "
                              "&& [ $i -lt 50 ]; do sleep 0.2; i=$((i+1)); done")
        kept = sc(two, "logs", "--node", worker.name, "-n", "5")
        shown = kept.stdout.splitlines()
        assert kept.returncode == 0 and GONE in shown, kept.stdout
        assert f"INFO headless rank 1 of 2 waiting for {head.fabric_ips[0]}" in shown[shown.index(GONE) + 1:], shown
    finally:
        assert sc(two, "down").returncode == 0
    # down let the head's keeper copy its container's last lines, then left no keeper on any node.
    kept = sc(two, "logs", "--node", head.name, "-n", "5")
    assert GONE in kept.stdout and "Starting vLLM API server" in kept.stdout, kept.stdout
    for host, pid in keepers.items():
        files, running = ssh(two, host, f"ls {KEPT}; echo --; ps -o stat= -p {pid} | grep -v Z; true").stdout.split("--")
        assert "main.log" in files.split() and "keeper.pid" not in files, (host, files)
        assert running.strip() == "", (host, running)  # nor the keeper's process (a zombie has ended)


def test_a_node_on_its_management_address_is_refused_and_nothing_is_left(two, tmp_path):
    worker = two.topology.hosts[1]
    ssh(two, worker.name, f"sed -i 's/^VLLM_HOST_IP=.*/VLLM_HOST_IP={worker.mgmt_ip}/; "
                          f"s/^RAY_NODE_IP_ADDRESS=.*/RAY_NODE_IP_ADDRESS={worker.mgmt_ip}/' ~/.config/sparkcluster/comm.env")
    try:
        result = serve(two)
        assert result.returncode == 1
        assert f"spark-2 joined Ray on {worker.mgmt_ip}, its management address" in " ".join(result.stderr.split())
        assert running_anywhere(two) == []
    finally:
        bootstrapped(two, tmp_path)  # rewrites the comm env


def test_a_node_missing_the_image_with_no_way_to_copy_it(two):
    head, worker = two.topology.hosts
    assert sc(two, "stage", MODEL).returncode == 0  # the model is in place: only the image is missing
    ssh(two, worker.name, f"docker rmi -f {TAG} >/dev/null 2>&1; true")
    # The worker can no longer reach the head's fabric address (ssh from this machine still works).
    ssh(two, worker.name, f"sudo ip route add prohibit {head.fabric_ips[0]}/32")
    try:
        result = serve(two)
        assert result.returncode == 1
        err = " ".join(result.stderr.split())
        assert f"loading image {TAG} on spark-2 from the head's sender at {head.fabric_ips[0]}:" in err
        assert running_anywhere(two) == []
        # Nothing is left behind on the head: no sender listening, no saved image, no save still running.
        assert head.fabric_ips[0] not in ssh(two, head.name, "ss -Hltn").stdout
        assert "No such file" in ssh(two, head.name, "ls ~/.cache/sparkcluster/image-sync 2>&1; true").stdout
        assert ssh(two, head.name, "pgrep -fa 'docker [s]ave'; true").stdout.strip() == ""
    finally:
        ssh(two, worker.name, f"sudo ip route del prohibit {head.fabric_ips[0]}/32")
        sc(two, "down")


def image_sync(c: SimCluster, *args: str) -> subprocess.CompletedProcess:
    return run_cli("image", "sync", *args, "-i", str(c.inventory_path), timeout=300)


def test_image_sync_sends_only_the_layers_a_node_lacks(two):
    head, worker = two.topology.hosts
    ssh(two, worker.name, f"docker rmi -f {TAG} {TAG}:patched >/dev/null 2>&1; true")
    first = image_sync(two, TAG, "--json")
    assert first.returncode == 0, first.stderr
    doc = json.loads(first.stdout)
    head_id = ssh(two, head.name, f"docker image inspect --format '{{{{.Id}}}}' {TAG}").stdout.strip()
    assert doc["id"] == head_id and {n["id"] for n in doc["nodes"].values()} == {head_id}
    size = int(ssh(two, head.name, f"docker image inspect --format '{{{{.Size}}}}' {TAG}").stdout)
    assert doc["nodes"]["spark-2"]["sent_bytes"] >= size  # the whole image: the worker held none of it

    # A rebuilt image that differs by one small layer: only that layer crosses the fabric.
    ssh(two, head.name, "mkdir -p ~/patch && cd ~/patch && head -c 300000 /dev/urandom > patch.bin && "
                        f"printf 'FROM {TAG}\nCOPY patch.bin /opt/patch.bin\n' > Dockerfile && "
                        f"DOCKER_BUILDKIT=0 docker build -q -t {TAG}:patched . >/dev/null")
    check = image_sync(two, f"{TAG}:patched", "--check", "--json")
    assert json.loads(check.stdout)["nodes"] == {"spark-2": {"layers_held": 1}}
    second = image_sync(two, f"{TAG}:patched", "--json")
    assert second.returncode == 0, second.stderr
    sent = json.loads(second.stdout)["nodes"]["spark-2"]["sent_bytes"]
    assert 300_000 < sent < 2_000_000, sent
    # The same image ID (the hash of a config that names every layer's content hash) as the head's.
    assert {n["id"] for n in json.loads(second.stdout)["nodes"].values()} == {
        ssh(two, head.name, f"docker image inspect --format '{{{{.Id}}}}' {TAG}:patched").stdout.strip()}
    again = json.loads(image_sync(two, f"{TAG}:patched", "--json").stdout)
    assert again["nodes"]["spark-2"]["sent_bytes"] == 0


def test_tp_larger_than_the_gpus_is_refused_before_anything_starts(two):
    result = serve(two, "--tp", "3")
    assert result.returncode == 2
    assert "TP 3 x PP 1 needs 3 GPUs, but the selection has 2 node(s)" in " ".join(result.stderr.split())
    assert running_anywhere(two) == []


def test_a_node_powered_off_during_bring_up(two):
    process = subprocess.Popen([sys.executable, "-m", "sparkcluster", "serve", "-i", str(two.inventory_path),
                                "--model", MODEL, "--no-verify", "--up-timeout", "40"],
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if line.startswith("ray"):
                two.power_off("spark-2")
                break
        rest = process.stderr.read()
        assert process.wait(timeout=180) == 1
        err = " ".join((" ".join(lines) + rest).split())
        assert "spark-2" in err, err
        assert running_anywhere(two) == []
    finally:
        process.kill()
        two.boot("spark-2")
