"""The command line's start: the parser lists every command without importing the wings, each command imports
only its own wing, `sparkcluster` alone shows the commands, and the completion scripts parse in their shells."""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine.cliapp import App
from tests.support.helpers import REQUIRE_SIM

ROOT = Path(__file__).resolve().parents[2]


def _registered(module: str) -> dict[str, str]:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    importlib.import_module(module).register(commands, App())
    return {c.dest: c.help or "" for c in commands._choices_actions}


@pytest.mark.parametrize("wing", cli.WINGS, ids=lambda w: w.module)
def test_each_row_says_what_its_wing_registers(wing: cli.Wing) -> None:
    # The help line --help shows without importing the wing is the one the wing registers, for every command.
    assert _registered(wing.module) == dict(wing.commands)


def _modules_after(argv: list[str]) -> set[str]:
    code = ("import sys\nfrom sparkcluster import cli\n"
            f"try:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
            "print('\\n'.join(sys.modules), file=sys.stderr)")  # stdout holds the help
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stderr
    return set(out.split())


HEAVY = {"paramiko", "fabric", "aiohttp", "matplotlib", "tokenizers", "yaml", "jinja2"}
WING_MODULES = {"sparkcluster.serving", "sparkcluster.bench", "sparkcluster.staging", "sparkcluster.nccl",
                "sparkcluster.sim", "sparkcluster.node", "sparkcluster.bootstrap"}


def test_help_imports_no_wing_and_nothing_heavy() -> None:
    loaded = _modules_after(["--help"])
    assert not loaded & (HEAVY | WING_MODULES)
    # Nor what the parser never needs: dataclasses (with inspect, ast, dis), typing, difflib (for a typo's hint)
    # were a third of --help's imports past the interpreter's own.
    assert not loaded & {"dataclasses", "inspect", "typing", "difflib"}, sorted(
        loaded & {"dataclasses", "inspect", "typing", "difflib"})


def test_bootstrap_imports_its_wing_only() -> None:
    loaded = _modules_after(["bootstrap", "--help"])
    assert "sparkcluster.bootstrap.cli" in loaded
    # What bootstrap runs on is imported when it runs, not for its --help.
    assert not loaded & {"sparkcluster.node.steps", "yaml", "jinja2", "rich", "paramiko", "fabric"}
    assert not loaded & {"aiohttp", "matplotlib", "tokenizers", "sparkcluster.serving", "sparkcluster.bench",
                         "sparkcluster.sim", "sparkcluster.nccl"}


def test_nccl_report_imports_neither_the_transport_nor_serving() -> None:
    loaded = _modules_after(["nccl-report", "--help"])
    assert "sparkcluster.nccl.cli" in loaded
    assert not loaded & {"sparkcluster.serving", "sparkcluster.bench", "aiohttp"}


def test_no_arguments_prints_the_commands_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    shown = capsys.readouterr().out
    for wing in cli.WINGS:
        for name, help_line in wing.commands:
            assert name in shown and help_line.split()[0] in shown


def test_an_unknown_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bootstrapp"])
    assert exit_.value.code == 2
    assert "invalid choice: 'bootstrapp'" in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_completion_script_parses_in_its_shell(shell: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", shell]) == 0
    text = capsys.readouterr().out
    # Every command, and the flags of a command deep in a wing, are in the script.
    for name in ("bootstrap", "serve", "nccl-report", "sim"):
        assert name in text
    assert "--trust-new-host-keys" in text or "trust-new-host-keys" in text
    if shutil.which(shell) is None:
        if shell == "bash" or REQUIRE_SIM:  # CI's machine has them (scripts/setup.sh): a skip there is a failure
            pytest.fail(f"{shell} is missing (scripts/setup.sh installs it)")
        pytest.skip(f"{shell} is not installed (scripts/setup.sh installs it)")
    path = tmp_path / f"completion.{shell}"
    path.write_text(text)
    checked = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_fish_completes_a_sub_command_flag_with_its_choices() -> None:
    from sparkcluster.completion import fish

    script = fish(cli.build_parser())
    bootstrap_runtime = [line for line in script.splitlines()
                         if "__fish_seen_subcommand_from bootstrap" in line and "-l runtime" in line]
    assert bootstrap_runtime and "-a 'docker host'" in bootstrap_runtime[0]


def test_a_positional_inventory_is_never_reported_as_from_i(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: the INVENTORY argument's error read "(from -i): no such file".
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    missing = tmp_path / "nope.yml"
    assert cli.main(["facts", str(missing)]) == 2
    assert f"{missing} (as given): no such file" in capsys.readouterr().err
    assert cli.main(["facts", "-i", str(missing)]) == 2
    assert f"{missing} (from -i): no such file" in capsys.readouterr().err


def test_recipes_show_takes_the_model_a_recipe_does_not_name(capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    assert cli.main(["recipes", "show", "default"]) == 2
    assert "names no model" in capsys.readouterr().err
    assert cli.main(["recipes", "show", "default", "--model", "Qwen/Qwen3-0.6B", "--tp", "2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"] == "Qwen/Qwen3-0.6B" and doc["tp"] == 2 and "vllm serve Qwen/Qwen3-0.6B" in doc["commands"][0]


@pytest.mark.parametrize(("argv", "flag"), [(["facts", "--forks=--"], "--forks"), (["serve", "--port=--"], "--port")])
def test_an_option_given_double_dash_is_checked_as_its_value(argv: list[str], flag: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # Python before 3.13 strips the `--` and hands the option an empty list, past its type check.
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert f"argument {flag}: '--' is not" in capsys.readouterr().err


def test_an_option_value_of_double_dash_is_kept_where_it_is_valid() -> None:
    assert cli.build_parser().parse_args(["down", "--limit=--"]).limit == "--"
