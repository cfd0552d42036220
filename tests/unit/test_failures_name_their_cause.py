"""Issue 28 (round 4), the parts beyond the trust gate, proven on data and on real local processes: a silent
link ends a transfer within the bound with the partial kept, a failure names the real cause (the source's
corrupt copy, the link that is down, a stale lock), lock files are their owner's alone, and a changed host key
reads as ssh prints it."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest

from sparkcluster.engine import deadlines
from sparkcluster.engine.command import Command, masked_env
from sparkcluster.engine.errors import SparkclusterError, UsageError
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.locks import busy, hold_command
from sparkcluster.engine.modelref import ModelRef
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result, sha256_fingerprint, ssh_for_bulk
from sparkcluster.nccl.proberun import run_probe
from sparkcluster.node.linkstate import LINKS_COMMAND, any_down, parse_links
from sparkcluster.observe.nodeprobe import GPU_OUTPUT_LIMIT, NODE_DEADLINE_S, parse_probe, probe_command
from sparkcluster.serving.launch import Node, ServeArgs
from sparkcluster.serving.lifecycle import ray_commands, vllm_commands
from sparkcluster.serving.runtime import RuntimeChoice
from sparkcluster.staging import blobwire
from sparkcluster.staging.failures import broken_link, corrupt_source
from sparkcluster.staging.hfcache import Manifest, SnapshotFile, finalize_command

SCRIPT = Path(blobwire.__file__)
TOKEN = "f" * 64
BLOB = "a" * 64
SIZE = 4 << 20


class SilentSender:
    """Answers one request with the header and a first MiB, then sends nothing more and keeps the connection
    open: a link that died without a reset, as the fetcher sees it."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.release = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.makefile("rb").readline()
            conn.sendall(b"OK %d\n" % SIZE + b"x" * (1 << 20))
            self.release.wait(60)


@pytest.mark.parametrize("mode", ["fetch", "stream"])
def test_a_silent_sender_ends_the_transfer_within_the_bound_and_keeps_the_partial(tmp_path, mode):
    # Failed before: the fetcher waited with no timeout once the header had arrived (for as long as the link
    # stayed down; staging's bound was 24 h), and --stall did not exist.
    sender = SilentSender()
    args = ["--connect", f"127.0.0.1:{sender.port}", "--source", "127.0.0.1", "--size", str(SIZE), "--stall", "1"]
    args += ["--dir", str(tmp_path), "--blob", BLOB] if mode == "fetch" else ["--name", "x.parts"]
    started = time.monotonic()
    try:
        result = subprocess.run([sys.executable, str(SCRIPT), mode, *args], input=(TOKEN + "\n").encode(),
                                capture_output=True, timeout=30)
    finally:
        sender.release.set()
    assert time.monotonic() - started < 10
    assert result.returncode == blobwire.EXIT_STALLED, result.stderr
    assert b"received nothing from 127.0.0.1:" in result.stderr and b"for 1 s (at byte 1048576 of" in result.stderr
    if mode == "fetch":  # kept for a resume
        assert (tmp_path / blobwire.PARTIAL_DIR / BLOB).stat().st_size == 1 << 20


def test_the_stall_bound_comes_from_the_environment_and_reaches_every_ssh(monkeypatch):
    monkeypatch.setenv(deadlines.STALL_ENV, "3")
    assert deadlines.stall_seconds() == 3
    assert "-o ServerAliveInterval=1 -o ServerAliveCountMax=3" in ssh_for_bulk()
    for bad in ("", "x", "-5", "nan", "inf", "0"):
        monkeypatch.setenv(deadlines.STALL_ENV, bad)
        assert deadlines.stall_seconds() == deadlines.DEFAULT_STALL_S
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    deadlines.bound_socket(client, 7)
    assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert client.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 7000
    for s in (client, listener):
        s.close()


# ---- the cause a failed copy is blamed on --------------------------------------------------------------
def corrupt(got: str) -> tuple[int, str]:
    return blobwire.EXIT_CORRUPT, f"blobwire: {BLOB} arrived corrupt (its hash is {got}, not its name)\n"


def test_a_blob_that_arrives_twice_with_the_same_wrong_hash_blames_the_source():
    # Failed before: "check that spark-2 reaches spark-1 ... over TCP (a firewall ...?)".
    message, fix = corrupt_source("spark-1", "model-1.safetensors", "acme/x", [corrupt("b" * 64), corrupt("b" * 64)])
    assert "spark-1's copy of it is corrupt" in message and "same wrong hash" in message
    assert "sparkcluster stage acme/x --status --verify full" in fix and "firewall" not in fix
    # bytes that differ from try to try are the link's doing, and one corrupt try is not a verdict
    assert corrupt_source("spark-1", "m", "acme/x", [corrupt("b" * 64), corrupt("c" * 64)]) is None
    assert corrupt_source("spark-1", "m", "acme/x", [corrupt("b" * 64), (blobwire.EXIT_CONNECTION, "")]) is None


LINKS = {
    "spark-1": "enP7s7 up 192.168.100.11\nenp1s0f1np1 up 10.100.0.11\nenP2p1s0f1np1 up\nlo unknown 127.0.0.1\n",
    "spark-2": "enP7s7 up 192.168.100.12\nenp1s0f1np1 lowerlayerdown 10.100.0.12\nenP2p1s0f1np1 down\n",
}


def test_a_broken_stream_names_the_node_and_the_link_that_is_down():
    message, fix = broken_link("spark-1", "spark-2", "model-1.safetensors", "acme/x", ("10.100.0.11", "10.100.0.12"),
                               "received nothing from 10.100.0.11:4000 for 3 s",
                               (parse_links(LINKS["spark-1"]), parse_links(LINKS["spark-2"])))
    assert "the fabric link between spark-2 and spark-1 is down on spark-2" in message
    assert "spark-2's QSFP links: enP2p1s0f1np1 down, enp1s0f1np1 lowerlayerdown (10.100.0.12)" in message
    assert "enP7s7" not in message and "the partial copy is kept" in message
    assert "sparkcluster stage acme/x` again: it resumes" in fix and "firewall" not in fix
    up = parse_links(LINKS["spark-1"])
    _, fix = broken_link("spark-1", "spark-2", "m", "acme/x", ("10.100.0.11", "10.100.0.12"), "reset", (up, up))
    assert "firewall" in fix  # every link up: something else between the addresses


# ---- locks ---------------------------------------------------------------------------------------------
def test_a_stale_lock_of_a_run_of_this_machine_says_so_and_when_it_clears():
    # Failed before: "stop it" for a PID that no longer exists, on the user's own machine.
    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = f"`sparkcluster stage acme/x` (pid {dead.pid} on {socket.gethostname()}, since 2026-01-01 10:00:00 UTC)"
    message, fix = busy("spark-2", "a stage of acme/x", holder, "stop it", "$HOME/x.lock")
    assert message.startswith("spark-2: a stale lock of a stage of acme/x: its holder, pid") and "gone" in message
    assert "fuser -k" in fix and "stop it" not in fix
    live = holder.replace(f"pid {dead.pid}", f"pid {os.getpid()}")
    assert busy("spark-2", "a stage", live, "stop it", "x")[1] == "stop it"
    elsewhere = holder.replace(socket.gethostname(), "another-machine")
    assert busy("spark-2", "a stage", elsewhere, "stop it", "x")[0].endswith(f"already running there: {elsewhere}")


def test_lock_files_are_their_owners_alone(tmp_path):
    # Failed before: the lock file was 0644 in a 0755 folder, so any user of the node could hold it with a
    # read-only flock. An older run's 0644 file is tightened too.
    locks = tmp_path / ".cache" / "sparkcluster" / "locks"
    locks.mkdir(parents=True)
    old = locks / "stage-x.lock"
    old.write_text("")
    old.chmod(0o644)
    locks.chmod(0o755)
    command = hold_command("stage-x", "me")
    process = subprocess.Popen(["/bin/sh", "-c", command.line()], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]})
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("me\n")
    process.stdin.flush()
    assert process.stdout.readline().strip() == "locked"
    try:
        assert stat.S_IMODE(old.stat().st_mode) == 0o600 and stat.S_IMODE(locks.stat().st_mode) == 0o700
    finally:
        process.stdin.close()
        process.wait(timeout=10)


# ---- messages ------------------------------------------------------------------------------------------
def test_a_changed_host_key_is_shown_as_ssh_shows_it(tmp_path):
    # Failed before: the MD5 hex digest, which neither ssh nor ssh-keygen -l prints.
    key = paramiko.Ed25519Key.from_private_key_file(str(_keygen(tmp_path)))
    listed = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "k.pub")], capture_output=True, text=True, check=True)
    assert sha256_fingerprint(key) == listed.stdout.split()[1]


def _keygen(tmp_path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    return tmp_path / "k"


# ---- secrets never in a command line ---------------------------------------------------------------------
CANARY = "hf_SERVEENVCANARY0123456789"
RECIPE_KEY = "wk_RECIPECANARY"
NODES = {"spark-1": Node("spark-1", 0, "10.100.0.11", "10.100.0.11"),
         "spark-2": Node("spark-2", 1, "10.100.0.12", "10.100.0.11")}


@pytest.mark.parametrize("runtime", ["docker", "host"])
def test_serve_env_secrets_travel_on_stdin_never_in_a_command_line(runtime):
    # Failed before: `export HF_TOKEN=hf_...` (host) or `-e HF_TOKEN=hf_...` (docker) in the line that becomes
    # the argv of the node's shell, readable by any user with ps, and shown by serve --check.
    hosts = tuple(Host(n, f"10.0.0.{i}", role="head" if i == 1 else "worker", vars={"python_env": "/v"})
                  for i, n in enumerate(NODES, 1))
    session = Session(Inventory(path=Path("inv.yml"), name="t", hosts=hosts,
                                vars={"serve_env": {"HF_TOKEN": CANARY, "VLLM_CPU_KVCACHE_SPACE": "1"}}), {})
    choice = RuntimeChoice(runtime, "vllm-node")
    args = ServeArgs("org/m", 2, served_name="m", env={"WANDB_API_KEY": RECIPE_KEY})
    commands = [*ray_commands(session, choice, NODES, args.env).values(),
                *vllm_commands(session, choice, NODES, "ray", args).values(),
                *vllm_commands(session, choice, NODES, "native", args).values()]
    for command in commands:
        for secret in (CANARY, RECIPE_KEY):
            assert secret not in command.line() and secret not in command.display()
        assert "VLLM_CPU_KVCACHE_SPACE" in command.line() or "docker exec" in command.line()  # plain env stays
    started = [c for c in commands if c.stdin]  # ray start everywhere, vLLM where it starts a process or container
    assert len(started) >= 4
    for command in started:
        assert f"HF_TOKEN={CANARY}\n" in command.stdin and f"WANDB_API_KEY={RECIPE_KEY}\n" in command.stdin
        if runtime == "docker":
            assert " -e HF_TOKEN " in command.line()  # docker takes the value from its client's environment


def test_the_node_shell_exports_the_secrets_it_reads_literally(tmp_path):
    hosts = (Host("spark-1", "10.0.0.1", role="head", vars={"python_env": str(tmp_path)}),)
    session = Session(Inventory(path=Path("inv.yml"), name="t", hosts=hosts,
                                vars={"serve_env": {"HF_TOKEN": "a'$(touch x)`b` c"}}), {})
    command = ray_commands(session, RuntimeChoice("host"), {"spark-1": NODES["spark-1"]}, {})["spark-1"]
    reader = command.line().split("\n", 1)[0]
    shown = subprocess.run(["sh", "-c", reader + '\nprintf %s "$HF_TOKEN"'], input=command.stdin, text=True,
                           capture_output=True, cwd=tmp_path)
    assert shown.stdout == "a'$(touch x)`b` c" and not (tmp_path / "x").exists()


def test_secret_like_names_are_masked_where_env_is_shown(tmp_path):
    shown = masked_env({"HF_TOKEN": CANARY, "WANDB_API_KEY": "k", "DB_PASSWORD": "p", "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert shown == {"HF_TOKEN": "********", "WANDB_API_KEY": "********", "DB_PASSWORD": "********",
                     "VLLM_CPU_KVCACHE_SPACE": "1"}
    (tmp_path / "r.yaml").write_text(f"model: acme/m\nenv:\n  HF_TOKEN: {CANARY}\n  VLLM_X: '1'\n")
    out = subprocess.run([sys.executable, "-m", "sparkcluster", "recipes", "show", "./r.yaml", "--json"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and '"HF_TOKEN": "********"' in out.stdout and '"VLLM_X": "1"' in out.stdout, out.stderr
    assert CANARY not in out.stdout + out.stderr  # failed before: `recipes show` printed the recipe's token


# ---- top's node probe ------------------------------------------------------------------------------------
def fake_smi(tmp_path: Path, body: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + body + "\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}


def probe(env: dict[str, str], nonce: str = "n0nce") -> tuple[subprocess.Popen, str]:
    command = probe_command({"main": "true"}, nonce)
    return subprocess.Popen(["sh", "-c", command.script], stdout=subprocess.PIPE, text=True, errors="replace", env=env,
                            start_new_session=True), nonce


def test_random_bytes_from_nvidia_smi_never_become_process_names(tmp_path):
    # Failed before: every line of the flood that began with @ opened a section, and became a "process".
    env = fake_smi(tmp_path, "printf 'garbage\\n@main\\nrunning\\n@x\\377y\\nrunning\\n@mem\\nMemTotal: 1 kB\\n'; "
                             "head -c 300000 /dev/urandom")
    process, nonce = probe(env)
    out = process.communicate(timeout=30)[0]
    sample = parse_probe("spark-3", out, nonce, ["main"])
    assert sample.processes == {"main": True} and sample.gpu_error
    assert sample.memory_total_bytes is None or sample.memory_total_bytes > 1024  # the flood's MemTotal is not read
    assert len(out) < GPU_OUTPUT_LIMIT + 4096


def test_a_hung_nvidia_smi_is_stopped_on_the_node_and_never_started_twice(tmp_path):
    # Failed before: nothing ended the probe's nvidia-smi on the node, and each later probe started one more.
    env = fake_smi(tmp_path, "exec sleep 31.5")
    first, nonce = probe(env)
    time.sleep(1)
    second, nonce2 = probe(env, "other")
    out = second.communicate(timeout=30)[0]  # answers at once: the GPU query is skipped while the first runs
    hung = subprocess.run(["pgrep", "-f", "sleep 31.5"], capture_output=True, text=True).stdout.split()
    assert len(hung) == 1, hung
    assert "still runs" in (parse_probe("n", out, nonce2, ["main"]).gpu_error or "")
    started = time.monotonic()
    answer = parse_probe("n", first.communicate(timeout=30)[0], nonce, ["main"])
    assert time.monotonic() - started < NODE_DEADLINE_S
    assert "no answer within" in (answer.gpu_error or "") and answer.processes == {"main": True}
    assert subprocess.run(["pgrep", "-f", "sleep 31.5"], capture_output=True).returncode == 1  # none left


# ---- revisions and refs are data -------------------------------------------------------------------------
@pytest.mark.parametrize("text", ["acme/m@main/../../x", "acme/m@/etc/passwd", "acme/m@x//y", "acme/m@x/",
                                  "acme/m@.hidden", "acme/m@x.lock", "acme/m@a..b", "acme/m@-x", "acme/m@x/./y"])
def test_a_revision_that_could_walk_out_of_refs_is_refused(text):
    # Failed before for the `..` and `/.`, `//`, `.lock` forms: they reached cat, rm -f and mv -f of refs/ paths.
    with pytest.raises(UsageError, match="invalid revision"):
        ModelRef.parse(text)
    with pytest.raises(UsageError):
        ModelRef("acme/m", text.partition("@")[2])  # built without parse() (a recipe's model_revision)


def test_a_branch_with_a_slash_is_staged_under_its_folder(tmp_path):
    # Failed before: refs/x/y.tmp was written without its folder: "No such file or directory".
    blob = "a" * 64
    model_dir = tmp_path / "models--acme--m"
    (model_dir / "blobs").mkdir(parents=True)
    (model_dir / "blobs" / blob).write_text("weights")
    model = ModelRef.parse("acme/m@x/y")
    manifest = Manifest(model, "c" * 40, (SnapshotFile("model.safetensors", blob, 7),))
    subprocess.run(["sh", "-c", finalize_command(str(model_dir), manifest).script], check=True)
    assert (model_dir / "refs" / "x" / "y").read_text() == "c" * 40
    assert str(model) == "acme/m@x/y" and ModelRef.parse("acme/m@refs/pr/1").revision == "refs/pr/1"


# ---- verify with the fabric down names the links, not gloo's traceback ------------------------------------
class FabricDownNode:
    """A node whose probe rank times out at gloo's rendezvous, and whose QSFP links read as `links`."""

    def __init__(self, name: str, links: str) -> None:
        self.host = Host(name, "192.168.100.1", role="head" if name == "spark-1" else "worker")
        self.links = links

    def run(self, command: Command) -> Result:
        if command == LINKS_COMMAND:
            return Result(command, 0, self.links, "", 0.1)
        if "probe" in command.script:
            return Result(command, 1, "Traceback (most recent call last):\nRuntimeError: [gloo] Timed out waiting "
                                      "60000ms for recv operation", "", 60.0)
        return Result(command, 0, "", "", 0.1)  # the kept log

    def close(self) -> None:  # a failed rank ends the others' waits by closing every connection
        pass


def test_verify_with_the_fabric_down_names_the_links_that_are_down():
    # Failed before: nine lines of the probe's gloo traceback and "run `sparkcluster bootstrap` first".
    nodes = {name: FabricDownNode(name, LINKS[name]) for name in ("spark-1", "spark-2")}
    session = Session(Inventory(path=Path("inv.yml"), name="t", hosts=tuple(n.host for n in nodes.values()), vars={}),
                      nodes)  # type: ignore[arg-type]
    with pytest.raises(SparkclusterError) as raised:
        run_probe(session, {name: Command("python3 probe") for name in nodes})
    message = raised.value.message
    assert "the fabric is down: spark-2's QSFP links: enP2p1s0f1np1 down, enp1s0f1np1 lowerlayerdown" in message
    assert "Traceback" not in message and "spark-1's" not in message  # spark-1's links are up
    assert "bootstrap" not in raised.value.fix and "QSFP cables" in raised.value.fix


def test_a_port_no_cable_serves_is_not_the_link_that_is_down():
    # Failed before (CI, a pair): "is down on spark-2 and spark-1" beside "enp1s0f1np1 up (10.102.0.12)": the other
    # port's twins, unaddressed and dark on every pair, were taken for the broken link.
    pair = parse_links("enp1s0f0np0 down\nenP2p1s0f0np0 down\nenp1s0f1np1 up 10.102.0.12\nenP2p1s0f1np1 up 10.102.1.12\n")
    message, fix = broken_link("spark-1", "spark-2", "m", "acme/x", ("10.102.0.11", "10.102.0.12"),
                               "cannot connect to 10.102.0.11:4000: [Errno 113] No route to host", (pair, pair))
    assert "is down on" not in message and "between spark-2 (10.102.0.12) and spark-1 (10.102.0.11) failed" in message
    assert "firewall" in fix
    # link-local twins carry no IPv4 address: a dark one still counts there
    link_local = parse_links("enp1s0f1np1 down\nenP2p1s0f1np1 up\n")
    assert any_down(link_local) and not any_down(parse_links("enp1s0f1np1 up\nenP2p1s0f1np1 up\n"))


def test_a_pulled_cable_whose_address_went_with_its_carrier_is_still_the_link_that_is_down():
    # networkd and NetworkManager drop a port's address when its carrier goes: on a ring node (two cables), the pulled
    # one is told apart from a port no cable ever lit by the kernel's carrier_up_count.
    ring = parse_links("enp1s0f0np0 up ups=1 10.100.0.12\nenP2p1s0f0np0 up ups=1 10.100.1.12\n"
                       "enp1s0f1np1 down ups=2\nenP2p1s0f1np1 down ups=2\n")
    assert ring[2].carrier_ups == 2 and ring[2].ipv4 == () and ring[0].ipv4 == ("10.100.0.12",)
    assert any_down(ring)
    pair = parse_links("enp1s0f0np0 down ups=0\nenP2p1s0f0np0 down ups=0\n"
                       "enp1s0f1np1 up ups=1 10.100.0.12\nenP2p1s0f1np1 up ups=1 10.100.1.12\n")
    assert not any_down(pair)
    assert parse_links("enp1s0f1np1 down ups= 10.0.0.1\n")[0].carrier_ups is None  # an old kernel: not read
