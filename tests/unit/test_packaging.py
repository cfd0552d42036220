"""What an installed wheel must carry: the simulator's host files and the example inventories."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True)
    return zipfile.ZipFile(next(out.glob("sparkcluster-*.whl")))


def test_wheel_ships_host_files_and_inventories(wheel):
    names = set(wheel.namelist())
    for host_file in ("boot.sh", "sshd_config", "nvidia-smi", "ibdev2netdev", "ethtool",
                      "nvidia-container-runtime-hook", "runc-capfilter"):
        assert f"sparkcluster/sim/host/{host_file}" in names
    assert "sparkcluster/inventories/two-sparks.yml" in names
    assert "sparkcluster/inventories/four-sparks-switch.yml" in names
    # the monitor wing's alert and recording rules (monitor up writes them beside Prometheus' configuration)
    assert "sparkcluster/monitor/rules/sparkcluster-alerts.yml" in names
    assert "sparkcluster/monitor/rules/sparkcluster-recording.yml" in names
    assert "sparkcluster/monitor/dashboards/sparkcluster.json" in names
    assert "sparkcluster/nccl/tuner/sizes_tuner.c" in names  # verify --tune builds it on each node


def test_wheel_declares_the_console_script(wheel):
    entry_points = next(n for n in wheel.namelist() if n.endswith("entry_points.txt"))
    assert "sparkcluster = sparkcluster.cli:run" in wheel.read(entry_points).decode()
