"""A 4-ring of simulated Sparks from unaddressed cables (`sim up 4 --topology ring --no-fabric-addresses`), one
cluster for the file: `topology` finds every cable by discovery before anything changes, bootstrap gives each cable
its own subnets (a second run changes nothing), neighbours answer over each link, the comm env is the 4-ring's
(ring algorithm forced); then eugr's 4x-spark-cluster recipe, by file, renders and serves the tiny Llama with the
real CPU vLLM as TP 2 x PP 2, ranks along the ring, a completion answering. Also: a 3-ring cabled port 0 to port 0
is refused before any change, naming the re-cabling (its own small cluster, no vLLM)."""

from __future__ import annotations

import json
import subprocess

import pytest

from sparkcluster.serving.readiness import http
from tests.helpers import run_cli, ssh
from tests.integration.rings import (
    bootstrap,
    comm_env_is_the_rings,
    each_cable_its_own_subnets,
    eugr_clone,
    found_before_addressing,
    ipv4,
    node_logs,
    ready_to_serve,
    ring,
    topology,
    vllm_lines,
)
from tests.integration.test_serve_host_vllm import processes

pytestmark = [pytest.mark.sim, pytest.mark.slow]


@pytest.fixture(scope="module")
def ring4(tmp_path_factory):
    c = ring(4, "ring4")
    try:
        code, before = topology(c)  # unaddressed: discovery runs on IPv6 link-local alone
        first = bootstrap(c, tmp_path_factory.mktemp("cfg"))
        yield c, before, code, first, tmp_path_factory
    finally:
        c.down()


def test_topology_finds_every_cable_before_anything_is_addressed(ring4):
    c, before, code, _, _ = ring4
    found_before_addressing(c, code, before)


def test_bootstrap_gives_each_cable_its_own_subnets_then_changes_nothing(ring4):
    c, _, _, first, tmp = ring4
    each_cable_its_own_subnets(c, first, tmp.mktemp("cfg"))


def test_neighbours_answer_over_each_link_and_the_comm_env_is_the_rings(ring4):
    c, _, _, first, _ = ring4
    comm_env_is_the_rings(c, first)


def test_eugrs_4x_recipe_serves_tp2_x_pp2_along_the_ring(ring4, tmp_path):
    c = ring4[0]
    ready_to_serve(c)
    user = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    recipe = eugr_clone(tmp_path / "cache", tmp_path / "config") / "recipes" / "4x-spark-cluster" / "tiny-llama.yaml"

    def serve(*more: str) -> subprocess.CompletedProcess:
        return run_cli("serve", "-i", str(c.inventory_path), "--runtime", "host", "--launcher", "native",
                       "--no-verify", "--recipe", str(recipe), *more, env=user)

    check = serve("--check")
    assert check.returncode == 0, check.stderr
    assert "would serve local/tiny-llama (host, native)" in check.stdout, check.stdout
    assert check.stdout.count("--tensor-parallel-size 2 --pipeline-parallel-size 2") == 4, check.stdout
    result = serve("--ready-timeout", "400", "--json")
    try:
        assert result.returncode == 0, result.stderr[-2000:] + node_logs(c)
        head = c.host("spark-1").mgmt_ip
        code, text = http(f"http://{head}:8000/v1/completions",
                          {"model": "tiny-4x", "prompt": "Four nodes of", "max_tokens": 8, "temperature": 0},
                          timeout=60)
        assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 8, text
        # One rank per node, placed along the ring walked from the head (1-2-3-4): stage 0 is spark-1, spark-2;
        # stage 1 is spark-4, spark-3, so that each rank's peer in the other stage is cabled to it (1-4, 2-3),
        # never the missing diagonal. The mod ran on every node first.
        for rank, line in zip((0, 1, 3, 2), vllm_lines(c)):
            assert "--tensor-parallel-size 2" in line and "--pipeline-parallel-size 2" in line, line
            assert f"--node-rank {rank} " in line and "--nnodes 4" in line, line
        for host in c.topology.hosts:
            assert ssh(c, host.name, "cat ~/eugr-mod-ran").stdout.strip() == "stage ready"
    finally:
        down = run_cli("down", "-i", str(c.inventory_path), "--json", env=user)
    assert down.returncode == 0, down.stderr
    assert all("vllm serve" not in processes(c, h.name) for h in c.topology.hosts)


def test_a_ring_cabled_port_0_to_port_0_is_refused_before_any_change(tmp_path):
    c = ring(3, "ring00", miscable="port0-port0", vllm=False)
    try:
        code, doc = topology(c)
        assert code == 1 and doc["kind"] == "ring"
        out = bootstrap(c, tmp_path)
        assert out.returncode == 1
        assert "spark-1 port 0 to spark-2 port 0" in out.stdout
        assert "on spark-1, swap the two QSFP cables (port 0 <-> port 1)" in out.stdout
        assert all(ipv4(c, h.name) == {} for h in c.topology.hosts)  # nothing was addressed
    finally:
        c.down()
