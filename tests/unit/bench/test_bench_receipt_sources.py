"""Where a receipt's engine comes from: serve records the command line as launched and the recipe and its mods by
sha256 (record version 4; an older record reads as not knowing them), and bench assembles the receipt from the
record, the nodes and the endpoint, marking unknown what a bare --url cannot tell."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sparkcluster.bench.receipt import BenchParams, NodeReceipt
from sparkcluster.bench.receipt_metrics import EngineDeltas
from sparkcluster.bench.receipt_sources import Served, assemble
from sparkcluster.recipes.types import Mod, Recipe
from sparkcluster.serving.launch import Node, ServeArgs
from sparkcluster.serving.layout import Placement
from sparkcluster.serving.provenance import launched
from sparkcluster.serving.record import Launched, ServeRecord, Serving

NODES = {"spark-1": Node("spark-1", 0, "10.0.0.1", "10.0.0.1"), "spark-2": Node("spark-2", 1, "10.0.0.2", "10.0.0.1")}
ARGS = ServeArgs("local/tiny-llama", 2, flags=("--max-model-len", "512", "--enforce-eager"))


def test_serve_records_the_heads_command_line_as_launched_and_the_recipe_by_content(tmp_path: Path) -> None:
    recipe_file = tmp_path / "tiny.yaml"
    recipe_file.write_text("model: local/tiny-llama\n")
    mod = tmp_path / "mods" / "tiny-template"
    mod.mkdir(parents=True)
    (mod / "run.sh").write_text("echo template\n")
    recipe = Recipe("tiny", source=str(recipe_file), mods=(Mod("tiny-template", mod, "mods/tiny-template"),))
    got = launched(ARGS, "ray", NODES, "spark-1", (), recipe)
    assert got.command == ("vllm", "serve", "local/tiny-llama", "--tensor-parallel-size", "2",
                           "--distributed-executor-backend", "ray", "--host", "0.0.0.0", "--port", "8000",
                           "--max-model-len", "512", "--enforce-eager")
    assert got.recipe_sha256 == hashlib.sha256(recipe_file.read_bytes()).hexdigest()
    (mod / "run.sh").write_text("echo another template\n")  # the same mod's name, other code: another digest
    assert launched(ARGS, "ray", NODES, "spark-1", (), recipe).mods[0][1] != got.mods[0][1]


def test_with_replicas_the_command_is_replica_zeros() -> None:
    placements = (Placement(0, ("spark-1",), 8001), Placement(1, ("spark-2",), 8002))
    got = launched(ARGS, "native", NODES, "spark-1", placements, Recipe("default"))
    assert got.command[:5] == ("vllm", "serve", "local/tiny-llama", "--tensor-parallel-size", "2")
    assert "--port" in got.command and got.command[got.command.index("--port") + 1] == "8001"
    assert got.recipe_sha256 is None and got.mods == ()


LAUNCHED = Launched(("vllm", "serve", "m", "--enforce-eager"), "recipes/tiny.yaml", "ab" * 32, (("fix", "cd" * 32),))
RECORD = ServeRecord("host", "native", "vllm-node", ("spark-1", "spark-2"),
                     Serving("m", "m", 8000, "http://10.0.0.1:8000/v1", 2, "tiny", ("--enforce-eager",),
                             launched=LAUNCHED))


def test_the_record_keeps_what_was_launched_and_an_older_one_knows_nothing_of_it() -> None:
    doc = json.loads(json.dumps(RECORD.to_json()))
    assert doc["version"] == 4 and doc["serving"]["launched"]["command"] == list(LAUNCHED.command)
    assert ServeRecord.from_json(doc) == RECORD
    del doc["serving"]["launched"]
    older = ServeRecord.from_json({**doc, "version": 3})
    assert older.serving is not None and older.serving.launched is None


def test_a_served_receipt_carries_the_engine_the_nodes_and_the_comm_env() -> None:
    served = Served(RECORD, None, "0.32.0+cpu", None, "/opt/vllm-env",
                    {"spark-1": {"NCCL_SOCKET_IFNAME": "enp1s0f0np0"}},
                    (NodeReceipt("spark-1", "6.17.0", "580.95.05"), NodeReceipt("spark-2", "6.17.0", "580.95.05")))
    receipt = assemble("http://10.0.0.1:8000/v1", served, "0.32.0", BenchParams("sustained"),
                       EngineDeltas(False, None, 0.0, 0, 30.0))
    engine = receipt.engine
    assert engine.vllm_version == "0.32.0+cpu"  # the build, not /version's release alone
    assert engine.command == LAUNCHED.command and engine.python_env == "/opt/vllm-env" and engine.image is None
    assert engine.recipe is not None and engine.recipe.mods[0].name == "fix"
    assert (engine.tp, engine.pp, engine.replicas) == (2, 1, 1)
    assert receipt.nodes is not None and [n.kernel for n in receipt.nodes] == ["6.17.0", "6.17.0"]
    assert not any(p.startswith(("engine.", "comm_env", "metrics")) for p in receipt.unknown())


def test_a_bare_url_knows_only_what_the_endpoint_said() -> None:
    receipt = assemble("http://them:8000/v1", None, "0.32.0", BenchParams("sustained"), None)
    assert receipt.engine.vllm_version == "0.32.0"
    assert {"engine.command", "engine.runtime", "engine.image_id", "engine.python_env", "nodes", "comm_env",
            "metrics"} <= set(receipt.unknown())


def test_a_secret_flags_value_never_reaches_the_record() -> None:
    args = ServeArgs("m", 1, flags=("--api-key", "sk-secret", "--hf-token=hf_x", "--max-num-batched-tokens", "8192",
                                    "--tokenizer", "org/tok"))
    got = launched(args, "native", {"spark-1": NODES["spark-1"]}, "spark-1", (), Recipe("default")).command
    assert "sk-secret" not in got and "--hf-token=hf_x" not in got
    assert got[-7:] == ("--api-key", "***", "--hf-token=***", "--max-num-batched-tokens", "8192", "--tokenizer",
                        "org/tok")
