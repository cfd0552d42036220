"""Room on a node for a copy: free bytes where the blobs land, and the error that names the node and the sizes
(a disk that fills midway would otherwise read as a failed link between two nodes)."""

from __future__ import annotations

from ..engine.command import Command
from ..engine.transport import Transport, Unreachable


def free_bytes(transport: Transport, path: str) -> int | None:
    """Free bytes on the filesystem holding `path`; None where it cannot be told (the copy itself then names it)."""
    try:
        result = transport.run(Command.argv(["df", "-Pk", "--", path], timeout=30))
    except Unreachable:
        return None
    fields = result.stdout.strip().splitlines()[-1].split() if result.ok and result.stdout.strip() else []
    return int(fields[3]) * 1024 if len(fields) > 3 and fields[3].isdigit() else None


def no_space(node: str, model: str, model_dir: str, needed: int, free: int | None) -> tuple[str, str]:
    """(message, fix) for a copy that does not fit on `node`."""
    has = f", has {size_text(free)}" if free is not None else ""
    return (f"no space left on {node} (needs {size_text(needed)}{has}) for {model}",
            f"free space on {node} under {model_dir} (or point HF_HOME there at a larger disk), then stage again: "
            "what arrived is kept")


def size_text(n: int) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"
