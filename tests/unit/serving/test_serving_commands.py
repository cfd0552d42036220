"""The serving wing's commands as values: what each runtime runs on a node (start, alive, logs, stop), the start
commands of a whole cluster, and the rule that a fallback refuses to serve. No simulator: Commands compared as
data, exactly as the engine's steps are."""

from __future__ import annotations

import io
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from sparkcluster.engine.command import Command, exports
from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.nccl.verdict import Verdict, VerdictStatus
from sparkcluster.nccl.verifyresult import VerifyResult
from sparkcluster.serving import phases
from sparkcluster.serving.keptlog import container_output, file_output, keep_host_output, keep_output, logs_or_kept
from sparkcluster.nccl.tunerplugin import container_mount
from sparkcluster.serving.launch import Node, ServeArgs
from sparkcluster.serving.lifecycle import ray_commands, running_current, vllm_commands
from sparkcluster.serving.nodes import node_env
from sparkcluster.serving.phases import ServeOptions
from sparkcluster.serving.record import ServeRecord
from sparkcluster.serving.render import progress_printer
from sparkcluster.serving.runtime import (
    DockerRuntime,
    HostRuntime,
    NodeEnv,
    RuntimeChoice,
    ours,
    started_at,
    stop_all_serving,
)

STATE = '"$HOME"/.cache/sparkcluster/serve'
from sparkcluster.serving.status import logs_command
from sparkcluster.staging.images import ImageInfo

ENV = NodeEnv("~/.config/sparkcluster/comm.env", {"HF_HUB_OFFLINE": "1"})
NODES = {"spark-1": Node("spark-1", 0, "192.168.177.11", "192.168.177.11"),
         "spark-2": Node("spark-2", 1, "192.168.177.12", "192.168.177.11")}


def inventory(**vars: object) -> Inventory:
    hosts = (Host("spark-1", "10.0.0.1", role="head", vars=dict(vars)), Host("spark-2", "10.0.0.2", role="worker", vars=dict(vars)))
    return Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={})


def cluster(**vars: object) -> Session:
    return Session(inventory(**vars), transports={})  # command values need no connection


def test_docker_runtime_commands():
    docker = DockerRuntime("vllm-node")
    start = docker.start_main(["ray", "start", "--block"], ENV)
    assert start == Command(  # eugr's line, then the keeper of its output (test_serve_kept_log.py)
        "docker run -d --privileged --gpus all --rm --ipc=host --network host --name vllm_node "
        '--env-file "$HOME"/.config/sparkcluster/comm.env -e HF_HUB_OFFLINE=1 '
        '-v "${HF_HOME:-$HOME/.cache/huggingface}":/root/.cache/huggingface'
        + container_mount('"$HOME"/.config/sparkcluster/comm.env') + " vllm-node ray start --block && "
        + keep_output(container_output("vllm_node"), "main"))
    assert docker.start_vllm_on_main(["vllm", "serve", "m"], ENV) == Command(
        "docker exec -d vllm_node sh -c 'echo $$ > /tmp/sparkcluster-vllm.pid; "
        "exec vllm serve m >> /tmp/sparkcluster-vllm.log 2>&1' && "
        + keep_output(file_output("vllm_node", "/tmp/sparkcluster-vllm.log", "/tmp/sparkcluster-vllm.pid"), "vllm"))
    assert docker.run_in_env(["python3", "-c", "print(1)"], ENV) == Command("docker exec -i vllm_node python3 -c 'print(1)'")
    assert docker.logs("main", 50, follow=True) == Command(
        logs_or_kept("vllm_node", "main", 50, "docker logs --tail 50 -f vllm_node 2>&1"))
    assert docker.logs("vllm", 50, follow=False) == Command(
        logs_or_kept("vllm_node", "vllm", 50, "docker exec vllm_node tail -n 50 /tmp/sparkcluster-vllm.log 2>&1"))
    twin = docker.run_in_env(["python3", "-"], ENV, twin=True).script
    assert twin.startswith(f"if {docker.alive('main').script}; then docker exec -i vllm_node python3 -; else docker run --rm -i ")


def test_host_runtime_commands_source_the_comm_env_then_the_fixed_env():
    host = HostRuntime("/opt/venv")
    start = host.start_main(["ray", "start", "--block"], NodeEnv("~/c.env", {"B": "two words", "A": "1"}))
    assert start.script.splitlines() == [
        "umask 077",  # the log and the files beside it private (issue 46, F7): test_serve_kept_log.py
        'mkdir -p "$HOME"/.cache/sparkcluster/serve && chmod 700 "$HOME"/.cache/sparkcluster/serve || exit 1',
        "cd || exit 1",
        'set -a; . "$HOME"/c.env || exit 1; set +a',
        "export PATH=/opt/venv/bin:\"$PATH\" A=1 B='two words'",
        f'if {ours(STATE + "/main.pid")}; then '
        "echo 'already running' >&2; exit 3; fi",
        f"{keep_host_output('main')} || exit 1",
        'setsid nohup ray start --block > "$HOME"/.cache/sparkcluster/serve/main.fifo 2>&1 < /dev/null &',
        f"{started_at('$!')} > {STATE}/main.pid.start; echo $! > {STATE}/main.pid"]
    assert host.alive("vllm") == Command(ours(f"{STATE}/vllm.pid"))


def test_a_pid_file_names_the_process_started_not_one_that_took_its_number_after_a_reboot(tmp_path):
    """After a reboot the pid file outlives its process and its number may be another's: `alive` compares the start
    time it wrote (seen: the supervisor's restart of a node that came back found `already running`)."""
    pid_file = tmp_path / "main.pid"
    started = subprocess.run(["sh", "-c", f"sleep 30 & {started_at('$!')} > {pid_file}.start; echo $! > {pid_file}; "
                                          f"if {ours(str(pid_file))}; then echo ours; fi"], capture_output=True, text=True)
    assert started.stdout.strip() == "ours"
    pid_file.write_text(f"{os.getpid()}\n")  # a live process that is not the one started
    stale = subprocess.run(["sh", "-c", f"if {ours(str(pid_file))}; then echo ours; else echo stale; fi"],
                           capture_output=True, text=True)
    assert stale.stdout.strip() == "stale"


@pytest.mark.parametrize("name", ["A;touch /tmp/x;B", "1X", "A B", "", "A-B", "$(id)"])
def test_an_env_name_that_is_not_a_name_never_reaches_a_shell(name):
    with pytest.raises(ValueError, match="not an environment variable name"):
        HostRuntime("/opt/venv").start_main(["true"], NodeEnv("~/c.env", {name: "1"}))
    with pytest.raises(ValueError):
        Command("true", env={name: "1"}).line()
    assert exports({"GOOD_1": "x;y"}) == "GOOD_1='x;y'"


def test_runtime_choice_is_completed_by_the_image_check():
    chosen = RuntimeChoice("docker", "vllm-node")
    assert chosen.on(inventory().hosts[0]) == DockerRuntime("vllm-node", caches=True)
    checked = chosen.with_image(ImageInfo("sha256:abc", 10, ("/opt/nvidia/entrypoint.sh",)))
    assert checked.on(inventory().hosts[0]) == DockerRuntime("vllm-node", ("/opt/nvidia/entrypoint.sh",), caches=True)
    # A Ray started from another image is not reused: the check compares the container's image with the head's.
    assert running_current(checked, inventory().hosts[0]).script.endswith(
        "test \"$(docker inspect -f '{{.Image}}' vllm_node)\" = sha256:abc")
    assert running_current(chosen, inventory().hosts[0]) == replace(chosen.on(inventory().hosts[0]).alive("main"),
                                                                    timeout=30)


def test_the_host_runtime_needs_a_python_env_to_start():
    with pytest.raises(SparkclusterError, match="spark-1: the host runtime needs `python_env`"):
        RuntimeChoice("host").on(inventory().hosts[0]).start_main(["ray", "start"], ENV)
    assert RuntimeChoice("host").on(inventory(python_env="/v").hosts[0]) == HostRuntime("/v", caches=True)


def test_cluster_start_commands_give_each_node_its_own_address_and_env():
    c = cluster(serve_env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    runtime = RuntimeChoice("docker", "vllm-node")
    ray = ray_commands(c, runtime, NODES, {"RECIPE": "1"})
    assert list(ray) == ["spark-1", "spark-2"]
    kept = f" && {keep_output(container_output('vllm_node'), 'main')}"  # after eugr's line, the keeper of its output
    assert ray["spark-1"].script.endswith("vllm-node ray start --block --head --port 6379 --node-ip-address "
                                          "192.168.177.11 --include-dashboard=True --dashboard-host 127.0.0.1 "
                                          "--dashboard-port 8265 --disable-usage-stats" + kept)
    assert ray["spark-2"].script.endswith("ray start --block --address=192.168.177.11:6379 --node-ip-address "
                                          "192.168.177.12" + kept)
    assert "-e HF_HUB_OFFLINE=1 -e RECIPE=1 -e VLLM_CPU_KVCACHE_SPACE=1" in ray["spark-2"].script
    args = ServeArgs("org/m", 2, served_name="m")
    assert list(vllm_commands(c, runtime, NODES, "ray", args)) == ["spark-1"]  # Ray places the workers
    native = vllm_commands(c, runtime, NODES, "native", args)
    assert "--node-rank 1 --master-addr 192.168.177.11 --master-port 29501 --headless" in native["spark-2"].script


def test_node_env_layers_inventory_then_host_then_recipe():
    inv = Inventory(path=Path("i.yml"), name="t", vars={"serve_env": {"A": "all", "B": "all"}},
                    hosts=(Host("h", "10.0.0.1", role="head", vars={"serve_env": {"B": "host", "C": "host"}}),))
    env = node_env(inv, inv.hosts[0], {"C": "recipe"})
    assert env == NodeEnv("~/.config/sparkcluster/comm.env",
                          {"HF_HUB_OFFLINE": "1", "A": "all", "B": "host", "C": "recipe"})


def test_logs_commands():
    runtime, (head, worker) = RuntimeChoice("docker"), inventory().hosts
    shown = logs_command(ServeRecord("docker", "ray", "vllm-node", ()), runtime, head, head, 20, follow=False)
    main = logs_or_kept("vllm_node", "main", 20, "docker logs --tail 20 vllm_node 2>&1")
    vllm = logs_or_kept("vllm_node", "vllm", 20, "docker exec vllm_node tail -n 20 /tmp/sparkcluster-vllm.log 2>&1")
    assert shown == Command(f"echo '== main =='; {main}; echo '== vllm =='; {vllm}", timeout=60)
    followed = logs_command(ServeRecord("docker", "native", "vllm-node", ()), runtime, worker, head, 20, follow=True)
    assert followed == Command(f"{logs_or_kept('vllm_node', 'main', 20, 'docker logs --tail 20 -f vllm_node 2>&1')}; wait",
                               timeout=60)


def test_stop_all_serving_stops_both_runtimes():
    script = stop_all_serving(inventory(python_env="/v").hosts[0]).script
    assert script.startswith("if command -v docker >/dev/null 2>&1; then if docker inspect vllm_router")
    assert "if docker inspect vllm_node" in script
    # the router in front of replicas first (issue 40), then vLLM, then what it runs on
    assert "for r in router vllm main; do" in script and "/v/bin/ray stop --force" in script
    # vLLM is stopped inside the container before the container: Ray, its main process, drains on SIGTERM while vLLM
    # holds its workers, and `docker stop` alone waited out the whole grace
    assert script.index("docker exec vllm_node sh -c 'p=$(cat /tmp/sparkcluster-vllm.pid") < script.index("docker stop")


def _verdict(status: str) -> VerifyResult:
    return VerifyResult("gloo", Verdict(VerdictStatus(status), "traffic on enP7s7", "bind to the QSFP interface", (), ("tcp",), False), [])


def test_a_fallback_refuses_to_serve_unless_allowed(monkeypatch):
    monkeypatch.setattr(phases, "run_verify", lambda *a, **k: _verdict("FAIL"))
    said = io.StringIO()
    say = progress_printer(Console(file=said, width=200))
    with pytest.raises(SparkclusterError, match="refusing to serve: the NCCL probe found a fallback: traffic on enP7s7"):
        phases.probe(cluster(), RuntimeChoice("docker"), ServeOptions(), say)
    assert said.getvalue().splitlines() == ["  probe (gloo): FAIL traffic on enP7s7"]
    allowed = phases.probe(cluster(), RuntimeChoice("docker"), ServeOptions(allow_fallback=True), say)
    assert allowed.verdict.status == "FAIL"
    monkeypatch.setattr(phases, "run_verify", lambda *a, **k: _verdict("PASS"))
    assert phases.probe(cluster(), RuntimeChoice("docker"), ServeOptions(), say).verdict.status == "PASS"


def test_the_probe_runs_where_vllm_will_run(monkeypatch):
    seen = {}

    def fake_verify(session, *, min_busbw, in_serving_env):
        seen.update({name: make(["python3", "-"]) for name, make in in_serving_env.items()})
        return _verdict("PASS")
    monkeypatch.setattr(phases, "run_verify", fake_verify)
    phases.probe(cluster(python_env="/v"), RuntimeChoice("host"), ServeOptions(), lambda event: None)
    assert seen["spark-2"].script.endswith("exec python3 -")
    assert 'export PATH=/v/bin:"$PATH" HF_HUB_OFFLINE=1' in seen["spark-2"].script


def test_the_probe_commands_are_values_one_rank_per_node():
    from sparkcluster.nccl.proberun import probe_commands
    session = cluster(python="/usr/bin/python3")
    env_files = {"spark-1": ".config/sparkcluster/comm.env", "spark-2": "/etc/sparkcluster/comm.env"}
    commands = probe_commands(session, "192.168.177.11", "gloo", "1M", env_files, "SCRIPT", 600, None)
    rank = ("--world 2 --master-addr 192.168.177.11 --master-port 29577 --backend gloo --timeout 60 --sizes 1M 2>&1")
    assert commands == {
        "spark-1": Command("cd; set -a; . ./.config/sparkcluster/comm.env || exit 1; set +a; NCCL_DEBUG=INFO; "
                           f"export NCCL_DEBUG; exec /usr/bin/python3 -c SCRIPT --rank 0 {rank}", timeout=660),
        "spark-2": Command("cd; set -a; . /etc/sparkcluster/comm.env || exit 1; set +a; NCCL_DEBUG=INFO; "
                           f"export NCCL_DEBUG; exec /usr/bin/python3 -c SCRIPT --rank 1 {rank}", timeout=660)}
    in_env = probe_commands(session, "192.168.177.11", "nccl", None, env_files, "SCRIPT", 600,
                            {n: (lambda argv: Command(" ".join(argv))) for n in env_files})
    assert in_env["spark-2"] == Command("env NCCL_DEBUG=INFO python3 - --rank 1 --world 2 --master-addr 192.168.177.11 "
                                        "--master-port 29577 --backend nccl --timeout 60 2>&1", stdin="SCRIPT",
                                        timeout=660)
