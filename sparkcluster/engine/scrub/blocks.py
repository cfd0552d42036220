"""Private keys written as blocks of lines: PEM and OpenSSH (`-----BEGIN ... PRIVATE KEY-----`), PGP (`... PRIVATE
KEY BLOCK-----`) and PuTTY's `Private-Lines: N`. A block runs to its END line, or to the end of the text when a `tail`
or `head` cut its END off; an END whose BEGIN was cut off ends a key that began where the text (or the last key)
did. Each search starts where the last one stopped and a block without an END takes the rest of the text, so the
whole is one pass however many BEGIN lines lack an END (the lazy `.*?` this replaces rescanned the text for each)."""

from __future__ import annotations

import re

from .marks import SCRUBBED, Tally

_LABEL = r"(?:[A-Z0-9]{1,16} ){0,4}PRIVATE KEY(?: BLOCK)?-----"
KEY_MARK = re.compile(rf"-----(BEGIN|END) {_LABEL}")
KEY_END = re.compile(rf"-----END {_LABEL}")
PUTTY_PRIVATE_LINES = re.compile(r"^Private-Lines:[ \t]*+([0-9]{1,5})[ \t]*+\r?$", re.MULTILINE)


def private_keys(text: str, tally: Tally) -> str:
    out: list[str] = []
    pos = 0
    while (mark := KEY_MARK.search(text, pos)) is not None:
        if mark[1] == "BEGIN":
            end = KEY_END.search(text, mark.end())
            out.append(text[pos:mark.start()])
            pos = end.end() if end is not None else len(text)
        else:
            pos = mark.end()
        out.append(SCRUBBED)
        tally["private key"] += 1
    out.append(text[pos:])
    return "".join(out)


def putty_keys(text: str, tally: Tally) -> str:
    """The N lines after `Private-Lines: N` (all that are left, where fewer are); the public lines stay."""
    out: list[str] = []
    pos = 0
    while (header := PUTTY_PRIVATE_LINES.search(text, pos)) is not None:
        start = end = header.end()
        for _ in range(int(header[1])):
            if end >= len(text):
                break
            newline = text.find("\n", end + 1)
            end = len(text) if newline < 0 else newline
        out += [text[pos:start], "\n" + SCRUBBED if end > start else ""]
        tally["a PuTTY private key"] += end > start
        pos = end
    out.append(text[pos:])
    return "".join(out)
