"""The step catalogue is lazy: a playbook imports the modules of the steps it names and no others (what keeps
`bootstrap`'s start cheap), and the declared table agrees with what the modules register."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkcluster.bootstrap import stepcatalog
from sparkcluster.engine import yamlsource
from sparkcluster.engine.steps.base import REGISTRY, Step, StepRegistry, register
from sparkcluster.engine.yamlsource import SourceList, SourceMap

ROOT = Path(__file__).resolve().parents[3]


def _loaded_after(code: str) -> set[str]:
    """The sparkcluster modules a fresh interpreter holds after running `code`."""
    probe = textwrap.dedent(code) + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    return {m for m in json.loads(done.stdout.splitlines()[-1]) if m.startswith("sparkcluster")}


def test_resolving_one_step_imports_only_its_module() -> None:
    loaded = _loaded_after("""
        from sparkcluster.bootstrap import stepcatalog
        from sparkcluster.engine.steps import REGISTRY
        assert REGISTRY["preflight.disk"].name == "preflight.disk"
    """)
    assert "sparkcluster.node.steps.preflight" in loaded
    assert not loaded & {"sparkcluster.engine.steps.docker", "sparkcluster.engine.steps.shell",
                         "sparkcluster.staging.step", "sparkcluster.staging.stager",
                         "sparkcluster.node.steps.addresses", "sparkcluster.node.steps.mesh"}


def test_a_playbook_loads_the_modules_of_the_steps_it_names(tmp_path: Path) -> None:
    book = tmp_path / "one.yml"
    book.write_text("plays:\n  - name: p\n    hosts: all\n    steps:\n      - command.run: {cmd: 'true'}\n")
    loaded = _loaded_after(f"""
        from sparkcluster.bootstrap import stepcatalog
        book = stepcatalog.load({str(book)!r})
        assert [c.name for c in book.plays[0].steps] == ["command.run"]
    """)
    assert "sparkcluster.engine.steps.shell" in loaded
    assert not any(m.startswith(("sparkcluster.staging", "sparkcluster.node.steps.")) for m in loaded)
    assert "sparkcluster.engine.steps.docker" not in loaded


def test_every_declared_step_is_registered_by_its_module_and_no_other() -> None:
    declared = dict(REGISTRY._declared)  # name -> module, as the packages declared them
    assert {"preflight.disk", "ssh.mesh", "docker.group", "models.stage", "fabric.addresses"} <= declared.keys()
    for name, module in declared.items():
        cls = REGISTRY[name]
        assert cls.name == name and cls.__module__ == module, (name, module, cls.__module__)
    # The other way round: every Step class a declared module defines is in the table (a step added to a module
    # but not declared would be unknown to every playbook that did not load its module first).
    for module in set(declared.values()):
        for value in vars(importlib.import_module(module)).values():
            if isinstance(value, type) and issubclass(value, Step) and value.__module__ == module \
                    and hasattr(value, "name"):
                assert declared.get(value.name) == module, f"{module} registers {value.name} undeclared"
    assert stepcatalog.load_bundled("bootstrap").plays


@pytest.mark.parametrize("book", sorted((ROOT / "sparkcluster" / "playbooks").glob("*.yml")), ids=lambda p: p.stem)
def test_each_bundled_playbook_passes_every_check_a_users_playbook_gets(book: Path) -> None:
    """load_bundled defers each step's module, and the check of its arguments, to the play that runs it (after
    connecting): this is where a bundled playbook's unknown step or argument, or a missing one, is caught."""
    eager = stepcatalog.load(book)
    deferred = stepcatalog.load_bundled(book.stem)  # parsed by libyaml: the same tree, lines and all

    def tree(x: object) -> object:
        if isinstance(x, SourceMap):
            return "map", x.line, sorted((str(k), x.key_line(k), tree(v)) for k, v in x.items())
        if isinstance(x, SourceList):
            return "list", x.line, [(x.item_line(i), tree(v)) for i, v in enumerate(x)]
        return type(x).__name__, x

    assert tree(yamlsource.load(book.read_text(), libyaml=True)) == tree(yamlsource.load(book.read_text()))
    assert [[(c.name, c.args, c.line) for c in p.steps] for p in eager.plays] == \
        [[(c.name, c.args, c.line) for c in p.steps] for p in deferred.plays]
    for play, checked in zip(deferred.plays, eager.plays, strict=True):
        play.import_steps()
        assert [c.step for c in play.steps] == [c.step for c in checked.steps]


def test_a_deferred_step_is_imported_when_its_play_starts() -> None:
    loaded = _loaded_after("""
        import sys
        from sparkcluster.bootstrap import stepcatalog
        book = stepcatalog.load_bundled("bootstrap")
        assert not any(m.startswith("sparkcluster.node.steps.") for m in sys.modules), "imported at load"
        cabling = book.plays[0]
        assert [c.name for c in cabling.steps] == ["fabric.cabling"]
        cabling.import_steps()
    """)
    assert "sparkcluster.node.steps.cabling" in loaded
    assert "sparkcluster.node.steps.preflight" not in loaded and "sparkcluster.staging.step" not in loaded


def test_a_module_that_does_not_register_its_declared_step_is_an_error() -> None:
    registry = StepRegistry()
    registry.declare("json", ["json.nothing"])
    assert "json.nothing" in registry and list(registry) == ["json.nothing"]
    with pytest.raises(RuntimeError, match="did not"):
        registry["json.nothing"]
    with pytest.raises(RuntimeError, match="declared by"):
        registry.declare("csv", ["json.nothing"])


def test_a_step_registers_once() -> None:
    with pytest.raises(RuntimeError, match="registered twice"):
        register(REGISTRY["preflight.disk"])


def test_bootstraps_start_imports_no_stager_and_no_table() -> None:
    """What `sparkcluster bootstrap --json` imports before it connects: its playbook's steps, the runner, the JSON
    reporter. Staging's machinery waits for a model to stage, rich's tables and live display for a terminal."""
    loaded = _loaded_after("""
        import io
        from sparkcluster import cli
        from sparkcluster.bootstrap import cli as bootstrap_cli, stepcatalog
        from sparkcluster.engine import runner, session
        from sparkcluster.engine.console import out
        from sparkcluster.engine.report import make_reporter
        book = stepcatalog.load(stepcatalog.bundled("bootstrap"))  # as a user's playbook: every step imported
        assert {c.name for p in book.plays for c in p.steps} >= {"models.stage", "ssh.mesh", "docker.group"}
        make_reporter(out, json_output=True, show_diff=False, out=io.StringIO())
        import sys
        assert not {"rich.table", "rich.live"} & set(sys.modules), "rich's tables were imported"
    """)
    assert "sparkcluster.staging.step" in loaded
    assert not loaded & {"sparkcluster.staging.stager", "sparkcluster.staging.chain", "sparkcluster.staging.wire"}


def test_bootstraps_start_imports_no_template_engine() -> None:
    """jinja2 is a tenth of bootstrap's start: it is imported when the first argument is rendered (per host, after
    connecting), not when the playbook loads; a playbook whose arguments hold no template never imports it."""
    loaded = _loaded_after("""
        import sys
        from sparkcluster.bootstrap import stepcatalog
        from sparkcluster.engine.playbook import build_args
        book = stepcatalog.load_bundled("bootstrap")
        assert "jinja2" not in sys.modules, "loading the bundled playbook imported jinja2"
        disk = next(c for p in book.plays for c in p.steps if c.name == "preflight.disk")
        plain = type(disk)(disk.step, {"min_free_gb": 7}, disk.line)
        assert build_args(plain, {}).min_free_gb == 7 and "jinja2" not in sys.modules
        assert build_args(disk, {"min_free_gb": "12"}).min_free_gb == 12  # the template renders on demand
        assert "jinja2" in sys.modules
    """)
    assert "sparkcluster.node.steps.preflight" in loaded  # build_args imported the deferred step's module
