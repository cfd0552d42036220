"""The control connection runs with Nagle's algorithm off from its first byte (engine/transport.py): every exec is a
few small packets each way, and with Nagle on each waited on the peer's delayed ACK, 40 ms a round trip."""

from __future__ import annotations

import socket

from sparkcluster.engine.transport import _direct_socket


def test_the_socket_to_a_node_has_tcp_nodelay_before_the_handshake() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        sock = _direct_socket("127.0.0.1", server.getsockname()[1], 5)
        try:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            assert sock.getpeername() == server.getsockname()
        finally:
            sock.close()
