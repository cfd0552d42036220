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
from sparkcluster.engine.locks import busy, hold_command
from sparkcluster.engine.transport import sha256_fingerprint, ssh_for_bulk
from sparkcluster.node.linkstate import parse_links
from sparkcluster.staging import blobwire
from sparkcluster.staging.failures import broken_link, corrupt_source

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
    for bad in ("", "x", "-5", "nan", "0"):
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
