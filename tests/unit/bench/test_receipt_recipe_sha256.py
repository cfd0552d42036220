"""The receipt's recipe by content (README audit round 3, item 12): the bundled `default` recipe, which lies inside
the installed package and is named "recipe default", is hashed as it is loaded, so a receipt of a serve with it
carries the sha256 of its file; and a recipe whose hash could not be taken is named in `unknown`, never left a
silent null."""

from __future__ import annotations

import hashlib

import pytest

from sparkcluster.bench.receipt import BenchParams, Engine, Mod, Receipt, RecipeUsed
from sparkcluster.bench.receipt_metrics import EngineDeltas
from sparkcluster.bench.receipt_sources import Served, assemble
from sparkcluster.recipes.load import BUNDLED, bundled_names, load_recipe
from sparkcluster.serving.launch import Node, ServeArgs
from sparkcluster.serving.provenance import launched
from sparkcluster.serving.record import ServeRecord, Serving

NODES = {"spark-1": Node("spark-1", 0, "10.0.0.1", "10.0.0.1"), "spark-2": Node("spark-2", 1, "10.0.0.2", "10.0.0.1")}
ARGS = ServeArgs("Qwen/Qwen3-0.6B", 2)


@pytest.mark.parametrize("name", bundled_names())
def test_a_bundled_recipe_is_known_by_the_sha256_of_its_file(name: str) -> None:
    recipe = load_recipe(name)
    assert recipe.source == f"recipe {name}"  # no path a later reader could hash
    assert recipe.sha256 == hashlib.sha256((BUNDLED / f"{name}.yml").read_bytes()).hexdigest()


def test_a_serve_of_the_default_recipe_records_and_receipts_its_sha256() -> None:
    recipe = load_recipe("default")
    got = launched(ARGS, "ray", NODES, "spark-1", (), recipe)
    assert got.recipe_source == "recipe default" and got.recipe_sha256 == recipe.sha256
    record = ServeRecord("host", "ray", "vllm-node", ("spark-1", "spark-2"),
                         Serving("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B", 8000, "http://10.0.0.1:8000/v1", 2, "default",
                                 (), launched=got))
    served = Served(record, None, "0.32.0", None, "/opt/vllm-env", {"spark-1": {}, "spark-2": {}}, ())
    receipt = assemble("http://10.0.0.1:8000/v1", served, "0.32.0", BenchParams("sustained"),
                       EngineDeltas(False, None, 0.0, 0, 30.0))
    doc = receipt.to_json()
    assert doc["engine"]["recipe"] == {"source": "recipe default", "sha256": recipe.sha256, "mods": ()}
    assert not any(p.startswith("engine.recipe") for p in doc["unknown"])


def test_a_recipe_whose_sha256_could_not_be_taken_is_named_unknown() -> None:
    receipt = Receipt("http://10.0.0.1:8000/v1",
                      Engine("0.32.0", ("vllm", "serve", "m"), "host", "ray", python_env="/opt/venv", tp=2, pp=1,
                             replicas=1, recipe=RecipeUsed("recipes/gone.yaml", None, (Mod("fix", None),))),
                      BenchParams("sustained"), {"spark-1": {}}, (), EngineDeltas(False, None, 0.0, 0))
    unknown = receipt.to_json()["unknown"]
    assert "engine.recipe.sha256" in unknown and "engine.recipe.mods[fix].sha256" in unknown
    assert "engine.recipe.source" not in unknown
