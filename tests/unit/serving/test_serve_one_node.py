"""Found by hand (issue 46): a one-node serve (`serve --limit spark-1`, eugr's solo mode) was refused with
`probe (gloo): FAIL no connection between the ranks was seen`: the probe judges the traffic between the ranks, and
a lone rank has none. One node has no link between nodes to probe: serve skips the probe there and says why (its
output and --json's `skipped`); two nodes still probe. The phases run for real; what reaches a node is faked."""

from __future__ import annotations

import io
from dataclasses import asdict
from pathlib import Path

import pytest
from rich.console import Console

from sparkcluster import cli
from sparkcluster.engine import session as session_module
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.recipes.load import Recipe
from sparkcluster.serving import phases, render
from sparkcluster.serving.launch import Node
from sparkcluster.serving.layout import Layout
from sparkcluster.serving.phases import ONE_NODE_PROBE, ServeOptions, serve
from sparkcluster.serving.progress import ignore
from sparkcluster.serving.runtime import RuntimeChoice

HOSTS = tuple(Host(f"spark-{i}", f"10.0.0.{i}", role="head" if i == 1 else "worker", vars={"python_env": "/v"})
              for i in (1, 2))


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of nodes of each probe serve ran; every step that would reach a node answers as a healthy one."""
    runs: list[int] = []

    def probe(session: Session, runtime: RuntimeChoice, opts: ServeOptions, emit: object) -> None:
        runs.append(len(session.hosts))
    monkeypatch.setattr(phases, "probe", probe)
    monkeypatch.setattr(phases, "read_nodes", lambda s, tp=0: {
        h.name: Node(h.name, i, f"10.1.0.{i + 1}", "10.1.0.1") for i, h in enumerate(s.hosts)})
    monkeypatch.setattr(phases, "stop_everywhere", lambda s: {})
    monkeypatch.setattr(phases, "start", lambda s, commands, what, fix: None)
    monkeypatch.setattr(phases, "wait_ready", lambda *args: None)
    monkeypatch.setattr(phases, "launched", lambda *args: None)
    monkeypatch.setattr(phases, "write_record", lambda s, record: None)
    return runs


def served(nodes: int) -> phases.ServeResult:
    inventory = Inventory(Path("inv.yml"), "lab", HOSTS[:nodes], {})
    opts = ServeOptions(runtime="host", launcher="native", layout=Layout(1, nodes, 1), model="/models/tiny",
                        recipe=Recipe("default"))
    return serve(Session(inventory, {}), opts, ignore)


def test_one_node_serves_without_the_probe_and_says_why(probed):
    result = served(1)
    assert probed == []  # failed before: the lone rank's probe ran, and its FAIL refused to serve
    assert result.skipped == {"verify": ONE_NODE_PROBE} and "verify" not in result.phases and result.verify is None
    assert asdict(result)["skipped"]["verify"].startswith("one node: ")  # --json's document
    out = io.StringIO()
    render.serving(Console(file=out, width=300), result)
    assert f"skipped verify: {ONE_NODE_PROBE}" in out.getvalue()


def test_two_nodes_still_probe(probed):
    result = served(2)
    assert probed == [2] and "verify" in result.phases and "verify" not in result.skipped


def test_verify_of_one_node_is_refused_before_connecting(tmp_path, monkeypatch, capsys):
    """The same lone rank's probe under `verify` failed as if something were broken: exit 2 before connecting."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected although one node has no link to probe")
    monkeypatch.setattr(session_module, "Transport", refuse)
    path = tmp_path / "inv.yml"
    path.write_text("hosts:\n  spark-1: {address: 10.0.0.1, role: head}\n  spark-2: {address: 10.0.0.2}\n")
    assert cli.main(["verify", "-i", str(path), "--limit", "spark-1"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "verify probes the links between nodes: spark-1 alone has none" in err and "--limit NODE1,NODE2" in err
