"""Issue 39 (round 5, T2 and M2): an inventory's networks near the top of IPv4 or outside unicast, every problem of
a host (not only its first), and `min_driver` are refused at load: exit 2 with file:line, before any connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine.inventory import load_inventory

from tests.support.inventory import problems

HOSTS = """\
hosts:
  spark-1: {address: 192.168.1.50, role: head}
  spark-2: {address: 192.168.1.51}
"""


def fabric(*lines: str) -> str:
    return "vars:\n  fabric:\n" + "".join(f"    {line}\n" for line in lines) + HOSTS


# ---- T2: link subnets near the top of IPv4, or outside unicast ---------------------------------------------
def test_a_link_subnet_near_the_top_of_ipv4_is_refused_with_its_line(tmp_path: Path, no_connection: None,
                                                                     capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: AddressValueError traceback (the 14 /24s after the second subnet run past 2**32), exit 1.
    text = fabric("node_subnet: 10.177.0.0/24", "subnets: [192.168.177.0/24, 255.255.250.0/24]")
    assert problems(tmp_path, text) == [
        "4: fabric.subnets: 255.255.250.0/24 is reserved address space (240.0.0.0/4), not a network a cable can use"]
    path = tmp_path / "inv.yml"
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    assert cli.main(["facts", "-i", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:4: fabric.subnets: 255.255.250.0/24 is reserved" in err and "Traceback" not in err, err


def test_the_whole_of_ipv4_as_a_link_subnet_is_refused(tmp_path: Path) -> None:
    # Failed before: AddressValueError traceback.
    assert problems(tmp_path, fabric("node_subnet: 10.177.0.0/24", "subnets: [192.168.177.0/24, 0.0.0.0/0]")) == [
        "4: fabric.subnets: 0.0.0.0/0 takes in 'this network' address space (0.0.0.0/8), not a network a cable can "
        "use"]


def test_a_link_subnet_high_in_unicast_space_still_loads(tmp_path: Path) -> None:
    # The ring's further subnets after 223.255.250.0/24 leave unicast space: the clash check stops at IPv4's end.
    path = tmp_path / "inv.yml"
    path.write_text(fabric("node_subnet: 10.177.0.0/24", "subnets: [192.168.177.0/24, 223.255.250.0/24]"))
    assert len(load_inventory(path, check_files=False).hosts) == 2


@pytest.mark.parametrize(("network", "why"), [("127.0.0.0/8", "loopback"), ("224.0.0.0/24", "multicast"),
                                              ("0.0.0.0/0", "'this network'")])
def test_a_node_subnet_that_is_no_unicast_network_is_refused(tmp_path: Path, network: str, why: str) -> None:
    # Failed before: 127.0.0.0/8 (loopback as the node subnet) loaded without a word.
    found = problems(tmp_path, fabric(f"node_subnet: {network}"))
    assert len(found) == 1 and found[0].startswith(f"3: fabric.node_subnet: {network} ") and why in found[0], found


# ---- M2: every problem of a host, and min_driver -----------------------------------------------------------
def test_every_problem_of_a_host_is_reported(tmp_path: Path) -> None:
    # Failed before: the address only; the ports were reported once the addresses were fixed.
    text = """\
hosts:
  s1: {address: 192.168.1.50, role: head}
  s2: {address: "$(id)", port: 70000}
  s4: {address: "host name", port: "22x", user: "Bad User"}
"""
    assert problems(tmp_path, text) == [
        "3: address '$(id)' is not an IP address or host name",
        "3: port must be a port number from 1 to 65535, not 70000",
        "4: address 'host name' is not an IP address or host name",
        "4: port must be a port number from 1 to 65535, not '22x'",
        "4: user 'Bad User' is not a valid user name",
    ]


@pytest.mark.parametrize("where", ["vars", "host", "group"])
def test_an_unreadable_min_driver_is_refused_at_load(tmp_path: Path, where: str) -> None:
    # Failed before: accepted at load; preflight refused it only once connected, as a failed step on every node.
    at = {"vars": 'vars: {min_driver: "abc"}\n' + HOSTS,
          "host": "hosts:\n  spark-1: {address: 192.168.1.50, role: head, vars: {min_driver: abc}}\n",
          "group": HOSTS + "groups:\n  rack: {hosts: [spark-2], vars: {min_driver: \"590.x\"}}\n"}[where]
    found = problems(tmp_path, at)
    assert len(found) == 1 and "min_driver must be an NVIDIA driver version such as \"590.44\"" in found[0], found
    line = {"vars": 1, "host": 2, "group": 5}[where]
    assert found[0].startswith(f"{line}: "), found


def test_a_min_driver_written_as_a_number_is_refused_for_its_lost_zeros(tmp_path: Path) -> None:
    # YAML reads 590.40 as the number 590.4, a lower floor than the driver 590.40 the user meant.
    found = problems(tmp_path, "vars: {min_driver: 590.40}\n" + HOSTS)
    assert found == ["1: min_driver must be an NVIDIA driver version such as \"590.44\", in quotes, not the number "
                     "590.4 (YAML drops a version's trailing zeros)"]


@pytest.mark.parametrize("version", ['"590.44"', '"580.95.05"', "'590'", "590"])
def test_a_readable_min_driver_loads(tmp_path: Path, version: str) -> None:
    path = tmp_path / "inv.yml"
    path.write_text(f"vars: {{min_driver: {version}}}\n" + HOSTS)
    assert str(load_inventory(path, check_files=False).vars["min_driver"]) == version.strip("'\"")


def test_min_driver_is_checked_in_an_ansible_inventory_too(tmp_path: Path) -> None:
    text = """\
all:
  vars:
    min_driver: latest
  children:
    head:
      hosts:
        spark-1: {ansible_host: 192.168.1.50}
"""
    found = problems(tmp_path, text)
    assert len(found) == 1 and found[0].startswith("3: min_driver must be an NVIDIA driver version"), found


@pytest.mark.parametrize("typed", [["--min-driver", "abc"], ["-e", "min_driver=590.x"]])
def test_a_driver_floor_typed_on_the_command_line_is_checked_before_connecting(
        tmp_path: Path, typed: list[str], no_connection: None, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: accepted, then every node failed preflight with "invalid minimum driver version".
    path = tmp_path / "inv.yml"
    path.write_text(HOSTS)
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    command = ["bootstrap", str(path)] if typed[0] == "--min-driver" else ["run", "playbooks/bootstrap.yml", "-i", str(path)]
    assert cli.main([*command, *typed]) == 2
    err = capsys.readouterr().err
    assert "is not an NVIDIA driver version" in err and "590.44" in err and "Traceback" not in err, err
