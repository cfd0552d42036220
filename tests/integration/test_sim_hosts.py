"""A simulated Spark looks like a Spark from the outside: names, NICs, tools, isolation, real sshd."""

import io
import re
import subprocess

import paramiko
import pytest

from tests.support.helpers import SESSION_DRIVERS, ssh

pytestmark = pytest.mark.sim


def test_each_host_has_its_hostname_and_sshd_as_pid_1(cluster):
    for i, host in enumerate(cluster.topology.hosts, start=1):
        out = ssh(cluster, host.name, "hostname; cat /etc/hostname; ps -o comm= -p 1").stdout.split()
        assert out == [f"spark-{i}", f"spark-{i}", "sshd"]


def test_interfaces_carry_spark_names_and_addresses(cluster):
    for host in cluster.topology.hosts:
        out = ssh(cluster, host.name, "ip -br -4 addr").stdout
        addrs = {m[0]: m[2] for m in re.findall(r"^(\S+?)(@\S+)?\s+\S+\s+(\S+)", out, re.M)}
        assert addrs["enP7s7"] == f"{host.mgmt_ip}/24"
        assert addrs["enp1s0f1np1"] == f"{host.fabric_ips[0]}/24"
        assert addrs["enP2p1s0f1np1"] == f"{host.fabric_ips[1]}/24"
        links = ssh(cluster, host.name, "ip -br link").stdout
        assert re.search(r"^enp1s0f0np0@\S+\s+DOWN", links, re.M)  # the uncabled port exists, down
        mtu = ssh(cluster, host.name, "cat /sys/class/net/enp1s0f1np1/mtu /sys/class/net/enP7s7/mtu").stdout.split()
        assert mtu == ["9000", "1500"]


def test_nvidia_smi_reports_a_gb10_with_each_hosts_driver(cluster):
    for host, driver in zip(cluster.topology.hosts, SESSION_DRIVERS):
        out = ssh(cluster, host.name, "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader").stdout
        assert out == f"NVIDIA GB10, {driver}\n"


def test_ibdev2netdev_shows_the_cabled_twins_up(cluster):
    out = ssh(cluster, "spark-1", "ibdev2netdev").stdout
    assert out == (
        "roceP2p1s0f0 port 1 ==> enP2p1s0f0np0 (Down)\n"
        "roceP2p1s0f1 port 1 ==> enP2p1s0f1np1 (Up)\n"
        "rocep1s0f0 port 1 ==> enp1s0f0np0 (Down)\n"
        "rocep1s0f1 port 1 ==> enp1s0f1np1 (Up)\n"
    )


def test_sysfs_infiniband_and_ethtool(cluster):
    out = ssh(cluster, "spark-1", "cat /sys/class/infiniband/rocep1s0f1/ports/1/state "
                                  "/sys/class/infiniband/rocep1s0f1/ports/1/gid_attrs/types/3 "
                                  "/sys/class/infiniband/rocep1s0f1/ports/1/gids/3; "
                                  "ls /sys/class/infiniband/rocep1s0f1/device/net").stdout.splitlines()
    ip = cluster.host("spark-1").fabric_ips[0]
    packed = "".join(f"{int(o):02x}" for o in ip.split("."))
    assert out == ["4: ACTIVE", "RoCE v2", f"0000:0000:0000:0000:0000:ffff:{packed[:4]}:{packed[4:]}", "enp1s0f1np1"]
    assert "Speed: 200000Mb/s" in ssh(cluster, "spark-1", "ethtool enp1s0f1np1").stdout
    assert "Speed: 10000Mb/s" in ssh(cluster, "spark-1", "ethtool enP7s7").stdout
    # the RDMA tree is read-only, like sysfs
    assert ssh(cluster, "spark-1", "echo x > /sys/class/infiniband/rocep1s0f1/ports/1/state", user="root",
               check=False).returncode != 0


def test_login_user_has_passwordless_sudo_but_is_not_in_the_docker_group(cluster):
    assert ssh(cluster, "spark-1", "sudo -n id -u").stdout == "0\n"
    assert "docker" not in ssh(cluster, "spark-1", "id -nG").stdout.split()


def test_host_to_host_ssh_over_both_fabric_twins(cluster):
    h2 = cluster.host("spark-2")
    for target in ("spark-2-fabric", h2.fabric_ips[0], h2.fabric_ips[1]):
        out = ssh(cluster, "spark-1", f"ssh -o BatchMode=yes {target} 'echo $SSH_CONNECTION'").stdout.split()
        assert out[2] in h2.fabric_ips  # the connection arrived on a fabric address, not the LAN


def test_jumbo_frames_cross_the_fabric(cluster):
    peer = cluster.host("spark-2").fabric_ips[0]
    assert ssh(cluster, "spark-1", f"ping -c1 -W2 -M do -s 8972 {peer}").returncode == 0


def test_disks_are_isolated_between_hosts_and_from_this_machine(cluster):
    marker = "/home/spark/isolation-marker"
    ssh(cluster, "spark-1", f"echo one > {marker}; sudo sh -c 'echo root-one > /etc/isolation-marker'")
    try:
        assert ssh(cluster, "spark-2", f"test -e {marker} || test -e /etc/isolation-marker", check=False).returncode == 1
        assert not __import__("os").path.exists("/etc/isolation-marker")
        assert (cluster.host_dir(cluster.host("spark-1")) / "upper" / marker.lstrip("/")).read_text() == "one\n"
    finally:
        ssh(cluster, "spark-1", f"rm -f {marker}; sudo rm -f /etc/isolation-marker")


def test_process_trees_are_isolated(cluster):
    ssh(cluster, "spark-1", "nohup sleep 300 >/dev/null 2>&1 </dev/null &")
    try:
        assert "sleep" not in ssh(cluster, "spark-2", "ps -eo comm=").stdout.split()
        assert "sleep" in ssh(cluster, "spark-1", "ps -eo comm=").stdout.split()
    finally:
        ssh(cluster, "spark-1", "pkill -x sleep", check=False)


def test_no_route_leaves_the_machine(cluster):
    out = ssh(cluster, "spark-1", "ip route; ip route get 1.1.1.1 2>&1 || true").stdout
    assert "default" not in out
    assert "unreachable" in out


def test_paramiko_verifies_host_keys(cluster):
    host = cluster.host("spark-1")

    def connect(known_hosts: bool) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if known_hosts:
            client.load_host_keys(str(cluster.known_hosts))
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(host.mgmt_ip, username="spark", key_filename=str(cluster.client_key), look_for_keys=False,
                       allow_agent=False, timeout=5)
        return client

    client = connect(known_hosts=True)
    _, out, _ = client.exec_command("hostname")
    assert out.read() == b"spark-1\n"
    sftp = client.open_sftp()
    sftp.putfo(io.BytesIO(b"payload\n"), "/home/spark/put-test")
    buf = io.BytesIO()
    sftp.getfo("/home/spark/put-test", buf)
    assert buf.getvalue() == b"payload\n"
    sftp.remove("/home/spark/put-test")
    client.close()
    # the same host, its key in no known_hosts, is refused
    with pytest.raises(paramiko.SSHException, match="not found in known_hosts"):
        connect(known_hosts=False)


def test_openssh_client_rejects_an_unknown_host(cluster, tmp_path):
    argv = cluster.ssh_argv("spark-1")
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv[argv.index(f"UserKnownHostsFile={cluster.known_hosts}")] = f"UserKnownHostsFile={empty}"
    result = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 255
    assert "Host key verification failed" in result.stderr
