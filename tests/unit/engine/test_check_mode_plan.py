"""Check mode shows the whole plan: the facts fabric.addresses plans for a node are what later steps check against
(node/planned.py), and the runner hands a plan's facts to the later plays in check mode only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import pytest

from sparkcluster.engine.command import Command
from sparkcluster.engine.facts import HostFacts, parse_probe
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.playbook import load_playbook
from sparkcluster.engine.runner import Runner
from sparkcluster.engine.session import Session
from sparkcluster.engine.steps.base import REGISTRY, HostContext, NoArgs, Plan, Step
from sparkcluster.node.addressing import fabric_config, plan_addresses
from sparkcluster.node.network import choose_for
from sparkcluster.node.planned import planned_facts
from tests.support.fake_transport import FakeTransport

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def spark() -> HostFacts:
    """A real Spark, its twins addressed (192.168.177.11/24, 192.168.178.11/24, MTU 9000) by NVIDIA's playbook."""
    return parse_probe((FIXTURES / "probe-spark.txt").read_text())


def fresh_from_the_box() -> HostFacts:
    """The same Spark before its twins had addresses: no IPv4 (nor the GIDs the kernel adds for one), MTU 1500."""
    facts = spark()
    twins = {i.name for i in facts.interfaces if i.name.startswith("en") and "np" in i.name}
    return replace(facts, interfaces=tuple(replace(i, ipv4=(), mtu=1500) if i.name in twins else i
                                           for i in facts.interfaces),
                   gids=tuple(g for g in facts.gids if not g.ipv4_mapped))


def test_the_planned_facts_of_a_fresh_spark_bind_as_the_addressed_one_does() -> None:
    inventory = Inventory(Path("inv.yml"), "t", (Host("spark-a", "10.0.0.1", "head"), Host("spark-b", "10.0.0.2",
                                                                                          "worker")), {})
    host = inventory.hosts[0]
    fresh = fresh_from_the_box()
    plan = plan_addresses(inventory, host, fresh, fabric_config(inventory, host))
    planned = planned_facts(fresh, plan)
    # Before: the fresh node has nothing to bind to (check mode's QSFP preflight failed on exactly this).
    assert all(not fresh.interface(t.netdev).ipv4 for t in plan.twins)  # type: ignore[union-attr]
    real, predicted = choose_for(host, spark()), choose_for(host, planned)
    assert (predicted.netdev, predicted.ip, predicted.prefix, predicted.mtu) == (real.netdev, real.ip, real.prefix,
                                                                                 real.mtu)
    # The RoCE v2 GID the kernel adds for the new address, at the index the real node's kernel gave it.
    assert predicted.gid_index == real.gid_index is not None
    assert planned_facts(spark(), plan_addresses(inventory, host, spark(), fabric_config(inventory, host))) == spark()


class _Plans(Step):
    """Plans new facts for its host: the hostname `renamed`, as if it were applied."""

    name = "test.plans"
    Args = NoArgs

    def check(self, ctx: HostContext) -> Plan:
        assert ctx.facts is not None
        if ctx.facts.hostname == "renamed":
            return Plan("already renamed")
        return Plan("rename", (Command("hostname renamed"),), planned_facts=replace(ctx.facts, hostname="renamed"))


class _Sees(Step):
    name = "test.sees"
    Args = NoArgs
    seen: ClassVar[list[tuple[str, bool]]] = []

    def check(self, ctx: HostContext) -> Plan:
        assert ctx.facts is not None
        self.seen.append((ctx.facts.hostname, ctx.is_planned()))
        return Plan(f"sees {ctx.facts.hostname}")


PLAYBOOK = """
plays:
  - name: change
    steps: [{test.plans: {}}]
  - name: later
    refresh_facts: true
    steps: [{test.sees: {}}]
"""


def test_check_mode_hands_a_plans_facts_to_the_later_plays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "test.plans", _Plans)
    monkeypatch.setitem(REGISTRY, "test.sees", _Sees)
    monkeypatch.setattr(_Sees, "seen", [])
    path = tmp_path / "pb.yml"
    path.write_text(PLAYBOOK)
    inventory = Inventory(Path("inv.yml"), "t", (Host("spark-1", "10.0.0.1", "head"),), {})
    with Session(inventory, {"spark-1": FakeTransport("spark-1", [])}) as session:  # type: ignore[dict-item]
        result = Runner(session, load_playbook(path), lambda event: None, check=True).run()
    assert result.exit_code == 0 and result.recap["spark-1"].changed == 1
    # The later play (which even asks for fresh facts) checks against the planned state, and knows it is planned.
    assert _Sees.seen == [("renamed", True)]
