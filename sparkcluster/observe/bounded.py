"""One HTTP request whose whole answer is bounded in time and in bytes: every read `status`, `top`, serve's readiness
and observe make of an endpoint goes through `request`.

A socket timeout bounds each read, not the request: a server that sends its headers and then a byte every 2 s (or a
body that never ends) held `status` and `top` for as long as it liked, and an endless /health body ran `status` out
of memory (2.2 GB). Here every receive waits only for what is left of one deadline taken when the request starts
(connect, headers and body together), and the body is read to a cap: past either, the answer is an error that says
which bound it met. No redirect is followed and no proxy is used: these are reads of the cluster's own servers.
"""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Answer:
    """What came back: the status and the whole body, or status 0 and why there is no whole answer."""

    status: int  # 0: no whole answer (nothing answered, not within the deadline, a body past the cap)
    body: bytes = b""
    error: str | None = None  # without the address: callers name it as they name the endpoint

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


def request(url: str, *, timeout_s: float, limit_bytes: int, data: bytes | None = None,
            headers: Mapping[str, str] | None = None) -> Answer:
    """GET `url` (POST `data` where given), the answer whole within `timeout_s` from now and `limit_bytes` of body at
    most. Never raises: every failure is the answer's error."""
    deadline = time.monotonic() + timeout_s
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        return Answer(0, error="the address's port is not a number")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return Answer(0, error="the address is not http(s)://HOST[:PORT]/...")
    if parts.username is not None:  # --url refuses one before this (observe/endpoint.py); nothing else gives one
        return Answer(0, error="the address holds a user or password, which is sent nowhere")
    sent = dict(headers or {})
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname, port, timeout=timeout_s)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connected: socket.socket | None = None
    try:
        connection.connect()
        connected = connection.sock
        cast(Any, connection).sock = _DeadlineSocket(connected, deadline)  # http.client takes any such object
        connection.request("POST" if data is not None else "GET", target, body=data, headers=sent)
        response = connection.getresponse()
        body = response.read(limit_bytes + 1)
    except TimeoutError:
        return Answer(0, error=f"did not answer within {timeout_s:g} s")
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Answer(0, error=f"did not answer: {_reason(e)}")
    finally:
        connection.close()
        if connected is not None:
            connected.close()
    if len(body) > limit_bytes:
        return Answer(0, error=f"sent more than {_size(limit_bytes)}; read no further")
    return Answer(response.status, body)


class _DeadlineSocket:
    """The connected socket as http.client uses it (sendall, makefile, close), each receive and send given only
    what is left of the request's deadline."""

    def __init__(self, sock: socket.socket | ssl.SSLSocket, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline

    def _left(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's deadline passed")
        self.sock.settimeout(left)

    def sendall(self, data: Any) -> None:
        self._left()
        self.sock.sendall(data)

    def recv_into(self, buffer: Any) -> int:
        self._left()
        return self.sock.recv_into(buffer)

    def makefile(self, mode: str = "rb", *args: object, **kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_Receiver(self))

    def close(self) -> None:
        """Nothing: http.client closes the connection as soon as it has read the headers of an answer that ends
        it, while the body is still to be read from the socket; `request` closes the socket once it has the body."""


class _Receiver(io.RawIOBase):
    """The raw stream under the response's buffered reader: every read a receive against the deadline."""

    def __init__(self, sock: _DeadlineSocket) -> None:
        super().__init__()
        self.sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self.sock.recv_into(buffer)


def _reason(error: BaseException) -> str:
    return str(getattr(error, "reason", None) or error) or type(error).__name__


def _size(limit: int) -> str:
    return f"{limit >> 20} MiB" if limit >= 1 << 20 and limit % (1 << 20) == 0 else f"{limit} bytes"
