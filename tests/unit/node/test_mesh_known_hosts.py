"""ssh.mesh reads each node's known_hosts whole and matches it itself (one process a node, not an `ssh-keygen -F`
per address): what it finds for an address must be what `ssh-keygen -F` finds, hashed entries included. The real
ssh-keygen is the oracle here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sparkcluster.node.steps.mesh import Link, known_host_keys, mesh_writes

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")

KEY_A = ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIHostKeyOfSpark2")
KEY_B = ("ecdsa-sha2-nistp256", "AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBOldKey")
KEY_C = ("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIWildcardKey")
KNOWN_HOSTS = f"""\
# written by hand
192.168.178.12,192.168.177.12 {' '.join(KEY_A)}
192.168.177.12 {' '.join(KEY_B)} old entry
@revoked 192.168.178.12 {' '.join(KEY_C)}
10.0.0.*,!10.0.0.7 {' '.join(KEY_C)}
[192.168.178.12]:2222 {' '.join(KEY_C)}

SPARK-3 {' '.join(KEY_A)}
"""
ADDRESSES = ["192.168.178.12", "192.168.177.12", "10.0.0.5", "10.0.0.7", "192.168.1.99", "spark-3"]


def ssh_keygen_finds(path: Path, address: str) -> set[tuple[str, str]]:
    out = subprocess.run(["ssh-keygen", "-F", address, "-f", str(path)], capture_output=True, text=True).stdout
    return {(f[1], f[2]) for line in out.splitlines() if not line.startswith("#") and len(f := line.split()) >= 3
            and not f[0].startswith("@")}


def test_plain_entries_match_what_ssh_keygen_finds(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text(KNOWN_HOSTS)
    found = known_host_keys(KNOWN_HOSTS.splitlines(), ADDRESSES)
    assert found["192.168.177.12"] == {KEY_A, KEY_B}
    assert found["192.168.178.12"] == {KEY_A}  # the revoked key is no key of record; the :2222 entry is another port
    assert "192.168.1.99" not in found
    for address in ADDRESSES:
        assert found.get(address, set()) == ssh_keygen_finds(path, address), address


def test_hashed_entries_match_as_ssh_keygen_hashed_them(tmp_path: Path) -> None:
    path = tmp_path / "known_hosts"
    path.write_text("192.168.178.12,192.168.177.12 " + " ".join(KEY_A) + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(path)], check=True, capture_output=True)  # Ubuntu's default
    hashed = path.read_text()
    assert "192.168" not in hashed and hashed.startswith("|1|")
    found = known_host_keys(hashed.splitlines(), ["192.168.178.12", "192.168.177.12", "192.168.177.13"])
    assert found == {"192.168.178.12": {KEY_A}, "192.168.177.12": {KEY_A}}
    assert found["192.168.177.12"] == ssh_keygen_finds(path, "192.168.177.12")


def test_a_damaged_hashed_entry_matches_nothing() -> None:
    assert known_host_keys(["|1|not-base64!|x== " + " ".join(KEY_A)], ["192.168.178.12"]) == {}


def test_the_write_forgets_only_the_addresses_already_on_record() -> None:
    """A fresh node's known_hosts holds none of the targets' addresses: its write runs no ssh-keygen -R (two
    processes and a rewrite of the file per address); a re-imaged target's stale address is still dropped first."""
    keys = {"spark-1": "ssh-ed25519 AAAAC3UserKeyOfSpark1 spark@one", "spark-2": "ssh-ed25519 AAAAC3UserKeyOfSpark2 spark@two"}
    host_keys = {"spark-1": "ssh-ed25519 AAAAC3HostKeyOfSpark1", "spark-2": "ssh-ed25519 AAAAC3HostKeyOfSpark2"}
    fresh = mesh_writes((Link("spark-1", "spark-2", ("10.0.0.12", "10.0.1.12"), recorded=()),), keys, host_keys)
    assert "ssh-keygen -R" not in fresh["spark-1"].script
    stale = mesh_writes((Link("spark-1", "spark-2", ("10.0.0.12", "10.0.1.12"), recorded=("10.0.1.12",)),),
                        keys, host_keys)
    assert stale["spark-1"].script.count("ssh-keygen -R") == 1 and "ssh-keygen -R 10.0.1.12 " in stale["spark-1"].script
