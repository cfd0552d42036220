"""How the engine gets in: ~/.ssh/config, host keys, sudo passwords, and bad inventories caught first."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.support.helpers import run_cli as cli, ssh

pytestmark = pytest.mark.sim


def test_ssh_config_is_honoured(cluster, tmp_path):
    """The inventory names only an ssh_config alias; HostName, User and IdentityFile come from ~/.ssh/config."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    host = cluster.host("spark-2")
    (home / ".ssh" / "config").write_text(
        f"Host sparky\n  HostName {host.mgmt_ip}\n  User spark\n  IdentityFile {cluster.client_key}\n")
    shutil.copy(cluster.known_hosts, home / ".ssh" / "known_hosts")
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"hosts": {"sparky": {"address": "sparky", "role": "head"}}}))
    out = cli("facts", str(inv), "--json", env={"HOME": str(home)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["sparky"]["hostname"] == "spark-2"


def test_a_host_behind_a_proxyjump_is_reached_through_it_with_every_host_key_verified(cluster, tmp_path):
    """The alias's HostName is 127.0.0.1, which only means spark-2 as seen from spark-2 itself: the connection must
    go through the jump host (spark-2 too, reached on its management address) to land there. The jump host's
    key is verified like any node's: without its known_hosts entry, nothing connects."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    gate = cluster.host("spark-2")
    (home / ".ssh" / "config").write_text(
        f"Host behind\n  HostName 127.0.0.1\n  User spark\n  IdentityFile {cluster.client_key}\n"
        f"  ProxyJump spark@{gate.mgmt_ip}\n\nHost {gate.mgmt_ip}\n  IdentityFile {cluster.client_key}\n")
    gate_key = next(line.split()[1:3] for line in cluster.known_hosts.read_text().splitlines()
                    if gate.mgmt_ip in line.split()[0].split(","))
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump({"hosts": {"behind": {"address": "behind", "role": "head"}}}))
    known = home / ".ssh" / "known_hosts"

    known.write_text(f"127.0.0.1 {' '.join(gate_key)}\n")  # the target's key alone
    refused = cli("facts", str(inv), "--json", env={"HOME": str(home)})
    assert refused.returncode == 1 and "not in known_hosts" in refused.stdout + refused.stderr

    known.write_text(f"127.0.0.1 {' '.join(gate_key)}\n{gate.mgmt_ip} {' '.join(gate_key)}\n")
    out = cli("facts", str(inv), "--json", env={"HOME": str(home)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["behind"]["hostname"] == "spark-2"


def test_unknown_host_key_is_refused_unless_trusted_explicitly(cluster, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    doc = yaml.safe_load(cluster.inventory_path.read_text())
    del doc["vars"]["known_hosts"]
    doc["hosts"] = {"spark-1": doc["hosts"]["spark-1"]}
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(doc))
    refused = cli("facts", str(inv), env={"HOME": str(home)})
    assert refused.returncode == 1
    assert "not in known_hosts" in refused.stdout and "--trust-new-host-keys" in refused.stdout
    trusted = cli("facts", str(inv), "--trust-new-host-keys", env={"HOME": str(home)})
    assert trusted.returncode == 0, trusted.stdout
    recorded = (home / ".ssh" / "known_hosts").read_text()
    assert recorded.startswith(cluster.host("spark-1").mgmt_ip + " ssh-ed25519 ")
    assert cli("facts", str(inv), env={"HOME": str(home)}).returncode == 0  # now known, no flag needed


def test_sudo_password_is_asked_once_and_fed_on_stdin_never_shown(cluster, fresh_host, tmp_path):
    password = "s3cret-Pa55"
    ssh(cluster, fresh_host, f"echo 'spark:{password}' | sudo chpasswd && "
                             "echo 'spark ALL=(ALL) ALL' | sudo tee /etc/sudoers.d/spark >/dev/null")
    assert ssh(cluster, fresh_host, "sudo -n true", check=False).returncode != 0  # a password is needed now
    doc = yaml.safe_load(cluster.inventory_path.read_text())
    doc["hosts"] = {"spark-1": doc["hosts"]["spark-1"], fresh_host: doc["hosts"][fresh_host]}
    inv = tmp_path / "inv.yml"
    inv.write_text(yaml.safe_dump(doc))
    pb = tmp_path / "pb.yml"
    pb.write_text("plays:\n  - name: p\n    steps:\n      - command.run: {cmd: 'id -u > /root/become-proof', sudo: true}\n")
    out = cli("run", str(pb), "-i", str(inv), "--limit", f"spark-1,{fresh_host}", "--ask-become-pass", "--json",
              stdin=password + "\n")
    assert out.returncode == 0, out.stdout + out.stderr
    assert password not in out.stdout and password not in out.stderr
    assert ssh(cluster, fresh_host, "sudo -n cat /root/become-proof", user="root").stdout == "0\n"


@pytest.mark.parametrize("content,message", [
    ("hosts:\n  a: {adress: 1.2.3.4, role: head}\n", "did you mean 'address'"),
    ("hosts:\n  a: {address: 1.2.3.4}\n", "head"),
    ("hosts: [\n", "YAML"),
])
def test_bad_inventory_stops_before_any_connection_with_exit_2(tmp_path, content, message):
    inv = tmp_path / "inv.yml"
    inv.write_text(content)
    pb = tmp_path / "pb.yml"
    pb.write_text("plays:\n  - name: p\n    steps:\n      - command.run: {cmd: 'true'}\n")
    for args in (["facts", str(inv)], ["run", str(pb), "-i", str(inv)]):
        out = cli(*args)
        assert out.returncode == 2, out.stderr
        assert message in out.stderr and "Traceback" not in out.stderr


def test_sudo_password_never_reaches_the_commands_stdin(cluster):
    """Where sudo does not ask (NOPASSWD, as on the simulated hosts), the password line is dropped."""
    from sparkcluster.engine.command import Command
    from sparkcluster.engine.inventory import load_inventory
    from sparkcluster.engine.transport import Transport

    host = load_inventory(cluster.inventory_path).hosts[0]
    transport = Transport(host, sudo_password="pw-must-not-leak")
    try:
        result = transport.run(Command("cat; id -u", sudo=True, stdin="payload\n"))
    finally:
        transport.close()
    assert result.ok and result.stdout == "payload\n0\n"
