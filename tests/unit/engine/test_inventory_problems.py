"""Every problem of an inventory in one run, each with its file:line, exit 2 before any connection: the `fabric:`
settings included (they used to pass the load and fail after connecting, or pass outright)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine.inventory import load_inventory
from tests.support.inventory import problems

THREE_PROBLEMS = """\
name: lab
vars:
  fabric:
    subnets: [10.10.0.0/24, 10.10.0.128/25]
    mtu: 90000
hosts:
  spark-1: {address: 192.168.1.50, role: head}
  spark-2: {address: 192.168.1.51, port: 70000}
"""


def test_three_problems_are_all_named_with_their_lines(tmp_path: Path) -> None:
    # Before: only the port was reported; the overlap failed after connecting, and MTU 90000 passed.
    assert problems(tmp_path, THREE_PROBLEMS) == [
        "4: fabric.subnets 10.10.0.0/24 and 10.10.0.128/25 overlap: each twin needs a subnet of its own",
        "5: fabric.mtu must be a whole number from 1280 to 9216, not 90000",
        "8: port must be a port number from 1 to 65535, not 70000",
    ]


def test_bootstrap_exits_2_naming_all_three_before_connecting(tmp_path: Path, no_connection: None,
                                                               capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "inv.yml"
    path.write_text(THREE_PROBLEMS)
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    assert cli.main(["bootstrap", str(path)]) == 2
    err = capsys.readouterr().err
    for line, what in ((4, "overlap"), (5, "fabric.mtu"), (8, "port must be")):
        assert f"{path}:{line}: " in err and what in err, err
    assert err.count("fix:") == 3


@pytest.mark.parametrize("fabric, line, message", [
    ("{topology: mesh}", 3, "fabric.topology must be one of auto, pair, switch, ring, not 'mesh'"),
    ("{subnets: [10.0.0.0/24]}", 3, "fabric.subnets must list two IPv4 networks, not a list"),
    ("{subnets: [10.0.0.1/24, 10.0.1.0/24]}", 3, "fabric.subnets: '10.0.0.1/24' is not an IPv4 network: 10.0.0.1/24 has host bits set"),
    ("{subnets: [10.0.0.0/31, 10.0.1.0/24]}", 3, "fabric.subnets: 10.0.0.0/31 holds no two nodes"),
    ("{mtu: nine}", 3, "fabric.mtu must be a whole number from 1280 to 9216, not 'nine'"),
    ("{confirm_timeout: 2}", 3, "fabric.confirm_timeout must be 5 to 600 seconds, not 2"),
    ("{subnet: [10.0.0.0/24, 10.0.1.0/24]}", 3, "fabric: unknown key 'subnet' (did you mean 'subnets'?)"),
    ("[10.0.0.0/24]", 3, "fabric must be a mapping of topology, subnets, mtu, confirm_timeout, control_plane, "
                         "node_subnet, not a list"),
    ("{control_plane: wifi}", 3, "fabric.control_plane must be routed or lan, not 'wifi'"),
    ("{node_subnet: 10.177.0.1/24}", 3, "fabric.node_subnet: '10.177.0.1/24' is not an IPv4 network: 10.177.0.1/24 "
                                        "has host bits set"),
    ("{node_subnet: 10.177.0.0/28}", 3, "fabric.node_subnet: 10.177.0.0/28 is too small (node numbers start at .11)"),
    # The default link subnets run 192.168.177.0/24, .178, then a ring's further cables .179, .180 ...
    ("{node_subnet: 192.168.180.0/24}", 3, "fabric.node_subnet 192.168.180.0/24 overlaps the link subnet "
                                           "192.168.180.0/24"),
    ("{subnets: [10.0.0.0/24, 10.0.1.0/24], node_subnet: 10.0.4.0/24}", 3,
     "fabric.node_subnet 10.0.4.0/24 overlaps the link subnet 10.0.4.0/24"),
])
def test_each_fabric_setting_is_checked_at_its_line(tmp_path: Path, fabric: str, line: int, message: str) -> None:
    text = f"vars:\n  x: 1\n  fabric: {fabric}\nhosts:\n  spark-1: {{address: 192.168.1.50, role: head}}\n"
    assert problems(tmp_path, text) == [f"{line}: {message}"]


def test_a_valid_fabric_and_a_host_level_override_load(tmp_path: Path) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("vars:\n  fabric: {topology: ring, subnets: [10.0.0.0/24, 10.0.1.0/24], mtu: 9000, "
                    "confirm_timeout: 30, control_plane: lan, node_subnet: 10.99.0.0/24}\nhosts:\n  spark-1: {address: 192.168.1.50, role: head, "
                    "vars: {fabric: {mtu: 1500}}}\n")
    inventory = load_inventory(path, check_files=False)
    assert inventory.vars["fabric"]["topology"] == "ring" and inventory.hosts[0].vars["fabric"]["mtu"] == 1500


def test_problems_of_several_hosts_and_groups_are_all_reported(tmp_path: Path) -> None:
    text = ("groups:\n  all: {}\n  g: {hosts: [spark-9]}\nhosts:\n  spark-1: {address: 192.168.1.50, role: head, "
            "bogus: 1}\n  spark-2: {port: 22}\n")
    found = problems(tmp_path, text)
    assert [p.split(":")[0] for p in found] == ["2", "3", "5", "6"], found
    assert "reserved" in found[0] and "spark-9" in found[1] and "'bogus'" in found[2] and "no address" in found[3]


def test_status_of_the_host_runtime_without_python_env_goes_on_to_connect(
        tmp_path: Path, no_connection: None, capsys: pytest.CaptureFixture[str]) -> None:
    """Only what starts an engine needs python_env (issue 46): status connects, here to no_connection's refusal."""
    path = tmp_path / "inv.yml"
    path.write_text("hosts:\n  spark-1: {address: 192.168.1.50, role: head}\n")
    for json_flag in ([], ["--json"]):
        with pytest.raises(AssertionError, match="connected"):
            cli.main(["status", "-i", str(path), "--runtime", "host", *json_flag])
    assert "python_env" not in capsys.readouterr().err


def test_serve_and_up_of_the_host_runtime_without_python_env_are_exit_2_before_connecting(
        tmp_path: Path, no_connection: None, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "inv.yml"
    path.write_text("hosts:\n  spark-1: {address: 192.168.1.50, role: head}\n")
    # no_connection fails any attempt to connect: serve would stage the model first (exit 2 came after that).
    assert cli.main(["serve", "-i", str(path), "--runtime", "host", "--model", "Qwen/Qwen3-0.6B", "--tp", "1"]) == 2
    assert cli.main(["up", "-i", str(path), "--runtime", "host"]) == 2
    assert capsys.readouterr().err.count("the host runtime needs `python_env`") == 2
