"""What only `serve` knows of what it started, kept in its record for bench's receipts: the head's `vllm serve`
command line exactly as launched, and the recipe and its mods by content (a recipe edited, or a mod changed,
under the same name is a different engine)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..engine.secret_names import masked_argv
from ..recipes.types import Recipe
from .launch import Launcher, Node, ServeArgs, vllm_serve_argv
from .layout import Placement
from .record import Launched
from .router import replica_nodes


def file_sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    except OSError:
        return None


def tree_sha256(folder: Path) -> str | None:
    """A mod's folder by content: each file's path inside it and its bytes, in sorted order."""
    digest = hashlib.sha256()
    try:
        for f in sorted(p for p in folder.rglob("*") if p.is_file()):
            digest.update(f.relative_to(folder).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(f.read_bytes()).digest())
    except OSError:
        return None
    return digest.hexdigest()


def launched(args: ServeArgs, launcher: Launcher, nodes: Mapping[str, Node], head: str,
             placements: Sequence[Placement], recipe: Recipe) -> Launched:
    """The head's (or replica 0's head's) `vllm serve` argv as the launcher runs it, and the recipe's source with the
    sha256 of its file (a bundled recipe's as loaded) and of each mod's folder (None where the source is no file of
    this machine)."""
    if placements:
        first = placements[0]
        members = replica_nodes(nodes, first)
        argv = vllm_serve_argv(ServeArgs(args.model, args.tp, args.pp, first.port, args.served_name, args.flags,
                                         args.env), "native", members[first.head], len(members))
    else:
        argv = vllm_serve_argv(args, launcher, nodes[head], len(nodes))
    source = recipe.source or None
    digest = recipe.sha256 or (file_sha256(Path(source)) if source else None)
    return Launched(masked_argv(argv), source, digest,
                    tuple((m.name, tree_sha256(m.path)) for m in recipe.mods))
