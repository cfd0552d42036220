"""One SSH connection per host per run (paramiko, ssh_config read as sshtarget.py says), host keys verified.

A failed command is data (Result), never an exception; only a host that cannot be reached, or that drops
off during a run, raises Unreachable, which the runner records as that host's status.
"""

from __future__ import annotations

import base64
import io
import logging
import os
import posixpath
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import deferred_invoke
from .command import Command
from .deadlines import bound_socket, keepalive_interval, stall_seconds
from .errors import SparkclusterError
from .inventory import Host
from .remote import STRICT_SSH

if TYPE_CHECKING:
    from typing import TypeAlias

    import paramiko

    from .sshtarget import SshTarget

    _Stream: TypeAlias = socket.socket | paramiko.Channel | paramiko.ProxyCommand  # what an SSH session runs over

# paramiko (with cryptography) is most of a command's start-up time: it is imported when the first connection opens,
# so that parsing, the inventory's validation and every usage error come first and fast. invoke, which paramiko
# imports for ssh_config's `Match exec` alone, loads only if that is used (deferred_invoke.py: 163 -> 73 ms).
# Fabric, which wrapped paramiko here once, needs invoke as it loads; all it gave was the reading of ssh_config,
# which paramiko's own parser does (sshtarget.py).
deferred_invoke.install()

CONNECT_ATTEMPTS = 3
RETRY_BACKOFF_S = 0.5  # doubled after each failed attempt
# OpenSSH from one node to another for bulk bytes (staging, images): the key mesh bootstrap made, strict host keys,
# AES-GCM (hardware-accelerated on the Spark's cores) and no compression (weights do not compress).
SSH_FOR_BULK = " ".join(["ssh", "-T", "-c", "aes128-gcm@openssh.com", "-o", "Compression=no", *STRICT_SSH,
                         "-o", "ConnectTimeout=10"])


def server_alive_options(stall: float) -> list[str]:
    """OpenSSH's keepalive: a server silent for about `stall` seconds ends the connection (exit 255)."""
    interval = int(keepalive_interval(stall))
    return ["-o", f"ServerAliveInterval={interval}", "-o", f"ServerAliveCountMax={max(1, int(stall) // interval)}"]


def ssh_for_bulk() -> str:
    """SSH_FOR_BULK with the run's bound on silence (deadlines.py): a dead link ends the copy instead of hanging it."""
    return " ".join([SSH_FOR_BULK, *server_alive_options(stall_seconds())])

# paramiko logs each failed handshake with a traceback, which Python's last-resort handler prints on stderr; the
# reason already reaches the user as one Unreachable line per host, so paramiko's records go nowhere.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


def load_ssh_library() -> None:
    """Imports paramiko, as the first connection does (once for the process, whichever thread comes first)."""
    import paramiko  # noqa: F401


class Unreachable(SparkclusterError):
    """The host could not be reached or dropped off; `fix` says what to try (exit 1). `host` names it, so a
    step on one node that reached for another can blame the right one."""

    def __init__(self, message: str, fix: str, host: str | None = None) -> None:
        super().__init__(message, fix)
        self.host = host


@dataclass(frozen=True)
class Result:
    command: Command
    exit_code: int  # -1 when the command was cut off by its timeout
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def stderr_tail(self, lines: int = 10) -> str:
        return "\n".join(self.stderr.strip().splitlines()[-lines:])


EOF_AFTER_EXIT_S = 2.0  # how long output may still arrive after a command's exit status


class Held:
    """A remote command kept alive by an open channel on a connection of its own (Transport.hold); `release()`
    ends it, waits briefly for it to exit, so what it held is free when release returns, and closes the connection."""

    def __init__(self, channel: paramiko.Channel, connection: _Connection) -> None:
        self._channel, self._connection, self._released = channel, connection, False

    def release(self, wait_s: float = 5.0) -> None:
        import paramiko

        if self._released:
            return
        self._released = True
        try:
            self._channel.shutdown_write()  # EOF on its stdin: the command ends
            deadline = time.monotonic() + wait_s
            while not self._channel.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.01)
        except (paramiko.SSHException, OSError, EOFError):
            pass  # the connection is gone, and the command with it
        finally:
            self._channel.close()
            self._connection.close()


def _trust_new_keys(path: Path) -> paramiko.MissingHostKeyPolicy:
    import paramiko

    class TrustNewKeys(paramiko.MissingHostKeyPolicy):
        """--trust-new-host-keys: accept an unknown key and append it to the inventory's known_hosts, or to
        ~/.ssh/known_hosts where the inventory names none (never a changed key: paramiko raises BadHostKeyException
        for that before consulting the policy). The inventory's file is the one its later runs and ssh read; a key
        written elsewhere would be shadowed by a stale entry there."""

        def __init__(self, path: Path) -> None:
            self.path = path

        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            path = self.path
            path.parent.mkdir(mode=0o700, exist_ok=True)
            with open(path, "a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            client.get_host_keys().add(hostname, key.get_name(), key)

    return TrustNewKeys(path)


class _Connection:
    """An open connection: paramiko's client, and the clients of the ProxyJump hops it runs through (closed
    after it)."""

    def __init__(self, client: paramiko.SSHClient, hops: list[paramiko.SSHClient]) -> None:
        self.client, self.hops = client, hops

    @property
    def transport(self) -> paramiko.Transport:
        transport = self.client.get_transport()
        if transport is None:
            raise EOFError("the connection is closed")
        return transport

    @property
    def is_connected(self) -> bool:
        transport = self.client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        for client in [self.client, *reversed(self.hops)]:
            client.close()


class Transport:
    """The connection to one host, opened lazily once and reused by every step of the run."""

    def __init__(self, host: Host, *, trust_new_host_keys: bool = False, sudo_password: str | None = None) -> None:
        self.host = host
        self.trust_new_host_keys = trust_new_host_keys
        self.sudo_password = sudo_password
        self._connection: _Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()
        # sshd's default MaxSessions is 10 channels per connection: stay below it whatever runs in parallel.
        self._channels = threading.BoundedSemaphore(8)

    def _unreachable(self, message: str, fix: str) -> Unreachable:
        return Unreachable(message, fix, host=self.host.name)

    # ---- connection --------------------------------------------------------------------------------
    def _connect(self) -> _Connection:
        with self._lock:
            if self._connection is not None and self._connection.is_connected:
                return self._connection
            if self._connection is not None:
                raise self._unreachable(f"lost the connection to {self.host.address}", _reachability_fix(self.host))
            self._connection = self._open_with_retries()
            return self._connection

    def _open_with_retries(self) -> _Connection:
        import paramiko

        from .sshtarget import load_ssh_config, resolve

        host = self.host
        target = resolve(host.address, user=host.user, port=host.port, key=host.key, config=load_ssh_config())
        known_hosts = _known_hosts_files(target, host)
        delay = RETRY_BACKOFF_S
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            hops: list[paramiko.SSHClient] = []
            client = _client(known_hosts, _trust_new_keys(trusted_keys_file(host)) if self.trust_new_host_keys
                             else paramiko.RejectPolicy())
            try:
                _connect_client(client, target, _stream(target, known_hosts, hops))
                conn = _Connection(client, hops)
                _bound(conn)
                return conn
            except paramiko.BadHostKeyException as e:
                raise self._unreachable(
                    f"the host key of {host.address} has CHANGED (got {e.key.get_name()} "
                    f"{sha256_fingerprint(e.key)}); refusing to connect",
                    _changed_key_fix(host, known_hosts),
                ) from None
            except paramiko.SSHException as e:
                if "not found in known_hosts" in str(e):
                    raise self._unreachable(
                        f"{host.address} is not in known_hosts, so its identity cannot be verified",
                        f"connect once with `ssh {host.address}` and check the fingerprint, add it to the "
                        "inventory's known_hosts file, or re-run with --trust-new-host-keys",
                    ) from None
                if isinstance(e, paramiko.AuthenticationException):
                    raise self._unreachable(
                        f"authentication as {target.user}@{host.address} failed: {e}",
                        f"check `key:` in the inventory, or install the key: ssh-copy-id {target.user}@{host.address}",
                    ) from None
                error: Exception = e
            except (OSError, EOFError) as e:
                error = e
            _Connection(client, hops).close()
            if attempt < CONNECT_ATTEMPTS:
                time.sleep(delay)
                delay *= 2
        raise self._unreachable(
            f"cannot connect to {host.address}:{host.port} after {CONNECT_ATTEMPTS} attempts: {error}",
            _reachability_fix(host),
        )

    def close(self) -> None:
        with self._lock:
            if self._sftp is not None:
                self._sftp.close()
            if self._connection is not None:
                self._connection.close()

    def host_key(self) -> tuple[str, str]:
        """(type, base64) of the key this host proved it holds when we connected: verified, so safe to
        hand on to another machine's known_hosts."""
        key = self._connect().transport.get_remote_server_key()
        return key.get_name(), key.get_base64()

    def reconnect(self) -> None:
        """A new login session. Needed after `usermod -aG`: group membership is fixed when a session starts."""
        self.close()
        with self._lock:
            self._sftp = None
            self._connection = None

    # ---- commands ----------------------------------------------------------------------------------
    def run(self, command: Command) -> Result:
        """Run one command; its output and exit code come back as a Result, whatever they are."""
        import paramiko

        conn = self._connect()
        password = self.sudo_password if command.sudo else None
        use_password = password is not None
        stdin = (password + "\n" if password is not None else "") + (command.stdin or "")
        start = time.monotonic()
        try:
            with self._channels:
                return self._exec(conn, command, stdin, use_password, start)
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._unreachable(f"{self.host.address} dropped off while running {command.label()}: {e}",
                              _reachability_fix(self.host)) from None

    def _exec(self, conn: _Connection, command: Command, stdin: str, use_password: bool, start: float) -> Result:
        """One exec channel: send stdin, collect both streams until the exit status or the deadline."""
        channel = conn.transport.open_session()
        channel.settimeout(1.0)
        channel.exec_command(command.line(sudo_password=use_password))
        if stdin:
            channel.sendall(stdin.encode())
        channel.shutdown_write()  # EOF: a command reading stdin must not wait for more
        stdout, stderr = io.BytesIO(), io.BytesIO()
        deadline, exited_at = start + command.timeout, 0.0
        while True:
            _drain(channel, stdout, stderr)
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                # sshd may send the exit status before the last of the output (seen: 1 run in 2,000 lost the
                # last line of `id -g`); the channel's EOF comes after all of it. A child left running in the
                # background can hold the output open, so the EOF is awaited only briefly.
                exited_at = exited_at or time.monotonic()
                if channel.eof_received or channel.closed or time.monotonic() - exited_at > EOF_AFTER_EXIT_S:
                    _drain(channel, stdout, stderr)
                    break
            if time.monotonic() > deadline:
                channel.close()
                stderr.write(f"\n(timed out after {command.timeout:.0f} s)".encode())
                return Result(command, -1, _text(stdout), _text(stderr), time.monotonic() - start, timed_out=True)
            if channel.closed and not channel.exit_status_ready():
                raise EOFError("channel closed before the command finished")
            time.sleep(0.002)
        code = channel.recv_exit_status()
        channel.close()
        if code == -1:  # paramiko's value for a channel that closed without an exit status
            raise EOFError("the connection closed before the command finished")
        return Result(command, code, _text(stdout), _text(stderr), time.monotonic() - start)

    def hold(self, command: Command, first_line_timeout: float = 30.0) -> tuple[str, Held]:
        """Start a command whose life is this handle's: its stdin (`command.stdin` first) stays open until the
        handle is released, or the connection is lost (this process killed included), and then it ends. Returns
        its first line of output, its answer, with the handle. For what must not outlive this run: a lock.
        The channel runs on a connection of its own, which reconnect() and close() leave alone: they end their
        connection's channels, and serve's stop of every node (a reconnect) let its lock go as its Ray phase began,
        so a second serve or up ran beside it."""
        import paramiko

        conn = self._open_with_retries()
        try:
            channel = conn.transport.open_session()
            channel.settimeout(1.0)
            channel.exec_command(command.line())
            if command.stdin:
                channel.sendall(command.stdin.encode())
            held = Held(channel, conn)
        except (paramiko.SSHException, OSError, EOFError) as e:
            conn.close()
            raise self._unreachable(f"{self.host.address} dropped off while starting {command.label()}: {e}",
                                    _reachability_fix(self.host)) from None
        line, deadline = b"", time.monotonic() + first_line_timeout
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            try:
                byte = channel.recv(1)  # what it printed before it exited is still read: EOF comes after it
            except TimeoutError:
                continue
            except (paramiko.SSHException, OSError) as e:
                held.release()
                raise self._unreachable(f"{self.host.address} dropped off while running {command.label()}: {e}",
                                        _reachability_fix(self.host)) from None
            if not byte:
                break
            line += byte
        if not line.endswith(b"\n"):  # ended or silent: its stderr says why
            errors = channel.recv_stderr(4096).decode(errors="replace").strip() if channel.recv_stderr_ready() else ""
            held.release()
            return errors or "(no answer)", held
        return line.decode(errors="replace").strip(), held

    # ---- files -------------------------------------------------------------------------------------
    def sftp(self) -> paramiko.SFTPClient:
        conn = self._connect()
        with self._lock:
            if self._sftp is None:
                self._sftp = conn.client.open_sftp()  # a channel on the same connection, not a second login
            return self._sftp

    def read_file(self, path: str) -> bytes | None:
        """A remote file's bytes, or None when it does not exist. `path` must be absolute."""
        import paramiko

        try:
            with self.sftp().open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except PermissionError:
            raise
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise self._unreachable(f"{self.host.address} dropped off while reading {path}: {e}",
                              _reachability_fix(self.host)) from None

    def write_file_atomic(self, path: str, content: bytes, mode: int) -> None:
        """Write as the login user: a temp file beside the target, chmod, then rename over it, so a reader
        never sees a half-written file and an interrupted write leaves the old one intact."""
        tmp = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.{os.urandom(4).hex()}.tmp")
        sftp = self.sftp()
        try:
            with sftp.open(tmp, "wb") as f:
                f.set_pipelined(True)
                f.write(content)
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, path)
        except BaseException:
            try:
                sftp.remove(tmp)
            except OSError:
                pass
            raise


def _client(known_hosts: list[Path], policy: paramiko.MissingHostKeyPolicy) -> paramiko.SSHClient:
    """A client that knows the keys in `known_hosts` and meets any other with `policy` (never adding it blindly)."""
    import paramiko

    client = paramiko.SSHClient()
    for path in known_hosts:
        client.load_host_keys(str(path))
    client.set_missing_host_key_policy(policy)
    return client


def _connect_client(client: paramiko.SSHClient, target: SshTarget, sock: _Stream) -> None:
    client.connect(
        target.hostname, target.port, target.user, sock=sock,
        key_filename=list(target.key_files) or None,  # type: ignore[arg-type]  # paramiko takes a list too
        # The inventory names the key: do not also offer every agent and default key.
        look_for_keys=not target.only_key_files, allow_agent=not target.only_key_files,
        timeout=target.connect_timeout,
    )


def _stream(target: SshTarget, known_hosts: list[Path], hops: list[paramiko.SSHClient]) -> _Stream:
    """What the SSH session to `target` runs over: a TCP connection; ProxyCommand's pipes; or, through each
    ProxyJump hop in turn (its host key verified as strictly as the target's), a channel from the last hop. The
    hops' clients go into `hops`, for the caller to close."""
    import paramiko

    if target.proxy_command:
        return paramiko.ProxyCommand(target.proxy_command)
    if not target.proxy_jump:
        return _direct_socket(target.hostname, target.port, target.connect_timeout)
    first = target.proxy_jump[0]
    sock: _Stream = _direct_socket(first.hostname, first.port, target.connect_timeout)
    for hop, after in zip(target.proxy_jump, [*target.proxy_jump[1:], target]):
        client = _client(known_hosts + [p for p in hop.known_hosts if p not in known_hosts], paramiko.RejectPolicy())
        hops.append(client)
        _connect_client(client, hop, sock)
        transport = client.get_transport()
        assert transport is not None  # connected just above
        sock = transport.open_channel("direct-tcpip", (after.hostname, after.port), ("", 0),
                                      timeout=target.connect_timeout)
    return sock


def _direct_socket(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection to the node with Nagle's algorithm off (see _bound): the key exchange and login are small
    packets each way too, 68 ms -> 29 ms here."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _bound(conn: _Connection) -> None:
    """SSH keepalives, and the kernel's bound on unanswered bytes (deadlines.py): a control connection whose
    node went silent is dropped within the stall bound, so a run waiting on it fails that node (Unreachable)
    instead of waiting for the kernel's two hours, and the node's sshd ends the session (its locks go with it).
    And TCP_NODELAY, as OpenSSH sets it: an exec is a few small packets each way, and with Nagle's algorithm
    the next one waits for the peer's delayed ACK (40 ms on Linux). `true` took 48 ms a round trip, 4.6 ms
    without (paramiko leaves Nagle on)."""
    stall = stall_seconds()
    conn.transport.set_keepalive(int(keepalive_interval(stall)))
    sock = conn.transport.sock
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        bound_socket(sock, stall)


def sha256_fingerprint(key: paramiko.PKey) -> str:
    """`SHA256:...` as ssh and `ssh-keygen -lf` print it (base64 of the key blob's sha256, unpadded)."""
    import hashlib  # after connecting: hashlib's OpenSSL binding is no part of the start

    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _drain(channel: paramiko.Channel, stdout: io.BytesIO, stderr: io.BytesIO) -> None:
    while channel.recv_ready():
        stdout.write(channel.recv(65536))
    while channel.recv_stderr_ready():
        stderr.write(channel.recv_stderr(65536))


def _text(buf: io.BytesIO) -> str:
    return buf.getvalue().decode(errors="replace")


def _known_hosts_files(target: SshTarget, host: Host) -> list[Path]:
    candidates = [Path.home() / ".ssh" / "known_hosts", *target.known_hosts]
    if host.known_hosts:
        candidates.append(Path(host.known_hosts))
    return [p for p in candidates if p.is_file()]


def known_hosts_name(host: Host) -> str:
    """The name a host's key is recorded under: `[address]:port` off port 22, as OpenSSH and paramiko write it."""
    return host.address if host.port == 22 else f"[{host.address}]:{host.port}"


def trusted_keys_file(host: Host) -> Path:
    return Path(host.known_hosts) if host.known_hosts else Path.home() / ".ssh" / "known_hosts"


def _changed_key_fix(host: Host, files: list[Path]) -> str:
    """Names the files that hold the old key, so the removal hits the entry that is read, not only ~/.ssh's."""
    name = known_hosts_name(host)
    holding = [f for f in files if _has_entry(f, name)] or [trusted_keys_file(host)]
    removals = "; ".join(f"ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(str(f))}" for f in holding)
    return (f"if the host was re-installed, remove its old key: {removals}; then check the new fingerprint and "
            "connect once with --trust-new-host-keys")


def _has_entry(path: Path, name: str) -> bool:
    import paramiko

    try:
        return paramiko.HostKeys(str(path)).lookup(name) is not None
    except (OSError, paramiko.SSHException, ValueError):
        return False


def _reachability_fix(host: Host) -> str:
    return f"check that {host.address} is powered on and reachable: ssh -p {host.port} {host.address} true"



def remote_path(path: str) -> str:
    """`~/x` -> `x`: SFTP resolves relative paths in the login user's home, on the remote host itself."""
    return path[2:] if path.startswith("~/") else path


def ssh_destination(host: Host) -> str:
    """`user@address` as the OpenSSH client needs it (without a user it would log in as the local one)."""
    return f"{host.user}@{host.address}" if host.user else host.address


def openssh_argv(host: Host) -> list[str]:
    """The OpenSSH client command (without the destination) for bulk copies from this machine: the same key
    and known_hosts as the paramiko connection, strict host keys, AES-GCM, no compression."""
    known = [str(Path.home() / ".ssh" / "known_hosts")] + ([host.known_hosts] if host.known_hosts else [])
    argv = ["ssh", "-p", str(host.port), *STRICT_SSH,
            "-o", f"UserKnownHostsFile={' '.join(known)}", "-o", "Compression=no", "-c", "aes128-gcm@openssh.com",
            *server_alive_options(stall_seconds())]
    if host.key:
        argv += ["-i", host.key, "-o", "IdentitiesOnly=yes"]
    return argv
