"""Issue 48, bootstrap's GPU clock cap: what `nvidia-smi -q -d CLOCK` is read for, the unit that keeps the cap across
reboots, and the cap refused before connecting where it cannot be one (the step's plans: tests/fixtures/steps/gpu.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.bootstrap import cli as bootstrap_cli
from sparkcluster.bootstrap import stepcatalog
from sparkcluster.engine import session as session_module
from sparkcluster.engine.errors import EXIT_USAGE
from sparkcluster.engine.playbook import build_args
from sparkcluster.node.gpuclock import Clocks, apply_line, parse_clock_report, unit_text

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


def report_of(case_id: str) -> str:
    """The `nvidia-smi -q -d CLOCK` output a step case answers with."""
    doc = json.loads((FIXTURES / "steps" / "gpu.json").read_text())
    case = next(c for c in doc["cases"] if c["id"] == case_id)
    return next(r["stdout"] for r in case["given"]["run"] if r["line"] == "nvidia-smi -q -d CLOCK")


def test_the_clock_report_is_read_from_its_clocks_and_max_clocks_sections_only():
    assert parse_clock_report(report_of("change-lock-reset-since-it-was-applied")) == Clocks(2405, 3003)
    # Applications Clocks and Max Customer Boost Clocks hold Graphics lines too (N/A on GB10): not the ones read
    text = ("GPU 0000000F:01:00.0\n    Applications Clocks\n        Graphics                          : 1500 MHz\n"
            "    Clocks\n        Graphics                          : N/A\n        SM                                : "
            "900 MHz\n    Max Clocks\n        Graphics                          : 3003 MHz\n")
    assert parse_clock_report(text) == Clocks(None, 3003)
    assert parse_clock_report("") == Clocks(None, None)


def test_the_unit_reapplies_the_cap_at_boot_with_nothing_systemd_would_expand():
    unit = unit_text(2000)
    assert "Type=oneshot" in unit and "WantedBy=multi-user.target" in unit
    assert "ExecStart=/bin/sh -c 'nvidia-smi -lgc 0,2000 && mkdir -p /run/sparkcluster && echo 0,2000 > " \
           "/run/sparkcluster/gpu-clock-cap'" in unit
    assert "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146" in unit  # why, for whoever finds the file
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert "$" not in exec_line and "%" not in exec_line
    assert apply_line(1800).startswith("nvidia-smi -lgc 0,1800 && ")


@pytest.fixture
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected although the input was invalid")
    monkeypatch.setattr(session_module, "Transport", refuse)
    monkeypatch.setattr(cli.err_console, "width", 10_000)


@pytest.mark.parametrize("cap, said", [("50", "50 MHz is outside 300-5000"), ("fast", "'fast' is not a clock in MHz")])
def test_a_flag_that_is_no_cap_is_refused_before_connecting(tmp_path, capsys, no_connection, cap, said):
    inventory = tmp_path / "inv.yml"
    inventory.write_text("hosts:\n  s1: {address: 10.0.0.1, role: head}\n")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bootstrap", str(inventory), "--gpu-clock-cap", cap])
    assert exit_info.value.code == EXIT_USAGE
    assert said in capsys.readouterr().err


def test_an_inventory_cap_that_is_no_cap_is_refused_with_its_line(tmp_path, capsys, no_connection):
    inventory = tmp_path / "inv.yml"
    inventory.write_text("vars:\n  gpu_clock_cap: 2000 MHz\nhosts:\n  s1: {address: 10.0.0.1, role: head}\n")
    assert cli.main(["bootstrap", str(inventory)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "inv.yml:2" in err and "gpu_clock_cap must be a GPU clock in MHz" in err and "gpu_clock_cap: 2000" in err


def test_the_flag_and_the_inventory_var_reach_the_step_as_a_whole_number(tmp_path, monkeypatch):
    """--gpu-clock-cap is the playbook's gpu_clock_cap (beating the inventory's), and bootstrap's step gets it as MHz;
    without either the step is asked for no cap (0: skipped)."""
    extras: list[dict[str, object]] = []
    monkeypatch.setattr(bootstrap_cli, "run_playbook",
                        lambda playbook, inventory, args, extra: extras.append(extra) or type("R", (), {"exit_code": 1}))
    inventory = tmp_path / "inv.yml"
    inventory.write_text("vars:\n  gpu_clock_cap: 1800\nhosts:\n  s1: {address: 10.0.0.1, role: head}\n")
    assert cli.main(["bootstrap", str(inventory), "--gpu-clock-cap", "2000"]) == 1
    assert extras == [{"gpu_clock_cap": 2000}]
    call = next(c for play in stepcatalog.load_bundled("bootstrap").plays for c in play.steps
                if c.name == "gpu.clock_cap")
    assert build_args(call, {"gpu_clock_cap": 2000}).cap_mhz == 2000
    assert build_args(call, {"gpu_clock_cap": 1800}).cap_mhz == 1800  # the inventory's var, where no flag is given
    assert build_args(call, {}).cap_mhz == 0
