"""A Docker serve's container output kept on the node after `--rm` removed the container (serving/keptlog.py): the
commands as values, and the keeper's shell run for real on this machine against a stand-in `docker` (its bound, its
detachment, its stop, vLLM's file beside Ray, and the `logs` fallback and root cause that read it)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result
from sparkcluster.serving.keptlog import (
    GONE_NOTICE,
    container_output,
    file_output,
    keep_host_output,
    keep_output,
    logs_or_kept,
    output_fifo,
    stop_keeper,
)
from sparkcluster.nccl.tunerplugin import container_mount
from sparkcluster.serving.launch import docker_run_line
from sparkcluster.serving.lifecycle import diagnosis
from sparkcluster.serving.record import ServeRecord, write_record
from sparkcluster.serving.runtime import DockerRuntime, HostRuntime, NodeEnv, RuntimeChoice

ENV = NodeEnv("~/.config/sparkcluster/comm.env", {"HF_HUB_OFFLINE": "1"})
EUGR = ("docker run -d --privileged --gpus all --rm --ipc=host --network host --name vllm_node "
        '--env-file "$HOME"/.config/sparkcluster/comm.env -e HF_HUB_OFFLINE=1 '
        '-v "${HF_HOME:-$HOME/.cache/huggingface}":/root/.cache/huggingface vllm-node ray start --block')
# `docker logs -f` of a container that printed 1..LINES and is gone (with KEEP_RUNNING, one that goes on); `docker
# logs --tail` and `docker inspect` of a container that is gone.
FAKE_DOCKER = """#!/bin/sh
case "$1" in
  logs) [ "$2" = --tail ] && { echo "Error response from daemon: No such container: $4" >&2; exit 1; }
        seq 1 "$LINES"; [ -n "$KEEP_RUNNING" ] && exec sleep 600; exit 0 ;;
  inspect) echo "Error: No such object: $2" >&2; exit 1 ;;
  exec) shift 2; exec "$@" ;;  # in the container: here
esac
exit 3
"""


def expanded(word: str, home: Path) -> str:
    """What the node's shell makes of one word of a command line, under HOME=home."""
    return subprocess.run(["sh", "-c", f'printf "%s" "{word}"'], env={"HOME": str(home), "PATH": os.environ["PATH"]},
                          capture_output=True, text=True, check=True).stdout


def test_the_container_starts_with_eugrs_exact_line_then_its_keeper(tmp_path):
    start = DockerRuntime("vllm-node").start_main(["ray", "start", "--block"], ENV).script
    mount = container_mount('"$HOME"/.config/sparkcluster/comm.env')
    hf = ":/root/.cache/huggingface"
    assert start == f"{EUGR.replace(hf, hf + mount)} && {keep_output(container_output('vllm_node'), 'main')}"
    # On a node whose comm env names no tuner plugin (verify --tune's choice per size), that word is empty: the
    # line the node runs is eugr's exactly. Where it names one, the plugin's folder is mounted at its own path.
    env = tmp_path / ".config" / "sparkcluster" / "comm.env"
    env.parent.mkdir(parents=True)
    env.write_text("NCCL_SOCKET_IFNAME=enp1s0f0np0\n")
    assert expanded(mount, tmp_path) == ""
    env.write_text(f"NCCL_SOCKET_IFNAME=enp1s0f0np0\nNCCL_TUNER_PLUGIN={tmp_path}/x.so\n")
    folder = f"{tmp_path}/.config/sparkcluster/nccl-tuner"
    assert expanded(mount, tmp_path) == f" -v {folder}:{folder}:ro"
    assert start.startswith(docker_run_line("vllm-node", '"$HOME"/.config/sparkcluster/comm.env',
                                            ["ray", "start", "--block"], env={"HF_HUB_OFFLINE": "1"}) + " && ")
    router = DockerRuntime("vllm-node").start_router(["vllm-router", "--port", "8000"], ENV).script
    assert router == ("docker run -d --rm --network host --name vllm_router vllm-node vllm-router --port 8000 && "
                      + keep_output(container_output("vllm_router"), "router"))


def test_the_keeper_is_private_detached_bounded_and_writes_where_the_host_runtime_does():
    keeper = keep_output(container_output("vllm_node"), "main")
    assert keeper == (
        'umask 077 && mkdir -p "$HOME"/.cache/sparkcluster/serve && chmod 700 "$HOME"/.cache/sparkcluster/serve && '
        '{ k=$(cat "$HOME"/.cache/sparkcluster/serve/main.keeper.pid '
        '2>/dev/null); if [ -n "$k" ]; then if ps -ww -o args= -p "$k" 2>/dev/null | grep -qF '
        "'sparkcluster/serve/main.log'; then kill -- -\"$k\" 2>/dev/null; fi; fi; "
        'rm -f "$HOME"/.cache/sparkcluster/serve/main.keeper.pid; rm -f "$HOME"/.cache/sparkcluster/serve/main.log '
        '"$HOME"/.cache/sparkcluster/serve/main.log.1; '
        ': > "$HOME"/.cache/sparkcluster/serve/main.log; setsid nohup sh -c \'docker logs -f vllm_node 2>&1 | '
        "SHELL=/bin/sh split -a 12 -b 8388608 --filter '\"'\"'if [ -s \"$HOME\"/.cache/sparkcluster/serve/main.log ]; "
        'then mv -f "$HOME"/.cache/sparkcluster/serve/main.log "$HOME"/.cache/sparkcluster/serve/main.log.1; fi; '
        "exec cat > \"$HOME\"/.cache/sparkcluster/serve/main.log'\"'\"'' > /dev/null 2>&1 < /dev/null & "
        'echo $! > "$HOME"/.cache/sparkcluster/serve/main.keeper.pid; }')
    # The host runtime's log of the same role is the same file, read with the chunk before it; its keeper's pid file
    # is not the containers' keepers' (down stops those first, while a host process still writes into its own).
    assert HostRuntime("/v").logs("main", 5, False).script == (
        'if [ -e "$HOME"/.cache/sparkcluster/serve/main.log.1 ]; then cat "$HOME"/.cache/sparkcluster/serve/main.log.1 '
        '"$HOME"/.cache/sparkcluster/serve/main.log 2>/dev/null | tail -n 5; '
        'else tail -n 5 "$HOME"/.cache/sparkcluster/serve/main.log 2>&1; fi')
    assert "main.keeper.pid" not in HostRuntime("/v").stop_all().script
    assert "main.host-keeper.pid" not in DockerRuntime("vllm-node").stop_all().script


def test_logs_read_the_container_while_it_exists_else_the_kept_log_saying_so():
    assert DockerRuntime("vllm-node").logs("main", 20, follow=True).script == (
        'if ! docker inspect vllm_node >/dev/null 2>&1 && [ -e "$HOME"/.cache/sparkcluster/serve/main.log ]; then '
        "echo 'the container is gone; its last output, kept by sparkcluster:'; "
        'cat "$HOME"/.cache/sparkcluster/serve/main.log.1 "$HOME"/.cache/sparkcluster/serve/main.log 2>/dev/null '
        "| tail -n 20; else docker logs --tail 20 -f vllm_node 2>&1; fi")
    assert DockerRuntime("vllm-node").logs("router", 5, follow=False).script == logs_or_kept(
        "vllm_router", "router", 5, "docker logs --tail 5 vllm_router 2>&1")
    assert DockerRuntime("vllm-node").logs("vllm", 5, follow=False).script == logs_or_kept(
        "vllm_node", "vllm", 5, "docker exec vllm_node tail -n 5 /tmp/sparkcluster-vllm.log 2>&1")


def test_down_lets_each_keeper_finish_then_stops_it():
    script = DockerRuntime("vllm-node").stop_all().script
    assert script.index("echo container; fi") < script.index("main.keeper.pid") < script.index("router.keeper.pid")
    assert stop_keeper("main", 5) in script and stop_keeper("router", 5) in script


def _node(tmp_path: Path, lines: int, keep_running: bool = False) -> dict[str, str]:
    """The environment of a node whose `docker` is the stand-in, with its home in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "docker").write_text(FAKE_DOCKER)
    (bin_dir / "docker").chmod(0o755)
    env = {"HOME": str(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}", "LINES": str(lines)}
    return env | ({"KEEP_RUNNING": "1"} if keep_running else {})


def _sh(script: str, env: dict[str, str]) -> str:
    return subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True, text=True,
                          timeout=30).stdout


def _keeper(tmp_path: Path, role: str = "main") -> int:
    return int((tmp_path / ".cache/sparkcluster/serve" / f"{role}.keeper.pid").read_text())


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie has ended: this machine's init may be slow to reap what it adopts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _ended(pid: int, within_s: float = 20) -> bool:
    deadline = time.monotonic() + within_s
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def test_the_kept_log_holds_the_containers_last_output_within_its_bound(tmp_path):
    env, chunk = _node(tmp_path, 50_000), 4096
    _sh(keep_output(container_output("vllm_node"), "main", chunk_bytes=chunk), env)  # returns at once: the keeper runs detached
    pid = _keeper(tmp_path)
    assert _ended(pid), "the keeper did not end with the container's output"
    kept = tmp_path / ".cache/sparkcluster/serve"
    log, older = kept / "main.log", kept / "main.log.1"
    assert older.stat().st_size == chunk and 0 < log.stat().st_size <= chunk  # 288,894 bytes came: two chunks stay
    assert _mode(kept) == 0o700 and _mode(log) == _mode(older) == 0o600  # K1: private
    assert (older.read_text() + log.read_text()).splitlines()[-1] == "50000"
    shown = _sh(DockerRuntime("vllm-node").logs("main", 3, follow=False).script, env)
    assert shown == f"{GONE_NOTICE}\n49998\n49999\n50000\n"


def test_a_new_keeper_replaces_the_last_serves_log_and_down_stops_one_that_does_not_end(tmp_path):
    env = _node(tmp_path, 5)
    _sh(keep_output(container_output("vllm_node"), "main", chunk_bytes=4096), env)
    assert _ended(_keeper(tmp_path))
    env = _node(tmp_path, 2, keep_running=True)
    _sh(keep_output(container_output("vllm_node"), "main", chunk_bytes=4096), env)
    pid = _keeper(tmp_path)
    assert int(subprocess.run(["ps", "-o", "sid=", "-p", str(pid)], capture_output=True, text=True).stdout) == pid
    time.sleep(0.3)
    assert _sh(DockerRuntime("vllm-node").logs("main", 10, follow=True).script, env) == f"{GONE_NOTICE}\n1\n2\n"
    group = [int(p) for p in subprocess.run(["ps", "-o", "pid=", "-g", str(pid)], capture_output=True,
                                            text=True).stdout.split()]
    assert len(group) >= 3  # sh, docker logs -f (the stand-in's sleep), split (and its cat)
    _sh(stop_keeper("main", 1), env)
    assert all(_ended(p, 5) for p in group) and not (tmp_path / ".cache/sparkcluster/serve/main.keeper.pid").exists()


def test_vllm_beside_ray_is_kept_from_its_file_until_that_vllm_exits(tmp_path):
    """The log vLLM writes inside vllm_node (the stand-in docker runs `docker exec` here): followed from its first
    line, past the pid file a vLLM stopped before left, until the new vLLM exits; then the keeper ends by itself."""
    env = _node(tmp_path, 0)
    log, pid_file = tmp_path / "vllm-in-container.log", tmp_path / "vllm-in-container.pid"
    log.write_text("INFO the vLLM before\n")
    stopped = subprocess.Popen(["true"])
    stopped.wait()
    pid_file.write_text(f"{stopped.pid}\n")
    _sh(keep_output(file_output("vllm_node", str(log), str(pid_file)), "vllm"), env)
    keeper = _keeper(tmp_path, "vllm")
    vllm = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.3)
        pid_file.write_text(f"{vllm.pid}\n")  # as the new vLLM's `echo $$` does, a moment after the start returned
        with log.open("a") as f:
            f.write("INFO Starting vLLM API server\n")
        time.sleep(1.5)
        assert _running(keeper), "the keeper stopped while its vLLM runs"
        with log.open("a") as f:
            f.write("ERROR its last words\n")
    finally:
        vllm.kill()
        vllm.wait()
    assert _ended(keeper, 10), "the keeper outlived its vLLM"
    kept = (tmp_path / ".cache/sparkcluster/serve/vllm.log").read_text()
    assert kept == "INFO the vLLM before\nINFO Starting vLLM API server\nERROR its last words\n"


def test_where_no_log_was_kept_docker_says_what_is_missing(tmp_path):
    shown = _sh(DockerRuntime("vllm-node").logs("main", 5, follow=False).script + "; true", _node(tmp_path, 0))
    assert shown == "Error response from daemon: No such container: vllm_node\n"


class _Node:
    """A node whose commands run for real in bash, in its own home (where its kept logs are), with the stand-in
    docker whose containers are gone."""

    def __init__(self, tmp_path: Path, kept: str) -> None:
        self.env = _node(tmp_path, 0)
        (tmp_path / ".cache/sparkcluster/serve").mkdir(parents=True)
        (tmp_path / ".cache/sparkcluster/serve/main.log").write_text(kept)

    def run(self, command: Command) -> Result:
        done = subprocess.run(["bash", "-c", command.script], env=self.env, capture_output=True, text=True, timeout=30)
        return Result(command, done.returncode, done.stdout, done.stderr, 0.0)

    def close(self) -> None:
        pass


def test_a_failed_start_whose_container_is_gone_is_told_by_the_kept_logs_first_error(tmp_path):
    """Native launcher, the worker's rank died with its container: its root cause comes from the kept log, as from
    docker logs before (the notice line is no error), and the fix points at that log."""
    failed = (Path(__file__).resolve().parents[2] / "fixtures/vllm/cpu-0.32-max-model-len-too-long.log").read_text()
    hosts = (Host("spark-1", "10.0.0.1", "head"), Host("spark-2", "10.0.0.2", "worker"))
    nodes = {"spark-1": _Node(tmp_path / "1", "INFO 11-27 16:25:01 [a.py:1] waiting for the workers\n"),
             "spark-2": _Node(tmp_path / "2", failed)}
    session = Session(Inventory(Path("inv.yml"), "t", hosts, {}), nodes)  # type: ignore[arg-type]
    found = diagnosis(session, RuntimeChoice("docker"), "native")
    assert found.cause.startswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig")
    assert found.cause.endswith("(spark-2's vLLM log)"), found.cause
    assert found.fix.endswith("the whole log, kept on the node after serve stopped the container: "
                                "`sparkcluster logs --node spark-2 -n 1000`"), found.fix


def _host_node(tmp_path: Path) -> tuple[HostRuntime, NodeEnv, dict[str, str], Path]:
    """A node of the host runtime in tmp_path: its python_env, its comm env file, and a state directory and log left
    by a serve from before this was private (0755, 0644)."""
    (tmp_path / "venv/bin").mkdir(parents=True)
    (tmp_path / "c.env").write_text("NCCL_DEBUG=INFO\n")
    state = tmp_path / ".cache/sparkcluster/serve"
    state.mkdir(parents=True)
    state.chmod(0o755)
    (state / "main.log").write_text("the last serve's output\n")
    (state / "main.log").chmod(0o644)
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"], "SHELL": "/bin/sh"}
    return HostRuntime(str(tmp_path / "venv")), NodeEnv("~/c.env"), env, state


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_host_runtimes_output_goes_through_its_keeper_into_a_private_log(tmp_path):
    """Issue 46, F7 (K1, K3): with the host runtime the process's output went `> main.log`, 0644 in a 0755 folder and
    with no bound. Now its pid file still names the process (stop, alive), its output and errors reach main.log
    through the keeper, the state folder is 0700 and every file in it 0600, and no fifo is left once both opened it."""
    runtime, env, node, state = _host_node(tmp_path)
    start = runtime.start_main(["sh", "-c", "echo started; echo 'ERROR its last words' >&2; exec sleep 60"], env)
    _sh(start.script, node)
    process = int((state / "main.pid").read_text())
    keeper = int((state / "main.host-keeper.pid").read_text())
    try:
        assert _running(process) and _running(keeper) and process != keeper
        assert subprocess.run(["bash", "-c", runtime.alive("main").script], env=node).returncode == 0
        deadline = time.monotonic() + 10
        while "ERROR" not in (state / "main.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sh(runtime.logs("main", 5, follow=False).script, node) == "started\nERROR its last words\n"
        assert not (state / "main.fifo").exists()
        assert _mode(state) == 0o700 and {p.name: _mode(p) for p in state.iterdir()} == {
            "main.log": 0o600, "main.pid": 0o600, "main.pid.start": 0o600, "main.host-keeper.pid": 0o600}
    finally:
        stopped = _sh(runtime.stop_all().script, node)
    assert stopped == "main\n" and _ended(process, 5) and _ended(keeper, 10), "down left the process or its keeper"
    assert not (state / "main.host-keeper.pid").exists()
    assert (state / "main.log").read_text() == "started\nERROR its last words\n"


def test_the_host_runtimes_kept_log_is_bounded_and_read_across_its_rotation(tmp_path):
    """K3: an unauthenticated client grew main.log 19 KB -> 18 MB in 2.4 s. The keeper of a process writing 288,894
    bytes keeps the last one to two chunks (4 KiB here), both private; logs reads the last lines across the two."""
    runtime, _, node, state = _host_node(tmp_path)
    chunk = 4096
    _sh(f"{keep_host_output('main', chunk_bytes=chunk)} || exit 1\nseq 1 50000 > {output_fifo('main')}", node)
    assert _ended(int((state / "main.host-keeper.pid").read_text())), "the keeper did not end with its writer"
    log, older = state / "main.log", state / "main.log.1"
    assert older.stat().st_size == chunk and 0 < log.stat().st_size <= chunk
    assert _mode(log) == _mode(older) == 0o600 and _mode(state) == 0o700
    assert _sh(runtime.logs("main", 3, follow=False).script, node) == "49998\n49999\n50000\n"
    lines = (older.read_text() + log.read_text()).splitlines()
    assert lines[-1] == "50000" and len(lines) < 2 * chunk // 6 + 2  # the last ones only


class _Head:
    """The head's transport as write_record uses it: what it ran, and each file written with its mode."""

    def __init__(self) -> None:
        self.ran: list[str] = []
        self.written: dict[str, int] = {}

    def run(self, command: Command) -> Result:
        self.ran.append(command.script)
        return Result(command, 0, "", "", 0.0)

    def write_file_atomic(self, path: str, content: bytes, mode: int) -> None:
        self.written[path] = mode

    def close(self) -> None:
        pass


def test_the_serve_record_is_written_private_in_a_private_folder():
    """K1: ~/.config/sparkcluster/serve.json was 0644 (any local user read the command and flags served)."""
    head = _Head()
    session = Session(Inventory(Path("inv.yml"), "t", (Host("spark-1", "10.0.0.1", "head"),), {}),
                      {"spark-1": head})  # type: ignore[dict-item]
    write_record(session, ServeRecord("docker", "ray", "vllm-node", ("spark-1",)))
    assert head.ran == ["mkdir -p .config/sparkcluster && chmod 700 .config/sparkcluster"]
    assert head.written == {".config/sparkcluster/serve.json": 0o600}
