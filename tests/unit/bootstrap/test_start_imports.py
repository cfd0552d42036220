"""What `sparkcluster bootstrap` imports before its first connection (issue 33: a start under 0.15 s of imports).

The real command line runs on an inventory of loopback hosts and is stopped where the transport imports paramiko,
which it does when the first connection opens: what is loaded then is bootstrap's start. Each module named
here was once part of it and is now imported later, where it is first needed (benchmarks/start_imports.py says
what each costs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

STOP_AT_FIRST_CONNECTION = """
import json, os, sys

class FirstConnection:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("paramiko", "fabric", "invoke"):
            sys.stdout.flush()
            os.write(1, ("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n").encode())
            os._exit(0)
        return None

sys.meta_path.insert(0, FirstConnection())
from sparkcluster.cli import main
sys.exit(main(sys.argv[1:]))
"""

# Imported when first needed, never before the first connection.
LATER = {
    "jinja2", "markupsafe",  # a template renders per host, after connecting
    "importlib.resources", "zipfile",  # the bundled playbook is found beside the package's modules
    "tempfile",  # recording the inventory used, after a bootstrap that succeeded
    "getpass",  # -K only
    "rich._emoji_codes",  # no console renders emoji codes
    "uuid", "platform",  # random names are os.urandom's bytes, not a uuid (uuid imports platform)
    "secrets", "hmac", "hashlib",  # nor secrets' tokens (hmac, hashlib); a host key's fingerprint after connecting
    "rich.table", "rich.live",  # into a pipe, lines; tables and the live display are a terminal's
    "sparkcluster.staging.stager", "sparkcluster.staging.chain",  # a model to stage, in the last play
    # The bundled playbook's steps, and the node's machinery they run on: imported as each play starts.
    "sparkcluster.node.steps.cabling", "sparkcluster.node.steps.preflight", "sparkcluster.node.steps.comm",
    "sparkcluster.node.discovery", "sparkcluster.node.fabric", "sparkcluster.node.addressing",
    "sparkcluster.staging.step", "sparkcluster.engine.steps.docker", "sparkcluster.engine.steps.files",
}


def _loaded_at_first_connection(tmp_path: Path, *flags: str) -> tuple[set[str], str]:
    inventory = tmp_path / "inventory.yml"
    # Port 1 on loopback: nothing listens, and the run is stopped before it would try.
    inventory.write_text("name: start\nvars:\n  user: nobody\nhosts:\n"
                         "  a: {address: 127.0.0.1, port: 1, role: head}\n"
                         "  b: {address: 127.0.0.2, port: 1, role: worker}\n")
    done = subprocess.run([sys.executable, "-c", STOP_AT_FIRST_CONNECTION, "bootstrap", str(inventory), *flags],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    marker = next((line for line in done.stdout.splitlines() if line.startswith("MODULES ")), None)
    assert marker is not None, f"bootstrap never reached its first connection:\n{done.stdout}\n{done.stderr}"
    return set(json.loads(marker.removeprefix("MODULES "))), done.stdout + done.stderr


def test_bootstrap_reaches_its_first_connection_having_imported_only_its_start(tmp_path: Path) -> None:
    loaded, output = _loaded_at_first_connection(tmp_path)
    # The start really ran: the inventory and the playbook loaded, the runner began its first play.
    assert "PLAY fabric cabling [a, b]" in output
    assert {"sparkcluster.engine.runner", "sparkcluster.engine.transport", "yaml", "rich.console"} <= loaded
    assert not loaded & LATER, f"imported before the first connection: {sorted(loaded & LATER)}"


def test_bootstrap_json_reaches_its_first_connection_without_the_later_modules(tmp_path: Path) -> None:
    loaded, _ = _loaded_at_first_connection(tmp_path, "--json")
    assert "sparkcluster.engine.runner" in loaded
    assert not loaded & LATER, f"imported before the first connection: {sorted(loaded & LATER)}"
