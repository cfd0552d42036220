"""`bootstrap --check` shows exactly what would run: the runner in check mode, over the plan cases of
tests/fixtures/steps, rendered by the report's JSON and plain-text reporters. Shell lines are under "commands",
files written whole under "uploads", and what is done otherwise (on other nodes, by staging) in words under
"notes", never among the commands."""

from __future__ import annotations

import io
import json
import shlex
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from sparkcluster.bootstrap import stepcatalog  # noqa: F401 (declares every step, staging's models.stage too)
from sparkcluster.engine.events import Event, Status, StepFinished
from sparkcluster.engine.playbook import Play, Playbook, StepCall
from sparkcluster.engine.report import JsonReporter, PlainReporter
from sparkcluster.engine.runner import Runner
from sparkcluster.engine.session import Session
from sparkcluster.engine.steps import REGISTRY
from sparkcluster.staging import hfcache as staging_hfcache
from sparkcluster.staging import stager as staging_stager
from tests.support.strict_transport import verify_all
from tests.support.step_plans import CASES, World

MESH_NOTES = ["create spark-1's key ~/.ssh/id_ed25519 unless it has one",
              "authorize spark-1's key on spark-2",
              "record spark-2's host key for 192.168.178.12, 192.168.177.12 on spark-1"]
STAGE_NOTES = ["download acme/tiny on spark-1, then stage it to every node",
               "stage acme/other to spark-2 over the fabric"]


def case(case_id: str) -> dict[str, Any]:
    return next(p.values[0] for p in CASES if p.id == case_id)


class FakeStager:
    """The Stager's reading side, as models.stage's check() uses it: acme/tiny is on no node, acme/other only
    on spark-1 (its complete copy is the source; spark-2 lacks it)."""

    def __init__(self, session: Session, model: Any) -> None:
        self.names = [h.name for h in session.inventory.hosts]
        self.model = str(model)
        self.scans: dict[str, str] = {}

    def scan(self) -> dict[str, str]:
        held = ["spark-1"] if self.model == "acme/other" else []
        self.scans = {n: ("complete" if n in held else "absent") for n in self.names}
        return self.scans

    def choose_source(self, source: str) -> tuple[str, str]:
        return "spark-1", "manifest"

    def statuses(self, manifest: str) -> dict[str, SimpleNamespace]:
        return {n: SimpleNamespace(complete=s == "complete") for n, s in self.scans.items()}


def check_run(world: World, *calls: StepCall) -> tuple[dict[str, Any], str]:
    """Runs `calls` on the world's `on` host in check mode; returns the --json document and the plain text."""
    out, text = io.StringIO(), io.StringIO()
    json_reporter = JsonReporter(out)
    plain_reporter = PlainReporter(Console(file=text, width=200, no_color=True))

    def emit(event: Event) -> None:
        json_reporter(event)
        plain_reporter(event)

    book = Playbook("pb.yml", "pb", (Play("p", world.on.name, tuple(calls), gather_facts=False),))
    Runner(Session(world.inventory, world.transports, dict(world.facts)), book, emit, check=True).run()  # type: ignore[arg-type]
    verify_all(world.transports)  # check() ran what its case scripts, and nothing else ran
    assert {name: t.writes for name, t in world.transports.items()} == {name: [] for name in world.transports}
    return json.loads(out.getvalue()), text.getvalue()


def call(name: str, **args: object) -> StepCall:
    return StepCall(REGISTRY[name], dict(args), 1)


@pytest.fixture
def fake_stager(monkeypatch: pytest.MonkeyPatch) -> None:
    # models.stage imports these when it has a model to stage (staging/step.py): patched where they live
    monkeypatch.setattr(staging_stager, "Stager", FakeStager)
    monkeypatch.setattr(staging_hfcache, "source_manifest", lambda model, scan: scan == "complete" or None)


def test_check_json_holds_no_prose_in_commands(fake_stager: None) -> None:
    """ssh.mesh, file.content and models.stage do what they do through other nodes, a whole-file write and the Stager: in
    --check --json their "commands" are empty, and what they would do is under "notes" and "uploads"."""
    mesh, _ = check_run(World(case("ssh:ssh.mesh:change-re-imaged-worker-has-a-new-host-key")), call("ssh.mesh"))
    files, _ = check_run(World(case("files:file.content:change-create")),
                         call("file.content", path="/home/spark/notes/a.txt", content="hello\n"))
    stage, _ = check_run(World({"_probes": {}, "given": {"hosts": [{"name": "spark-1", "role": "head"},
                                                                   {"name": "spark-2"}]}}),
                         call("models.stage", models=["acme/tiny", "acme/other"]))
    steps = {s["step"]: s for doc in (mesh, files, stage) for s in doc["steps"]}
    assert {name: (s["status"], s["commands"], s["uploads"], s["notes"]) for name, s in steps.items()} == {
        "ssh.mesh": ("changed", [], [], MESH_NOTES),
        "file.content": ("changed", [], [{"path": "/home/spark/notes/a.txt", "mode": "0644", "size": 6}], []),
        "models.stage": ("changed", [], [], STAGE_NOTES),
    }
    assert all(doc["check"] and doc["exit_code"] == 0 for doc in (mesh, files, stage))


def test_check_json_keeps_real_commands_as_commands() -> None:
    """A step whose plan is shell lines (docker.group's usermod) shows them under "commands", as displayed, and
    every entry there splits as a shell line; nothing else is added beside them."""
    world = World(case("docker:docker.group:change-not-a-member"))
    doc, _ = check_run(world, call("docker.group"))
    [step] = doc["steps"]
    assert (step["status"], step["commands"], step["uploads"], step["notes"]) == (
        "changed", ["sudo usermod -aG docker spark"], [], [])
    assert all(shlex.split(line) for line in step["commands"])


def test_check_text_shows_each_kind_as_what_it_is(fake_stager: None) -> None:
    """The plain reporter (CI logs) prints shell lines as `run:`, whole-file writes as `upload:` and notes as `would:`."""
    _, mesh = check_run(World(case("ssh:ssh.mesh:change-re-imaged-worker-has-a-new-host-key")), call("ssh.mesh"))
    _, files = check_run(World(case("files:file.content:change-create")),
                         call("file.content", path="/home/spark/notes/a.txt", content="hello\n"))
    _, docker = check_run(World(case("docker:docker.group:change-not-a-member")), call("docker.group"))
    assert "\nPLAY p [spark-1]\n" in mesh  # the hosts, not dropped as a markup tag
    assert [line for line in mesh.splitlines() if line.startswith("  ")] == [f"  would:  {n}" for n in MESH_NOTES]
    assert [line for line in files.splitlines() if line.startswith("  ")] == [
        "  upload: /home/spark/notes/a.txt (6 bytes, mode 0644)"]
    assert [line for line in docker.splitlines() if line.startswith("  ")] == ["  run:    sudo usermod -aG docker spark"]


def test_status_is_ansibles_words_and_prints_as_them() -> None:
    assert [str(s) for s in Status] == ["ok", "changed", "skipped", "failed", "unreachable"]
    event = StepFinished("spark-1", "p", "s", Status.CHANGED, "r", 0.0)
    assert json.loads(json.dumps({"status": event.status})) == {"status": "changed"}
    assert f"{event.status:<8}|" == "changed |"
