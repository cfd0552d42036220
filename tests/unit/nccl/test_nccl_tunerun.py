"""verify --tune's run (issue 50), with a double at the probe's boundary that prints what the probe prints: the
winner lands in every node's comm env and last-verify record, --check changes nothing, gloo keeps the default and
says why, --reset goes back; the default is measured with an earlier tuning unset."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result
from sparkcluster.nccl.proberun import probe_commands
from sparkcluster.nccl.tune import BLOCK_BEGIN, Candidate, tuned_settings
from sparkcluster.nccl.tunerun import render, run_reset, run_tune

COMM = ".config/sparkcluster/comm.env"
RECORD = ".config/sparkcluster/last-verify.json"
BOOTSTRAP_ENV = "# sparkcluster bootstrap\nNCCL_IB_HCA=rocep1s0f1\nNCCL_SOCKET_IFNAME=enp1s0f1np1\n"


class Node:
    """A node's files: the comm env (read and written whole) and the last-verify record (through `cat`)."""

    def __init__(self) -> None:
        self.files = {COMM: BOOTSTRAP_ENV.encode(), RECORD: json.dumps({"status": "PASS"}).encode()}

    def read_file(self, path: str) -> bytes | None:
        return self.files.get(path.removeprefix("~/"))

    def write_file_atomic(self, path: str, content: bytes, mode: int) -> None:
        self.files[path.removeprefix("~/")] = content

    def run(self, command: Command) -> Result:
        if re.match(r"cat \S*last-verify.json 2>/dev/null", command.script):
            return Result(command, 0, self.files.get(RECORD, b"").decode(), "", 0.0)
        if "last-verify.json.tmp" in command.script:
            self.files[RECORD] = (command.stdin or "").encode()
        return Result(command, 0, "", "", 0.0)  # test -f: the comm env is there

    def close(self) -> None:
        pass


def cluster() -> tuple[Session, dict[str, Node]]:
    hosts = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))
    nodes = {h.name: Node() for h in hosts}
    return Session(Inventory(Path("inv.yml"), "t", hosts, {}), transports=nodes), nodes  # type: ignore[arg-type]


# All-reduce medians per call at 8 KiB (c1) and 64 KiB (c8), and busbw at 64 MiB, per candidate: LL wins decode
# within busbw; 4 channels is faster still but loses a third of the busbw.
TIMES = {"default": (50.0, 100.0, 20.0), "LL protocol": (38.0, 80.0, 19.5), "4 channels": (30.0, 60.0, 13.0)}


def probe_double(candidate: Candidate) -> str:
    """What rank 0 of the probe prints last, with this candidate's timings (others: the default's, +2%)."""
    us8k, us64k, busbw = TIMES.get(candidate.name, tuple(v * 1.02 for v in TIMES["default"]))
    latency = [{"op": "all_reduce", "size_bytes": s, "median_us": us, "p99_us": us * 1.3, "iters": 100,
                "per_sample": 10, "timing": "graph", "sum_ok": True} for s, us in ((8192, us8k), (65536, us64k))]
    rows = [{"op": "all_reduce", "size_bytes": 64 << 20, "time_us": 6000.0, "algbw_gbps": busbw,
             "busbw_gbps": busbw}]
    return "SPARKCLUSTER_PROBE_RESULT " + json.dumps({"backend": "nccl", "world": 2, "rows": rows,
                                                      "latency": latency})


def test_the_winner_is_in_every_nodes_comm_env_and_last_verify_record_and_reset_removes_it():
    session, nodes = cluster()
    with session:
        found = run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=probe_double)
    assert found.transport == "ib" and found.choice is not None and found.written
    assert found.choice.chosen.settings == {"NCCL_PROTO": "LL"}
    assert found.choice.reason.startswith("LL protocol: decode all-reduces 150.0 -> 118.0 us (21% faster)")
    verdicts = {c["name"]: c["verdict"] for c in found.to_json()["candidates"]}
    assert verdicts["4 channels"] == "loses 35% busbw at 64 MiB and above" and verdicts["LL protocol"] == "chosen"
    for node in nodes.values():
        env = node.files[COMM].decode()
        assert env.startswith(BOOTSTRAP_ENV) and tuned_settings(env) == {"NCCL_PROTO": "LL"}
        record = json.loads(node.files[RECORD])
        assert record["status"] == "PASS" and record["comm_tuned"]["settings"] == {"NCCL_PROTO": "LL"}
        assert record["comm_tuned"]["decode_bytes"] == {"1": 8192, "8": 65536}
    with session:
        back = run_reset(session)
    assert back.before == {"NCCL_PROTO": "LL"}
    for node in nodes.values():
        assert node.files[COMM].decode() == BOOTSTRAP_ENV and "comm_tuned" not in json.loads(node.files[RECORD])


def test_check_measures_and_changes_nothing():
    session, nodes = cluster()
    with session:
        found = run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=probe_double,
                         check=True)
    assert found.choice is not None and found.choice.chosen.name == "LL protocol" and not found.written
    assert all(n.files[COMM].decode() == BOOTSTRAP_ENV for n in nodes.values())
    assert all("comm_tuned" not in json.loads(n.files[RECORD]) for n in nodes.values())
    text = render(found).splitlines()
    assert text[1].split() == ["CANDIDATE", "DECODE(us)", "VS", "DEFAULT", "BUSBW", "LOST", "VERDICT"]
    assert text[2].split() == ["default", "150.0", "-", "-", "the", "default"]
    assert text[3].split() == ["LL", "protocol", "118.0", "+21%", "2%", "chosen"]
    assert "4 channels                         90.0        +40%         35%  loses 35% busbw" in "\n".join(text)
    assert text[-1] == "would set in every node's comm env (--check): NCCL_PROTO=LL"


def test_under_gloo_the_candidates_are_measured_and_the_default_kept_saying_why():
    session, nodes = cluster()
    measured: list[str] = []

    def gloo(candidate: Candidate) -> str:
        measured.append(candidate.name)
        return probe_double(candidate)

    with session:
        found = run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="gloo", measure=gloo)
    assert found.choice is not None and not found.choice.changes_anything and len(measured) > 5
    assert "NCCL's settings change nothing" in found.choice.reason
    assert all(BLOCK_BEGIN not in n.files[COMM].decode() for n in nodes.values())


def test_each_candidates_probe_runs_with_an_earlier_tuning_unset_and_its_own_set():
    session, _ = cluster()
    commands = probe_commands(session, "192.168.100.1", "nccl", "64M", {"spark-1": COMM, "spark-2": COMM},
                              "print()", 60, None, extra_env={"spark-1": {"NCCL_MAX_NCHANNELS": "4"}},
                              probe_args=["--latency-sizes", "8192"], unset=("NCCL_PROTO", "NCCL_MAX_NCHANNELS"))
    head = commands["spark-1"].script
    assert "unset NCCL_PROTO; NCCL_MAX_NCHANNELS=4; export NCCL_MAX_NCHANNELS;" in head
    assert "unset NCCL_MAX_NCHANNELS" not in head and "--latency-sizes 8192" in head
    assert "unset NCCL_PROTO; unset NCCL_MAX_NCHANNELS;" in commands["spark-2"].script


def test_bad_tune_flags_are_refused_before_connecting(tmp_path, monkeypatch, capsys):
    from sparkcluster import cli
    from sparkcluster.engine import session as session_module

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected although the flags were refused")
    monkeypatch.setattr(session_module, "Transport", refuse)
    path = tmp_path / "inv.yml"
    path.write_text("hosts:\n  spark-1: {address: 10.0.0.1, role: head}\n  spark-2: {address: 10.0.0.2}\n")
    for flags, words in ((["--tune"], "needs the model it tunes for"),
                         (["--tune", "--model", "../x"], "--model '../x': not a model id of the HF cache"),
                         (["--tune", "--hidden-size", "0"], "--hidden-size 0: not a positive whole number"),
                         (["--tune", "--hidden-size", "4096", "--concurrency", "1,x"], "--concurrency '1,x'"),
                         (["--tune", "--hidden-size", "4096", "--concurrency", "0"], "not a list of positive"),
                         (["--check"], "--check goes with --tune or --reset"),
                         (["--tune", "--reset", "--hidden-size", "4096"], "--tune and --reset together")):
        assert cli.main(["verify", "-i", str(path), *flags]) == 2, flags
        assert words in " ".join(capsys.readouterr().err.split()), flags


def test_a_later_verify_keeps_the_tuning_in_its_record_and_status_names_it():
    from sparkcluster.nccl.lastverify import last_verify, record_verdict
    from sparkcluster.nccl.verdict import Verdict, VerdictStatus
    from sparkcluster.nccl.verifyresult import VerifyResult

    session, nodes = cluster()
    with session:
        run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=probe_double)
        record_verdict(session, VerifyResult("nccl", Verdict(VerdictStatus.PASS, "RDMA on both twins", "", (), (),
                                                                False), []))
    for node in nodes.values():
        record = json.loads(node.files[RECORD])
        assert record["cause"] == "RDMA on both twins" and record["comm_tuned"]["settings"] == {"NCCL_PROTO": "LL"}
        line = last_verify(node.files[RECORD].decode())
        assert line is not None and line.startswith("PASS, tuned NCCL_PROTO=LL (nccl, ")


def test_bench_receipts_read_the_tuned_variables_from_the_comm_env():
    from sparkcluster.bench.receipt_sources import comm_env

    session, _ = cluster()
    with session:
        run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=probe_double)
        env = comm_env(session, session.head)  # what bench's receipt records of a node
    assert env["NCCL_PROTO"] == "LL" and env["NCCL_IB_HCA"] == "rocep1s0f1"
    assert not any(key.startswith("#") for key in env)  # the block's markers are comments, as env files read them


def test_the_decode_budget_names_the_settings_its_latency_was_timed_with():
    from sparkcluster.bench.ceiling import ServedModel
    from sparkcluster.bench.decode_budget import budget, describe, for_served, latency_of
    from tests.support.bench import LLAMA_8B, RECORD

    tuned = {**RECORD, "comm_tuned": {"name": "LL protocol", "settings": {"NCCL_PROTO": "LL"}}}
    curve = latency_of(tuned)
    assert curve is not None and curve.settings == (("NCCL_PROTO", "LL"),)
    assert latency_of(curve.to_json()) == curve  # as bench's config carries it
    inputs = for_served(ServedModel("m", LLAMA_8B, None), {"nodes": ["spark-1", "spark-2"], "tp": 2}, tuned)
    assert inputs is not None
    assert "2026-11-27T16:00:00+00:00) with NCCL_PROTO=LL (verify --tune)" in describe(budget(inputs, [(1, 0.03)]))
    plain = for_served(ServedModel("m", LLAMA_8B, None), {"nodes": ["spark-1", "spark-2"], "tp": 2}, RECORD)
    assert plain is not None and "with no verify --tune settings" in describe(budget(plain, [(1, 0.03)]))


class StagedNode(Node):
    """A head whose HF cache holds `config` (None: nothing staged; config_script then exits 3, as on a node)."""

    def __init__(self, config: dict | None) -> None:
        super().__init__()
        self.config = config

    def run(self, command: Command) -> Result:
        if "config.json" in command.script and "@@index@@" in command.script:
            if self.config is None:
                return Result(command, 3, "", "", 0.0)
            return Result(command, 0, json.dumps(self.config) + "\n@@index@@\n", "", 0.0)
        return super().run(command)


def tune_args(*flags: str):
    from sparkcluster.cli import build_parser
    return build_parser().parse_args(["verify", "-i", "inv.yml", "--tune", *flags])


def test_the_decode_sizes_come_from_the_staged_models_config_unless_the_flags_give_them():
    from sparkcluster.engine.errors import UsageError
    from sparkcluster.nccl.cli import tune_shape

    hosts = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))
    qwen = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 5120, "num_hidden_layers": 64,
            "torch_dtype": "bfloat16"}
    vision = {"text_config": {"hidden_size": 3072, "num_hidden_layers": 28, "torch_dtype": "float32"}}
    for config, flags, expected in ((qwen, ["--model", "Qwen/Qwen3-32B"], (5120, 2)),
                                    (vision, ["--model", "org/vl"], (3072, 2)),  # float32 is served in 16 bits
                                    (qwen, ["--model", "Qwen/Qwen3-32B", "--dtype-bytes", "1"], (5120, 1)),
                                    (None, ["--hidden-size", "4096"], (4096, 2))):
        nodes = {h.name: StagedNode(config) for h in hosts}
        session = Session(Inventory(Path("inv.yml"), "t", hosts, {}), transports=nodes)  # type: ignore[arg-type]
        with session:
            assert tune_shape(session, tune_args(*flags)) == expected, flags
    nodes = {h.name: StagedNode(None) for h in hosts}
    session = Session(Inventory(Path("inv.yml"), "t", hosts, {}), transports=nodes)  # type: ignore[arg-type]
    with session:
        try:
            tune_shape(session, tune_args("--model", "Qwen/Qwen3-32B"))
        except UsageError as e:
            assert e.message == "spark-1 has no config.json of Qwen/Qwen3-32B in its HF cache"
            assert e.fix.startswith("stage it first (`sparkcluster stage Qwen/Qwen3-32B`)")
        else:
            raise AssertionError("a model not staged was read")


def test_the_model_tuned_for_is_named_in_the_output_and_the_record():
    session, nodes = cluster()
    with session:
        found = run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=probe_double,
                         model="meta-llama/Meta-Llama-3-8B")
    assert render(found).startswith("verify --tune (nccl, ib): all_reduce at the decode sizes of "
                                    "meta-llama/Meta-Llama-3-8B 8 KiB (concurrency 1), 64 KiB (concurrency 8)")
    assert found.to_json()["model"] == "meta-llama/Meta-Llama-3-8B"
    assert all(json.loads(n.files[RECORD])["comm_tuned"]["model"] == "meta-llama/Meta-Llama-3-8B"
               for n in nodes.values())


class BuildingNode(Node):
    """A node that builds the tuner plugin (its home /home/nvidia), or has no C compiler (`cc=False`)."""

    def __init__(self, cc: bool = True) -> None:
        super().__init__()
        self.cc = cc

    def run(self, command: Command) -> Result:
        if "command -v cc" in command.script:
            if not self.cc:
                return Result(command, 3, "", "no C compiler (cc)\n", 0.0)
            return Result(command, 0, "SPARKCLUSTER_HOME=/home/nvidia\n", "", 0.0)
        return super().run(command)


def pairs_double(candidate: Candidate) -> str:
    """probe_double, with Ring + LL as fast as LL at both decode sizes (so the table is Ring + LL), and the table
    through the plugin as fast as 4 channels at the decode sizes without its busbw loss."""
    from sparkcluster.nccl.tune import PER_SIZE_NAME

    if candidate.name == "Ring + LL":
        return probe_double(Candidate("LL protocol"))
    if candidate.name == PER_SIZE_NAME:
        return probe_double(Candidate("4 channels")).replace('"busbw_gbps": 13.0', '"busbw_gbps": 20.0')
    return probe_double(candidate)


def test_a_choice_per_size_is_built_on_every_node_measured_and_kept_with_each_nodes_own_paths():
    from sparkcluster.nccl.tune import PER_SIZE_NAME
    from sparkcluster.nccl.tunerplugin import PLUGIN, SOURCE, source

    hosts = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))
    nodes = {h.name: BuildingNode() for h in hosts}
    session = Session(Inventory(Path("inv.yml"), "t", hosts, {}), transports=nodes)  # type: ignore[arg-type]
    measured: list[Candidate] = []

    def double(candidate: Candidate) -> str:
        measured.append(candidate)
        return pairs_double(candidate)

    with session:
        found = run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=double)
    assert found.choice is not None and found.choice.chosen.name == PER_SIZE_NAME, found.choice
    assert measured[-2].name == PER_SIZE_NAME and measured[-1].name == "default"  # then the default again, last
    table = measured[-2].settings["NCCL_TUNER_CONFIG_FILE"]
    assert measured[-2].settings["NCCL_TUNER_PLUGIN"] == PLUGIN and re.fullmatch(
        r"~/\.config/sparkcluster/nccl-tuner/sizes-[0-9a-f]{12}\.csv", table)
    assert found.table == "Ring + LL up to 128 KiB, NCCL's own choice above"
    for node in nodes.values():
        assert node.files[SOURCE.removeprefix("~/")] == source()
        assert node.files[table.removeprefix("~/")].decode().splitlines()[-1] == "allreduce,0,131072,ring,ll,-1,-1,-1"
        assert tuned_settings(node.files[COMM].decode()) == {
            "NCCL_TUNER_CONFIG_FILE": "/home/nvidia/" + table.removeprefix("~/"),
            "NCCL_TUNER_PLUGIN": "/home/nvidia/.config/sparkcluster/nccl-tuner/libnccl-tuner-sparkcluster.so"}
        record = json.loads(node.files[RECORD])
        assert record["comm_tuned"]["per_size_table"] == "Ring + LL up to 128 KiB, NCCL's own choice above"
    text = render(found)
    assert "per size, through NCCL's tuner plugin: Ring + LL up to 128 KiB, NCCL's own choice above; measured as " \
           "'per size (tuner plugin)' above" in text
    assert "set in every node's comm env: NCCL_TUNER_CONFIG_FILE=~/" in text and "would set" not in text
    with session:
        assert run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=double,
                        check=True).choice is not None
    assert "would set in every node's comm env (--check)" in render(dataclasses.replace(found, written=False))


def test_a_node_without_a_compiler_leaves_the_table_unmeasured_and_says_the_fix():
    hosts = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))
    nodes = {"spark-1": BuildingNode(), "spark-2": BuildingNode(cc=False)}
    session = Session(Inventory(Path("inv.yml"), "t", hosts, {}), transports=nodes)  # type: ignore[arg-type]
    with session:
        found = run_tune(session, hidden_size=4096, concurrencies=[1, 8], backend="nccl", measure=pairs_double)
    assert found.table_refused == {"spark-2": "no C compiler (cc): install one, e.g. `apt install gcc`"}
    assert found.choice is not None and found.choice.chosen.name == "LL protocol"
    assert "not measured (spark-2: no C compiler (cc): install one, e.g. `apt install gcc`)" in render(found)
