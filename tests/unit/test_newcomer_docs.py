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
    # successful bootstrap records one (bootstrap/cli.py), as the README and `bootstrap --help` say.
    from sparkcluster.engine.inventory import InventoryError, find_inventory

    with pytest.raises(InventoryError) as error:
        find_inventory(None, env={"HOME": str(tmp_path)}, cwd=tmp_path, config_dir=tmp_path / "config")
    fix = " ".join(error.value.fix.split())
    assert "once bootstrap has succeeded with an inventory, later commands find it on their own" in fix
    # An installed user has no inventories/ folder at hand: the README's quick start holds the example too.
    assert "Quick start (real Sparks)" in fix and "Quick start (real Sparks)" in README.read_text()


README = ROOT / "README.md"
QUICK_START_INVENTORY = "<!-- real sparks inventory: tests/unit/test_newcomer_docs.py loads it -->"


DOCS = ROOT / "docs"


def doc_section(path: Path, title: str) -> str:
    """A page's `## title` section, to the next `## ` heading."""
    text = path.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else len(text)]


def readme_section(title: str) -> str:
    return doc_section(README, title)


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


def test_the_layout_table_names_files_that_exist_and_every_wing_and_sub_package() -> None:
    # Failed before: `sparkcluster/cli.py` was said to hold facts, bootstrap and run (bootstrap_cli.py does), and
    # bench/ had no row. Then (README audit, round 3, item 10) bench/layouts/ and bench/explain/ went unnamed: every
    # sub-package is now named in its wing's row, relative to the wing (`methods/closed_loop/`).
    table = doc_section(DOCS / "development.md", "Layout")
    rows = [line for line in table.splitlines() if line.startswith("| `sparkcluster/")]
    named = {path for row in rows for path in re.findall(r"`(sparkcluster/[\w/.]+)`", row.split("|")[1])}
    for path in named:
        assert (ROOT / path).exists(), f"docs/development.md's layout names {path}, which does not exist"
    wings = {f"sparkcluster/{p.name}/" for p in (ROOT / "sparkcluster").iterdir()
             if (p / "__init__.py").exists()}
    assert wings <= named, f"wings without a row in docs/development.md's layout: {sorted(wings - named)}"
    cli_row = next(row for row in rows if "`sparkcluster/cli.py`" in row)
    assert "`sparkcluster/completion.py`" in cli_row
    bootstrap_row = next(row for row in rows if "`sparkcluster/bootstrap/`" in row.split("|")[1])
    assert "facts, bootstrap and run" in bootstrap_row and "`stepcatalog.py`" in bootstrap_row
    for wing in wings:
        row = next(row for row in rows if f"`{wing}`" in row.split("|")[1])
        base = ROOT / wing
        for init in sorted(base.rglob("__init__.py")):
            if init.parent == base or "__pycache__" in init.parts:
                continue
            sub = init.parent.relative_to(base).as_posix() + "/"
            assert f"`{sub}`" in row, f"{wing}{sub} is not named in its wing's row of docs/development.md"


# ---- the README in a tenth of its length, the reference in docs/ (issue 46; README audit, round 3) ----------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without its fenced code blocks."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    heads = re.findall(r"^#{1,6} (.+)$", prose(path.read_text()), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def test_the_readme_reads_in_ten_minutes_and_links_every_docs_page() -> None:
    # Failed before: 18,380 words, about 70 minutes of reading, and no docs/ page but failure-modes.md.
    text = README.read_text()
    words = len(prose(text).split())
    assert 1500 <= words <= 2500, f"README.md has {words} words outside its code blocks"
    linked = {target.split("#")[0] for target in LINK.findall(text)}
    for page in sorted(DOCS.glob("*.md")):
        assert f"docs/{page.name}" in linked, f"README.md links no docs/{page.name}"
    for family in ("bootstrap", "stage", "verify", "serve", "bench", "observe", "recipes", "simulator",
                   "topologies", "security", "development"):
        assert (DOCS / f"{family}.md").exists(), f"docs/{family}.md is missing"


def test_every_link_between_the_readme_and_the_docs_resolves() -> None:
    # A page that moved, or a heading renamed, must not leave a link that goes nowhere.
    for page in pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            assert dest.exists(), f"{page.name} links {target}: no such file"
            if anchor and dest.suffix == ".md":
                assert anchor in anchors(dest), f"{page.name} links {target}: {dest.name} has no such heading"


def test_a_twin_is_defined_where_the_readme_first_says_it() -> None:
    # Failed before: "the cabled port's two twins" from step 2 on, never defined.
    text = README.read_text()
    first = text.lower().index("twin")
    sentence = text[text.rindex("\n\n", 0, first):text.index("\n\n", first)]
    for name in ("enp1s0f1np1", "enP2p1s0f1np1", "rocep1s0f1", "roceP2p1s0f1", "PCIe x4"):
        assert name in sentence, f"the README's first use of 'twin' does not say {name}"
    assert "**twins**" in sentence


def test_undoing_bootstrap_names_everything_bootstrap_writes_on_a_node() -> None:
    # Failed before: nothing said how to remove what bootstrap set. Each path comes from the step that writes it.
    from sparkcluster.node import forwarding
    from sparkcluster.node.addressing import NETPLAN_FILE
    from sparkcluster.node.network import COMM_ENV_PATH, NODE_NETDEV
    from sparkcluster.node.routed import SYSCTL_FILE
    from sparkcluster.node.steps import addresses, mesh

    undo = readme_section("Undoing bootstrap on a node")
    for written in (NETPLAN_FILE, addresses.STATE_DIR, addresses.SAVED_SYSCTL, SYSCTL_FILE, forwarding.CHAIN,
                    NODE_NETDEV, COMM_ENV_PATH, mesh.KEY, "~/.ssh/authorized_keys", "~/.ssh/known_hosts"):
        assert written in undo, f"the README's undo section does not name {written}"
    for command in (f"sudo rm {NETPLAN_FILE}", f"sudo iptables -X {forwarding.CHAIN}", f"sudo ip link del {NODE_NETDEV}",
                    f"sudo sysctl -p {addresses.SAVED_SYSCTL}", "sudo gpasswd -d $USER docker", "ssh-keygen -R",
                    "control_plane: lan"):
        assert command in undo, f"the README's undo section lacks `{command}`"


def test_the_test_script_runs_in_the_order_development_md_states() -> None:
    # Failed before (audit item 5): the README said unit tests first, beside setup-vllm.sh; test.sh waits for it and
    # runs the integration tests first.
    script = (ROOT / "scripts" / "test.sh").read_text()
    runs = [line for line in script.splitlines() if line.startswith("run_pytest ")]
    order = [("tests/integration" if "tests/integration" in run else "serial" if "-m serial" in run else "tests/unit")
             for run in runs]
    assert order == ["tests/integration", "tests/unit", "serial"], order
    assert script.index('wait "$vllm_setup"') < script.index(runs[0])
    said = " ".join(doc_section(DOCS / "development.md", "Tests").split())
    places = [said.index(marker) for marker in ("once `scripts/setup-vllm.sh` is done", "over `tests/integration`",
                                                  "over `tests/unit`", "marked `serial`")]
    assert places == sorted(places), said


def test_every_command_has_a_row_in_the_readme_and_a_docs_page_that_names_it() -> None:
    table = readme_section("Commands")
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for wing in cli.WINGS:
        for name, _ in wing.commands:
            row = next((r for r in rows if re.search(rf"`{re.escape(name)}(?: [^`]*)?`", r.split("|")[1])), None)
            assert row is not None, f"the README's Commands table has no row for {name}"
            link = re.search(r"\]\(([^)]+)\)", row)
            assert link is not None, f"the README's row for {name} links no page"
            page = ROOT / link.group(1).split("#")[0] if not link.group(1).startswith("#") else README
            assert f"sparkcluster {name}" in page.read_text(), f"{page.name} never names `sparkcluster {name}`"


def test_what_is_written_where_names_the_layouts_folder() -> None:
    # Failed before (audit item 14): "writes only under ~/.config/sparkcluster and ~/.cache/sparkcluster", while
    # `bench --layouts` writes ./bench-layouts in the working directory unless --out is given.
    from sparkcluster.bench.layouts.cli import DEFAULT_OUT

    where = doc_section(DOCS / "commands.md", "What sparkcluster writes, and where")
    assert f"`./{DEFAULT_OUT}`" in where and "--out" in where


def test_each_field_figure_is_said_once() -> None:
    # Failed before: the field figures and the owners' latency stood in four places and three.
    for figure in ("23.7", "21.9", "13.9", "17.6", "12.3", "105-127"):
        holders = [p.name for p in pages() for _ in range(p.read_text().count(figure))]
        assert len(holders) == 1, f"{figure} is said {len(holders)} times: in {holders}"
