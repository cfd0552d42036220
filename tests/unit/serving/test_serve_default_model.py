"""The real-Sparks quick start's step 6, `sparkcluster serve --tp 2` with the README's inventory and no --model
(README audit round 3, item 2): the bundled `default` recipe names no model, so serve takes the inventory's first
`models:` entry (what bootstrap staged); with none there, it is bad input naming both fixes, before connecting."""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkcluster.cli import build_parser
from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.engine.inventory import Inventory, load_inventory
from sparkcluster.serving.cli import cmd_serve, options, sized

README_INVENTORY = Path(__file__).resolve().parents[3] / "inventories" / "two-sparks.yml"


class Checked(Exception):
    """The fake connection's answer: everything before connecting passed."""


def serve_args(*words: str) -> argparse.Namespace:
    argv = ["serve", *words]
    remote = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: len(argv) - len(remote) - 1] if "--" in argv else argv
    args = build_parser(["serve"]).parse_args(own)
    args.remote = remote
    return args


def connect_to(inventory: Inventory) -> Callable[..., object]:
    def connect(args: argparse.Namespace, check: Callable[[Inventory], None]) -> object:
        check(inventory)  # what cli.py's connect does before the first SSH connection
        raise Checked
    return connect


def test_serve_tp_2_with_the_readmes_inventory_serves_its_model() -> None:
    inventory = load_inventory(README_INVENTORY, check_files=False)
    assert inventory.models == ("Qwen/Qwen3-0.6B",)
    args = serve_args("--tp", "2", "--check")
    with pytest.raises(Checked):  # no "recipe 'default' names no model" before connecting
        cmd_serve(args, connect_to(inventory))  # type: ignore[arg-type]
    chosen = sized(options(args), inventory)
    assert chosen.serve_args().model == "Qwen/Qwen3-0.6B" and chosen.layout.tp == 2


def test_the_model_given_or_the_recipes_beats_the_inventorys() -> None:
    inventory = load_inventory(README_INVENTORY, check_files=False)
    given = serve_args("--tp", "2", "--model", "org/other")
    assert sized(options(given), inventory).serve_args().model == "org/other"
    recipe = serve_args("--tp", "2", "--recipe", "gpt-oss-120b")
    assert sized(options(recipe), inventory).serve_args().model == "openai/gpt-oss-120b"


def test_no_model_anywhere_is_bad_input_naming_both_fixes(tmp_path: Path) -> None:
    bare = tmp_path / "inventory.yml"
    shutil.copy(README_INVENTORY, bare)
    bare.write_text(bare.read_text().replace("models:\n  - Qwen/Qwen3-0.6B\n", ""))
    inventory = load_inventory(bare, check_files=False)
    assert inventory.models == ()
    with pytest.raises(UsageError) as refused:
        cmd_serve(serve_args("--tp", "2"), connect_to(inventory))  # type: ignore[arg-type]
    assert refused.value.exit_code == EXIT_USAGE
    assert "recipe 'default' names no model, and the inventory lists none under `models:`" in refused.value.message
    assert "--model ORG/NAME" in refused.value.fix and "`models:`" in refused.value.fix
