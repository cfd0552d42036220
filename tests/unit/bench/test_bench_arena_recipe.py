"""The Arena's recipe.yaml and metadata.json describe what the head's serve record says: every parallelism
(TP x PP), flags that read back as the arguments they were, and nothing from this machine's files."""

from __future__ import annotations

import datetime
import json
import shlex

import yaml

from sparkcluster.bench.methods.llama_benchy import arena
from sparkcluster.bench.methods.llama_benchy.schedule import BenchyOptions
from sparkcluster.bench.methods.llama_benchy.profile import ARENA_V2
from sparkcluster.bench.target import from_record, from_url
from sparkcluster.serving.record import ServeRecord, Serving

SPEC = json.dumps({"method": "eagle3", "model": "org/draft model", "num_speculative_tokens": 3})
FLAGS = ("--max-model-len", "4096", "--speculative-config", SPEC)


def target(recipe: str | None = "qwen3", tp: int = 1, pp: int = 3):
    return from_record(ServeRecord("docker", "ray", "vllm-node:1", ("spark-1", "spark-2", "spark-3"), Serving(
        "org/model", "model", 8123, "http://10.0.0.1:8123/v1", tp, recipe, FLAGS, pp=pp)), "sha256:abc")


def test_a_local_file_named_by_the_heads_record_is_never_read(tmp_path, monkeypatch):
    """The record comes from the head: a name in it must not pull a file of this machine into a submission."""
    monkeypatch.chdir(tmp_path)
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    for name in (str(secret), "id_rsa"):
        text = arena.recipe_text(target(recipe=name))
        assert "PRIVATE KEY" not in text
        assert yaml.safe_load(text)["model"] == "org/model"  # the recipe of what the record says instead


def test_the_recipe_names_tp_and_pp_and_its_flags_read_back_as_they_were():
    recipe = yaml.safe_load(arena.recipe_text(target()))
    assert recipe["defaults"] == {"tensor_parallel": 1, "pipeline_parallel": 3, "served_model_name": "model",
                                  "port": 8123}
    assert recipe["container"] == "vllm-node:1" and recipe["min_nodes"] == 3
    argv = shlex.split(recipe["command"])
    assert argv[argv.index("-tp") + 1] == "{tensor_parallel}" and argv[argv.index("-pp") + 1] == "{pipeline_parallel}"
    assert tuple(argv[-len(FLAGS):]) == FLAGS  # the JSON value stays one argument
    assert json.loads(argv[-1]) == json.loads(SPEC)
    assert "qwen3" in recipe["metadata"]["description"]  # the recorded recipe's name, as a name


def test_the_metadata_names_each_parallelism_that_is_not_1():
    started = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    for tp, pp, cluster in ((1, 3, {"pp": 3}), (2, 2, {"tp": 2, "pp": 2}), (2, 1, {"tp": 2}), (1, 1, {})):
        tgt = target(tp=tp, pp=pp)
        recipe = arena.recipe_text(tgt)
        meta = arena.metadata(ARENA_V2, tgt, BenchyOptions(), started, started, True, False, recipe)
        assert {k: v for k, v in meta["cluster"].items() if k in ("tp", "pp")} == cluster
        assert meta["cluster"]["node_count"] == 3 and meta["recipe"]["text"] == recipe


def test_an_endpoint_given_by_url_claims_no_parallelism_it_cannot_know():
    recipe = yaml.safe_load(arena.recipe_text(from_url("http://10.0.0.9:9000/v1", "m")))
    assert recipe["defaults"] == {"served_model_name": "m", "port": 9000}
    assert recipe["command"] == "vllm serve {model} --served-model-name {served_model_name} --port {port}"
