"""The daemon of a delayed twin (delay.py starts it inside the host's network namespace): it binds an NFQUEUE and
lets each packet through `delay` after it arrived, in order.

It speaks nfnetlink_queue itself (the kernel's netlink protocol, include/uapi/linux/netfilter/nfnetlink_queue.h:
bind a queue, receive each packet's id, answer with a verdict), so the simulator needs no library for it. Verdicts
go out in batches (one accepts every packet up to an id), which keeps up with the simulator's gloo traffic on a
loaded machine.

    ip netns exec NS python3 -m sparkcluster.sim.delayd --queue 7 --delay-us 2000
"""

from __future__ import annotations

import argparse
import collections
import errno
import signal
import socket
import struct
import sys
import time
from collections.abc import Sequence

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_CONFIG, NFQNL_MSG_VERDICT_BATCH = 0, 2, 3
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1  # the packet's id and headers' metadata, no payload: nothing to copy to user space
NFQA_CFG_F_FAIL_OPEN = 1  # a full queue accepts a packet instead of dropping it
NFQA_CFG_F_GSO = 4  # a segmentation-offload packet queued whole (up to 64 KB), not cut to the MTU first: fewer ids
NF_ACCEPT = 1
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
QUEUE_MAXLEN = 65536  # packets held at once: 2 ms of the simulator's fastest twin with room to spare
READY = "bound"  # the daemon's first line once its queue is bound: rules added before it would pass undelayed


def _attr(kind: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _message(kind: int, queue: int, attrs: bytes) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, NLM_F_REQUEST, 0, 0) + body


def config_messages(queue: int) -> list[bytes]:
    """Bind `queue`, copy no payload, hold up to QUEUE_MAXLEN packets and accept past that."""
    return [_message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND,
                                                                                socket.AF_INET))),
            _message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
                     + _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))
                     + _attr(NFQA_CFG_MASK, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))
                     + _attr(NFQA_CFG_FLAGS, struct.pack("!I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO)))]


def accept_up_to(queue: int, packet_id: int) -> bytes:
    """One verdict for every packet of `queue` up to `packet_id` (ids rise one by one across the queue)."""
    return _message(NFQNL_MSG_VERDICT_BATCH, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id)))


def packet_ids(data: bytes) -> list[int]:
    """The ids of the queued packets in one read (several netlink messages may share it)."""
    ids = []
    offset = 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            break
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at, end = offset + 20, offset + length  # past nlmsghdr and nfgenmsg
            while at + 4 <= end:
                attr_len, attr_kind = struct.unpack_from("=HH", data, at)
                if attr_len < 4:
                    break
                if attr_kind & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, at + 4)[0])
                at += attr_len + (-attr_len % 4)
        offset += length + (-length % 4)
    return ids


def serve(queue: int, delay_s: float) -> None:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    for message in config_messages(queue):
        sock.send(message)
    print(READY, flush=True)
    held: collections.deque[tuple[float, int]] = collections.deque()  # (when it may go, its id), in arrival order
    while True:
        sock.settimeout(max(0.0, held[0][0] - time.monotonic()) if held else None)
        try:
            data = sock.recv(1 << 20)
            arrived = time.monotonic()
            held.extend((arrived + delay_s, i) for i in packet_ids(data))
        except (TimeoutError, BlockingIOError):  # a timeout of 0 (a packet due now) makes the socket non-blocking
            pass
        except OSError as e:
            if e.errno != errno.ENOBUFS:  # the kernel dropped notifications: their packets wait for the next batch
                raise
        now = time.monotonic()
        last = None
        while held and held[0][0] <= now:
            last = held.popleft()[1]
        if last is not None:
            sock.send(accept_up_to(queue, last))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="let the packets of an NFQUEUE through after a delay")
    parser.add_argument("--queue", type=int, required=True)
    parser.add_argument("--delay-us", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.queue, args.delay_us / 1e6)
    return 0


if __name__ == "__main__":
    sys.exit(main())
