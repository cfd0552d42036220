"""Issue 39 (round 5, T3): `SPARKCLUSTER_STALL_S` of 24.9 days or more crashed every connecting command, as
TCP_USER_TIMEOUT (milliseconds, a C int) overflowed. The bound is held at what the kernel option can carry."""

from __future__ import annotations

import socket

import pytest

from sparkcluster.engine import deadlines
from sparkcluster.engine.deadlines import MAX_STALL_S, STALL_ENV, bound_socket, stall_seconds


@pytest.mark.parametrize("value", ["2147484", "3e6", "1e308", "1.7976931348623157e308"])
def test_a_huge_stall_is_held_at_the_largest_the_kernel_takes(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    # Failed before: TypeError (setsockopt's bytes form) for 2147484 and 3e6; OverflowError for 1e308.
    monkeypatch.setenv(STALL_ENV, value)
    stall = stall_seconds()
    assert stall == MAX_STALL_S
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        bound_socket(sock, stall)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == int(MAX_STALL_S * 1000)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1


@pytest.mark.parametrize("stall", [3e6, 1e308, float("inf")])
def test_a_socket_is_bounded_whatever_stall_it_is_given(stall: float) -> None:
    # Failed before: bound_socket itself overflowed on a value that did not come through stall_seconds.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        bound_socket(sock, stall)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == int(MAX_STALL_S * 1000)


def test_the_bound_is_the_largest_tcp_user_timeout_and_is_documented() -> None:
    assert MAX_STALL_S * 1000 <= 2**31 - 1 < (MAX_STALL_S + 1) * 1000
    assert "24.8 days" in (deadlines.__doc__ or "")


@pytest.mark.parametrize("value", ["60", "2147483", "0.5"])
def test_ordinary_values_are_unchanged(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(STALL_ENV, value)
    assert stall_seconds() == max(1.0, float(value))
