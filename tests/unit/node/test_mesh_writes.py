"""ssh.mesh's apply as data and in a real shell: one write per node (not one exec per link), run twice against
temporary home folders standing in for two nodes' ~/.ssh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sparkcluster.node.steps.mesh import Link, mesh_writes

KEYS = {"spark-1": "ssh-ed25519 AAAAC3UserKeyOfSpark1 spark@one", "spark-2": "ssh-ed25519 AAAAC3UserKeyOfSpark2 spark@two"}
HOST_KEYS = {"spark-1": "ssh-ed25519 AAAAC3HostKeyOfSpark1", "spark-2": "ssh-ed25519 AAAAC3HostKeyOfSpark2"}


def real_key(path: Path) -> str:
    """ssh-keygen -R only drops entries whose key it can parse: the shell test uses real ones."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


LINKS = (Link("spark-1", "spark-2", ("10.0.0.12", "10.0.1.12")), Link("spark-2", "spark-1", ("10.0.0.11", "10.0.1.11")))


def test_one_command_per_node_with_every_key_on_stdin_never_in_the_line() -> None:
    writes = mesh_writes(LINKS, KEYS, HOST_KEYS)
    assert set(writes) == {"spark-1", "spark-2"}
    one = writes["spark-1"]
    assert one.stdin == ("@known 10.0.0.12,10.0.1.12 ssh-ed25519 AAAAC3HostKeyOfSpark2\n"
                         f"@auth {KEYS['spark-2']}\n")
    assert "AAAAC3" not in one.script and "ssh-keygen -R 10.0.0.12 -f ~/.ssh/known_hosts" in one.script


def test_the_writes_authorize_and_record_once_however_often_they_run(tmp_path: Path) -> None:
    keys = {name: real_key(tmp_path / f"user-{name}") + f" spark@{name}" for name in KEYS}
    host_keys = {name: real_key(tmp_path / f"host-{name}") for name in KEYS}
    homes = {name: tmp_path / name for name in KEYS}
    ssh = homes["spark-1"] / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "known_hosts").write_text(f"10.0.0.12 {real_key(tmp_path / 'stale')}\n")  # a re-imaged node's old key
    stale = (ssh / "known_hosts").read_text().split()[2]
    for _ in range(2):
        for name, command in mesh_writes(LINKS, keys, host_keys).items():
            done = subprocess.run(["sh", "-c", command.line()], input=command.stdin, capture_output=True, text=True,
                                  env={**os.environ, "HOME": str(homes[name])}, timeout=20)
            assert done.returncode == 0, done.stderr
    for name, other in (("spark-1", "spark-2"), ("spark-2", "spark-1")):
        ssh = homes[name] / ".ssh"
        assert (ssh / "authorized_keys").read_text() == keys[other] + "\n"
        assert stale not in (ssh / "known_hosts").read_text()
        for address in next(link.addresses for link in LINKS if link.target == other):
            found = subprocess.run(["ssh-keygen", "-F", address, "-f", str(ssh / "known_hosts")],
                                   capture_output=True, text=True).stdout
            assert [line.split()[1:] for line in found.splitlines() if not line.startswith("#")] == \
                [host_keys[other].split()]
        assert oct((ssh / "authorized_keys").stat().st_mode & 0o777) == "0o600"
