"""NCCL log reader, verdict, report and the probe's pure helpers, on logs in the captured line shapes."""

import ast
import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.nccl.logs import BandwidthRow, busbw, format_table, read_log, read_probe_output
from sparkcluster.nccl.report import report
from sparkcluster.nccl.verdict import DEFAULT_MIN_BUSBW_GBPS, ONE_TWIN_MAX_GBPS, judge

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "nccl"
PROBE_PATH = ROOT / "sparkcluster" / "nccl" / "probe.py"
MiB = 1 << 20


def load_probe():
    """The probe as it runs in a container: a file on its own, outside the package."""
    spec = importlib.util.spec_from_file_location("nccl_probe_under_test", PROBE_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


probe = load_probe()


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def ranks_of(name: str):
    return read_log(fixture(name), name)


def rows(*busbws: float, size: int = 256 * MiB, op: str = "all_reduce") -> list[BandwidthRow]:
    return [BandwidthRow(op, size, 1000.0, b, b) for b in busbws]


# ---- every fixture's verdict and fix: tests/fixtures/cases/nccl-verdicts.json (tests/unit/test_case_tables.py) -------


# ---- reading -----------------------------------------------------------------------------------------------
def test_reads_the_real_two_gpu_capture():
    """NCCL 2.28.9 on two H200s of one host: no RDMA device, so Socket is chosen at init, yet the data went P2P."""
    ranks = ranks_of("captured-h200-p2p.log")
    assert [(r.host, r.rank, r.nccl_version, r.network) for r in ranks] == [
        ("vm", 0, "2.28.9+cuda13.0", "Socket"), ("vm", 1, "2.28.9+cuda13.0", "Socket")]
    assert all(r.no_ib_device and r.init_complete and len(r.channels) == 24 for r in ranks)
    assert {c.transport for r in ranks for c in r.channels} == {"P2P"}
    assert ranks[0].oob_interface == "eth0" and ranks[0].ib_devices == ()
    parsed_rows, probe_ranks = read_probe_output(fixture("captured-h200-p2p.log"))
    assert [(r.op, r.size_bytes) for r in parsed_rows][:2] == [("all_reduce", 1 << 20), ("all_reduce", 16 << 20)]
    assert len(parsed_rows) == 10 and [r["device"] for r in probe_ranks] == ["cuda:0", "cuda:1"]
    # busbw as nccl-tests computes it: all_gather on two ranks is half the algbw.
    gather = next(r for r in parsed_rows if r.op == "all_gather" and r.size_bytes == 1 << 30)
    assert gather.busbw_gbps == pytest.approx(gather.algbw_gbps / 2, rel=1e-3)


def test_report_on_the_real_captures():
    code, text = report([str(FIXTURES / "captured-h200-p2p.log")], json_output=False, min_busbw=None)
    assert code == 0 and text.startswith("WARN  intra-node only")
    code, text = report([str(FIXTURES / "captured-h200-socket-lo.log")], json_output=False, min_busbw=None)
    assert code == 1 and text.startswith("FAIL  socket fallback over lo: NCCL_IB_DISABLE=1")


def test_reads_each_process_of_a_healthy_two_node_log():
    first, second = ranks_of("roce-both-twins.log")
    assert (first.source, first.host, first.rank) == ("roce-both-twins.log spark-1:2331", "spark-1", 0)
    assert (second.host, second.rank, second.nccl_version) == ("spark-2", 1, None)  # only rank 0 prints it
    assert first.nccl_version == "2.28.9+cuda13.0"
    assert first.network == "IB"
    assert first.ib_devices == ("rocep1s0f0", "roceP2p1s0f0")
    assert first.ib_hca_env == "roceP2p1s0f0,rocep1s0f0"
    assert (first.oob_interface, first.bootstrap_interface) == ("enp1s0f0np0", "enp1s0f0np0")
    assert first.init_complete and not first.truncated and not first.no_ib_device
    assert [(c.rank_from, c.rank_to, c.transport) for c in first.channels] == [
        (1, 0, "NET/IB"), (1, 0, "NET/IB"), (0, 1, "NET/IB"), (0, 1, "NET/IB")]
    assert first.channels[0].line == 24
    assert second.transports == ("NET/IB",)


def test_reads_the_socket_fallback_lines():
    rank = ranks_of("socket-no-device.log")[0]
    assert rank.no_ib_device and rank.network == "Socket"
    assert (rank.socket_interfaces, rank.socket_addresses) == (("enp1s0f1np1",), ("192.168.100.10",))
    assert rank.transports == ("NET/Socket",)


def test_reads_the_hpcx_plugin_lines():
    rank = ranks_of("hpcx-ibext.log")[0]
    assert rank.network == "IBext"
    assert rank.ib_devices == ("rocep1s0f1", "roceP2p1s0f1")
    assert rank.transports == ("NET/IBext",)


@pytest.mark.parametrize("line, transport", [
    ("Channel 09/0 : 1[0] -> 0[0] [send] via NET/IBext_v10/1", "NET/IBext"),
    ("Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0", "NET/IB"),
    ("Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0(1)/GDRDMA", "NET/IB"),
    ("Channel 00 : 0[0] -> 1[1] [send] via NET/Socket/0", "NET/Socket"),
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read", "P2P"),
    ("Channel 00 : 0[0] -> 1[1] via P2P/IPC", "P2P"),
    ("Channel 01/0 : 1[1] -> 0[0] via SHM/direct/direct", "SHM"),
])
def test_channel_forms(line, transport):
    (rank,) = read_log(f"gpu-node:11:12 [0] NCCL INFO {line}\n")
    assert [c.transport for c in rank.channels] == [transport]


def test_the_ring_listing_is_not_a_connection():
    (rank,) = read_log("NCCL INFO Channel 00/02 :    0   1\nNCCL INFO Using network IB\n")
    assert rank.channels == () and rank.truncated


def test_the_captured_lines_without_prefix():
    """Lines from a real Spark's NCCL log, verbatim: one RankLog for the whole text."""
    healthy = ("NCCL INFO NCCL_IB_HCA set to roceP2p1s0f0,rocep1s0f0\n"
               "NCCL INFO NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]; "
               "OOB enp1s0f0np0:192.168.100.10<0>\n"
               "NCCL INFO Using network IB\n"
               "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n")
    fallback = ("NCCL INFO NET/IB : No device found.\n"
                "NCCL INFO NET/Socket : Using [0]enp1s0f1np1:192.168.100.10<0>\n"
                "NCCL INFO Using network Socket\n"
                "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n")
    (rank,) = read_log(healthy, "capture")
    assert (rank.source, rank.host, rank.ib_devices) == ("capture", None, ("rocep1s0f0", "roceP2p1s0f0"))
    assert judge([rank]).status == "PASS"
    assert judge(read_log(fallback)).cause.startswith("socket fallback over enp1s0f1np1: NET/IB found no device")


def test_splits_a_vllm_log_by_process_and_strips_ray_colours():
    ranks = ranks_of("vllm-ray-combined.log")
    assert [(r.host, r.rank, r.network) for r in ranks] == [("spark-1", 0, "IB"), ("spark-2", 1, "IB")]
    assert all(len(r.channels) == 4 for r in ranks)


def test_a_traceback_goes_to_the_process_ray_names():
    text = ("(RayWorkerWrapper pid=2201, ip=192.168.177.12) spark-2:2201:2201 [0] NCCL INFO Using network IB\n"
            "(RayWorkerWrapper pid=1850, ip=192.168.177.11) spark-1:1850:1850 [0] NCCL INFO Using network IB\n"
            "(RayWorkerWrapper pid=2201, ip=192.168.177.12) RuntimeError: NCCL error: unhandled system error\n")
    worker, head = read_log(text, "vllm.log")
    assert worker.errors == ("(RayWorkerWrapper pid=2201, ip=192.168.177.12) RuntimeError: NCCL error: "
                             "unhandled system error",)
    assert head.errors == ()


def test_unattributed_tracebacks_come_after_the_ranks():
    ranks = ranks_of("ibv-modify-qp.log")
    assert [r.source for r in ranks] == ["ibv-modify-qp.log spark-1:2331", "ibv-modify-qp.log"]
    assert ranks[0].warnings[0].startswith("NCCL WARN Call to ibv_modify_qp failed with 110")
    assert "unhandled system error" in ranks[1].errors[0]


def test_a_merged_virtual_device_counts_both_twins():
    text = fixture("hpcx-ibext.log").replace("name=rocep1s0f1 speed=200000",
                                             "name=rocep1s0f1+roceP2p1s0f1 speed=400000")
    text = "\n".join(line for line in text.splitlines() if "[1] name=" not in line and "HCA 1" not in line)
    ranks = read_log(text)
    assert ranks[0].ib_devices == ("rocep1s0f1", "roceP2p1s0f1")
    assert judge(ranks).status == "PASS"


# ---- judging -----------------------------------------------------------------------------------------------
def test_expected_hcas():
    both = ranks_of("roce-both-twins.log")
    assert judge(both, expected_hcas=("rocep1s0f0", "roceP2p1s0f0")).status == "PASS"
    other_port = judge(both, expected_hcas=("rocep1s0f1", "roceP2p1s0f1"))
    assert (other_port.status, other_port.cause) == (
        "WARN", "NCCL uses rocep1s0f0, roceP2p1s0f0, not in the expected HCAs (rocep1s0f1, roceP2p1s0f1)")
    one = judge(ranks_of("roce-one-twin.log"), expected_hcas=("rocep1s0f1", "roceP2p1s0f1"))
    assert one.status == "WARN" and one.cause.startswith("one twin only")
    assert one.fix.startswith("NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1")


def test_one_device_that_is_not_a_spark_twin_is_not_one_twin():
    text = fixture("roce-one-twin.log").replace("rocep1s0f1:1/RoCE", "mlx5_0:1/IB")
    assert judge(read_log(text)).status == "PASS"


@pytest.mark.parametrize("hca_line, shown", [
    ("NCCL_IB_HCA set to mlx5_7", "NCCL_IB_HCA=mlx5_7 matches no RDMA device"),  # a Spark has mlx5_0..3 at most
    ("NCCL_IB_HCA set to ", "NCCL_IB_HCA=(empty) matches no RDMA device"),
])
def test_an_unknown_ib_hca_list(hca_line, shown):
    text = fixture("socket-no-device.log").replace("NCCL_IB_HCA set to rocep1s0f1,roceP2p1s0f1", hca_line)
    verdict = judge(read_log(text))
    assert verdict.cause == f"socket fallback over enp1s0f1np1: {shown}"
    assert verdict.fix == "set NCCL_IB_HCA to both twins of the cabled port: rocep1s0f1,roceP2p1s0f1 (F2)"
    assert judge(read_log(text), expected_hcas=("rocep1s0f0", "roceP2p1s0f0")).fix.endswith(
        "rocep1s0f0,roceP2p1s0f0 (F2)")


def test_a_known_ib_hca_list_without_devices_is_the_container():
    text = fixture("socket-no-device.log").replace("rocep1s0f1,roceP2p1s0f1", "rocep1s0f0")
    assert "is /dev/infiniband in the container?" in judge(read_log(text), expected_hcas=("rocep1s0f0",)).cause
    assert "matches no RDMA device" in judge(read_log(text), expected_hcas=("rocep1s0f1",)).cause


def test_socket_channels_alone_are_a_fallback():
    text = "NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
    verdict = judge(read_log(text))
    assert (verdict.status, verdict.cause) == ("FAIL", "socket fallback: NCCL chose NET/Socket (TCP) over NET/IB")
    assert "NCCL_NET=IB" in verdict.fix


def test_using_network_socket_before_any_channel_is_a_fallback_not_just_truncated():
    verdict = judge(read_log("NCCL INFO NET/IB : No device found.\nNCCL INFO Using network Socket\n"))
    assert verdict.cause == "socket fallback: NET/IB found no device (is /dev/infiniband in the container?)"


@pytest.mark.parametrize("interface_line", [
    "spark-1:2331:2331 [0] NCCL INFO Bootstrap: Using enP7s7:10.20.0.11<0>",
    "spark-1:2331:2398 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; "
    "OOB enP7s7:10.20.0.11<0>",
])
def test_bootstrap_or_oob_on_the_management_port_fails(interface_line):
    lines = [line for line in fixture("vllm-ray-combined.log").splitlines() if "spark-1" not in line]
    channel = "spark-1:2331:2405 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0"
    verdict = judge(read_log("\n".join([interface_line, *lines, channel])))
    assert verdict.status == "FAIL"
    assert "on the management interface enP7s7 (10 GbE)" in verdict.cause


def test_custom_management_and_qsfp_interfaces():
    ranks = ranks_of("roce-both-twins.log")
    assert "eno1" not in judge(ranks, management_interfaces=("eno1",)).cause
    fail = judge(ranks, management_interfaces=("enp1s0f0np0",))
    assert fail.status == "FAIL" and "enp1s0f0np0" in fail.cause
    warn = judge(ranks, qsfp_interfaces=("enp1s0f1np1",))
    assert (warn.status, warn.cause) == ("WARN", "NCCL bootstrap on enp1s0f0np0, not the QSFP interface (enp1s0f1np1)")
    assert judge(ranks, qsfp_interfaces=("enp1s0f0np0",)).status == "PASS"


def test_intra_node_only():
    ranks = ranks_of("intra-node-p2p.log")
    assert judge(ranks, require_network=False).status == "PASS"
    assert judge(ranks, require_network=False).intra_node_only
    details = judge(ranks).details
    assert any("between nodes it would fall back to TCP sockets" in d for d in details)
    shm = read_log("h:1:2 [0] NCCL INFO Using network IB\n"
                   "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct\n")
    assert judge(shm).cause == "intra-node only (SHM): not a network verdict: it says nothing about the QSFP link"


def test_init_complete_without_channels_says_connections_are_lazy():
    # NCCL >= 2.22 connects at the first collective: before it, neither channel lines nor "Connected all rings".
    text = "\n".join(line for line in fixture("roce-both-twins.log").splitlines()
                     if " via " not in line and "Connected all" not in line)
    verdict = judge(read_log(text))
    assert verdict.status == "FAIL"
    assert verdict.cause.startswith("NCCL init completed but no channel was connected yet")


@pytest.mark.parametrize("line, fix", [
    ("spark-1:1:2 [0] transport/net_ib.cc:1695 NCCL WARN NET/IB : Got completion from peer 192.168.177.12<40291> "
     "with status=IBV_WC_REM_INV_REQ_ERR(9) opcode=0 len=0 vendor_err=138", "(F7)"),
    ("spark-1:1:2 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer; remote process "
     "exited or there was a network error", "another rank died first"),
    ("spark-1:1:2 [0] enqueue.cc:123 NCCL WARN Cuda failure 'out of memory'", "NCCL_DEBUG_SUBSYS=INIT,NET"),
])
def test_warn_lines_fail(line, fix):
    text = fixture("roce-both-twins.log") + line + "\n"
    verdict = judge(read_log(text))
    assert verdict.status == "FAIL"
    assert verdict.cause.startswith("NCCL error: NCCL WARN ")
    assert fix in verdict.fix


def test_no_logs_at_all_fail():
    assert judge([]).cause == "no NCCL INFO lines in the given logs"


def test_bandwidth():
    healthy = ranks_of("roce-both-twins.log")
    passed = judge(healthy, rows=rows(21.5, 22.8))
    assert passed.status == "PASS" and passed.cause.endswith("best busbw 22.8 GB/s")
    # Every channel on NET/IB with both twins and the link still slow: FAIL, with the cause the numbers point at.
    one_twin = judge(healthy, rows=rows(11.5))
    assert (one_twin.status, one_twin.cause) == (
        "FAIL", "RDMA, but the link delivers 11.50 GB/s of an expected >= 18 (one twin's ceiling: is only one twin "
                "carrying traffic? verify measures each twin)")
    for told_apart in ("dmesg | grep -i mlx5", "reboot", "ethtool --show-fec", "mtu 1500", "both twins"):
        assert told_apart in one_twin.fix
    replugged = judge(healthy, rows=rows(2.83, size=16 << 30))
    assert replugged.status == "FAIL" and replugged.cause.startswith(
        "RDMA, but the link delivers 2.83 GB/s of an expected >= 18 (a few GB/s at every size with both twins on "
        "NET/IB: a hot re-plug or PCIe power limit")
    stricter = judge(healthy, rows=rows(21.5), min_busbw_gbps=23.0)
    assert stricter.cause.startswith("RDMA, but the link delivers 21.50 GB/s of an expected >= 23 (MTU 1500")
    # The in-place column counts too: nccl-tests prints both, and either proves the link.
    in_place = [BandwidthRow("all_gather", 16 << 30, 1.0, 40.0, 17.5, 22.9)]
    assert judge(healthy, rows=in_place).status == "PASS"
    one_hca = judge(ranks_of("roce-one-twin.log"), rows=rows(11.2))
    assert one_hca.cause.endswith("(one twin only: NCCL uses rocep1s0f1 alone)")
    small_only = judge(healthy, rows=rows(30.0, size=16 * MiB))
    assert (small_only.status, small_only.cause) == ("WARN", "no measurement at 64 MiB or more: bandwidth not judged")
    # Only sizes of 64 MiB and more count: a fast small size cannot rescue a slow large one.
    assert judge(healthy, rows=[*rows(30.0, size=16 * MiB), *rows(10.0)]).status == "FAIL"


def test_bandwidth_does_not_hide_or_replace_the_transport_verdict():
    assert judge(ranks_of("socket-no-device.log"), rows=rows(22.0)).cause.startswith("socket fallback")
    assert judge(ranks_of("intra-node-p2p.log"), rows=rows(1.0)).cause.startswith("intra-node only")


def test_default_threshold_separates_both_twins_from_one():
    assert ONE_TWIN_MAX_GBPS < DEFAULT_MIN_BUSBW_GBPS < 21.875  # NVIDIA's 16 GB pass mark


# ---- bandwidth arithmetic and the table --------------------------------------------------------------------
@pytest.mark.parametrize("op, world, factor", [
    ("all_reduce", 2, 1.0), ("all_reduce", 4, 1.5), ("all_reduce", 1, 0.0),
    ("all_gather", 2, 0.5), ("reduce_scatter", 8, 7 / 8),
])
def test_busbw_factors(op, world, factor):
    algbw, bus = busbw(op, 2_000_000_000, 0.5, world)
    assert algbw == pytest.approx(4.0)
    assert bus == pytest.approx(4.0 * factor)


def test_busbw_refuses_unknown_ops():
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        busbw("broadcast", 1, 1.0, 2)


TABLE_ROWS = [BandwidthRow("all_reduce", 64 * MiB, 3112.4, 21.56, 21.56),
              BandwidthRow("all_reduce", 1024 * MiB, 47021.9, 22.83, 22.83),
              BandwidthRow("all_gather", 64 * MiB, 6010.0, 11.17, 5.58)]


def test_format_table():
    assert format_table(TABLE_ROWS).splitlines() == [
        "# all_reduce",
        "#       size        count   type    time(us)  algbw(GB/s)  busbw(GB/s)",
        "    67108864     16777216  float      3112.4        21.56        21.56",
        "  1073741824    268435456  float     47021.9        22.83        22.83",
        "# Avg bus bandwidth    : 22.1950",
        "# all_gather",
        "#       size        count   type    time(us)  algbw(GB/s)  busbw(GB/s)",
        "    67108864     16777216  float      6010.0        11.17         5.58",
        "# Avg bus bandwidth    : 5.5800",
    ]


def probe_output(result_rows: list[dict]) -> str:
    rank0 = {"rank": 0, "local_rank": 0, "hostname": "spark-1", "backend": "gloo", "device": "cpu",
             "tcp": [["192.168.177.11", "192.168.177.12"]]}
    rank1 = {**rank0, "rank": 1, "hostname": "spark-2", "tcp": [["192.168.177.12", "192.168.177.11"]]}
    result = {"backend": "gloo", "world": 2, "hostnames": ["spark-1", "spark-2"], "rows": result_rows,
              "peers": [{"rank": r["rank"], "hostname": r["hostname"], "tcp": r["tcp"]} for r in (rank0, rank1)]}
    return "\n".join([
        f"[rank1]: SPARKCLUSTER_PROBE_RANK {json.dumps(rank1)}",
        f"SPARKCLUSTER_PROBE_RANK {json.dumps(rank0)}",
        probe.format_table(result_rows),
        "SPARKCLUSTER_PROBE_RANK {\"rank\": 2, \"hostn",  # a line cut short by a killed rank
        f"SPARKCLUSTER_PROBE_RESULT {json.dumps(result)}",
    ])


def test_read_probe_output_round_trip():
    text = probe_output([r.__dict__ for r in TABLE_ROWS])
    parsed_rows, ranks = read_probe_output(text)
    assert parsed_rows == TABLE_ROWS
    assert [(r["rank"], r["hostname"], r["tcp"]) for r in ranks] == [
        (0, "spark-1", [["192.168.177.11", "192.168.177.12"]]), (1, "spark-2", [["192.168.177.12", "192.168.177.11"]])]
    assert read_probe_output("no probe here") == ([], [])


# ---- report (the nccl-report command) ----------------------------------------------------------------------
def test_report_exit_codes_and_text():
    code, text = report([str(FIXTURES / "roce-both-twins.log")], json_output=False, min_busbw=None)
    assert code == 0 and text.startswith("PASS  RDMA: NET/IB")
    code, text = report([str(FIXTURES / "roce-one-twin.log")], json_output=False, min_busbw=None)
    assert code == 0 and text.startswith("WARN  one twin only") and "\n  fix: NCCL_IB_HCA=" in text
    code, text = report([str(FIXTURES / "socket-no-device.log")], json_output=False, min_busbw=None)
    assert code == 1 and text.startswith("FAIL  socket fallback")


def test_report_reads_several_files_as_one_cluster(tmp_path):
    lines = fixture("roce-one-twin.log").splitlines()
    for host in ("spark-1", "spark-2"):
        (tmp_path / f"{host}.log").write_text("\n".join(line for line in lines if line.startswith(host)))
    code, doc = report([str(tmp_path / "spark-1.log"), str(tmp_path / "spark-2.log")], json_output=True,
                       min_busbw=None)
    doc = json.loads(doc)
    assert [r["host"] for r in doc["ranks"]] == ["spark-1", "spark-2"]
    assert doc["status"] == "WARN" and code == 0


def test_report_judges_the_probe_output_in_the_same_log(tmp_path):
    log = tmp_path / "probe.log"
    slow = [{"op": "all_reduce", "size_bytes": 1 << 30, "time_us": 93000.0, "algbw_gbps": 11.55, "busbw_gbps": 11.55}]
    log.write_text(fixture("roce-both-twins.log") + probe_output(slow))
    code, text = report([str(log)], json_output=False, min_busbw=None)
    assert code == 1 and text.startswith("FAIL  RDMA, but the link delivers 11.55 GB/s of an expected >= 18")
    assert "# Avg bus bandwidth    : 11.5500" in text
    code, doc = report([str(log)], json_output=True, min_busbw=10.0)
    doc = json.loads(doc)
    assert (code, doc["status"], doc["rows"][0]["busbw_gbps"]) == (0, "PASS", 11.55)
    assert [r["hostname"] for r in doc["probe_ranks"]] == ["spark-1", "spark-2"]
    assert "channels" not in doc["ranks"][0] and doc["ranks"][0]["transports"] == ["NET/IB"]
    assert doc["transports"] == ["NET/IB"] and doc["intra_node_only"] is False


def test_report_json_for_a_failure():
    code, doc = report([str(FIXTURES / "empty.log")], json_output=True, min_busbw=None)
    doc = json.loads(doc)
    assert (code, doc["status"], doc["cause"]) == (1, "FAIL", f"no NCCL INFO lines in {FIXTURES / 'empty.log'}")


def test_report_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError) as error:
        report([str(tmp_path / "nope.log")], json_output=False, min_busbw=None)
    assert error.value.exit_code == EXIT_USAGE
    assert "nope.log: no such file" in error.value.message


# ---- the probe's helpers -----------------------------------------------------------------------------------
def test_probe_needs_only_the_standard_library_and_torch():
    tree = ast.parse(PROBE_PATH.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - set(sys.stdlib_module_names) == {"torch"}
    top_level = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    assert "torch" not in top_level  # imported when it runs, so these tests need no torch


@pytest.mark.parametrize("text, size", [("1M", 1 << 20), ("16M", 16 << 20), ("1G", 1 << 30), ("64K", 65536),
                                        ("4096", 4096), ("256MiB", 256 << 20), ("2gb", 2 << 30)])
def test_parse_size(text, size):
    assert probe.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1T", "1.5G", "-1M", "M"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError, match="bad size"):
        probe.parse_size(text)


def test_parse_args_defaults_from_torchrun_env():
    args = probe.parse_args([], {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "192.168.177.11",
                                 "MASTER_PORT": "29511"})
    assert (args.rank, args.world, args.local_rank, args.master_addr, args.master_port) == (
        1, 2, 1, "192.168.177.11", 29511)
    assert (args.backend, args.device, args.iters, args.warmup) == ("nccl", "cuda", 10, 3)
    assert args.sizes == [1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    assert args.ops == ["all_reduce", "all_gather"]


def test_parse_args_flags_win_over_env():
    args = probe.parse_args(["--rank", "0", "--world", "2", "--backend", "gloo", "--sizes", "1M,2M",
                             "--ops", "reduce_scatter"], {"RANK": "1", "WORLD_SIZE": "4"})
    assert (args.rank, args.world, args.device, args.sizes, args.ops) == (0, 2, "cpu", [1 << 20, 2 << 20],
                                                                          ["reduce_scatter"])


@pytest.mark.parametrize("argv, message", [
    (["--sizes", "1M,2G"], "size 2147483648 is above --max-bytes 1073741824"),
    (["--sizes", "16G"], "a 16 GB nccl-tests run froze nodes"),
    (["--sizes", "1X"], "bad size '1X'"),
    (["--device", "cpu"], "--backend nccl needs --device cuda"),
    (["--ops", "all_to_all"], "unknown op 'all_to_all'"),
    (["--rank", "2", "--world", "2"], "--rank 2 is outside --world 2"),
    (["--iters", "0"], "--iters must be at least 1"),
])
def test_parse_args_refuses(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        probe.parse_args(argv, {})
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_parse_args_a_larger_cap_allows_larger_sizes():
    assert probe.parse_args(["--sizes", "2G", "--max-bytes", "2G"], {}).sizes == [2 << 30]


# /proc/net/tcp prints each 32-bit word of an address in host byte order; these texts are a little-endian host's.
PROC_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:7531 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 40001 1 0000000000000000 100 0 0 10 0
   1: 0BB1A8C0:7531 0CB1A8C0:D2F4 01 00000000:00000000 00:00000000 00000000  1000        0 40002 1 0000000000000000 20 4 30 10 -1
   2: 0BB1A8C0:A1B2 0CB1A8C0:7531 01 00000000:00000000 00:00000000 00000000  1000        0 40003 1 0000000000000000 20 4 30 10 -1
   3: 0B1414AC:0016 0A1414AC:C350 01 00000000:00000000 00:00000000 00000000     0        0 50000 1 0000000000000000 20 4 30 10 -1
"""
PROC_TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000BB1A8C0:9C41 0000000000000000FFFF00000CB1A8C0:E001 01 00000000:00000000 00:00000000 00000000  1000        0 40004 1 0000000000000000 20 4 30 10 -1
   1: B80D0120000000000000000001000000:9C42 B80D0120000000000000000002000000:E002 01 00000000:00000000 00:00000000 00000000  1000        0 40005 1 0000000000000000 20 4 30 10 -1
"""


def test_socket_inodes():
    links = ["/dev/null", "socket:[40002]", "pipe:[777]", "socket:[40004]", "anon_inode:[eventfd]"]
    assert probe.socket_inodes(links) == {40002, 40004}


@pytest.mark.skipif(sys.byteorder != "little", reason="the fake /proc texts are a little-endian host's")
def test_established_peers_keeps_this_process_established_connections():
    owned = {40001, 40002, 40003, 40004, 40005}  # 40001 listens; 50000 (ssh) belongs to another process
    assert probe.established_peers([PROC_TCP, PROC_TCP6], owned) == [
        ("192.168.177.11", "192.168.177.12"), ("2001:db8::1", "2001:db8::2")]
    assert probe.established_peers([PROC_TCP], {50000}) == [("172.20.20.11", "172.20.20.10")]


def test_tcp_peers_sees_a_real_loopback_connection():
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                assert ("127.0.0.1", "127.0.0.1") in probe.tcp_peers()
                assert client.fileno() >= 0


@pytest.mark.slow
def test_probe_runs_two_gloo_ranks(tmp_path):
    """The whole probe on CPU tensors; skipped where torch is not installed (it is not a sparkcluster dependency)."""
    pytest.importorskip("torch")
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
    argv = [sys.executable, str(PROBE_PATH), "--backend", "gloo", "--world", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--sizes", "1M,64M", "--iters", "2", "--warmup", "1"]
    ranks = [subprocess.Popen([*argv, "--rank", str(r)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    outputs = [p.communicate(timeout=120) for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0], [err[-2000:] for _, err in outputs]
    parsed_rows, probe_ranks = read_probe_output(outputs[0][0] + outputs[1][0])
    assert [(r.op, r.size_bytes) for r in parsed_rows] == [
        ("all_reduce", 1 << 20), ("all_reduce", 64 << 20), ("all_gather", 1 << 20), ("all_gather", 64 << 20)]
    assert all(r.busbw_gbps > 0 for r in parsed_rows)
    assert [r["rank"] for r in probe_ranks] == [0, 1]
    assert all(["127.0.0.1", "127.0.0.1"] in r["tcp"] for r in probe_ranks)


# ---- bandwidth wherever a log has it, runs judged apart (issue: a degraded link never passes) ----------------
def report_text(*names: str, min_busbw: float | None = None) -> tuple[int, str]:
    return report([str(FIXTURES / n) for n in names], json_output=False, min_busbw=min_busbw)


def test_nccl_tests_table_is_read_with_both_columns():
    from sparkcluster.nccl.tables import read_tables
    tables = read_tables(fixture("nccl-tests-roce-degraded.log"), "x")
    assert [(t.op, t.avg_busbw_gbps, t.hosts) for t in tables] == [("all_gather", 2.815, ("spark-a1f3", "spark-b7c2"))]
    assert [(r.size_bytes, r.busbw_gbps, r.in_place_busbw_gbps) for r in tables[0].rows] == [
        (67108864, 2.79, 2.80), (4294967296, 2.82, 2.83), (17179869184, 2.82, 2.83)]
    # mpirun --tag-output prefixes, and the op from "# Collective test starting".
    tagged = read_tables(fixture("nccl-tests-only.log"), "y")
    assert [(t.op, len(t.rows), t.rows[-1].busbw_gbps) for t in tagged] == [("all_reduce", 4, 22.83)]


def test_every_channel_on_rdma_but_a_degraded_link_fails():
    """A re-plugged ConnectX-7 on a power-limited slot: both twins on NET/IB, busbw 2.8 GB/s. It must not pass."""
    code, text = report_text("nccl-tests-roce-degraded.log")
    first = text.splitlines()[0]
    assert code == 1 and first.startswith("FAIL  RDMA, but the link delivers 2.83 GB/s of an expected >= 18 (a few "
                                          "GB/s at every size with both twins on NET/IB: a hot re-plug or PCIe power")
    assert "dmesg | grep -i mlx5" in first and "`ethtool --show-fec <twin>`" in text
    assert report_text("nccl-tests-roce-degraded.log", min_busbw=2.5)[0] == 0


def test_a_table_without_nccl_lines_gets_a_bandwidth_verdict_and_says_the_transport_is_unknown(tmp_path):
    code, text = report_text("nccl-tests-only.log")
    assert (code, text.splitlines()[0]) == (0, "PASS  busbw 22.84 GB/s >= 18; transport unknown: no NCCL INFO lines "
                                               "(rerun with NCCL_DEBUG=INFO to see it)")
    slow = tmp_path / "slow.log"
    slow.write_text(fixture("nccl-tests-only.log").replace(" 22.", " 2."))
    code, text = report([str(slow)], json_output=False, min_busbw=None)
    assert code == 1 and text.startswith("FAIL  the link delivers 2.84 GB/s of an expected >= 18")
    assert "transport unknown" in text.splitlines()[0]
    # nccl-tests' average alone (NVIDIA's own script reads only that line) is still a measurement.
    avg = tmp_path / "avg.log"
    avg.write_text("# Avg bus bandwidth    : 2.8311\n")
    assert report([str(avg)], json_output=False, min_busbw=None)[1].startswith("FAIL  the link delivers 2.83 GB/s")


def test_one_host_table_says_nothing_about_the_link(tmp_path):
    one_host = tmp_path / "one.log"
    one_host.write_text(fixture("nccl-tests-only.log").replace("spark-b7c2", "spark-a1f3"))
    code, text = report([str(one_host)], json_output=False, min_busbw=None)
    assert (code, text.splitlines()[0]) == (0, "WARN  every rank on one host (spark-a1f3): the table says nothing "
                                               "about the QSFP link")


def test_transport_proven_without_bandwidth_says_so_and_reads_the_ib_using_line():
    ranks = ranks_of("nccl229-mlx5-names.log")
    assert (ranks[0].network, ranks[0].ib_devices, ranks[0].nccl_version) == ("IB", ("mlx5_1", "mlx5_3"), "2.29.2+cuda13.0")
    verdict = judge(ranks)
    assert verdict.status == "PASS" and verdict.cause.endswith(
        "transport proven, bandwidth not in this log: run `sparkcluster verify`")
    # Cut before "Using network": the NET/IB line alone names the network.
    cut = "\n".join(fixture("nccl229-mlx5-names.log").splitlines()[:4])
    assert read_log(cut)[0].network == "IB"
    # ...but not the one NCCL prints with no device before falling back (real NCCL 2.28.9 output).
    assert all(r.network == "Socket" for r in ranks_of("real/h100-socket-default.log"))


def test_socket_on_the_management_port_outranks_a_truncated_log():
    ranks = ranks_of("socket-management-truncated.log")
    assert ranks[0].truncated and ranks[0].network == "Socket"
    verdict = judge(ranks)
    assert verdict.status == "FAIL" and verdict.cause.startswith(
        "socket fallback on the management interface enP7s7 (10 GbE, about 1 GB/s)")
    assert "NCCL_SOCKET_IFNAME=" in verdict.fix
    assert any("truncated" in d for d in verdict.details)  # still listed, below the root cause


def test_two_runs_in_one_file_are_judged_apart(tmp_path):
    """Real: two probe runs appended to one file on an H100 (tests/fixtures/nccl/real/README.md)."""
    code, doc = report([str(FIXTURES / "real" / "h100-two-runs.log")], json_output=True, min_busbw=None)
    runs = json.loads(doc)["runs"]
    assert code == 1 and [r["name"].rsplit(" ", 2)[-2:] for r in runs] == [["(vm:550,", "vm:551)"],
                                                                           ["(vm:607,", "vm:608)"]]
    assert all(r["status"] == "FAIL" and r["cause"].startswith("socket fallback over lo") for r in runs)
    assert [len(r["rows"]) for r in runs] == [4, 4]
    # A healthy RDMA run next to a degraded one in one call: the degraded one is not hidden.
    code, text = report_text("roce-both-twins.log", "nccl-tests-roce-degraded.log")
    assert code == 1 and text.splitlines()[0] == "FAIL  2 runs, judged apart: 1 FAIL, 1 PASS"
    assert "run 2: " in text and "RDMA, but the link delivers 2.83" in text


def test_real_socket_captures_fail_with_their_bandwidth():
    for name, iface in (("real/h100-socket-default.log", "eth0"), ("real/h100-socket-lo-limited.log", "lo")):
        code, doc = report([str(FIXTURES / name)], json_output=True, min_busbw=None)
        doc = json.loads(doc)
        assert code == 1 and doc["cause"].startswith(f"socket fallback over {iface}")
        assert {r["op"] for r in doc["rows"]} == {"all_reduce", "all_gather"}
        assert max(r["busbw_gbps"] for r in doc["rows"]) < 5.0  # what one TCP socket carried there


def test_twins_compared_alone_name_the_degraded_one_and_the_dead_one():
    from sparkcluster.nccl.twins import Twin, TwinMeasure, judge_twins
    a = Twin(0, {"spark-1": "enp1s0f1np1", "spark-2": "enp1s0f1np1"}, {}, {})
    b = Twin(1, {"spark-1": "enP2p1s0f1np1", "spark-2": "enP2p1s0f1np1"}, {}, {})
    assert judge_twins([TwinMeasure(a, 11.2), TwinMeasure(b, 10.9)], "spark-1") is None
    assert judge_twins([TwinMeasure(a, 11.2), TwinMeasure(b, 5.7)], "spark-1") is None  # within 2x
    degraded = judge_twins([TwinMeasure(a, 11.2), TwinMeasure(b, 1.4)], "spark-1")
    assert degraded is not None and degraded.status == "FAIL"
    assert degraded.cause == ("twin 1 (enP2p1s0f1np1) is degraded: 1.400 GB/s alone against 11.200 on twin 0 "
                              "(enp1s0f1np1) (more than 2x apart)")
    assert "dmesg | grep -i mlx5" in degraded.fix and "ethtool enP2p1s0f1np1" in degraded.fix
    dead = judge_twins([TwinMeasure(a, 11.2), TwinMeasure(b, None, "the probe failed on spark-2 (exit 1):")], "spark-1")
    assert dead is not None and dead.cause == ("twin 1 (enP2p1s0f1np1) carries nothing on its own: the probe failed "
                                               "on spark-2 (exit 1):")


def test_the_verdict_each_node_keeps_reads_back_as_one_line():
    from sparkcluster.nccl.lastverify import last_verify
    doc = {"status": "FAIL", "cause": "twin 1 (enP2p1s0f1np1) is degraded", "backend": "gloo", "busbw_gbps": 0.5321,
           "at": "2026-11-24T05:00:00+00:00"}
    assert last_verify(json.dumps(doc)) == ("FAIL, busbw 0.53 GB/s (gloo, 2026-11-24T05:00:00+00:00): twin 1 "
                                            "(enP2p1s0f1np1) is degraded")
    assert last_verify(json.dumps({**doc, "status": "PASS", "busbw_gbps": None})) == (
        "PASS (gloo, 2026-11-24T05:00:00+00:00)")
    assert last_verify("") is None and last_verify("[1]") is None


def test_mlx5_names_in_nccl_ib_hca_are_a_sparks_not_a_typo():
    """With /dev/infiniband missing, NCCL_IB_HCA=mlx5_1,mlx5_3 (a kernel naming by PCI order) is F1, not a wrong
    HCA list; a name no Spark has still is."""
    base = fixture("socket-no-device.log")
    hca_line = next(line for line in base.splitlines() if "NCCL_IB_HCA set" in line)
    for hcas, cause in (("mlx5_1,mlx5_3", "is /dev/infiniband in the container?"),
                        ("mlx5_7", "NCCL_IB_HCA=mlx5_7 matches no RDMA device")):
        text = base.replace(hca_line, hca_line.split("NCCL_IB_HCA set")[0] + f"NCCL_IB_HCA set to {hcas}")
        assert cause in judge(read_log(text)).cause


def test_two_communicators_of_one_process_are_one_run_real_capture():
    """Real (H100, NCCL 2.28.9): each process joins two commIds, as vLLM's world and TP groups do, with
    NCCL_IB_HCA=mlx5_1,mlx5_3 and no RDMA device: one run, the missing devices named (F1)."""
    ranks = ranks_of("real/h100-two-comms.log")
    assert [len(r.comm_ids) for r in ranks if r.host] == [2, 2]
    code, doc = report([str(FIXTURES / "real" / "h100-two-comms.log")], json_output=True, min_busbw=None)
    doc = json.loads(doc)
    assert code == 1 and len(doc["runs"]) == 1
    assert doc["cause"] == "socket fallback over lo: NET/IB found no device (is /dev/infiniband in the container?)"


# ---- rings and switches: what NCCL prints on 3 and 4 nodes (tests/fixtures/nccl/README.md) ----------------
def test_a_three_ring_passes_on_the_rings_floor_with_gdr_off():
    """13.86 GB/s all_reduce is what a healthy 3-ring delivers: under the pair's 18, above the ring's floor."""
    ranks = ranks_of("ring3-roce.log")
    assert [(r.host, r.n_nodes, r.rings_connected, r.trees_connected, r.gdr) for r in ranks] == [
        (f"spark-{i}", 3, True, True, False) for i in (1, 2, 3)]
    code, text = report([str(FIXTURES / "ring3-roce.log")], json_output=False, min_busbw=None)
    assert code == 0, text
    assert text.startswith("PASS  RDMA: NET/IB on rocep1s0f0, rocep1s0f1, roceP2p1s0f0, roceP2p1s0f1 for 3 rank(s) "
                           "(GDR off: GB10 has no GPUDirect RDMA"), text
    assert text.splitlines()[0].endswith("best busbw 13.9 GB/s")
    # The pair's floor is still there when asked for.
    code, text = report([str(FIXTURES / "ring3-roce.log")], json_output=False, min_busbw=18.0)
    assert code == 1 and "13.88 GB/s of an expected >= 18" in text


def test_gdr_off_is_rdma_on_a_pair():
    verdict = judge(ranks_of("pair-gdr-off.log"), rows=rows(23.7, size=1 << 30))
    assert verdict.status == "PASS" and verdict.transports == ("NET/IB",)
    assert "(GDR off: GB10 has no GPUDirect RDMA, NCCL stages through host memory)" in verdict.cause


def test_a_working_four_ring_is_not_truncated():
    """vLLM's workers print no channel line of their own; "Connected all rings" says their init finished."""
    ranks = ranks_of("ring4-ring-only.log")
    assert [bool(r.channels) for r in ranks] == [True, False, False, False]
    assert not any(r.truncated for r in ranks) and all(r.rings_connected and not r.trees_connected for r in ranks)
    verdict = judge(ranks)
    assert verdict.status == "PASS" and verdict.transports == ("NET/IB",), verdict.details
    assert verdict.cause.endswith("transport proven, bandwidth not in this log: run `sparkcluster verify`")


def test_a_four_ring_whose_tree_connect_fails_is_told_to_force_the_ring_algorithm():
    verdict = judge(ranks_of("ring4-tree-connect.log"))
    assert verdict.status == "FAIL"
    assert verdict.cause.startswith("NCCL's tree connect (ncclTransportTreeConnect) failed on a ring of 4: the rings "
                                    "connected, but the tree joins opposite nodes"), verdict.cause
    assert "192.168.0.1 on rocep1s0f0 -> 192.168.4.3 timed out" in verdict.cause
    assert "NCCL_ALGO=Ring NCCL_SKIP_TREE_CONNECT=1" in verdict.fix


def test_a_three_ring_cabled_port0_to_port0_names_the_two_ports_and_the_crosswise_fix():
    verdict = judge(ranks_of("ring3-port0-port0.log"))
    assert verdict.cause == ("ibv_modify_qp timed out between 192.168.0.1 on rocep1s0f0 -> 192.168.4.3: no cable joins "
                             "these two ports (their addresses are on different links), and NCCL hints the NICs are "
                             "not cross-rail connected")
    assert verdict.fix.startswith("a ring of 3: cable it crosswise, port 0 of each node to port 1 of the next")
    assert "NCCL_IB_SUBNET_AWARE_ROUTING=1" in verdict.fix and "NCCL_ALGO=Ring" not in verdict.fix


def test_the_cabling_fix_fits_the_node_count_and_the_topology():
    from sparkcluster.nccl.rings import Endpoint
    import ipaddress
    ranks = ranks_of("ring3-port0-port0.log")
    pair = judge(ranks_of("ibv-modify-qp.log"))
    assert pair.cause == ("ibv_modify_qp timed out between 192.168.100.11 on rocep1s0f0 -> 192.168.100.12: the port "
                          "NCCL took does not reach the peer's")
    assert pair.fix.startswith("two nodes: cable the same QSFP port on both") and "rocep1s0f0 is not on the cable" in pair.fix
    switch = judge(ranks, topology="switch")
    assert switch.fix.startswith("behind a switch: twin k of every node on the one subnet of twin k")
    # With the cluster's addresses (verify has them) the ports are named by node and netdev.
    named = judge(ranks, endpoints={
        "192.168.0.1": Endpoint("spark-1", "enp1s0f0np0", ipaddress.ip_network("192.168.0.0/24")),
        "192.168.4.3": Endpoint("spark-3", "enp1s0f0np0", ipaddress.ip_network("192.168.4.0/24"))})
    assert named.cause.startswith("ibv_modify_qp timed out between spark-1 enp1s0f0np0 (192.168.0.1) on rocep1s0f0 -> "
                                  "spark-3 enp1s0f0np0 (192.168.4.3): no cable joins")
    # Two ports of one link that time out: the link itself, not the cabling.
    one_link = judge(ranks, endpoints={
        "192.168.0.1": Endpoint("spark-1", "enp1s0f0np0", ipaddress.ip_network("192.168.0.0/16"))})
    assert "two ports of one link: that link does not carry RoCE" in one_link.cause and "(F7)" in one_link.fix


def test_the_older_modify_qp_line_without_the_gids_still_gets_the_node_counts_fix():
    text = fixture("ring3-port0-port0.log").replace(
        "failed with 110 Connection timed out, on dev rocep1s0f0:1, curr state INIT, next state RTR, local GID index 3, "
        "local GID ::ffff:192.168.0.1, remote GID ::ffff:192.168.4.3", "failed with error Connection timed out")
    verdict = judge(read_log(text))
    assert verdict.cause == "NCCL error: ibv_modify_qp timed out"
    assert verdict.fix.startswith("a ring of 3: cable it crosswise")


@pytest.mark.parametrize("topology, nodes, floor", [
    (None, 2, 18.0), ("ring", 2, 18.0), (None, 3, 10.0), ("ring", 4, 10.0), ("switch", 8, 14.0), ("pair", None, 18.0)])
def test_the_default_floor_per_topology(topology, nodes, floor):
    from sparkcluster.nccl.thresholds import floor_for
    assert floor_for(topology, nodes).min_busbw_gbps == floor


def test_the_floors_sit_under_the_field_figures():
    from sparkcluster.nccl.thresholds import PAIR, RING, SWITCH, TWIN
    for found, field in ((PAIR, 21.9), (RING, 13.9), (SWITCH, 17.6), (TWIN, 12.3)):
        assert 0.6 * field < found.min_busbw_gbps < field
    assert TWIN.min_busbw_gbps < ONE_TWIN_MAX_GBPS < PAIR.min_busbw_gbps
