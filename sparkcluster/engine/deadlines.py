"""How long a network connection may stay silent before the run gives up on it, stated once.

A link that dies without a reset (a pulled cable, a port taken down) sends nothing, neither data nor an error:
a reader without a bound waits for as long as it stays down. Every connection a run holds is bounded the same
way: the SSH control connections to the nodes (keepalives, and the kernel drops the connection once they go
unanswered), the OpenSSH connections between nodes (ServerAlive), and the data connections of staging and image
sync (a read timeout, TCP keepalive and TCP_USER_TIMEOUT on both ends).

`SPARKCLUSTER_STALL_S` sets the bound in seconds (default 60); tests set a few seconds. It is at most 2147483 s
(24.8 days): TCP_USER_TIMEOUT carries it in milliseconds in a C int, so a larger value is held at that.
"""

from __future__ import annotations

import math
import os
import socket

STALL_ENV = "SPARKCLUSTER_STALL_S"
DEFAULT_STALL_S = 60.0
MIN_STALL_S = 1.0
MAX_STALL_S = float((2**31 - 1) // 1000)  # TCP_USER_TIMEOUT is a C int of milliseconds


def stall_seconds() -> float:
    """The bound in force: the environment's, else the default. A value that is not a positive number is
    ignored (the default holds) rather than turning every wait unbounded; one above MAX_STALL_S is held at it."""
    try:
        value = float(os.environ.get(STALL_ENV, ""))
    except ValueError:
        return DEFAULT_STALL_S
    return min(MAX_STALL_S, max(MIN_STALL_S, value)) if math.isfinite(value) and value > 0 else DEFAULT_STALL_S


def keepalive_interval(stall: float) -> float:
    """How often an idle connection is probed: several probes fit in the bound, at most every 15 s."""
    return max(1.0, min(15.0, stall / 4))


def bound_socket(sock: socket.socket, stall: float) -> None:
    """TCP keepalive on an idle connection, and TCP_USER_TIMEOUT on one whose sent bytes go unacknowledged:
    either way the kernel ends a connection whose peer has been silent for about `stall` seconds. Options a
    platform lacks are skipped (the read timeouts still bound the wait)."""
    stall = min(stall, MAX_STALL_S)  # every option below is a C int
    interval = int(keepalive_interval(stall))
    options = [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)]
    for name, value in (("TCP_KEEPIDLE", interval), ("TCP_KEEPINTVL", interval),
                        ("TCP_KEEPCNT", max(1, int(stall) // interval)), ("TCP_USER_TIMEOUT", int(stall * 1000))):
        if hasattr(socket, name):
            options.append((socket.IPPROTO_TCP, getattr(socket, name), value))
    for level, option, value in options:
        try:
            sock.setsockopt(level, option, value)
        except OSError:
            pass  # not a TCP socket (a unix socket from a ProxyCommand): its own peer bounds it
