"""`monitor up` beside a REAL served model (the CPU vLLM of .venv-vllm, two replicas behind vllm-router, one per
simulated Spark, the host runtime): Prometheus on the head scrapes each replica's own /metrics, labelled with its
node, replica and model, and the router's; under a bench, each replica's token counter rises in Prometheus. Then
`monitor down --purge` and `down` leave nothing running."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkcluster.monitor.deploy import DEFAULT_LISTEN
from sparkcluster.sim import SimCluster, UpOptions, tinymodel
from tests.support import vllm_model_info
from tests.support.helpers import require_sim, run_cli, ssh, unique_name
from tests.support.sim_serving import VLLM_ENV

pytestmark = [pytest.mark.sim, pytest.mark.slow]
MODEL = "local/tiny-llama"
VLLM_FLAGS = ["--", "--max-model-len", "512", "--enforce-eager"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimCluster]:
    require_sim(docker=False)
    if not (VLLM_ENV / "bin" / "vllm").exists():
        pytest.fail(f"{VLLM_ENV} is missing: run scripts/setup-vllm.sh")
    c = SimCluster.up(UpOptions(count=2, name=unique_name("monserve"), docker=False, vllm_env=str(VLLM_ENV)))
    try:
        config = tmp_path_factory.mktemp("cfg")
        boot = run_cli("bootstrap", str(c.inventory_path), "--runtime", "host", env={"XDG_CONFIG_HOME": str(config)})
        assert boot.returncode == 0, boot.stdout[-2000:] + boot.stderr[-2000:]
        tinymodel.generate_on(c, "spark-1", str(VLLM_ENV / "bin" / "python"))
        vllm_model_info.lay_on(c, VLLM_ENV)
        yield c
    finally:
        c.down()


def sc(c: SimCluster, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """A command on the cluster; `monitor VERB` takes the inventory after its verb."""
    words = 2 if args[0] == "monitor" else 1
    return run_cli(*args[:words], "-i", str(c.inventory_path), *args[words:], timeout=timeout)


def query(c: SimCluster, expr: str) -> list[dict]:
    script = ("python3 -c 'import sys, urllib.parse, urllib.request; print(urllib.request.urlopen("
              f"\"http://{DEFAULT_LISTEN}/api/v1/query?\" + urllib.parse.urlencode({{\"query\": sys.argv[1]}}), "
              "timeout=10).read().decode())' " + json.dumps(expr).replace("'", ""))
    return list(json.loads(ssh(c, "spark-1", script).stdout)["data"]["result"])


def tokens_by_replica(c: SimCluster) -> dict[tuple[str, str], float]:
    return {(r["metric"]["node"], r["metric"]["replica"]): float(r["value"][1])
            for r in query(c, "sum by (node, replica) (vllm:generation_tokens_total)")}


def test_each_replica_is_a_target_and_its_tokens_rise_under_a_bench(cluster: SimCluster, tmp_path: Path) -> None:
    try:
        served = sc(cluster, "serve", "--replicas", "2", "--model", MODEL, "--no-verify", "--no-supervise", "--json",
                    *VLLM_FLAGS)
        assert served.returncode == 0, served.stderr[-3000:]
        up = sc(cluster, "monitor", "up", "--json")
        assert up.returncode == 0, up.stdout + up.stderr[-2000:]
        jobs = {(t["job"], t.get("node"), t.get("replica"), t.get("model")) for t in json.loads(up.stdout)["targets"]}
        assert {("vllm", "spark-1", "replica 0", MODEL), ("vllm", "spark-2", "replica 1", MODEL),
                ("vllm-router", "spark-1", None, MODEL)} <= jobs, jobs

        deadline = time.monotonic() + 90
        while True:
            status = sc(cluster, "monitor", "status", "--json")
            doc = json.loads(status.stdout)
            if status.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert status.returncode == 0, doc
        assert {(t["job"], t["node"], t["replica"]) for t in doc["targets"]} >= {
            ("vllm", "spark-1", "replica 0"), ("vllm", "spark-2", "replica 1"), ("vllm-router", "spark-1", None),
            ("sparkcluster-node", "spark-1", None), ("sparkcluster-node", "spark-2", None)}, doc

        before = tokens_by_replica(cluster)
        assert set(before) == {("spark-1", "replica 0"), ("spark-2", "replica 1")}, before
        bench = sc(cluster, "bench", "--concurrency", "2", "--prompt-tokens", "32", "--output-tokens", "8",
                   "--runs", "1", "--warmup", "0", "--requests-per-stream", "4", "--json", timeout=600)
        assert bench.returncode == 0, bench.stdout[-2000:] + bench.stderr[-2000:]
        deadline = time.monotonic() + 60  # a scrape every 15 s
        while True:
            after = tokens_by_replica(cluster)
            if all(after.get(k, 0) > v for k, v in before.items()) or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert all(after[k] > v for k, v in before.items()), (before, after)  # the router reached both
        deadline = time.monotonic() + 60  # the recording rules run every 15 s
        while True:
            recorded = query(cluster, "vllm:generation_tokens_per_second:rate1m")
            if len(recorded) == 2 or time.monotonic() > deadline:
                break
            time.sleep(5)
        assert {r["metric"]["replica"] for r in recorded} == {"replica 0", "replica 1"}, recorded
        # status reads the endpoint's figures from this Prometheus (its last 5 min), and says so
        said = json.loads(sc(cluster, "status", "--json").stdout)["server"]
        assert said["source"]["from"] == "prometheus" and said["source"]["place"] == "spark-1", said
        assert said["figures"]["generation_tokens_per_s"] > 0, said
    finally:
        down = sc(cluster, "monitor", "down", "--purge", "--json")
        sc(cluster, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert ssh(cluster, "spark-1", "pgrep -x prometheus || echo none").stdout.strip() == "none"
