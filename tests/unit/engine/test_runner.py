"""The runner with a scripted fake transport: ordering, statuses, failure policy, check mode, recap."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.engine.events import PlayFinished, RunFinished, StepFinished
from sparkcluster.engine.facts import PROBE_SCRIPT, HostFacts
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.playbook import load_playbook
from sparkcluster.engine.runner import Runner
from sparkcluster.engine.session import Session
from tests.support.fake_transport import FakeTransport


def inventory(n: int = 3) -> Inventory:
    hosts = tuple(Host(name=f"spark-{i}", address=f"10.0.0.{i}", role="head" if i == 1 else "worker")
                  for i in range(1, n + 1))
    return Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={"greeting": "hi"})


def playbook(tmp_path: Path, text: str):
    path = tmp_path / "pb.yml"
    path.write_text(text)
    return load_playbook(path)


def run(tmp_path, text, transports, check=False):
    events = []
    with Session(inventory(len(transports)), transports) as session:  # closes every transport, however it ends
        return Runner(session, playbook(tmp_path, text), events.append, check=check).run(), events


TWO_PLAYS = """
plays:
  - name: prepare
    steps:
      - command.run: {cmd: "echo {{ greeting }} from {{ host.name }}"}
      - command.run: {cmd: "second-step"}
  - name: cluster
    require: all
    steps:
      - command.run: {cmd: "needs-everyone"}
"""


def test_steps_run_in_order_with_templates_rendered_per_host(tmp_path):
    transports = {f"spark-{i}": FakeTransport(f"spark-{i}", []) for i in (1, 2, 3)}
    result, events = run(tmp_path, TWO_PLAYS, transports)
    assert result.exit_code == 0
    for name, t in transports.items():
        assert t.ran[1:] == [f"echo hi from {name}", "second-step", "needs-everyone"]
        assert t.closed
    assert all(r.changed == 3 and r.failed == 0 for r in result.recap.values())


def test_a_hosts_facts_are_made_template_values_once_per_gathering(tmp_path, monkeypatch):
    # Each step's arguments render twice a play (its batched reads, then its run); the facts' JSON form is made
    # once per facts gathered, not at each rendering.
    made = []
    to_json = HostFacts.to_json
    monkeypatch.setattr(HostFacts, "to_json", lambda facts: made.append(facts) or to_json(facts))
    text = """
plays:
  - name: one
    steps:
      - command.run: {cmd: "echo {{ facts.hostname }} {{ facts.arch }}"}
      - command.run: {cmd: "echo {{ facts.hostname }} again"}
  - name: two
    steps:
      - command.run: {cmd: "echo {{ facts.os }}"}
"""
    transports = {f"spark-{i}": FakeTransport(f"spark-{i}", []) for i in (1, 2)}
    result, _ = run(tmp_path, text, transports)
    assert result.exit_code == 0
    for t in transports.values():
        assert t.ran[1:] == ["echo spark-a1b2 aarch64", "echo spark-a1b2 again", "echo Ubuntu 24.04.3 LTS"]
    assert len(made) == 2  # one gathering for each host


def test_failure_is_data_with_command_exit_code_stderr_and_fix(tmp_path):
    transports = {
        "spark-1": FakeTransport("spark-1", []),
        "spark-2": FakeTransport("spark-2", [("second-step", 3, "", "line1\nboom: disk full\n")]),
    }
    text = TWO_PLAYS.replace('cmd: "second-step"', 'cmd: "second-step", fix: "free some disk"')
    result, events = run(tmp_path, text, transports)
    failure = result.failures["spark-2"]
    assert failure.command == "second-step" and failure.exit_code == 3
    assert failure.stderr_tail.endswith("boom: disk full") and failure.fix == "free some disk"
    assert result.recap["spark-2"].failed == 1
    # the require: all play stopped the run, so no host got to it
    assert "needs-everyone" not in transports["spark-1"].ran
    assert result.stopped_by == "cluster"
    assert result.exit_code == 1


def test_unreachable_host_drops_out_and_the_others_finish(tmp_path):
    transports = {"spark-1": FakeTransport("spark-1", []), "spark-2": FakeTransport("spark-2", [], unreachable=True)}
    text = TWO_PLAYS.replace("require: all", "require: none")
    result, events = run(tmp_path, text, transports)
    assert result.recap["spark-2"].unreachable == 1 and result.recap["spark-2"].changed == 0
    assert transports["spark-1"].ran[-1] == "needs-everyone"
    assert result.exit_code == 1
    assert any(isinstance(e, StepFinished) and e.status == "unreachable" and e.host == "spark-2" for e in events)


def test_check_mode_plans_but_runs_nothing_that_changes(tmp_path):
    transports = {"spark-1": FakeTransport("spark-1", [])}
    result, events = run(tmp_path, TWO_PLAYS, transports, check=True)
    assert transports["spark-1"].ran == [PROBE_SCRIPT]  # only the read-only probe
    finished = [e for e in events if isinstance(e, StepFinished)]
    assert all(e.status == "changed" and e.reason.startswith("would ") for e in finished)
    assert finished[0].commands == ("echo hi from spark-1",)


def test_undefined_template_variable_fails_the_step_not_the_run(tmp_path):
    transports = {"spark-1": FakeTransport("spark-1", []), "spark-2": FakeTransport("spark-2", [])}
    text = """
plays:
  - name: p
    steps:
      - command.run: {cmd: "echo {{ no_such_var }}"}
"""
    result, _ = run(tmp_path, text, transports)
    failure = result.failures["spark-1"]
    assert not failure.message.startswith("internal error")
    assert "'no_such_var' is undefined" in failure.message and "-e NAME=VALUE" in failure.fix
    assert result.exit_code == 1


def test_events_close_with_play_and_run_finished(tmp_path):
    transports = {"spark-1": FakeTransport("spark-1", [])}
    _, events = run(tmp_path, TWO_PLAYS, transports)
    assert isinstance(events[-1], RunFinished)
    assert [e.play for e in events if isinstance(e, PlayFinished)] == ["prepare", "cluster"]


@pytest.mark.parametrize("text,message", [
    ("plays: []", "non-empty `plays:`"),
    ("plays:\n  - name: x\n    steps:\n      - comand.run: {cmd: x}\n", "did you mean 'command.run'"),
    ("plays:\n  - name: x\n    steps:\n      - command.run: {cmnd: x}\n", "did you mean 'cmd'"),
    ("plays:\n  - name: x\n    steps:\n      - command.run: {}\n", "needs cmd"),
    ("plays:\n  - name: x\n    require: most\n    steps:\n      - command.run: {cmd: x}\n", "require must be"),
    ("plays:\n  - name: x\n    stepz: []\n", "did you mean 'steps'"),
    ("plays: [\n", "invalid YAML"),
    ("plays:\n  - name: a\n    name: b\n    steps:\n      - command.run: {cmd: x}\n", ":3: invalid YAML: duplicate key 'name'"),
    ("plays:\n  - name: x\n    steps:\n      - 5: {}\n", "a step name must be text"),
])
def test_playbook_errors_name_the_line_and_the_fix(tmp_path, text, message):
    from sparkcluster.engine.errors import UsageError

    with pytest.raises(UsageError) as info:
        playbook(tmp_path, text)
    assert message in str(info.value)


def test_a_playbook_whose_steps_are_deferred_runs_as_the_checked_one(tmp_path):
    # stepcatalog.load_bundled defers each step's module to its play: the runner imports it there, and the run
    # is the one the fully checked playbook makes.
    path = tmp_path / "pb.yml"
    path.write_text(TWO_PLAYS)
    runs = []
    for defer in (False, True):
        book = load_playbook(path, defer_steps=defer)
        assert all(isinstance(c.ref, str) == defer for p in book.plays for c in p.steps)
        transports = {f"spark-{i}": FakeTransport(f"spark-{i}", []) for i in (1, 2)}
        events = []
        with Session(inventory(2), transports) as session:
            result = Runner(session, book, events.append).run()
        runs.append((result.exit_code, sorted((e.host, e.step, e.status, e.reason) for e in events
                                              if isinstance(e, StepFinished)), [t.ran for t in transports.values()]))
    assert runs[0] == runs[1]
    assert runs[1][0] == 0 and len(runs[1][1]) == 6
