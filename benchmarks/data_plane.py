"""The data plane on a simulated 2-Spark cluster, every figure from one run, as ratios against raw TCP between the
same two hosts' fabric addresses (socat, 1 MiB buffers):

(a) staging a 1 GiB model to one worker, --transport tcp vs raw TCP             goal >= 0.7
(b) CPU seconds per GB delivered, tcp vs ssh (rsync over ssh)                   goal <= 1/3
(c) a 1.1 GB image to one worker (`image sync`) vs raw TCP of the same bytes    goal >= 0.5
(d) a second sync after changing one small layer: bytes on the wire
(e) the alternative kept out: a transient registry (Debian's docker-registry) on the head, push + pull

Alongside, what bounds the image path on its own, timed inside the hosts: `docker save` and `docker load` alone.

Baselines are timed inside the hosts (date and /proc/stat before and after), so no process start of ours is in
them; the CLI figures are whole runs. CPU seconds are the whole machine's (/proc/stat, user+system+irq) during
the step: every simulated host shares this machine's cores, so this is what carries over to Sparks that each
have their own.

Run as root:  .venv/bin/python benchmarks/data_plane.py [--size-mib 1024] [--no-registry]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparkcluster.sim import SimCluster, UpOptions, image  # noqa: E402
from sparkcluster.sim.fakemodel import generate  # noqa: E402

MODEL = "acme/bench"
TAG = "vllm-node"
RAY_ENV = Path(__file__).resolve().parents[1] / ".venv-ray"
REGISTRY_YML = "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: /tmp/registry\nhttp:\n  addr: 127.0.0.1:5000\n"


STAMP = "date +%s.%N; head -1 /proc/stat"  # a host's clock and the machine's CPU counters: same kernel for all


def cpu_seconds(stat_line: str) -> float:
    fields = [int(v) for v in stat_line.split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def machine_cpu_seconds() -> float:
    return cpu_seconds(Path("/proc/stat").read_text().split("\n", 1)[0])


class Measured:
    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def __enter__(self) -> "Measured":
        self._t, self._c = time.monotonic(), machine_cpu_seconds()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.monotonic() - self._t, machine_cpu_seconds() - self._c


def between(start: str, end: str) -> Measured:
    """The span between two STAMP outputs taken inside the hosts: no process start of ours in it."""
    (t0, stat0), (t1, stat1) = (text.strip().split("\n", 1) for text in (start, end))
    m = Measured()
    m.wall, m.cpu = float(t1) - float(t0), cpu_seconds(stat1) - cpu_seconds(stat0)
    return m


def root(cluster: SimCluster, host: str, command: str) -> str:
    return subprocess.run(sim_exec(cluster, host, command), check=True, capture_output=True, text=True).stdout


def sim_exec(cluster: SimCluster, host: str, command: str) -> list[str]:
    return [sys.executable, "-m", "sparkcluster", "sim", "exec", "--name", cluster.state.name, host, "--", "bash", "-c",
            command]


def cli(cluster: SimCluster, *args: str, env: dict | None = None) -> str:
    result = subprocess.run([sys.executable, "-m", "sparkcluster", *args, "-i", str(cluster.inventory_path)],
                            capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise SystemExit(f"sparkcluster {' '.join(args)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-2000:]}")
    return result.stdout


def raw_tcp(cluster: SimCluster, path: str, sink: str = "/dev/null") -> Measured:
    """socat from a file on spark-1 (read once first: in the page cache, as staging's source is) to spark-2,
    timed inside the hosts from the sender's start to the receiver's end."""
    ip = cluster.host("spark-2").fabric_ips[0]
    root(cluster, "spark-1", f"cat {path} >/dev/null")
    receiver = subprocess.Popen(sim_exec(cluster, "spark-2", f"socat -b 1048576 -u TCP-LISTEN:5999,reuseaddr,bind={ip} "
                                                          f"{sink} && {STAMP}"), stdout=subprocess.PIPE, text=True)
    time.sleep(1)
    start = root(cluster, "spark-1", f"{STAMP}; socat -b 1048576 -u FILE:{path} TCP:{ip}:5999")
    return between(start, receiver.communicate()[0])


def in_host(cluster: SimCluster, host: str, command: str) -> Measured:
    """`command` on `host`, timed inside it."""
    return between(*root(cluster, host, f"{STAMP}; {{ {command}; }} >/dev/null && echo END && {STAMP}").split("END\n"))


def stage(cluster: SimCluster, *args: str, drop: bool = True) -> tuple[Measured, float]:
    """(the CLI run measured, the copy phase's seconds as it reports them)."""
    if drop:
        root(cluster, "spark-2", "rm -rf /home/spark/.cache/huggingface/hub/models--acme--bench")
    with Measured() as m:
        doc = json.loads(cli(cluster, "stage", MODEL, "--json", "--limit", "spark-1,spark-2", *args))
    return m, doc["nodes"]["spark-2"]["seconds"]


def registry_sync(cluster: SimCluster, tag: str) -> tuple[Measured, Measured]:
    """The transient-registry way: a registry on the head's loopback, published on its fabric address by socat
    (peers only); the worker pulls through its own loopback forwarder (Docker trusts plain HTTP there only)."""
    head_ip = cluster.host("spark-1").fabric_ips[0]
    root(cluster, "spark-1", f"rm -rf /tmp/registry; printf '{REGISTRY_YML}' > /tmp/registry.yml; "
                             "setsid nohup docker-registry serve /tmp/registry.yml >/tmp/registry.log 2>&1 </dev/null & "
                             f"setsid nohup socat TCP-LISTEN:5000,bind={head_ip},reuseaddr,fork,range={head_ip}/24 "
                             "TCP:127.0.0.1:5000 >/dev/null 2>&1 </dev/null & sleep 1")
    root(cluster, "spark-2", f"setsid nohup socat TCP-LISTEN:5000,bind=127.0.0.1,reuseaddr,fork TCP:{head_ip}:5000 "
                             ">/dev/null 2>&1 </dev/null & sleep 0.5")
    try:
        with Measured() as push:
            root(cluster, "spark-1", f"docker tag {tag} 127.0.0.1:5000/{tag} && docker push -q 127.0.0.1:5000/{tag}")
        with Measured() as pull:
            root(cluster, "spark-2", f"docker pull -q 127.0.0.1:5000/{tag}")
    finally:
        root(cluster, "spark-1", "pkill -x docker-registry; pkill -x socat; true")
        root(cluster, "spark-2", f"pkill -x socat; docker rmi -f 127.0.0.1:5000/{tag} >/dev/null 2>&1; true")
    return push, pull


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--no-registry", action="store_true", help="skip (e), the slowest part")
    args = parser.parse_args()
    gb = args.size_mib * 2**20 / 1e9
    cluster = SimCluster.up(UpOptions(count=2, name="bench-data", ssh_mesh=False))
    try:
        with tempfile.TemporaryDirectory() as cfg:
            cli(cluster, "bootstrap", env={"XDG_CONFIG_HOME": cfg})
        generate(cluster, "spark-1", MODEL, args.size_mib * 2**20, shards=4)
        root(cluster, "spark-1", f"head -c {args.size_mib}M /dev/urandom > /tmp/raw.bin")
        raw = raw_tcp(cluster, "/tmp/raw.bin")
        raw_file = raw_tcp(cluster, "/tmp/raw.bin", "CREATE:/tmp/raw.out")
        tcp, tcp_copy = stage(cluster)
        tcp1, tcp1_copy = stage(cluster, "--streams", "1")
        ssh, ssh_copy = stage(cluster, "--transport", "ssh")
        idle, _ = stage(cluster, drop=False)  # the CLI's fixed cost (start, facts, scan) with nothing to copy
        print(f"raw TCP (socat) {gb:.2f} GB spark-1 -> spark-2: {gb / raw.wall * 1e3:.0f} MB/s, "
              f"{raw.cpu / gb:.2f} CPU-s/GB; into a file: {gb / raw_file.wall * 1e3:.0f} MB/s, "
              f"{raw_file.cpu / gb:.2f} CPU-s/GB")
        for name, m, copy in (("tcp, 2 streams", tcp, tcp_copy), ("tcp, 1 stream", tcp1, tcp1_copy),
                              ("ssh (rsync)", ssh, ssh_copy)):
            print(f"stage {name:15} copy {copy:6.2f} s = {gb / copy * 1e3:5.0f} MB/s = {raw.wall / copy:.2f} x raw TCP "
                  f"({raw_file.wall / copy:.2f} x into a file); whole CLI {m.wall:5.2f} s, {m.cpu / gb:.2f} CPU-s/GB")
        print(f"(a) tcp staging / raw TCP = {raw.wall / tcp_copy:.2f} (goal >= 0.7)")
        print(f"(b) CPU-s per GB, tcp / ssh = {tcp.cpu / ssh.cpu:.2f} whole CLI runs; without the fixed "
              f"{idle.cpu:.2f} CPU-s of a run with nothing to copy: {(tcp.cpu - idle.cpu) / gb:.2f} vs "
              f"{(ssh.cpu - idle.cpu) / gb:.2f} CPU-s/GB = {(tcp.cpu - idle.cpu) / (ssh.cpu - idle.cpu):.2f} (goal <= 0.33)")

        tar = image.build(TAG, ray_env=RAY_ENV, with_torch=True)  # the 1.1 GB test image (cached)
        image.import_into(cluster, ["spark-1"], TAG, tar)
        size = int(root(cluster, "spark-1", f"docker image inspect --format '{{{{.Size}}}}' {TAG}"))
        image_id = root(cluster, "spark-1", f"docker image inspect --format '{{{{.Id}}}}' {TAG}").strip()
        save_only = in_host(cluster, "spark-1", f"docker save {image_id} > /tmp/image.tar")
        raw_image = raw_tcp(cluster, "/tmp/image.tar")
        tar_bytes = int(root(cluster, "spark-1", "stat -c %s /tmp/image.tar"))
        raw_tcp(cluster, "/tmp/image.tar", "CREATE:/tmp/image.tar")  # onto spark-2, to load it there alone
        load_only = in_host(cluster, "spark-2", "docker load -q -i /tmp/image.tar")
        root(cluster, "spark-2", f"rm -f /tmp/image.tar; docker rmi -f {image_id} >/dev/null")
        with Measured() as full:
            sent = json.loads(cli(cluster, "image", "sync", TAG, "--json"))["nodes"]["spark-2"]["sent_bytes"]
        root(cluster, "spark-1", f"mkdir -p /tmp/patch && cd /tmp/patch && head -c 1M /dev/urandom > patch.bin && "
                                 f"printf 'FROM {TAG}\\nCOPY patch.bin /patch.bin\\n' > Dockerfile && "
                                 f"DOCKER_BUILDKIT=0 docker build -q -t {TAG}:patched . >/dev/null")
        with Measured() as patched:
            sent2 = json.loads(cli(cluster, "image", "sync", f"{TAG}:patched", "--json"))["nodes"]["spark-2"]["sent_bytes"]
        print(f"image {size / 1e9:.2f} GB, saved tar {tar_bytes / 1e9:.2f} GB: raw TCP {raw_image.wall:.2f} s; on their "
              f"own, docker save on spark-1 {save_only.wall:.2f} s ({save_only.cpu:.1f} CPU-s), docker load on "
              f"spark-2 {load_only.wall:.2f} s ({load_only.cpu:.1f} CPU-s)")
        print(f"(c) image sync, full: {full.wall:.2f} s, {sent / 1e6:.0f} MB on the wire, {full.cpu:.1f} CPU-s; "
              f"image sync / raw TCP = {raw_image.wall / full.wall:.2f} (goal >= 0.5); "
              f"/ (save + load alone) = {(save_only.wall + load_only.wall) / full.wall:.2f}")
        print(f"(d) after a 1 MB layer changed: {patched.wall:.2f} s, {sent2 / 1e6:.2f} MB on the wire "
              f"({sent2 / sent:.4f} of the full copy), {patched.cpu:.1f} CPU-s")
        if not args.no_registry:
            root(cluster, "spark-2", f"docker rmi -f {TAG} {TAG}:patched >/dev/null; docker image prune -f >/dev/null")
            push, pull = registry_sync(cluster, TAG)
            print(f"(e) registry, full: push {push.wall:.2f} s + pull {pull.wall:.2f} s = {push.wall + pull.wall:.2f} s, "
                  f"{push.cpu + pull.cpu:.1f} CPU-s; image sync is {(push.wall + pull.wall) / full.wall:.1f}x faster")
    finally:
        cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
