"""What bench's tests share: a model's shape (LLAMA_8B), the decode budget's head and record, llama-benchy's corpus and
runner, a result and its receipt as `bench --explain` reads them, and the stub's requests under a Ctrl-C."""

from __future__ import annotations

import argparse
import json
import signal
from contextlib import contextmanager
from pathlib import Path

from sparkcluster.bench.receipt import BenchParams, Engine, NodeReceipt, Receipt
from sparkcluster.bench.receipt_metrics import EngineDeltas
from sparkcluster.engine.command import Command
from sparkcluster.engine.facts import parse_probe
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result
from sparkcluster.nccl.finding import Verdict, VerdictStatus
from sparkcluster.nccl.lastverify import record_doc
from sparkcluster.nccl.latency import Latency, LatencyRow
from sparkcluster.nccl.verifyresult import VerifyResult
from sparkcluster.node.health import health_command
from sparkcluster.serving.record import RECORD_FILE
from tests.support.helpers import run_cli

LLAMA_8B = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 14336, "vocab_size": 128256, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

# A direct pair's all-reduce medians, in the range of issue 40's field numbers (41 us at 8 KB, ~2,100 us at 1 MB).
PAIR_US = {"8192": 41.0, "32768": 60.0, "131072": 120.0, "524288": 600.0, "2097152": 4200.0}
# The last-verify record as verify writes it on every node (nccl/lastverify.py: record_doc), at a fixed time.
RECORD = {**record_doc(VerifyResult(
    "nccl", Verdict(VerdictStatus.PASS, "NET/IB on roceP2p1s0f1", "", (), ("IB",), False), [],
    latency=Latency(tuple(LatencyRow("all_reduce", int(size), us, 1.5 * us, 50) for size, us in PAIR_US.items())))),
    "at": "2026-11-27T16:00:00+00:00"}


class Head:
    """The head as bench reads it: the serve record, the model's config.json, the last verify, GPU telemetry."""

    def __init__(self, url: str, verify: dict | None) -> None:
        self.serve = {"version": 2, "runtime": "host", "launcher": "ray", "image": "", "nodes": ["spark-1", "spark-2"],
                      "serving": {"model": "meta-llama/Meta-Llama-3-8B", "served_name": "stub-model", "port": 8000,
                                  "endpoint": url, "tp": 2, "pp": 1, "flags": []}}
        self.verify = verify

    def read_file(self, path: str) -> bytes | None:
        if path != RECORD_FILE:  # the receipt's read of each node's comm env: none written here
            return None
        return json.dumps(self.serve).encode()

    def run(self, command: Command) -> Result:
        script = command.script
        if "@@index@@" in script:  # node/modelconfig.config_script: config.json, then the safetensors index
            return Result(command, 0, json.dumps(LLAMA_8B) + "\n@@index@@\n", "", 0.01)
        if "last-verify.json" in script:
            return Result(command, 0 if self.verify else 1, json.dumps(self.verify) if self.verify else "", "", 0.01)
        if script == health_command("").script:  # the receipt's doctor probe: unanswered, its fields unknown
            return Result(command, 1, "", "", 0.01)
        if "nvidia-smi" in script:
            return Result(command, 0, "71, 87.61, 2424, [N/A], 0x0000000000000000\nrc=0\n", "", 0.01)
        raise AssertionError(f"bench ran an unexpected command: {script}")

    def close(self) -> None:
        pass


def connect_to(head: object):
    """`connect` for a cluster of one head, `head` answering its commands, with a real Spark's probe as its facts."""
    @contextmanager
    def connect(args: argparse.Namespace, check: object, require_all: bool = True):
        hosts = (Host(name="spark-1", address="10.0.0.1", role="head"),)
        with Session(Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={}), {"spark-1": head}) as s:
            s.facts.update({"spark-1": parse_probe((FIXTURES / "probe-spark.txt").read_text())})
            yield s

    return connect


def corpus(tmp_path: Path) -> Path:
    """A book of our own: 20,000 words of a 500-word vocabulary."""
    path = tmp_path / "book.txt"
    path.write_text(" ".join(f"word{(i * 7919) % 500}" for i in range(20000)))
    return path


def benchy(tmp_path: Path, url: str, *flags: str, timeout: float = 180):
    return run_cli("bench", "--url", url, "--method", "llama-benchy", "--corpus", str(corpus(tmp_path)), *flags,
                   env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HOME": str(tmp_path)}, timeout=timeout)


COMMAND = ("vllm", "serve", "local/tiny-llama", "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "2",
           "--max-model-len", "512")


def receipt(command: tuple[str, ...] = COMMAND, kernel: str = "6.11.0-1016-nvidia",
            metrics: EngineDeltas | None = None) -> Receipt:
    nodes = (NodeReceipt("spark-1", "6.11.0-1016-nvidia", "580.95.05", "5.36", {"enp1s0f0np0": "28.45.1200"},
                         "2.28.3"),
             NodeReceipt("spark-2", kernel, "580.95.05", "5.36", {"enp1s0f0np0": "28.45.1200"}, "2.28.3"))
    return Receipt("http://10.0.0.1:8000/v1",
                   Engine("0.32.0", command, "host", "native", python_env="/opt/venv", tp=2, pp=1, replicas=1),
                   BenchParams("sustained", {"concurrency": [1, 2], "prompt_tokens": 256, "output_tokens": 64},
                               "ab" * 32),
                   {"spark-1": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"}, "spark-2": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"}},
                   nodes, metrics or EngineDeltas(False, None, 0.0, 0.0), created="2026-11-27T17:00:00+00:00")


def result(tmp_path: Path, name: str, made: Receipt, generation: tuple[float, float] = (10.0, 18.0)) -> str:
    rows = [{"concurrency": c, "prefill_tps": 500.0, "generation_tps": g, "peak_tps": g, "ttft_s": {"mean": 0.1},
             "itl_s": {"mean": 0.05}} for c, g in zip((1, 2), generation, strict=True)]
    path = tmp_path / name
    path.write_text(json.dumps({"config": {}, "rows": rows, "receipt": made.to_json()}))
    return str(path)


def _sigint_as_a_terminal_sends_it() -> None:
    """A run started in the background by a shell without job control inherits SIGINT ignored, and the child
    would then never see Ctrl-C: give it the default disposition, as an interactive terminal does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stub_requests(url: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=5) as response:
        text = response.read().decode()
    line = next(line for line in text.splitlines() if line.startswith("stub:requests_total"))
    return int(line.split()[-1])
