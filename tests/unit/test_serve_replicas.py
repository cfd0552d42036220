"""Issue 40, replicas: the layout value, its placement along the fabric and the refusals before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.inventory import load_inventory
from sparkcluster.recipes.types import Recipe
from sparkcluster.serving.layout import Layout, Placement, choose_layout
from sparkcluster.serving.parallel import check_layout


def _inventory(tmp_path: Path, count: int):
    hosts = "".join(f"  spark-{i}: {{address: 192.168.1.{10 + i}, role: {'head' if i == 1 else 'worker'}}}\n"
                    for i in range(1, count + 1))
    (tmp_path / "inv.yml").write_text(f"name: t\nvars: {{user: spark}}\nhosts:\n{hosts}")
    return load_inventory(tmp_path / "inv.yml")


def test_a_single_engine_is_the_layout_with_one_replica():
    one = Layout(1, 2, 1)
    assert (one.nodes, one.routed, one.name) == (2, False, "tp2")
    assert one.place(["a", "b"], 8000) == (Placement(0, ("a", "b"), 8000),)
    assert Layout(1, 1, 2).name == "tp1pp2"


def test_replicas_take_consecutive_nodes_of_the_cable_order_and_ports_beside_the_router():
    # A 4-ring walked a-b-c-d: two replicas of TP 2 are a-b and c-d, each pair cabled; the router keeps 8000.
    layout = Layout(2, 2, 1)
    assert (layout.nodes, layout.routed, layout.name) == (4, True, "2x tp2")
    assert layout.place(["a", "b", "c", "d"], 8000) == (Placement(0, ("a", "b"), 8001),
                                                        Placement(1, ("c", "d"), 8002))
    assert [p.head for p in Layout(2).place(["spark-1", "spark-2"], 9000)] == ["spark-1", "spark-2"]
    with pytest.raises(ValueError):
        layout.place(["a", "b"], 8000)


def test_a_layout_round_trips_through_json_and_names_the_kinds_bench_measures():
    layout = Layout(2, 1, 2)
    assert layout.to_json() == {"name": "2x tp1pp2", "replicas": 2, "tp": 1, "pp": 2}
    assert Layout.from_json(layout.to_json()) == layout
    assert Layout.from_json({"tp": 2}) == Layout(1, 2, 1)  # a record without replicas ran one engine
    assert [Layout.of_kind(k, 2) for k in ("tp", "pp", "replicas")] == [Layout(1, 2, 1), Layout(1, 1, 2), Layout(2)]


def test_choose_layout_fills_tp_from_a_replicas_share_of_the_nodes():
    assert choose_layout(4, replicas=2) == Layout(2, 2, 1)
    assert choose_layout(4, replicas=4) == Layout(4, 1, 1)
    assert choose_layout(4, replicas=2, pp=2) == Layout(2, 1, 2)


@pytest.mark.parametrize("replicas, tp, match, fix", [
    (3, None, "3 replicas on 4 nodes", "a divisor of 4 (1, 2, 4)"),
    (2, 1, r"2 replicas of TP 1 x PP 1 take 2 nodes, and the selection has 4", "product is 2"),
    (0, None, "--replicas 0: needs at least 1", "N >= 1"),
])
def test_a_layout_that_does_not_divide_the_nodes_is_refused(replicas, tp, match, fix):
    with pytest.raises(UsageError, match=match) as e:
        choose_layout(4, replicas=replicas, tp=tp)
    assert fix in e.value.fix and e.value.exit_code == 2


def test_check_layout_keeps_one_engines_rules_and_applies_a_recipes_bounds_per_replica(tmp_path):
    two = _inventory(tmp_path, 2)
    assert check_layout(None, None, None, two, Recipe("plain")) == Layout(1, 2, 1)
    assert check_layout(2, None, None, two, Recipe("plain")) == Layout(2, 1, 1)
    solo = Recipe("s", max_nodes=1)  # eugr's solo_only
    assert check_layout(2, None, None, two, solo) == Layout(2, 1, 1)  # one engine per Spark: what solo_only asks
    cluster = Recipe("c", min_nodes=2)  # eugr's cluster_only: too large for one Spark
    with pytest.raises(UsageError, match="at least 2 nodes per engine"):
        check_layout(2, None, None, two, cluster)
