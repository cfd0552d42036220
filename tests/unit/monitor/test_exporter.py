"""The node exporter: each reading sparkcluster already takes, rendered as Prometheus series, from a node made of
files (tests/support/monitor.py: captured nvidia-smi and kernel-log outputs, a sysfs tree, the supervisor's
files), read back with the Prometheus reader top uses, and served over real HTTP on loopback."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkcluster.monitor.exporter import ExporterServer
from sparkcluster.monitor.exposition import Family, render
from sparkcluster.observe.prometheus import Scrape, parse
from sparkcluster.serving.incidents import Action, Incident, Outcome, Seen, SupervisorState, WatchState
from tests.support.monitor import GPU_HOT, SECRET, FakeNode, incident, write_file


def value(scrape: Scrape, name: str, **labels: str) -> float | None:
    found = [s.value for s in scrape.samples if s.name == name and all(dict(s.labels).get(k) == v
                                                                         for k, v in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


@pytest.fixture
def node(tmp_path: Path) -> FakeNode:
    return FakeNode(tmp_path)


def scrape_of(node: FakeNode) -> Scrape:
    text = render(node.collector().node())
    scrape = parse(text)
    assert scrape.skipped == 0, text
    return scrape


def test_gpu_telemetry_and_each_reason(node: FakeNode) -> None:
    node.gpu = GPU_HOT  # 92 C, 95.03 W, SM 1534 MHz, 0x40: hw_thermal_slowdown
    s = scrape_of(node)
    assert value(s, "sparkcluster_gpu_telemetry_up") == 1
    assert value(s, "sparkcluster_gpu_temperature_celsius") == 92
    assert value(s, "sparkcluster_gpu_power_watts") == 95.03
    assert value(s, "sparkcluster_gpu_sm_clock_hertz") == 1534e6
    assert value(s, "sparkcluster_gpu_clock_event", reason="hw_thermal_slowdown", throttle="1") == 1
    assert value(s, "sparkcluster_gpu_clock_event", reason="gpu_idle", throttle="0") == 0
    assert value(s, "sparkcluster_gpu_throttled") == 1


def test_a_gpu_that_does_not_answer_is_unknown_not_zero(node: FakeNode) -> None:
    node.gpu, node.gpu_rc = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver", 9
    s = scrape_of(node)
    assert value(s, "sparkcluster_gpu_telemetry_up") == 0
    assert value(s, "sparkcluster_gpu_temperature_celsius") is None
    assert value(s, "sparkcluster_gpu_throttled") is None


def test_unified_memory_and_cma(node: FakeNode) -> None:
    s = scrape_of(node)
    assert value(s, "sparkcluster_memory_total_bytes") == 125513484 * 1024
    assert value(s, "sparkcluster_memory_available_bytes") == 110000000 * 1024
    assert value(s, "sparkcluster_cma_total_bytes") == 65536 * 1024
    assert value(s, "sparkcluster_cma_free_bytes") == 32768 * 1024


def test_kernel_log_events_by_kind_and_xid_by_number(node: FakeNode) -> None:
    s = scrape_of(node)
    assert value(s, "sparkcluster_kernel_log_readable") == 1
    assert value(s, "sparkcluster_kernel_events_total", kind="xid") == 4
    assert value(s, "sparkcluster_kernel_events_total", kind="nv-no-memory") == 2
    assert value(s, "sparkcluster_kernel_events_total", kind="mlx5-timeout") == 2  # both of its lines, as doctor counts
    assert value(s, "sparkcluster_kernel_events_total", kind="oom-kill") is not None
    assert value(s, "sparkcluster_kernel_xid_total", xid="13") == 2
    assert value(s, "sparkcluster_kernel_xid_total", xid="79") == 1


def test_a_clean_kernel_log_still_shows_every_kind_at_zero(node: FakeNode) -> None:
    """A first Xid must be an increase of a series Prometheus already has, or no alert can see it rise."""
    node.journal = "2026-11-27T09:58:03+00:00 spark-2 kernel: mlx5_core 0000:01:00.0: firmware version: 28.45.1200\n"
    s = scrape_of(node)
    for kind in ("xid", "nv-no-memory", "mlx5-timeout", "aer", "oom-kill"):
        assert value(s, "sparkcluster_kernel_events_total", kind=kind) == 0


def test_the_kernel_log_is_read_once_a_minute_not_per_scrape(node: FakeNode) -> None:
    clock = [0.0]
    collector = node.collector(clock)
    collector.node()
    clock[0] = 30.0
    collector.node()
    assert sum("journalctl" in c for c in node.shell_calls) == 1
    node.journal += "2026-11-27T12:00:00+00:00 spark-2 kernel: NVRM: Xid (PCI:000f:01:00): 79, GPU has fallen off the bus.\n"
    clock[0] = 61.0
    s = parse(render(collector.node()))
    assert sum("journalctl" in c for c in node.shell_calls) == 2
    assert value(s, "sparkcluster_kernel_xid_total", xid="79") == 2


def test_qsfp_twins_state_speed_and_roce_counters(node: FakeNode) -> None:
    s = scrape_of(node)
    lit = {"netdev": "enp1s0f1np1", "hca": "rocep1s0f1", "port": "1"}
    dark = {"netdev": "enp1s0f0np0", "hca": "rocep1s0f0", "port": "0"}
    assert value(s, "sparkcluster_qsfp_up", **lit) == 1 and value(s, "sparkcluster_qsfp_used", **lit) == 1
    assert value(s, "sparkcluster_qsfp_speed_mbps", **lit) == 200000
    assert value(s, "sparkcluster_qsfp_expected_speed_mbps", **lit) == 200000
    assert value(s, "sparkcluster_qsfp_up", **dark) == 0 and value(s, "sparkcluster_qsfp_used", **dark) == 0
    assert value(s, "sparkcluster_qsfp_speed_mbps", **dark) is None  # no link: unknown, not 0
    assert value(s, "sparkcluster_roce_bytes_total", direction="transmit", **lit) == 4000  # 4-octet words
    assert value(s, "sparkcluster_roce_packets_total", direction="receive", **lit) == 20
    assert value(s, "sparkcluster_roce_errors_total", counter="out_of_buffer", **lit) == 0
    assert value(s, "sparkcluster_roce_congestion_total", counter="np_cnp_sent", **lit) == 3
    assert value(s, "sparkcluster_qsfp_up", netdev="lo") is None


def test_a_twins_speed_is_ethtools_as_the_facts_probe_reads_it(node: FakeNode) -> None:
    """The simulator's twins are veths (sysfs: 10000) with an emulated ethtool: the facts' rule, ethtool first."""
    node.ethtool = {"enp1s0f1np1": "100000Mb/s", "enP2p1s0f1np1": "Unknown!"}
    s = scrape_of(node)
    assert value(s, "sparkcluster_qsfp_speed_mbps", netdev="enp1s0f1np1", hca="rocep1s0f1", port="1") == 100000
    assert value(s, "sparkcluster_qsfp_speed_mbps", netdev="enP2p1s0f1np1", hca="roceP2p1s0f1", port="1") == 200000
    assert not any("enp1s0f0np0" in c for c in node.shell_calls if "ethtool" in c)  # a down twin: no ethtool


def test_hf_cache_disk_and_last_verify(node: FakeNode) -> None:
    s = scrape_of(node)
    free, size = value(s, "sparkcluster_hf_cache_free_bytes"), value(s, "sparkcluster_hf_cache_size_bytes")
    assert free is not None and size is not None and 0 < free <= size
    assert value(s, "sparkcluster_verify_pass", backend="nccl") == 1
    assert value(s, "sparkcluster_verify_busbw_bytes_per_second", group="all") == 21.4e9
    assert value(s, "sparkcluster_verify_busbw_bytes_per_second", group="link",
                 link="spark-1:enp1s0f1np1 <-> spark-2:enp1s0f1np1") == 11.2e9
    assert value(s, "sparkcluster_verify_latency_seconds", group="all", size_bytes="8192") == pytest.approx(35.5e-6)
    assert value(s, "sparkcluster_verify_timestamp_seconds") == 1796032800


def test_supervisor_state_incidents_and_recovery_times(node: FakeNode) -> None:
    node.supervisor("degraded", [incident(), incident(outcome="failed", recovered_s=None),
                                 incident(target="vLLM", seen="engine-dead", recovered_s=40.0)])
    with (node.supervisor_dir / "events.jsonl").open("a") as f:
        f.write("not json\n" + json.dumps({**incident(), "target": "$(reboot)"}) + "\n")
    s = parse(render(node.collector().supervisor()))
    assert value(s, "sparkcluster_supervisor_up") == 1
    assert value(s, "sparkcluster_supervisor_state", state="degraded") == 1
    assert value(s, "sparkcluster_supervisor_state", state="watching") == 0
    assert value(s, "sparkcluster_supervisor_restarts_last_hour") == 1
    assert value(s, "sparkcluster_supervisor_seen_total", seen="wedged") == 2
    assert value(s, "sparkcluster_supervisor_seen_total", seen="node-down") == 0
    assert value(s, "sparkcluster_supervisor_incidents_total", target="replica 2", seen="wedged", action="restart",
                 outcome="recovered") == 1
    assert value(s, "sparkcluster_supervisor_detection_seconds_count") == 3
    assert value(s, "sparkcluster_supervisor_recovery_seconds_sum") == 135.0
    assert value(s, "sparkcluster_supervisor_last_recovery_seconds") == 40.0
    assert value(s, "sparkcluster_supervisor_unread_event_lines") == 2


def test_what_the_supervisor_writes_is_what_the_exporter_reads(node: FakeNode) -> None:
    """The files as the supervisor's own types write them (serving/incidents.py), a node as target included."""
    state = SupervisorState(WatchState.DEGRADED, "2026-12-01T10:00:00+00:00", 2, f"lost spark-2; {SECRET}")
    written = [Incident("2026-12-01T10:00:00+00:00", "spark-2", Seen.NODE_DOWN, Action.DEGRADE, Outcome.RECOVERED,
                        30.0, 120.0, f"HF_TOKEN={SECRET}", "spark-2 is gone"),
               Incident("2026-12-01T10:05:00+00:00", "replica 1", Seen.WEDGED, Action.RESTART_REPLICA,
                        Outcome.RECOVERED, 65.0, 80.0)]
    write_file(node.supervisor_dir / "state.json", json.dumps(state.to_json()))
    write_file(node.supervisor_dir / "events.jsonl", "".join(json.dumps(i.to_json()) + "\n" for i in written))
    text = render(node.collector().supervisor())
    s = parse(text)
    assert value(s, "sparkcluster_supervisor_state", state="degraded") == 1
    assert value(s, "sparkcluster_supervisor_state_since_timestamp_seconds") == 1796119200
    assert value(s, "sparkcluster_supervisor_incidents_total", target="spark-2", seen="node-down", action="degrade",
                 outcome="recovered") == 1
    assert value(s, "sparkcluster_supervisor_incidents_total", target="replica 1", seen="wedged",
                 action="restart-replica", outcome="recovered") == 1
    assert value(s, "sparkcluster_supervisor_recovery_seconds_sum") == 200.0
    assert value(s, "sparkcluster_supervisor_unread_event_lines") == 0
    assert SECRET not in text and "is gone" not in text


def test_no_supervisor_files_is_said_not_invented(node: FakeNode) -> None:
    s = parse(render(node.collector().supervisor()))
    assert value(s, "sparkcluster_supervisor_up") == 0
    assert "sparkcluster_supervisor_state" not in s.names()
    write_file(node.supervisor_dir / "state.json", '{"version": 2, "state": "watching"}')
    assert value(parse(render(node.collector().supervisor())), "sparkcluster_supervisor_up") == 0


def test_no_secret_and_no_free_text_leaves_the_node(node: FakeNode) -> None:
    node.supervisor("watching", [incident()])
    node.journal += f"2026-11-27T12:00:00+00:00 spark-2 kernel: NVRM: Xid (PCI:000f:01:00): 31, {SECRET}\n"
    text = render(node.collector().node()) + render(node.collector().supervisor())
    assert SECRET not in text and "HF_TOKEN" not in text and "log line" not in text


def test_label_values_are_escaped() -> None:
    family = Family("x", "help")
    family.add(1, link='a"b\\c\nd')
    text = render([family])
    assert text.splitlines()[-1] == 'x{link="a\\"b\\\\c\\nd"} 1'
    assert dict(parse(text).samples[0].labels)["link"] == 'a"b\\c\nd'


@pytest.fixture
def served(node: FakeNode) -> Iterator[str]:
    server = ExporterServer(("127.0.0.1", 0), node.collector())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_served_over_http(served: str, node: FakeNode) -> None:
    node.supervisor()
    with urllib.request.urlopen(f"{served}/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert value(parse(r.read().decode()), "sparkcluster_gpu_telemetry_up") == 1
    with urllib.request.urlopen(f"{served}/supervisor", timeout=10) as r:
        assert value(parse(r.read().decode()), "sparkcluster_supervisor_up") == 1
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{served}/secrets", timeout=10)
    assert e.value.code == 404
