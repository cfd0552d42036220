"""sparkcluster's NCCL tuner plugin on the nodes: built from its C source (tuner/sizes_tuner.c) with each node's own
`cc`, beside the table verify --tune measured, in one folder of the login user's home.

NCCL takes a choice per message size only through a tuner plugin, and its paths in the comm env must be absolute
(dlopen and fopen expand no `~`), so each node's paths are its own home's (`for_host`). Built on the node, not
shipped built: a Spark is aarch64 and its libc is the node's; the source is 200 lines of C with no header of
NCCL's. A node without a C compiler cannot take the table: verify --tune says so and measures without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources

from ..engine.command import Command, shell_path
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import remote_path

TUNER_DIR = "~/.config/sparkcluster/nccl-tuner"
PLUGIN = f"{TUNER_DIR}/libnccl-tuner-sparkcluster.so"
TABLE = f"{TUNER_DIR}/sizes.csv"
SOURCE = f"{TUNER_DIR}/sizes_tuner.c"


@dataclass(frozen=True)
class Installed:
    """Where the plugin and the table are on each node (its home), or why a node could not build it."""

    homes: Mapping[str, str]
    refused: Mapping[str, str]

    @property
    def ok(self) -> bool:
        return bool(self.homes) and not self.refused


def source() -> bytes:
    return (resources.files("sparkcluster.nccl") / "tuner" / "sizes_tuner.c").read_bytes()


def for_host(settings: Mapping[str, str], home: str) -> dict[str, str]:
    """`settings` with a `~/` value made the node's absolute path (the plugin's and the table's)."""
    return {k: f"{home.rstrip('/')}/{v[2:]}" if v.startswith("~/") else v for k, v in settings.items()}


def install(session: Session, table_csv: str) -> Installed:
    """The source and the table written on every node, the plugin built there (into a temporary name, then moved:
    a serve starting meanwhile never loads half a library); each node's home, or why it could not."""
    build = (f"command -v cc >/dev/null 2>&1 || {{ echo 'no C compiler (cc)'; exit 3; }}; "
             f"cc -O2 -shared -fPIC {shell_path(SOURCE)} -o {shell_path(PLUGIN)}.tmp 2>&1 && "
             f"mv {shell_path(PLUGIN)}.tmp {shell_path(PLUGIN)} && printf '%s' \"$HOME\"")

    def one(host: Host) -> tuple[str, str | None, str | None]:
        transport = session.transport(host)
        session.run(host, Command(f"mkdir -p {shell_path(TUNER_DIR)}", timeout=30))
        transport.write_file_atomic(remote_path(SOURCE), source(), 0o644)
        transport.write_file_atomic(remote_path(TABLE), table_csv.encode(), 0o644)
        done = session.run(host, Command(build, timeout=120))
        if not done.ok or not done.stdout.startswith("/"):
            why = (done.stdout or done.stderr).strip().splitlines()
            return host.name, None, (why[-1] if why else f"exit {done.exit_code}")
        return host.name, done.stdout.strip(), None

    found = session.each(one)
    return Installed({name: home for name, home, _ in found if home},
                     {name: why for name, _, why in found if why})
