"""Power-off, boot, reset and teardown of simulated hosts."""

import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest

from sparkcluster.engine.errors import UsageError
from sparkcluster.sim import SimCluster, UpOptions, netns
from tests.support.helpers import require_sim, ssh, unique_name

pytestmark = pytest.mark.sim


def test_power_off_kills_every_process_and_boot_keeps_the_disk(cluster, fresh_host):
    ssh(cluster, fresh_host, "echo kept > ~/disk-marker; nohup sleep 600 >/dev/null 2>&1 </dev/null &")
    pid1 = cluster.state.hosts[fresh_host].pid1
    cluster.power_off(fresh_host)
    assert not os.path.exists(f"/proc/{pid1}")
    assert subprocess.run(["ip", "netns", "pids", cluster.host(fresh_host).netns], capture_output=True,
                          text=True).stdout == ""
    assert ssh(cluster, fresh_host, "true", check=False).returncode == 255
    cluster.boot(fresh_host)
    assert ssh(cluster, fresh_host, "cat ~/disk-marker; pgrep -x sleep || echo no-sleep").stdout == "kept\nno-sleep\n"


KEEPER = """[Unit]
Description=sim keeper
After=network-online.target

[Service]
Type=simple
User={user}
ExecStart=/bin/sleep 1000
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
"""


def _keeper(cluster, host: str) -> dict[str, str]:
    out = ssh(cluster, host, "systemctl show -p ActiveState,MainPID,NRestarts keeper").stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_systemd_brings_an_enabled_unit_back_after_a_crash_and_a_reboot(cluster, fresh_host):
    user = cluster.state.user
    # the host's unit directory is its own: none of the real machine's units (its lower layer) show or start
    assert ssh(cluster, fresh_host, "ls -A /etc/systemd/system").stdout == ""
    unit = shlex.quote(KEEPER.format(user=user))
    ssh(cluster, fresh_host, f"printf %s {unit} | sudo tee /etc/systemd/system/keeper.service >/dev/null"
        " && sudo systemctl daemon-reload && sudo systemctl enable --now keeper")
    assert ssh(cluster, fresh_host, "systemctl is-active keeper", check=False).returncode == 0
    first = _keeper(cluster, fresh_host)
    assert first["ActiveState"] == "active" and first["NRestarts"] == "0"
    assert ssh(cluster, fresh_host, f"ps -o user=,args= -p {first['MainPID']}").stdout.split() == \
        [user, "/bin/sleep", "1000"]

    ssh(cluster, fresh_host, f"sudo kill -9 {first['MainPID']}")
    deadline = time.monotonic() + 1 + 2  # RestartSec + 2 s
    while (now := _keeper(cluster, fresh_host))["NRestarts"] != "1" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert now["ActiveState"] == "active" and now["NRestarts"] == "1" and now["MainPID"] != first["MainPID"], now

    cluster.power_off(fresh_host)
    cluster.boot(fresh_host)  # no command after it: the boot starts what is enabled
    booted = _keeper(cluster, fresh_host)
    assert booted["ActiveState"] == "active" and booted["NRestarts"] == "0", booted
    assert ssh(cluster, fresh_host, f"ps -o user= -p {booted['MainPID']}").stdout.strip() == user

    ssh(cluster, fresh_host, "sudo systemctl disable --now keeper")
    assert ssh(cluster, fresh_host, "systemctl is-active keeper", check=False).returncode == 3
    time.sleep(1.5)  # past RestartSec: a stopped unit stays stopped
    assert _keeper(cluster, fresh_host)["ActiveState"] == "inactive"
    cluster.power_off(fresh_host)
    cluster.boot(fresh_host)
    assert _keeper(cluster, fresh_host) == {"ActiveState": "inactive", "MainPID": "0", "NRestarts": "0"}
    assert "Started keeper.service - sim keeper." in ssh(cluster, fresh_host, "journalctl -u keeper").stdout


def test_reset_gives_a_fresh_disk(cluster, fresh_host):
    ssh(cluster, fresh_host, "echo gone > ~/reset-marker; sudo usermod -aG docker spark")
    cluster.reset(fresh_host)
    out = ssh(cluster, fresh_host, "test -e ~/reset-marker && echo still-there; id -nG").stdout.split()
    assert out == ["spark"]
    # the emulated hardware comes back with the fresh disk
    assert ssh(cluster, fresh_host, "nvidia-smi -L").stdout.startswith("GPU 0: NVIDIA GB10")


def test_booting_a_running_host_is_refused(cluster):
    with pytest.raises(UsageError, match="already running"):
        cluster.boot("spark-1")


def test_unknown_host_names_the_known_ones(cluster):
    with pytest.raises(UsageError, match="spark-1, spark-2, spark-3"):
        cluster.power_off("spark-9")


def _cgroup_dirs(fragment: str) -> list[str]:
    found = []
    for dirpath, dirnames, _ in os.walk("/sys/fs/cgroup"):
        found += [os.path.join(dirpath, d) for d in dirnames if fragment in d]
        if dirpath.count("/") > 6:
            dirnames.clear()
    return found


def _mounts(fragment: str) -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if fragment in line]


def test_down_leaves_nothing_behind():
    require_sim(docker=True)
    c = SimCluster.up(UpOptions(count=2, name=unique_name("down")))
    ssh(c, "spark-1", "docker version >/dev/null", user="root")  # dockerd is up, so there is something to clean
    pids = [s.unshare_pid for s in c.state.hosts.values()] + [s.pid1 for s in c.state.hosts.values()]
    names = [h.netns for h in c.topology.hosts]
    links = [*c.topology.bridges, *(n.root_end for h in c.topology.hosts for n in h.nics)]
    state_dir = c.dir
    assert set(names) <= set(netns.list_netns())
    c.down()
    assert not set(names) & set(netns.list_netns())
    assert not set(links) & set(netns.list_links())
    assert not [p for p in pids if os.path.exists(f"/proc/{p}") and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[1][:3]]
    assert not _cgroup_dirs(f"sparkcluster-{c.state.name}-")
    assert not _mounts(str(state_dir))
    assert not state_dir.exists()
