"""What `monitor up` has Prometheus scrape, from the inventory and the serve record, and the configuration it
writes, checked by the real `promtool check config` with the rule files beside it; the command's bad input is
refused before anything connects."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkcluster.cli import main
from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.engine.inventory import Host
from sparkcluster.engine.transport import Unreachable
from sparkcluster.monitor import cli as monitor_cli
from sparkcluster.monitor.alerting import alertmanager_config
from sparkcluster.monitor.cli import resolved_addresses
from sparkcluster.monitor.config import prometheus_config
from sparkcluster.monitor.packaged import rule_paths
from sparkcluster.monitor.targets import targets_of
from sparkcluster.serving.layout import Placement
from sparkcluster.serving.record import ServeRecord, Serving

HOSTS = (Host("spark-1", "192.168.1.10", "head"), Host("spark-2", "192.168.1.11", "worker"))
ONE = ServeRecord("host", "ray", "", ("spark-1", "spark-2"),
                  Serving("Qwen/Qwen3-0.6B", "qwen", 8000, "http://192.168.1.10:8000/v1", 2))
TWO = ServeRecord("host", "native", "", ("spark-1", "spark-2"),
                  Serving("Qwen/Qwen3-0.6B", "", 8000, "http://192.168.1.10:8000/v1", 1,
                          replicas=(Placement(0, ("spark-1",), 8001), Placement(1, ("spark-2",), 8002))))


def jobs(text: str) -> dict[str, dict[str, Any]]:
    return {job["job_name"]: job for job in yaml.safe_load(text)["scrape_configs"]}


def test_a_job_per_node_and_the_engine_labelled_with_node_replica_and_model() -> None:
    targets = targets_of(HOSTS, HOSTS[0], ONE, on_head=True)
    got = jobs(prometheus_config(targets, ["rules/a.yml"]))
    assert got["sparkcluster-node"]["static_configs"] == [
        {"targets": ["192.168.1.10:9839"], "labels": {"node": "spark-1"}},
        {"targets": ["192.168.1.11:9839"], "labels": {"node": "spark-2"}}]
    assert got["sparkcluster-supervisor"]["metrics_path"] == "/supervisor"
    assert got["vllm"]["static_configs"] == [{"targets": ["192.168.1.10:8000"],
                                              "labels": {"node": "spark-1", "replica": "vLLM", "model": "qwen"}}]
    # Ray's stat logger's names (ray_vllm_*) are read as vLLM's own
    assert got["vllm"]["metric_relabel_configs"][0]["replacement"] == "vllm:${1}"
    assert "vllm-router" not in got


def test_each_replica_where_it_answers_and_the_router_on_the_heads_loopback() -> None:
    got = jobs(prometheus_config(targets_of(HOSTS, HOSTS[0], TWO, on_head=True), []))
    assert [c["targets"][0] for c in got["vllm"]["static_configs"]] == ["192.168.1.10:8001", "192.168.1.11:8002"]
    assert [c["labels"]["replica"] for c in got["vllm"]["static_configs"]] == ["replica 0", "replica 1"]
    assert got["vllm-router"]["static_configs"][0]["targets"] == ["127.0.0.1:29000"]
    # from this machine (--here) the router's loopback listener is out of reach: no job that would always be down
    assert "vllm-router" not in jobs(prometheus_config(targets_of(HOSTS, HOSTS[0], TWO, on_head=False), []))


def test_an_ssh_config_alias_is_scraped_at_its_hostname(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An inventory may name a node by an alias of ~/.ssh/config: Prometheus knows no alias, so the target is the
    HostName ssh would connect to."""
    (tmp_path / ".ssh").mkdir()
    (tmp_path / ".ssh/config").write_text("Host sparky\n  HostName 10.9.8.7\n")
    monkeypatch.setenv("HOME", str(tmp_path))
    hosts = (Host("spark-1", "sparky", "head"), Host("spark-2", "192.168.1.11", "worker"))
    addresses = resolved_addresses(hosts)
    assert addresses == {"spark-1": "10.9.8.7", "spark-2": "192.168.1.11"}
    got = jobs(prometheus_config(targets_of(hosts, hosts[0], ONE, on_head=True, addresses=addresses), []))
    assert [c["targets"] for c in got["sparkcluster-node"]["static_configs"]] == [["10.9.8.7:9839"],
                                                                                ["192.168.1.11:9839"]]
    assert got["vllm"]["static_configs"][0]["targets"] == ["10.9.8.7:8000"]


def test_nothing_served_means_the_nodes_and_the_supervisor_only() -> None:
    assert sorted(jobs(prometheus_config(targets_of(HOSTS, HOSTS[0], None, on_head=True), []))) == [
        "sparkcluster-node", "sparkcluster-supervisor"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool missing: apt-get install prometheus")
def test_promtool_accepts_the_written_configuration_with_its_rules(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    for path in rule_paths():
        shutil.copy(path, tmp_path / "rules" / path.name)
    config = tmp_path / "prometheus.yml"
    config.write_text(prometheus_config(targets_of(HOSTS, HOSTS[0], TWO, on_head=True),
                                        [f"rules/{p.name}" for p in rule_paths()]))
    done = subprocess.run(["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 2 rule files found" in done.stdout


def test_notify_points_prometheus_at_its_alertmanager_and_the_url_stays_in_its_file(tmp_path: Path) -> None:
    targets = targets_of(HOSTS, HOSTS[0], None, on_head=True)
    doc = yaml.safe_load(prometheus_config(targets, [], alertmanager="127.0.0.1:9096"))
    assert doc["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9096"]}]}]}
    assert "alerting" not in yaml.safe_load(prometheus_config(targets, []))
    url = "https://hooks.example.com/services/T000/B000/" + "XXXXSECRET"
    config = tmp_path / "alertmanager.yml"
    config.write_text(alertmanager_config(url))
    receiver = yaml.safe_load(config.read_text())["receivers"][0]
    assert receiver["webhook_configs"] == [{"url": url, "send_resolved": True}]
    if shutil.which("amtool"):  # Debian's prometheus-alertmanager
        done = subprocess.run(["amtool", "check-config", str(config)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


@pytest.mark.parametrize("argv, said", [
    (["monitor", "up", "--notify", "hooks.example.com/x"], "http:// or https:// webhook URL"),
    (["monitor", "up", "--listen", "nowhere"], "is not HOST:PORT"),
    (["monitor", "up", "--exporter-port", "70000"], "is not a port"),
    (["monitor", "status", "--listen", "127.0.0.1:0"], "is not HOST:PORT"),
])
def test_bad_flags_are_refused_before_connecting(argv: list[str], said: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert said in capsys.readouterr().err


class _NoNodeTouched:
    """A session whose head did not answer: any command on a node is a failure of the test."""

    def __init__(self) -> None:
        self.head, self.hosts = HOSTS[0], HOSTS
        self.unreachable = {"spark-1": Unreachable("192.168.1.10: connection timed out", "check its power")}

    def transport(self, host: object) -> object:
        raise AssertionError(f"{host} was reached for")

    def each(self, fn: object, hosts: object = None) -> list[object]:
        raise AssertionError("the nodes were changed")

    def __enter__(self) -> _NoNodeTouched:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def test_an_unreachable_head_stops_up_before_any_node_changes() -> None:
    args = argparse.Namespace(here=False, exporter_port=9839, notify=None, check=False, listen="127.0.0.1:9095",
                              json=True)
    with pytest.raises(SparkclusterError) as e:
        connect: Any = lambda *a, **k: _NoNodeTouched()  # noqa: E731 - the App's connect, faked
        monitor_cli.cmd_up(args, connect)
    assert e.value.exit_code == 1 and e.value.message.startswith("spark-1 (the head, where Prometheus runs)")
    assert "--here" in e.value.fix
