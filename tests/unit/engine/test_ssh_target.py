"""How a host is reached: the inventory's settings over ssh_config's, as paramiko parses it (engine/sshtarget.py);
and invoke, which paramiko imports for `Match exec` alone, loaded only where it is used."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import paramiko

from sparkcluster.engine.sshtarget import resolve

CONFIG = """
Host sparky
  HostName 10.0.0.7
  User spark
  IdentityFile ~/.ssh/sparky_key
  UserKnownHostsFile {known}
  ConnectTimeout 4

Host behind
  HostName 192.168.100.2
  ProxyJump admin@gate:2222,inner

Host inner
  HostName 10.1.0.1
  User relay

Host piped
  ProxyCommand nc %h %p
"""


def config(tmp_path: Path) -> paramiko.SSHConfig:
    known = tmp_path / "known"
    known.write_text("")
    return paramiko.SSHConfig.from_file(io.StringIO(CONFIG.format(known=known)))


def test_an_alias_takes_its_hostname_user_keys_known_hosts_and_timeout(tmp_path):
    target = resolve("sparky", user=None, port=22, key=None, config=config(tmp_path))
    assert (target.hostname, target.port, target.user, target.connect_timeout) == ("10.0.0.7", 22, "spark", 4.0)
    assert target.key_files == (str(Path.home() / ".ssh" / "sparky_key"),) and not target.only_key_files
    assert target.known_hosts == (tmp_path / "known",)
    assert (target.proxy_jump, target.proxy_command) == ((), None)


def test_the_inventorys_user_and_key_win_and_its_key_comes_first(tmp_path):
    target = resolve("sparky", user="ops", port=2200, key="/keys/inv", config=config(tmp_path))
    assert (target.user, target.port) == ("ops", 2200)
    assert target.key_files[0] == "/keys/inv" and target.only_key_files


def test_proxyjump_hops_resolve_in_order_through_ssh_config(tmp_path):
    target = resolve("behind", user="spark", port=22, key=None, config=config(tmp_path))
    hops = [(h.hostname, h.port, h.user) for h in target.proxy_jump]
    assert hops == [("gate", 2222, "admin"), ("10.1.0.1", 22, "relay")]
    assert target.proxy_command is None and target.hostname == "192.168.100.2"


def test_proxycommand_tokens_are_expanded(tmp_path):
    target = resolve("piped", user="spark", port=22, key=None, config=config(tmp_path))
    assert target.proxy_command == "nc piped 22"


def test_an_unknown_address_is_itself_with_the_defaults(tmp_path):
    target = resolve("10.9.9.9", user=None, port=22, key=None, config=config(tmp_path))
    assert (target.hostname, target.key_files, target.connect_timeout) == ("10.9.9.9", (), 10.0)


def test_paramiko_loads_without_invoke_until_a_match_exec_needs_it(tmp_path):
    probe = f"""
import io, sys
import sparkcluster.engine.transport  # installs the stand-in, as every command does before paramiko loads
import paramiko
assert "invoke.config" not in sys.modules, "paramiko's import loaded invoke"
config = paramiko.SSHConfig.from_file(io.StringIO("Match exec \\"test -d {tmp_path}\\"\\n  User matched\\n"))
assert config.lookup("anything")["user"] == "matched"  # the exec ran: through the real invoke
assert "invoke.config" in sys.modules
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr
