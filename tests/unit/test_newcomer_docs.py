"""What a newcomer reads in `--help` and the README matches the code (issue 43's README audit, round 2)."""

from __future__ import annotations

import re
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
    # An installed user has no inventories/ folder at hand: the README's quick start holds the example too.
    assert "Quick start (real Sparks)" in fix and "Quick start (real Sparks)" in README.read_text()


README = ROOT / "README.md"
QUICK_START_INVENTORY = "<!-- real sparks inventory: tests/unit/test_newcomer_docs.py loads it -->"


def readme_section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def test_the_real_sparks_quick_start_inventory_is_the_shipped_one_and_valid(tmp_path: Path) -> None:
    # The first thing a Spark owner writes: it must load as it is, and say what inventories/two-sparks.yml says.
    from sparkcluster.engine.inventory import load_inventory

    text = readme_section("Quick start (real Sparks)")
    block = text[text.index(QUICK_START_INVENTORY):].split("```yaml\n", 1)[1].split("\n```", 1)[0]
    (tmp_path / "inventory.yml").write_text(block + "\n")
    quick = load_inventory(tmp_path / "inventory.yml", check_files=False)
    shipped = load_inventory(ROOT / "sparkcluster" / "inventories" / "two-sparks.yml", check_files=False)
    assert [(h.name, h.address, h.role) for h in quick.hosts] == [(h.name, h.address, h.role) for h in shipped.hosts]
    assert quick.head.name == "spark-a"


def test_the_real_sparks_quick_start_walks_every_step_in_order() -> None:
    text = readme_section("Quick start (real Sparks)")
    steps = ["sparkcluster facts --trust-new-host-keys", "sparkcluster bootstrap -K", "sparkcluster topology",
             "sparkcluster verify", "sparkcluster serve", "sparkcluster bench"]
    places = [text.index(step) for step in steps]
    assert places == sorted(places)
    readme = README.read_text()
    assert readme.index("## Quick start (the simulator)") < readme.index("## Quick start (real Sparks)") < \
        readme.index("## Install")
    # The first two commands a reader meets stay the demo and the tests.
    first = [line.split()[0] for line in readme.split("```bash\n", 1)[1].split("\n```", 1)[0].splitlines()]
    assert first == ["./scripts/demo.sh", "./scripts/test.sh"]


def test_the_layout_table_names_files_that_exist_and_every_wing() -> None:
    # Failed before: `sparkcluster/cli.py` was said to hold facts, bootstrap and run (bootstrap_cli.py does), and
    # bench/ had no row.
    table = readme_section("Layout")
    rows = [line for line in table.splitlines() if line.startswith("| `sparkcluster/")]
    named = {path for row in rows for path in re.findall(r"`(sparkcluster/[\w/.]+)`", row.split("|")[1])}
    for path in named:
        assert (ROOT / path).exists(), f"README's layout names {path}, which does not exist"
    wings = {f"sparkcluster/{p.name}/" for p in (ROOT / "sparkcluster").iterdir()
             if (p / "__init__.py").exists()}
    assert wings <= named, f"wings without a row in README's layout: {sorted(wings - named)}"
    cli_row = next(row for row in rows if "`sparkcluster/cli.py`" in row)
    assert "`sparkcluster/bootstrap_cli.py`" in cli_row and "`sparkcluster/completion.py`" in cli_row
