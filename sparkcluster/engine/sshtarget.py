"""Where and as whom a host is reached: the inventory's settings, then ssh_config's (~/.ssh/config, then
/etc/ssh/ssh_config, read by paramiko's parser; the first value found wins, as in OpenSSH), then the defaults.

The inventory wins over ssh_config for the user, the port and the key (an inventory key comes first, ssh_config's
IdentityFile entries after it). ProxyJump (hops `[user@]host[:port]`, each resolved here in turn) or ProxyCommand
(its tokens expanded by paramiko) says how the TCP stream reaches the host.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import paramiko

SSH_CONFIG_FILES = ("~/.ssh/config", "/etc/ssh/ssh_config")
DEFAULT_CONNECT_TIMEOUT_S = 10


@dataclass(frozen=True)
class SshTarget:
    hostname: str  # what the TCP connection goes to (ssh_config's HostName for an alias)
    port: int
    user: str
    key_files: tuple[str, ...]  # tried in order; none: the agent and ~/.ssh's default keys
    only_key_files: bool  # the inventory named the key: offer no agent or default key besides
    known_hosts: tuple[Path, ...]  # ssh_config's UserKnownHostsFile entries that exist
    connect_timeout: float
    proxy_jump: tuple[SshTarget, ...] = ()  # the hops, first to last
    proxy_command: str | None = None


def load_ssh_config() -> paramiko.SSHConfig:
    from paramiko import SSHConfig

    config = SSHConfig()
    for name in SSH_CONFIG_FILES:
        path = Path(os.path.expanduser(name))
        if path.is_file():
            with open(path) as f:
                config.parse(f)
    return config


def resolve(address: str, *, user: str | None, port: int | None, key: str | None,
            config: paramiko.SSHConfig, hops_allowed: bool = True) -> SshTarget:
    """`address` (an IP, a DNS name or an ssh_config alias) as ssh would reach it. `port` None: ssh_config's or 22."""
    found = config.lookup(address)
    files = ([key] if key else []) + [os.path.expanduser(f) for f in found.get("identityfile", [])]
    known = tuple(p for p in (Path(os.path.expanduser(v)) for v in found.get("userknownhostsfile", "").split())
                  if p.is_file())
    hops: tuple[SshTarget, ...] = ()
    if hops_allowed and found.get("proxyjump", "none").lower() != "none":
        hops = tuple(_hop(spec, config) for spec in found["proxyjump"].split(","))
    command = found.get("proxycommand", "none")
    return SshTarget(
        hostname=found.get("hostname", address),
        port=port or int(found.get("port", 22)),
        user=user or found.get("user") or getpass.getuser(),
        key_files=tuple(files),
        only_key_files=key is not None,
        known_hosts=known,
        connect_timeout=float(found.get("connecttimeout", DEFAULT_CONNECT_TIMEOUT_S)),
        proxy_jump=hops,
        proxy_command=None if hops or command.lower() == "none" else command,  # ProxyJump wins, as in OpenSSH
    )


def _hop(spec: str, config: paramiko.SSHConfig) -> SshTarget:
    """One ProxyJump hop, `[user@]host[:port]`, resolved through ssh_config itself (a hop's own ProxyJump is not
    followed: the hops are already listed in order)."""
    user, _, rest = spec.strip().rpartition("@")
    host, port = rest, None
    if rest.count(":") == 1:  # host:port (an IPv6 address has more colons, and no port here)
        host, number = rest.split(":")
        port = int(number)
    return resolve(host, user=user or None, port=port, key=None, config=config, hops_allowed=False)
