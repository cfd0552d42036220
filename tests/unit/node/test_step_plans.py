"""Step plans as data: facts parsed from a real Spark's probe and scripted command outputs in,
the exact Plan out (reason, commands as values, uploads, notes, warnings, diff), through a strict transport that
fails on any command a case does not list. Change cases also apply the plan (with a new instance of the step, so
nothing may be kept on it between check and apply) and check again, which must be a no-op.

The cases live in tests/fixtures/steps/*.json, one entry each:
  id, step, args                      the step as a playbook would call it
  given: probe, probe_replace, user,  the host's facts (a probe capture, edited as text), its login user,
         run, files | hosts, on       the commands check() may run (exact line or regex) and the remote files;
                                      `hosts` lists several nodes for cross-node steps, `on` the one it runs on
  expect: reason, changed, skip,      the Plan check() returns, or `fails`/`fix`: the StepFailed it raises;
          commands, uploads, notes,   `commands` only shell lines that run on the host, `uploads` files written through
          warnings, diff, payload     SFTP, `notes` what is done otherwise, in words; `payload`: the fields a step's own
                                      Plan subclass adds (ssh.mesh's links), as JSON
  apply: run, writes, reconnects,     what apply() runs and writes; `after`: what the second check() runs,
         after, reason                `reason`: the no-op it then returns
  xfail                               a known defect: the case states the right behaviour and fails until fixed
A file's `probes` names edited variants of a capture (spark-2: the next addresses on each /24).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from sparkcluster.engine.command import Command
from sparkcluster.engine.playbook import StepCall, build_args
from sparkcluster.engine.steps import REGISTRY, Plan, StepFailed
from sparkcluster.engine.steps.base import Upload
from sparkcluster.engine.steps.files import file_state
from sparkcluster.node import steps as _node_steps  # noqa: F401 (registers the node's steps)
from tests.support.strict_transport import StrictTransport, verify_all
from tests.support.step_plans import CASES, World, script, text_of


# The engine's generic steps and the node's. Other wings register more (staging's models.stage) when they are
# imported, which depends on what else the session imported; those are tested with their wing.
ENGINE_STEPS = {name for name, cls in REGISTRY.items()
                if cls.__module__.startswith(("sparkcluster.engine.steps.", "sparkcluster.node.steps."))}
# Steps still being written alongside these tests, without plan cases yet. Each must gain a no-op and a change
# case in tests/fixtures/steps/; the coverage test fails as soon as a listed step has any case, to drop it here.
NOT_YET_COVERED = {"fabric.addresses", "fabric.cabling"}  # cabling: its logic is tests/unit/node/test_fabric_graph.py
# Preflight checks only read: they have no change case; a warning or a failure stands in for it.
READ_ONLY = {"preflight.gpu", "preflight.driver", "preflight.qsfp", "preflight.docker", "preflight.disk",
             "preflight.cluster", "preflight.fabric"}


def command(spec: dict[str, Any]) -> Command:
    return Command(spec["script"], sudo=spec.get("sudo", False), env=spec.get("env", {}),
                   timeout=spec.get("timeout", 120.0), stdin=spec.get("stdin"))


def upload(spec: dict[str, Any]) -> Upload:
    return Upload(spec["path"], spec["mode"], spec["size"])


PLAN_FIELDS = [f.name for f in dataclasses.fields(Plan)]


def plan_part(plan: Plan) -> Plan:
    """The Plan fields of `plan`, whatever subclass a step returns it as."""
    return Plan(**{name: getattr(plan, name) for name in PLAN_FIELDS})


def payload(plan: Plan) -> dict[str, Any]:
    """What a step's own Plan subclass adds (ssh.mesh's links), as JSON; {} for a plain Plan."""
    extra = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan) if f.name not in PLAN_FIELDS}
    return json.loads(json.dumps({k: [dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v for v in value]
                                  if isinstance(value, tuple) else value for k, value in extra.items()}))


def make_step(case: dict[str, Any]):
    cls = REGISTRY[case["step"]]
    return cls(build_args(StepCall(cls, dict(case.get("args", {})), 1), {}))


# ---- the cases -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_check_plans_exactly_what_the_case_says(case):
    world = World(case)
    step = make_step(case)
    expect = case["expect"]
    if "fails" in expect:
        with pytest.raises(StepFailed) as info:
            step.check(world.context())
        assert info.value.message == expect["fails"]
        assert info.value.fix == expect.get("fix", "")
    else:
        plan = step.check(world.context())
        assert plan_part(plan) == Plan(
            reason=expect["reason"],
            commands=tuple(command(c) for c in expect.get("commands", [])),
            uploads=tuple(upload(u) for u in expect.get("uploads", [])),
            notes=tuple(expect.get("notes", [])),
            skip=expect.get("skip", False),
            diff="".join(line + "\n" for line in expect["diff"]) if expect.get("diff") else None,
            warnings=tuple(expect.get("warnings", [])),
        )
        assert payload(plan) == expect.get("payload", {})
        assert plan.changes is expect["changed"]
    verify_all(world.transports)  # every scripted command ran, nothing else did
    # check() only reads: no file written, no new session
    assert [(name, t.writes, t.reconnects) for name, t in world.transports.items()] == \
        [(name, [], 0) for name in world.transports]


APPLY_CASES = [c for c in CASES if "apply" in c.values[0]]


@pytest.mark.parametrize("case", APPLY_CASES)
def test_apply_then_check_again_is_a_no_op(case):
    world = World(case)
    step = make_step(case)
    ctx = world.context()
    plan = step.check(ctx)
    assert plan.changes
    verify_all(world.transports)
    apply = case["apply"]
    for name, runs in apply.get("run", {}).items():
        script(world.transports[name], runs)
    before = {name: len(t.writes) for name, t in world.transports.items()}
    make_step(case).apply(ctx, plan)  # another instance: apply() reads the plan, nothing kept on the step by check()
    verify_all(world.transports)
    written = {name: [(p, c, oct(m)) for p, c, m in t.writes[before[name]:]] for name, t in world.transports.items()}
    expected_writes = {name: [] for name in world.transports}
    for name, writes in apply.get("writes", {}).items():
        expected_writes[name] = [(w["path"], text_of(w), oct(int(w["mode"], 8))) for w in writes]
    assert written == expected_writes
    assert {n: t.reconnects for n, t in world.transports.items()} == {
        n: apply.get("reconnects", {}).get(n, 0) for n in world.transports}
    for name, runs in apply.get("after", {}).items():
        script(world.transports[name], runs)
    after = step.check(ctx)
    assert (after.reason, after.changes) == (apply["reason"], False)
    verify_all(world.transports)


def test_every_registered_step_has_a_no_op_case_and_a_change_case():
    kinds: dict[str, set[str]] = {name: set() for name in ENGINE_STEPS - NOT_YET_COVERED}
    for param in CASES:
        case = param.values[0]
        if "xfail" in case:
            continue  # a known defect covers nothing
        expect = case["expect"]
        if "fails" in expect:
            kinds[case["step"]].add("fails")
        elif expect.get("skip"):
            kinds[case["step"]].add("skip")
        elif expect["changed"]:
            kinds[case["step"]].add("changed")
        else:
            kinds[case["step"]].add("warns" if expect.get("warnings") else "ok")
    missing = {}
    for name, seen in kinds.items():
        needed = {"ok", "warns"} if name in READ_ONLY else {"ok", "changed"}
        if name in READ_ONLY and "fails" in seen:
            needed = {"ok"}
        if not needed <= seen:
            missing[name] = sorted(needed - seen)
    assert missing == {}
    applied = {c.values[0]["step"] for c in APPLY_CASES}
    assert applied == ENGINE_STEPS - READ_ONLY - NOT_YET_COVERED, "every changing step is applied in a case"
    assert not NOT_YET_COVERED & {c.values[0]["step"] for c in CASES}, "covered now: take it out of NOT_YET_COVERED"


def test_the_cases_cover_the_engines_steps_and_nothing_else():
    assert len(ENGINE_STEPS) >= 14 and READ_ONLY < ENGINE_STEPS
    assert {c.values[0]["step"] for c in CASES} == ENGINE_STEPS - NOT_YET_COVERED
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


def test_a_file_write_is_shown_as_the_upload_it_is_with_a_home_relative_path_kept_relative():
    """A file is written through SFTP, so the plan shows an Upload and no shell line that would never run; the
    default comm.env path stays `~/`, resolved on the remote host, as the write itself is."""
    world = World({"_probes": {}, "given": {}})
    plan = make_step({"step": "comm.env"}).check(world.context())
    assert plan.commands == () and plan.notes == ()
    assert [(u.path, u.mode) for u in plan.uploads] == [("~/.config/sparkcluster/comm.env", "0644")]
    created = [line[1:] for line in (plan.diff or "").splitlines(keepends=True)[3:]]  # after ---, +++ and @@
    assert plan.uploads[0].size == len("".join(created).encode())
    assert plan.changes


# ---- apply() failing: the failure carries the command's result and the step's fix ---------------------------
def single_host_world(runs: list[dict[str, Any]]) -> World:
    return World({"_probes": {}, "given": {"run": runs}})


def test_docker_group_apply_proves_the_group_with_a_new_session():
    world = single_host_world([
        {"line": "getent group docker", "stdout": "docker:x:998:\n"},
        {"line": "sudo -n -H -- sh -c 'usermod -aG docker spark'"},
        {"line": "docker ps -q", "exit_code": 1,
         "stderr": "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock\n"},
    ])
    step, ctx = make_step({"step": "docker.group"}), world.context()
    with pytest.raises(StepFailed) as info:
        step.apply(ctx, step.check(ctx))
    assert info.value.message == ("`docker ps` still fails in a new session: permission denied while trying to connect "
                                  "to the Docker daemon socket at unix:///var/run/docker.sock")
    assert info.value.fix == "check that the daemon runs (sudo systemctl status docker)"
    assert info.value.result is not None and info.value.result.command == Command("docker ps -q")
    transport = world.transports["spark-1"]
    assert transport.reconnects == 1  # the probe ran in a new login session, after usermod
    assert transport.lines() == ["getent group docker", "sudo -n -H -- sh -c 'usermod -aG docker spark'", "docker ps -q"]
    transport.verify()


@pytest.mark.parametrize("answer,message", [
    ({"exit_code": 100, "stderr": "Reading package lists...\nE: Unable to locate package rsync\n"},
     "`sudo apt-get install -y -q --no-install-recommends rsync` exited 100"),
    ({"exit_code": -1, "timed_out": True, "stderr": "\n(timed out after 900 s)"},
     "`sudo apt-get install -y -q --no-install-recommends rsync` timed out"),
])
def test_packages_apply_failure_names_the_command_and_the_fix(answer, message):
    world = single_host_world([
        {"line": "dpkg-query -W -f '${Package} ${Status}\n' rsync", "exit_code": 1},
        {"line": "sudo -n -H -- sh -c 'apt-get update -q'"},
        {"line": "sudo -n -H -- sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get install -y -q "
                 "--no-install-recommends rsync'", **answer},
    ])
    step, ctx = make_step({"step": "packages.present", "args": {"names": ["rsync"]}}), world.context()
    with pytest.raises(StepFailed) as info:
        step.apply(ctx, step.check(ctx))
    assert info.value.message == message
    assert info.value.fix == "check the node's apt sources and network, or install the packages by hand"
    assert info.value.result.stderr_tail(1) == answer["stderr"].strip().splitlines()[-1]
    world.transports["spark-1"].verify()


# ---- the strict transport itself: a fake that cannot fail would make every test above vacuous ------------------
def test_strict_transport_fails_on_an_unexpected_command_naming_its_display():
    t = StrictTransport("spark-1").expect("true")
    with pytest.raises(AssertionError, match=r"spark-1: unexpected command `sudo echo \*\*\*\*\*\*\*\*`"):
        t.run(Command("echo hunter2", sudo=True, secrets=("hunter2",)))
    t.run(Command("true"))
    # the runner turns a step's exceptions into failures, so verify() must still see it afterwards
    with pytest.raises(AssertionError, match=r"unexpected command\(s\): \['sudo echo \*\*\*\*\*\*\*\*'\]"):
        t.verify()


def test_strict_transport_fails_when_an_expected_command_never_ran():
    t = StrictTransport("spark-2").expect("a").expect(re.compile(r"^b "))
    assert t.run(Command("a")).ok
    with pytest.raises(AssertionError) as info:
        t.verify()
    assert str(info.value) == "spark-2: expected command(s) that never ran: [\"re:'^b '\"]; what ran: ['a']"
    assert t.run(Command("b x")).ok
    t.verify()


def test_strict_transport_matches_the_exact_shell_line_once_and_answers():
    t = StrictTransport().expect("sudo -n -H -- sh -c 'id -u'", exit_code=3, stdout="0\n", stderr="e")
    with pytest.raises(AssertionError):
        t.run(Command("id -u"))  # the same script without sudo is another line
    result = t.run(Command("id -u", sudo=True))
    assert (result.exit_code, result.stdout, result.stderr, result.ok) == (3, "0\n", "e", False)
    with pytest.raises(AssertionError):
        t.run(Command("id -u", sudo=True))  # used up
    assert t.lines() == ["id -u", "sudo -n -H -- sh -c 'id -u'", "sudo -n -H -- sh -c 'id -u'"]


def test_strict_transport_ordered_and_stdin():
    t = StrictTransport(ordered=True).expect("first").expect("second", stdin="key\n")
    with pytest.raises(AssertionError):
        t.run(Command("second", stdin="key\n"))  # out of order
    t.run(Command("first"))
    with pytest.raises(AssertionError):
        t.run(Command("second", stdin="other\n"))
    t.run(Command("second", stdin="key\n"))
    assert [c.stdin for c in t.ran] == ["key\n", None, "other\n", "key\n"]


def test_strict_transport_keeps_files_and_modes():
    t = StrictTransport().put_file("x", "old", 0o600)
    assert t.read_file("x") == b"old" and t.read_file("y") is None
    t.write_file_atomic("y", b"new", 0o640)
    assert t.read_file("y") == b"new" and t.run(file_state("~/y")).stdout == "640\nbmV3\n"  # its mode, base64 "new"
    assert t.writes == [("y", b"new", 0o640)] and t.reads == ["x", "y", "y", "y"]
    assert t.run(file_state("~/z")).stdout == "@missing\n"
