"""An inventory's problems as the loader names them, for the tests of bad inventories."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.engine.inventory import InventoryError, load_inventory


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "inv.yml"
    path.write_text(text)
    with pytest.raises(InventoryError) as raised:
        load_inventory(path, check_files=False)
    return [e.message.removeprefix(f"{path}:") for e in raised.value.problems]
