"""`sim degrade HOST TWIN --delay 2ms` (issue 40): netem where the kernel has it, else the NFQUEUE daemon of
sparkcluster/sim/delay.py, whose netlink messages are checked here against the kernel's layouts
(include/uapi/linux/netfilter/nfnetlink_queue.h)."""

from __future__ import annotations

import socket
import struct

import pytest

from sparkcluster.sim import delay, delayd
from sparkcluster.sim.netns import degrade_lines
from sparkcluster.sim.topology import HostSpec, Subnets, build_topology
from tests.support.helpers import run_cli


def spark2() -> HostSpec:
    return build_topology("t", 2, Subnets(7), ["580.95.05"]).hosts[1]


def test_a_delay_is_netem_each_way_with_the_rate_beside_it_and_a_rate_alone_stays_tbf():
    host = spark2()
    root, inside = degrade_lines(host, "enP2p1s0f1np1", None, "2ms")
    assert inside == ["qdisc replace dev enP2p1s0f1np1 root netem delay 2ms"]
    assert root == [f"qdisc replace dev {host.nic('enP2p1s0f1np1').root_end} root netem delay 2ms"]
    assert degrade_lines(host, "enP2p1s0f1np1", "1gbit", "2ms")[1] == [
        "qdisc replace dev enP2p1s0f1np1 root netem delay 2ms rate 1gbit"]
    assert degrade_lines(host, "enP2p1s0f1np1", "1gbit")[1][0].startswith("qdisc replace dev enP2p1s0f1np1 root tbf")
    assert degrade_lines(host, "enP2p1s0f1np1", None)[1] == ["qdisc del dev enP2p1s0f1np1 root"]


def packet_message(queue: int, packet_id: int) -> bytes:
    """An NFQNL_MSG_PACKET as the kernel sends it: nlmsghdr, nfgenmsg, NFQA_PACKET_HDR then another attribute."""
    attrs = struct.pack("=HH", 11, 1) + struct.pack("!IHB", packet_id, 0x0800, 3) + b"\0"  # 7 bytes, padded to 8
    attrs += struct.pack("=HH", 8, 11) + struct.pack("!I", 1500)  # NFQA_PAYLOAD-like trailer
    body = struct.pack("=BBH", socket.AF_INET, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (3 << 8) | 0, 0, 0, 0) + body


def test_the_daemon_reads_every_packet_id_of_a_read_and_accepts_up_to_one_in_a_batch():
    assert delayd.packet_ids(packet_message(7, 41) + packet_message(7, 42)) == [41, 42]
    assert delayd.packet_ids(b"") == [] and delayd.packet_ids(b"\0" * 16) == []  # a zero length stops the walk
    verdict = delayd.accept_up_to(7, 42)
    length, kind, flags = struct.unpack_from("=IHH", verdict)
    assert (length, kind, flags) == (len(verdict), (3 << 8) | 3, 1)  # NFQNL_MSG_VERDICT_BATCH, NLM_F_REQUEST
    assert struct.unpack_from("!H", verdict, 18)[0] == 7  # nfgenmsg's res_id: the queue, big-endian
    assert verdict[20:] == struct.pack("=HH", 12, 2) + struct.pack("!II", 1, 42)  # NFQA_VERDICT_HDR: NF_ACCEPT, id
    bind, params = delayd.config_messages(7)
    assert bind[20:] == struct.pack("=HH", 8, 1) + struct.pack("!BxH", 1, socket.AF_INET)  # NFQNL_CFG_CMD_BIND


def test_the_twins_packets_go_to_its_queue_both_ways_and_pass_when_no_daemon_listens():
    added = delay.rules("enP2p1s0f1np1", "-A")
    queue = str(delay.queue_of("enP2p1s0f1np1"))
    assert added == [
        ["iptables", "-w", "-t", "mangle", "-A", "OUTPUT", "-o", "enP2p1s0f1np1", "-j", "NFQUEUE", "--queue-num", queue,
         "--queue-bypass"],
        ["iptables", "-w", "-t", "mangle", "-A", "PREROUTING", "-i", "enP2p1s0f1np1", "-j", "NFQUEUE", "--queue-num",
         queue, "--queue-bypass"]]
    assert delay.queue_of("enp1s0f1np1") != delay.queue_of("enP2p1s0f1np1")


@pytest.mark.parametrize(("flags", "error"), [
    (["--clear", "--delay", "2ms"], "--clear lifts every limit: it takes no --rate or --delay"),
    ([], "sim degrade needs --rate, --delay (or both), or --clear"),
    (["--delay", "2 ms"], "invalid delay '2 ms'"),
    (["--delay", "-1ms"], "invalid delay '-1ms'"),  # a bad value, not argparse's "expected one argument"
    (["--delay", "99999999999s"], "invalid delay '99999999999s': longer than 60s"),  # not tc's "too large"
])
def test_a_bad_degrade_is_refused_before_anything_changes(flags, error):
    out = run_cli("sim", "degrade", "--name", "no-such-cluster", "spark-2", "1", *flags)
    assert out.returncode == 2 and error in out.stderr, out.stdout + out.stderr
