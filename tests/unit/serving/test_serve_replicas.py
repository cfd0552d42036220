"""Issue 40, replicas: the layout value, its placement along the fabric and the refusals before anything connects."""

from __future__ import annotations

import io
import json
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from sparkcluster import cli
from sparkcluster.bench.ceiling import effective_nodes
from sparkcluster.bench.target import from_record
from sparkcluster.engine.command import Command
from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.engine.inventory import Host, Inventory, load_inventory
from sparkcluster.engine.session import Session
from sparkcluster.recipes.load import load_recipe
from sparkcluster.recipes.types import Recipe
from sparkcluster.serving.fit import check_fit, parse_weights
from sparkcluster.serving.keptlog import container_output, keep_output, logs_or_kept
from sparkcluster.serving.launch import Node, ServeArgs
from sparkcluster.serving.layout import Layout, LayoutAsk, Placement
from sparkcluster.serving.parallel import size_layout
from sparkcluster.serving.phases import ServeResult
from sparkcluster.serving.record import ServeRecord, Serving
from sparkcluster.serving.render import serving, status_table
from sparkcluster.serving.router import replica_commands, replica_nodes, router_command
from sparkcluster.serving.runtime import DockerRuntime, HostRuntime, NodeEnv, RuntimeChoice, ours, started_at
from sparkcluster.serving.status import (
    ClusterStatus,
    NodeStatus,
    ProcessState,
    ReplicaStatus,
    ServerStatus,
    behind_router,
    node_roles,
    replica_status,
)
from tests.support.metrics import CAPTURES, busier, metrics_server


def _inventory(tmp_path: Path, count: int):
    hosts = "".join(f"  spark-{i}: {{address: 192.168.1.{10 + i}, role: {'head' if i == 1 else 'worker'}}}\n"
                    for i in range(1, count + 1))
    (tmp_path / "inv.yml").write_text(f"name: t\nvars: {{user: spark}}\nhosts:\n{hosts}")
    return load_inventory(tmp_path / "inv.yml")


def test_a_single_engine_is_the_layout_with_one_replica():
    one = Layout(1, 2, 1)
    assert (one.nodes, one.routed, one.name) == (2, False, "tp2")
    assert one.place(["a", "b"], 8000) == (Placement(0, ("a", "b"), 8000),)
    assert Layout(1, 1, 2).name == "tp1pp2"


def test_replicas_take_consecutive_nodes_of_the_cable_order_and_ports_beside_the_router():
    # A 4-ring walked a-b-c-d: two replicas of TP 2 are a-b and c-d, each pair cabled; the router keeps 8000.
    layout = Layout(2, 2, 1)
    assert (layout.nodes, layout.routed, layout.name) == (4, True, "2x tp2")
    assert layout.place(["a", "b", "c", "d"], 8000) == (Placement(0, ("a", "b"), 8001),
                                                        Placement(1, ("c", "d"), 8002))
    assert [p.head for p in Layout(2).place(["spark-1", "spark-2"], 9000)] == ["spark-1", "spark-2"]
    with pytest.raises(ValueError):
        layout.place(["a", "b"], 8000)


def test_a_layout_round_trips_through_json_and_names_the_kinds_bench_measures():
    layout = Layout(2, 1, 2)
    assert layout.to_json() == {"name": "2x tp1pp2", "replicas": 2, "tp": 1, "pp": 2}
    assert Layout.from_json(layout.to_json()) == layout
    assert Layout.from_json({"tp": 2}) == Layout(1, 2, 1)  # a record without replicas ran one engine
    assert [Layout.of_kind(k, 2) for k in ("tp", "pp", "replicas")] == [Layout(1, 2, 1), Layout(1, 1, 2), Layout(2)]


def test_choose_layout_fills_tp_from_a_replicas_share_of_the_nodes(tmp_path):
    four, plain = _inventory(tmp_path, 4), Recipe("plain")
    assert size_layout(LayoutAsk(2), four, plain) == Layout(2, 2, 1)
    assert size_layout(LayoutAsk(4), four, plain) == Layout(4, 1, 1)
    assert size_layout(LayoutAsk(2, pp=2), four, plain) == Layout(2, 1, 2)


@pytest.mark.parametrize("replicas, tp, match, fix", [
    (3, None, "3 replicas on 4 nodes", "a divisor of 4 (1, 2, 4)"),
    (2, 1, r"2 replicas of TP 1 x PP 1 take 2 nodes, and the selection has 4", "product is 2"),
    (0, None, "--replicas 0: needs at least 1", "N >= 1"),
])
def test_a_layout_that_does_not_divide_the_nodes_is_refused(tmp_path, replicas, tp, match, fix):
    with pytest.raises(UsageError, match=match) as e:
        size_layout(LayoutAsk(replicas, tp), _inventory(tmp_path, 4), Recipe("plain"))
    assert fix in e.value.fix and e.value.exit_code == 2


def test_check_layout_keeps_one_engines_rules_and_applies_a_recipes_bounds_per_replica(tmp_path):
    two = _inventory(tmp_path, 2)
    assert size_layout(LayoutAsk(), two, Recipe("plain")) == Layout(1, 2, 1)
    assert size_layout(LayoutAsk(2), two, Recipe("plain")) == Layout(2, 1, 1)
    solo = Recipe("s", max_nodes=1)  # eugr's solo_only
    assert size_layout(LayoutAsk(2), two, solo) == Layout(2, 1, 1)  # one engine per Spark: what solo_only asks
    cluster = Recipe("c", min_nodes=2)  # eugr's cluster_only: too large for one Spark
    with pytest.raises(UsageError, match="at least 2 nodes per engine"):
        size_layout(LayoutAsk(2), two, cluster)


def test_the_record_keeps_each_replica_and_reads_an_older_one_as_one_engine():
    serving = Serving("org/m", "m", 8000, "http://10.0.0.1:8000/v1", 1,
                      replicas=(Placement(0, ("spark-1",), 8001), Placement(1, ("spark-2",), 8002)))
    record = ServeRecord("host", "native", "vllm-node", ("spark-1", "spark-2"), serving)
    doc = json.loads(json.dumps(record.to_json()))
    assert doc["version"] == 4
    assert doc["serving"]["replicas"] == [{"index": 0, "nodes": ["spark-1"], "port": 8001},
                                          {"index": 1, "nodes": ["spark-2"], "port": 8002}]
    assert ServeRecord.from_json(doc) == record and serving.layout == Layout(2, 1, 1)
    del doc["serving"]["replicas"]
    old = ServeRecord.from_json({**doc, "version": 2})
    assert old.serving is not None and old.serving.replicas == () and old.serving.layout == Layout(1, 1, 1)


# --- the replicas' and the router's command lines, as values (no connection) ---

ENV = NodeEnv("~/.config/sparkcluster/comm.env", {"HF_HUB_OFFLINE": "1"})
NODES = {"spark-1": Node("spark-1", 0, "10.77.0.11", "10.77.0.11"),
         "spark-2": Node("spark-2", 1, "10.77.0.12", "10.77.0.11")}


def _cluster(**vars: object) -> Session:
    hosts = (Host("spark-1", "192.168.1.11", role="head", vars=dict(vars)),
             Host("spark-2", "192.168.1.12", role="worker", vars=dict(vars)))
    return Session(Inventory(Path("inv.yml"), "t", hosts, {}), transports={})


def test_each_replica_is_its_own_engine_on_its_port_and_the_router_fronts_them_on_the_head():
    session = _cluster(python_env="/v")
    runtime = RuntimeChoice("host", caches=False)
    placements = Layout(2).place(list(NODES), 8000)
    args = ServeArgs("org/m", tp=1, port=8000, served_name="m", flags=("--max-model-len", "512"))
    commands = replica_commands(session, runtime, NODES, placements, args)
    # vLLM alone on each node (no Ray, no --nnodes: a replica of one node), each on its loopback behind the key guard
    # at its own port (issue 46, F1: vLLM's /invocations needs no key)
    assert ("vllm serve org/m --tensor-parallel-size 1 --host 127.0.0.1 --port 28001 --served-model-name m "
            "--max-model-len 512 > \"$HOME\"/.cache/sparkcluster/serve/main.fifo") in commands["spark-1"].script
    assert " --listen 0.0.0.0:8001 --upstream 28001 -- vllm serve" in commands["spark-1"].script
    assert "--port 28002" in commands["spark-2"].script and "--distributed-executor-backend" not in commands["spark-2"].script
    router = router_command(session, runtime, NODES, placements, args)
    assert list(router) == ["spark-1"]  # on the head only, at the endpoint's port, reaching replicas on the fabric
    assert (" --listen 0.0.0.0:8000 --upstream 28000 -- vllm-router --host 127.0.0.1 --port 28000 --worker-urls "
            "http://10.77.0.11:8001 http://10.77.0.12:8002 --policy round_robin --health-check-interval-secs 5 "
            "--health-failure-threshold 2 --worker-startup-check-interval 1 > \"$HOME\"/.cache/sparkcluster/serve/"
            "router.fifo") in router["spark-1"].script


def test_replicas_of_two_nodes_rank_inside_each_replica():
    nodes = {n: Node(n, i, f"10.0.0.{i + 1}", "10.0.0.1") for i, n in enumerate(["a", "b", "c", "d"])}
    second = replica_nodes(nodes, Layout(2, 2).place(list(nodes), 8000)[1])
    assert second == {"c": Node("c", 0, "10.0.0.3", "10.0.0.3"), "d": Node("d", 1, "10.0.0.4", "10.0.0.3")}


def test_the_router_is_a_process_each_runtime_starts_watches_and_stops_like_vllm():
    host = HostRuntime("/v")
    assert host.start_router(["vllm-router", "--port", "8000"], ENV).script.endswith(
        "setsid nohup vllm-router --port 8000 > \"$HOME\"/.cache/sparkcluster/serve/router.fifo 2>&1 < /dev/null &\n"
        f"{started_at('$!')} > \"$HOME\"/.cache/sparkcluster/serve/router.pid.start; "
        "echo $! > \"$HOME\"/.cache/sparkcluster/serve/router.pid")
    assert host.alive("router") == Command(ours("\"$HOME\"/.cache/sparkcluster/serve/router.pid"))
    assert "for r in router vllm main; do" in host.stop_all().script
    docker = DockerRuntime("vllm-node", entrypoint=("vllm", "serve"))
    # an image whose entrypoint is `vllm serve` gets the router's own as entrypoint
    assert docker.start_router(["vllm-router", "--port", "8000"], ENV) == Command(
        "docker run -d --rm --network host --name vllm_router --entrypoint vllm-router vllm-node --port 8000 && "
        + keep_output(container_output("vllm_router"), "router"))  # the keeper of its output: test_serve_kept_log.py
    assert docker.alive("router").script == "test \"$(docker inspect -f '{{.State.Running}}' vllm_router 2>/dev/null)\" = true"
    assert docker.logs("router", 20, follow=False) == Command(
        logs_or_kept("vllm_router", "router", 20, "docker logs --tail 20 vllm_router 2>&1"))
    assert docker.stop_all().script.startswith("if docker inspect vllm_router >/dev/null 2>&1; then docker rm -f vllm_router")


# --- a model that does not fit a replica ---

def test_weights_come_from_the_index_else_the_files():
    assert parse_weights('{"metadata": {"total_size": 240000000000}}\n@@files@@\n9\n') == 240_000_000_000
    assert parse_weights("\n@@files@@\n6800000\n") == 6_800_000
    assert parse_weights("\n@@files@@\n0\n") is None


def test_a_model_that_does_not_fit_a_replica_is_refused_with_the_nodes_it_needs():
    # gpt-oss-120b-like bf16 weights, 240 GB: a replica of one Spark gives vLLM 128 GB x 0.9 = 115.2 GB.
    with pytest.raises(UsageError) as e:
        check_fit("org/big", 240_000_000_000, Layout(2), ())
    assert e.value.exit_code == 2
    assert "240.0 GB" in e.value.message and "1 node(s): 115.2 GB for vLLM" in e.value.message
    assert "at least 3 nodes" in e.value.fix
    check_fit("org/big", 240_000_000_000, Layout(1, 3), ())  # TP 3 holds it
    with pytest.raises(UsageError, match="gpu-memory-utilization 0.5"):
        check_fit("org/m", 70_000_000_000, Layout(2), ("--gpu-memory-utilization", "0.5"))
    check_fit("org/m", None, Layout(2), ())  # unknown size: vLLM's own check stands


# --- status: the router and each replica ---

def test_status_names_a_replica_whose_vllm_stopped_and_is_not_healthy():
    placements = Layout(2).place(["spark-1", "spark-2"], 8000)
    up = ReplicaStatus(placements[0], "http://192.168.1.11:8001/v1", 200)
    down = ReplicaStatus(placements[1], "http://192.168.1.12:8002/v1", 0, ("spark-2",))
    assert up.healthy and not down.healthy
    assert down.to_json() == {"index": 1, "nodes": ["spark-2"], "endpoint": "http://192.168.1.12:8002/v1",
                              "health": 0, "healthy": False, "down": ["spark-2"], "figures": None}
    record = ServeRecord("host", "native", "vllm-node", ("spark-1", "spark-2"),
                         Serving("org/m", "m", 8000, "http://192.168.1.11:8000/v1", 1, replicas=placements))
    server = ServerStatus("http://192.168.1.11:8000/v1", "org/m", "m", 503, ("m",))
    state = ClusterStatus(record, {"spark-1": NodeStatus(processes={"main": ProcessState.RUNNING,
                                                                     "router": ProcessState.RUNNING}),
                                   "spark-2": NodeStatus(processes={"main": ProcessState.STOPPED})},
                          server=server, replicas=(up, down))
    assert not state.healthy and [r["nodes"] for r in state.to_json()["replicas"]] == [["spark-1"], ["spark-2"]]
    out = io.StringIO()
    status_table(Console(file=out, width=200), state)
    text = out.getvalue()
    assert "router answering, a replica out of rotation (HTTP 503)" in text
    assert "replica 1 on spark-2 at http://192.168.1.12:8002/v1: down: vLLM not running on spark-2" in text
    assert "spark-1" in text and "router running" in text


def test_node_roles_add_the_router_on_the_head_of_a_replicated_serve():
    replicated = Serving("m", "m", 8000, "e", 1, replicas=Layout(2).place(["a", "b"], 8000))
    assert node_roles(replicated, "native", True) == ["main", "router"]
    assert node_roles(replicated, "native", False) == ["main"]
    assert node_roles(Serving("m", "m", 8000, "e", 2), "ray", True) == ["main", "vllm"]


# --- refused before anything connects (exit 2) ---

@pytest.mark.parametrize("extra, inventory_vars, message", [
    (["--replicas", "3"], "", "3 replicas on 2 nodes"),
    (["--replicas", "2", "--launcher", "ray"], "", "--launcher ray with 2 replicas of TP 1 x PP 1"),
    (["--replicas", "2", "--tp", "2"], "", "2 replicas of TP 2 x PP 1 take 4 nodes"),
    ([], ", replicas: 3", "3 replicas on 2 nodes"),  # the inventory asks for replicas too
])
def test_serve_refuses_replicas_the_nodes_cannot_hold_before_connecting(tmp_path, monkeypatch, capsys, no_connection,
                                                                       extra, inventory_vars, message):
    inv = tmp_path / "inv.yml"
    inv.write_text(f"name: t\nvars: {{user: spark, python_env: /v{inventory_vars}}}\nhosts:\n"
                   "  spark-1: {address: 10.0.0.1, role: head}\n  spark-2: {address: 10.0.0.2, role: worker}\n")
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["serve", "-i", str(inv), "--runtime", "host", "--model", "org/m", *extra])
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_USAGE and message in err, err


def test_a_recipe_asks_for_replicas(tmp_path):
    path = tmp_path / "r.yml"
    path.write_text("model: org/m\nreplicas: 2\nflags: {--max-model-len: 512}\n")
    assert load_recipe(str(path)).replicas == 2
    path.write_text("model: org/m\nreplicas: 0\n")
    with pytest.raises(UsageError, match=r"r.yml:2: replicas 0 is not a number of engines"):
        load_recipe(str(path))


def test_serve_says_it_serves_replicas_behind_the_router_and_where_each_is():
    result = ServeResult("http://10.0.0.1:8000/v1", "org/m", "m", "host", "native", [], {"router": 1.0},
                         replicas=list(Layout(2).place(["spark-1", "spark-2"], 8000)))
    out = io.StringIO()
    serving(Console(file=out, width=200), result)
    text = out.getvalue()
    assert "serving m with 2 replicas behind vLLM's router (host, native) at http://10.0.0.1:8000/v1" in text
    assert "replica 0 on spark-1, port 8001" in text and "replica 1 on spark-2, port 8002" in text


def test_bench_reads_the_replicas_and_takes_one_replicas_nodes_for_a_streams_ceiling():
    placements = Layout(2).place(["spark-1", "spark-2"], 8000)
    record = ServeRecord("host", "native", "vllm-node", ("spark-1", "spark-2"),
                         Serving("org/m", "m", 8000, "http://10.0.0.1:8000/v1", 1, replicas=placements))
    config = from_record(record, None).config
    assert config["replicas"] == 2 and config["endpoint"] == "http://10.0.0.1:8000/v1"  # bench measures the router
    assert effective_nodes(config) == 1  # a stream decodes on one replica's single node, not on both
    assert effective_nodes({"nodes": ["a", "b"], "tp": 2, "pp": 1, "replicas": 1}) == 2


def test_status_reads_each_replicas_own_metrics_and_sums_them_for_the_endpoint():
    # Failed before: the endpoint's figures came from the router's /metrics, which vllm-router hands to one replica
    # in turn: two scrapes a second apart could read two engines' counters, and no replica had figures of its own.
    placements = Layout(2).place(["spark-1", "spark-2"], 8000)
    with metrics_server(CAPTURES) as (one, _), metrics_server([busier(c) for c in CAPTURES]) as (two, _):
        replicas = tuple(replica_status(replace(p, port=int(url.rsplit(":", 1)[1].split("/")[0])), "127.0.0.1", {})
                         for p, url in zip(placements, (one, two)))
    assert [r.health for r in replicas] == [200, 200] and all(r.figures is not None for r in replicas)
    assert [r.to_json()["figures"]["running"] for r in replicas] == [8.0, 3.0]
    server = ServerStatus("http://192.168.1.11:8000/v1", "org/m", "m", 200, ("m",))
    total = behind_router(server, replicas).figures
    assert total is not None and (total.running, total.waiting, total.preemptions) == (11.0, 2.0, 4.0)
    assert total.itl_p50_s is None  # a sum of quantiles is none
    out = io.StringIO()
    status_table(Console(file=out, width=300), ClusterStatus(None, {}, server=server, replicas=replicas))
    assert out.getvalue().count("    running ") == 2, out.getvalue()  # each replica's own line
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    gone = replica_status(replace(placements[1], port=free), "127.0.0.1", {})  # nothing listens there
    assert gone.health == 0 and gone.figures is None and behind_router(server, (gone,)) == server
