"""What a newcomer reads in `--help` and the README matches the code (issue 43's README audit, round 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.nccl import thresholds

ROOT = Path(__file__).resolve().parents[2]


def help_of(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("COLUMNS", "10000")  # argparse wraps at $COLUMNS: one line per option
    with pytest.raises(SystemExit) as exit_:
        cli.main([*argv, "--help"])
    assert exit_.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_serve_help_gives_the_min_busbw_default_per_topology(capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: serve's --min-busbw said "bus bandwidth the probe needs, GB/s" and no default (verify's did).
    text = help_of(["serve"], capsys, monkeypatch)
    option = text[text.rindex("--min-busbw MIN_BUSBW"):].split("--check")[0]  # its line, past the usage
    for floor in (thresholds.PAIR, thresholds.RING, thresholds.SWITCH):
        assert f"{floor.topology}: {floor.min_busbw_gbps:g} GB/s" in option


def test_the_no_inventory_fix_says_only_a_successful_bootstrap_is_remembered(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: "once a command has used an inventory, later commands find it on their own", though only a
    # successful bootstrap records one (bootstrap_cli.py), as the README and `bootstrap --help` say.
    from sparkcluster.engine.inventory import InventoryError, find_inventory

    with pytest.raises(InventoryError) as error:
        find_inventory(None, env={"HOME": str(tmp_path)}, cwd=tmp_path, config_dir=tmp_path / "config")
    fix = " ".join(error.value.fix.split())
    assert "once bootstrap has succeeded with an inventory, later commands find it on their own" in fix
