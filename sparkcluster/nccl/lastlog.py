"""Each node keeps the verify probe's own output (NCCL_DEBUG=INFO lines on GPUs, the connections on CPU), pass or
fail, beside the last verdict: `doctor --bundle` collects it, and `nccl-report` reads it there."""

from __future__ import annotations

from ..engine.command import Command, shell_path
from ..engine.transport import Transport, Unreachable

LAST_VERIFY_LOG = "~/.config/sparkcluster/last-verify.log"
KEEP_BYTES = 4_000_000  # the newest runs (a verify makes one per twin): enough for every rank's init and channels


def keep_log(transport: Transport, output: str) -> None:
    """Append one run's output under a dated header, keeping the file's last KEEP_BYTES. Best effort: a node that
    cannot take it keeps what it had; the verdict does not depend on it."""
    path = shell_path(LAST_VERIFY_LOG)
    script = (f"mkdir -p {shell_path(LAST_VERIFY_LOG.rsplit('/', 1)[0])} && "
              f"{{ printf '\\n# sparkcluster verify: the probe of %s\\n' \"$(date -u +%FT%TZ)\"; cat; }} >> {path} && "
              f"tail -c {KEEP_BYTES} {path} > {path}.tmp && mv {path}.tmp {path}")
    try:
        transport.run(Command(script, stdin=output[-KEEP_BYTES:], timeout=30))
    except Unreachable:
        pass
