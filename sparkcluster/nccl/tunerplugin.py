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
SOURCE = f"{TUNER_DIR}/sizes_tuner.c"
HOME_MARK = "SPARKCLUSTER_HOME="
NO_COMPILER = 3  # the build's exit code where the node has no cc


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


def install(session: Session, table_path: str, table_csv: str) -> Installed:
    """The source and the table written on every node, the plugin built there (into a temporary name, then moved:
    a serve starting meanwhile never loads half a library); each node's home, or why it could not. The table's
    name is its content's (SizeTable.digest): writing it never changes a table a comm env already points at."""
    build = (f"command -v cc >/dev/null 2>&1 || {{ echo 'no C compiler (cc)' >&2; exit {NO_COMPILER}; }}; "
             f"cc -O2 -shared -fPIC {shell_path(SOURCE)} -o {shell_path(PLUGIN)}.tmp >&2 && "
             f"mv {shell_path(PLUGIN)}.tmp {shell_path(PLUGIN)} && printf '{HOME_MARK}%s\\n' \"$HOME\"")

    def one(host: Host) -> tuple[str, str | None, str | None]:
        transport = session.transport(host)
        try:
            made = session.run(host, Command(f"mkdir -p {shell_path(TUNER_DIR)}", timeout=30))
            if not made.ok:
                return host.name, None, f"cannot make {TUNER_DIR}: {made.stderr_tail(1) or made.exit_code}"
            transport.write_file_atomic(remote_path(SOURCE), source(), 0o644)
            transport.write_file_atomic(remote_path(table_path), table_csv.encode(), 0o644)
        except OSError as e:
            return host.name, None, f"cannot write {TUNER_DIR}: {e}"
        done = session.run(host, Command(build, timeout=120))
        home = next((l[len(HOME_MARK):] for l in done.stdout.splitlines() if l.startswith(HOME_MARK)), "")
        if done.ok and home.startswith("/"):
            return host.name, home, None
        if done.exit_code == NO_COMPILER:
            return host.name, None, "no C compiler (cc): install one, e.g. `apt install gcc`"
        return host.name, None, f"the plugin did not build: {done.stderr_tail(1) or f'exit {done.exit_code}'}"

    found = session.each(one)
    return Installed({name: home for name, home, _ in found if home},
                     {name: why for name, _, why in found if why})


def remove_line() -> str:
    """Shell removing the plugin's folder (verify --reset: nothing of the tuning stays on the node)."""
    return f"rm -rf {shell_path(TUNER_DIR)}"


def container_mount(env_file: str) -> str:
    """Shell giving ` -v DIR:DIR:ro` where the node's comm env (`env_file`, a shell word) names the tuner plugin,
    and nothing otherwise (so an untuned node's `docker run` runs exactly as it did): the paths there are the
    node's own, absolute, and the container sees them at the same place."""
    folder = shell_path(TUNER_DIR)
    return f"$(grep -qs '^NCCL_TUNER_PLUGIN=' {env_file} && printf ' -v %s:%s:ro' {folder} {folder})"
