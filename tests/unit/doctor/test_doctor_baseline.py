"""Baselines (issue 42): each node's versions, limits and figures saved as a typed, versioned JSON, and compared
later: every change named per node with old and new; a change that lands on a known-bad value, or a figure that fell
(busbw down more than 10%, CMA to 0), fails. A bad file is refused before anything connects (exit 2)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from sparkcluster.doctor import baseline
from sparkcluster.doctor.baseline import Baseline, NodeBaseline, baseline_of, busbw_of, compare
from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.engine.facts import Gpu, PcieLink, parse_probe
from sparkcluster.node.health import parse_health
from sparkcluster.node.parity import Node

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
FACTS = parse_probe((FIXTURES / "probe-spark.txt").read_text())
HEALTH = parse_health((FIXTURES / "doctor" / "health-spark.txt").read_text(), "vllm-node")
X4 = tuple(PcieLink(n, "32.0_GT/s_PCIe", "4", "32.0_GT/s_PCIe", "4") for n in ("enp1s0f1np1", "enP2p1s0f1np1"))
RECORD = {"status": "PASS", "busbw_gbps": 21.4, "twins": {"twin 0 (enp1s0f1np1)": 11.9, "twin 1 (enP2p1s0f1np1)": 12.1},
          "at": "2026-11-20T08:00:00+00:00"}


def node(driver: str = "580.95.05", kernel: str = "6.17.0-1032-nvidia", cma: int = 65536) -> Node:
    facts = replace(FACTS, kernel=kernel, gpus=(Gpu("NVIDIA GB10", driver, "12.1"),), pcie_links=X4)
    return Node(facts, replace(HEALTH, cma_total_kb=cma, memlock="unlimited", bios_date="04/20/2026"))


def saved(**nodes: Node) -> Baseline:
    return baseline_of(nodes, {n: RECORD for n in nodes})


def test_a_node_records_its_versions_limits_and_figures():
    b = baseline_of({"spark-1": node()}, {"spark-1": RECORD}).nodes["spark-1"]
    assert (b.kernel, b.driver, b.bios, b.bios_date) == ("6.17.0-1032-nvidia", "580.95.05", "5.36_0ACUM020", "04/20/2026")
    assert b.connectx_firmware == ("28.45.1200 (NVD0000000033)",)
    assert (b.host_nccl, b.image_nccl, b.cuda, b.dgx_os) == ("2.27.7", "2.28.3", "13.0", "DGX Spark 7.2.3")
    assert (b.memlock, b.cma_total_kb, b.mem_total_kb) == ("unlimited", 65536, 124544304)
    assert b.busbw_gbps == {"all": 21.4, "twin 0 (enp1s0f1np1)": 11.9, "twin 1 (enP2p1s0f1np1)": 12.1}
    assert b.verified_at == "2026-11-20T08:00:00+00:00"


def test_links_of_a_ring_are_kept_and_a_failed_one_is_not_a_figure():
    record = {"busbw_gbps": 13.9, "links": {"spark-1 port 0 <-> spark-2 port 1 twin 0 (enp1s0f0np0)": 11.8,
                                            "spark-2 port 0 <-> spark-3 port 1 twin 0 (enp1s0f0np0)": None}}
    assert busbw_of(record) == {"all": 13.9, "spark-1 port 0 <-> spark-2 port 1 twin 0 (enp1s0f0np0)": 11.8}
    assert busbw_of({"status": "PASS", "busbw_gbps": True}) == {}


def test_the_same_cluster_has_no_changes():
    assert compare(saved(**{"spark-1": node(), "spark-2": node()}), saved(**{"spark-1": node(), "spark-2": node()})) == []


def test_a_driver_changed_on_one_node_is_named_with_old_and_new():
    changes = compare(saved(**{"spark-1": node(), "spark-2": node()}),
                      saved(**{"spark-1": node(), "spark-2": node(driver="590.48.01")}))
    assert [(c.node, c.what, c.old, c.new, c.bad) for c in changes] == [("spark-2", "driver", "580.95.05", "590.48.01", "")]


def test_a_kernel_that_lands_on_a_known_bad_value_fails_with_its_fix():
    changes = compare(saved(**{"spark-1": node()}), saved(**{"spark-1": node(kernel="7.0.0-1019-nvidia")}))
    kernel = next(c for c in changes if c.what == "kernel")
    assert (kernel.old, kernel.new) == ("6.17.0-1032-nvidia", "7.0.0-1019-nvidia")
    assert kernel.bad.startswith("lands on a known-bad kernel") and "kho=off" in kernel.fix and kernel.source


def test_cma_to_zero_fails_and_names_kho_off():
    changes = compare(saved(**{"spark-1": node()}), saved(**{"spark-1": node(cma=0)}))
    cma = next(c for c in changes if c.what == "CmaTotal kB")
    assert (cma.old, cma.new) == ("65536", "0") and cma.bad.startswith("CMA fell to 0") and "kho=off" in cma.fix


def test_busbw_down_more_than_ten_percent_fails_and_less_is_news():
    now = baseline_of({"spark-1": node()}, {"spark-1": {**RECORD, "busbw_gbps": 19.8,
                                                        "twins": {"twin 0 (enp1s0f1np1)": 3.1,
                                                                  "twin 1 (enP2p1s0f1np1)": 12.1}}})
    changes = {c.what: c for c in compare(saved(**{"spark-1": node()}), now)}
    assert changes["busbw"].bad == "" and (changes["busbw"].old, changes["busbw"].new) == ("21.40 GB/s", "19.80 GB/s")
    twin = changes["busbw twin 0 (enp1s0f1np1)"]
    assert twin.bad == "fell 74% (more than 10%)" and "verify" in twin.fix
    assert "busbw twin 1 (enP2p1s0f1np1)" not in changes


def test_a_node_gone_or_new_is_named():
    changes = compare(saved(**{"spark-1": node(), "spark-2": node()}), saved(**{"spark-1": node(), "spark-3": node()}))
    assert [(c.node, c.old, c.new) for c in changes] == [
        ("spark-2", "in the baseline", "not checked now (unreachable, or left the inventory)"),
        ("spark-3", "not in the baseline", "checked now")]


def test_a_saved_file_reads_back_the_same(tmp_path):
    first = saved(**{"spark-1": node(), "spark-2": node(kernel="7.0.0-1019-nvidia")})
    path = tmp_path / "baseline.json"
    baseline.write(first, baseline.writable(str(path)))
    doc = json.loads(path.read_text())
    assert doc["version"] == baseline.BASELINE_VERSION and set(doc["nodes"]) == {"spark-1", "spark-2"}
    assert baseline.read(str(path)) == first
    assert [p.name for p in tmp_path.iterdir()] == ["baseline.json"]  # no temporary file left beside it


@pytest.mark.parametrize("content, said", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    ('{"version": 7, "nodes": {}}', "baseline version 7; this sparkcluster reads version 1"),
    ('[1, 2]', "not a sparkcluster baseline"),
    ('{"version": 1, "nodes": {"spark-1": {"driver": 580}}}', "node 'spark-1' has driver = 580"),
    ('{"version": 1, "nodes": {"spark-1": {"busbw_gbps": {"all": "fast"}}}}', "node 'spark-1' has busbw_gbps"),
])
def test_a_bad_baseline_file_is_refused_with_its_fix(tmp_path, content, said):
    path = tmp_path / "b.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UsageError) as e:
        baseline.read(str(path))
    assert said in e.value.message and e.value.exit_code == EXIT_USAGE and "--save-baseline" in e.value.fix


def test_a_folder_or_missing_folder_is_refused_for_saving(tmp_path):
    with pytest.raises(UsageError, match="is a folder"):
        baseline.writable(str(tmp_path))
    with pytest.raises(UsageError, match="no folder"):
        baseline.writable(str(tmp_path / "none" / "b.json"))


def test_an_unknown_field_of_this_version_is_ignored():
    doc = {"version": 1, "saved_at": "x", "nodes": {"spark-1": {"driver": "580.95.05", "fan_rpm": 1200}}}
    assert baseline.from_json(doc, "b.json").nodes["spark-1"] == NodeBaseline(driver="580.95.05")


@pytest.mark.parametrize("content, said", [
    (None, "--baseline {path}: no such file"),
    ("{\n  broken", "{path}:2: not JSON"),
    ('{"version": 2, "nodes": {}}', "{path}: baseline version 2; this sparkcluster reads version 1"),
])
def test_the_cli_refuses_a_bad_baseline_with_exit_2_before_connecting(tmp_path, capsys, content, said):
    from sparkcluster.cli import main

    inventory = tmp_path / "inventory.yml"  # nothing listens there: a connection would fail otherwise (exit 1)
    inventory.write_text("hosts:\n  spark-1: {address: 127.0.0.1, port: 1, role: head}\n")
    path = tmp_path / "baseline.json"
    if content is not None:
        path.write_text(content)
    assert main(["doctor", "-i", str(inventory), "--baseline", str(path)]) == EXIT_USAGE
    err = " ".join(capsys.readouterr().err.split())
    assert said.format(path=path) in err and "--save-baseline" in err, err


def test_the_changes_are_printed_per_node_old_to_new_with_why_and_fix(tmp_path):
    import io

    from rich.console import Console

    before = saved(**{"spark-1": node(), "spark-2": node()})
    after = saved(**{"spark-1": node(), "spark-2": node(driver="590.48.01", kernel="7.0.0-1019-nvidia")})
    out = io.StringIO()
    baseline.render(Console(file=out, width=300, soft_wrap=True), before, "b.json", compare(before, after), after, tmp_path / "n.json")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("since the baseline b.json (saved ")
    assert lines[1].startswith("  FAIL spark-2 kernel: 6.17.0-1032-nvidia -> 7.0.0-1019-nvidia: lands on a known-bad")
    assert lines[2].startswith("         fix: add `kho=off`") and lines[3].startswith("         reported: ")
    assert "       spark-2 driver: 580.95.05 -> 590.48.01" in lines
    assert "baseline: 2 changes on 1 node, 1 failing" in lines
    assert lines[-1] == f"baseline: saved 2 nodes to {tmp_path / 'n.json'}; after the next `apt upgrade` and reboot: " \
                        f"sparkcluster doctor --baseline {tmp_path / 'n.json'}"
