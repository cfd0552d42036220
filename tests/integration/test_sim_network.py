"""The LAN is rate-limited to about 1/20 of the fabric, so traffic on the wrong interface is measurably slower."""

import json
import re
import subprocess
import time

import pytest

from tests.support.helpers import ssh

pytestmark = pytest.mark.sim

# Large enough that the LAN's floor (1.6 s at its rate) dwarfs the fixed cost of a send (an ssh round trip and a
# Python start, 0.3-0.5 s on a loaded CI machine), which the fabric's time also holds.
SEND_MB = 96


def _rate_bits(rate: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(kbit|mbit|gbit)", rate).groups()
    return float(value) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[unit]


def test_management_link_has_a_token_bucket_in_both_directions(cluster):
    inside = json.loads(ssh(cluster, "spark-1", "/usr/sbin/tc -j qdisc show dev enP7s7").stdout)
    root_end = cluster.host("spark-1").nic("enP7s7").root_end
    outside = json.loads(subprocess.run(["tc", "-j", "qdisc", "show", "dev", root_end], capture_output=True,
                                        text=True, check=True).stdout)
    for qdiscs in (inside, outside):
        assert qdiscs[0]["kind"] == "tbf"
        assert qdiscs[0]["options"]["rate"] * 8 == _rate_bits(cluster.state.lan_rate)
    fabric = json.loads(ssh(cluster, "spark-1", "/usr/sbin/tc -j qdisc show dev enp1s0f1np1").stdout)
    assert all(q["kind"] != "tbf" for q in fabric)


def _send(cluster, dest_ip: str) -> float:
    """Seconds to push SEND_MB from spark-2 to spark-1 over a plain TCP connection to dest_ip."""
    ssh(cluster, "spark-1", "nohup python3 -c \"import socket; s=socket.create_server(('0.0.0.0', 5201)); "
                            "c,_=s.accept(); [0 for _ in iter(lambda: c.recv(1<<20), b'')]\" >/dev/null 2>&1 </dev/null &")
    time.sleep(0.3)
    start = time.monotonic()
    ssh(cluster, "spark-2", f"python3 -c \"import socket; c=socket.create_connection(('{dest_ip}', 5201)); "
                            f"b=bytes(1<<20); [c.sendall(b) for _ in range({SEND_MB})]; c.shutdown(1); c.recv(1)\"")
    return time.monotonic() - start


def test_lan_cannot_beat_its_rate_but_the_fabric_can(cluster):
    """A token bucket cannot deliver more than rate*t + burst, so the lower bound on the LAN time is a
    property of the shaping, not a timing guess; the fabric must beat that same bound."""
    lan_s = _send(cluster, cluster.host("spark-1").mgmt_ip)
    floor_s = (SEND_MB * 2**20 * 8 - 256 * 1024 * 8) / _rate_bits(cluster.state.lan_rate)
    assert lan_s >= floor_s
    fabric_s = _send(cluster, cluster.host("spark-1").fabric_ips[0])
    assert fabric_s < floor_s
