"""What a failed blob copy between two nodes is blamed on, decided from what the copy said (pure functions, so
tests hand them results as data): the source's own copy when a blob arrives twice with the same wrong hash,
the fabric link (named, with its state on both ends) when the stream broke off or went silent."""

from __future__ import annotations

import re
from collections.abc import Sequence

from ..node.linkstate import LinkState, any_down, describe
from .blobwire import EXIT_CONNECTION, EXIT_CORRUPT, EXIT_STALLED

BROKEN_LINK_EXITS = (EXIT_CONNECTION, EXIT_STALLED)
_CORRUPT_HASH = re.compile(r"arrived corrupt \(its hash is ([0-9a-f]+)")
_WRONG_SIZE = re.compile(r"holds \S+ as .*, not \d+ bytes")


def corrupt_source(up: str, path: str, model: str, attempts: Sequence[tuple[int, str]]) -> tuple[str, str] | None:
    """`attempts`: (exit code, stderr) of each try. Two corrupt arrivals with one and the same wrong hash (or a
    sender that holds the blob at another size) mean the sender's file is wrong, not the bytes in flight, which
    would differ from try to try. None when that is not what happened."""
    if len(attempts) < 2 or any(code != EXIT_CORRUPT for code, _ in attempts):
        return None
    hashes = {m[1] for _, stderr in attempts if (m := _CORRUPT_HASH.search(stderr))}
    wrong_size = all(_WRONG_SIZE.search(stderr) for _, stderr in attempts)
    if not wrong_size and (len(hashes) != 1 or not all(_CORRUPT_HASH.search(stderr) for _, stderr in attempts)):
        return None
    what = "at a size other than the manifest's" if wrong_size else f"twice with the same wrong hash ({hashes.pop()[:16]}...)"
    return (f"{path} arrived from {up} {what}: {up}'s copy of it is corrupt (not the link)",
            f"check the copies with `sparkcluster stage {model} --status --verify full`; "
            f"`sparkcluster stage {model} --verify full` repairs them from an intact copy")


def broken_link(up: str, name: str, path: str, model: str, addresses: tuple[str, str], detail: str,
                links: tuple[Sequence[LinkState] | None, Sequence[LinkState] | None]) -> tuple[str, str]:
    """The stream from `up` (at addresses[0]) to `name` (addresses[1]) broke off or went silent: name both
    ends' QSFP links, the down ones first, and say that the partial copy waits for a re-run."""
    up_links, name_links = links
    down = [node for node, node_links, address in ((name, name_links, addresses[1]), (up, up_links, addresses[0]))
            if any_down(node_links, address)]
    state = "; ".join([describe(name, name_links, addresses[1]), describe(up, up_links, addresses[0])])
    cause = f"the fabric link between {name} and {up} is down on {' and '.join(down)}" if down else \
        f"the fabric link between {name} ({addresses[1]}) and {up} ({addresses[0]}) failed"
    message = f"copy of {path} from {up} stopped: {detail} ({cause}; {state}); the partial copy is kept"
    fix = (f"bring the link back (`ip -br link` on {name} and {up}; check the QSFP cable between them), then run "
           f"`sparkcluster stage {model}` again: it resumes where this stopped")
    if not down:
        fix += "; if the links are up, check for a firewall between the fabric addresses, or stage with --transport ssh"
    return message, fix


def source_gone(name: str, gone: Sequence[str], up: str | None, model: str) -> tuple[str, str]:
    """`name` cannot copy on: the nodes before it in the chain that feed it (`gone`, nearest last) went away, and
    the nearest one left (`up`, None where none is) shares no subnet with it. The cables are not to blame."""
    source = gone[-1] if gone else "the node before it"
    why = (f"and {up}, the nearest node before it that is left, shares no subnet with {name} (no cable joins them)"
           if up is not None else "and no node before it in the chain is left to copy from")
    return (f"{source}, the chain's source for {name}, went away, {why}; {name} was not staged (its partial copy "
            "is kept)",
            f"bring {' and '.join(gone) or 'the source'} back (check that {'it is' if len(gone) < 2 else 'they are'} "
            f"powered on and reachable), then run `sparkcluster stage {model}` again: it resumes where this stopped")
