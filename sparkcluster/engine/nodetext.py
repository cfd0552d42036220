"""Text a node wrote (nvidia-smi's output, versions, interface names, kernel messages), made safe to print.

A node's output reaches this machine's terminal inside our own lines: an escape sequence in it would clear the
screen, recolour what follows or set the window's title (`ESC]0;title BEL ESC[2J590.48.01` from a wrapped
nvidia-smi), and a newline would forge a line of our report. ECMA-48's escape sequences are removed whole, so
what was printed around them reads as it would on a screen (`590.48.01`); any other control character goes.
"""

from __future__ import annotations

import re

# ECMA-48: CSI sequences (colours, cursor, clearing), the string controls (OSC, DCS, SOS, PM, APC: a title, a
# hyperlink) up to their terminator (BEL or ST), or to the end where a node left one open, and the short escapes
# (ESC and one to three bytes); each in its 7-bit (ESC ...) and 8-bit (C1 byte) form.
_ESCAPE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c|$)"
    r"|\x1b[ -/]*[0-~]?"
)
_SPACE_LIKE = str.maketrans("\t\n\r\v\f", "     ")


def without_escapes(text: str) -> str:
    """`text` without its terminal escape sequences, nothing else changed: for a reader of a node's log (NCCL's lines
    behind Ray's coloured prefixes) that needs its columns as printed but not the colours splitting them."""
    if "\x1b" not in text and text.isascii():
        return text  # most lines of a long log: two scans in C instead of the pattern tried at every character
    return _ESCAPE.sub("", text)


def printable(text: str) -> str:
    """`text` without terminal escape sequences or control characters (tabs and line breaks become spaces: one
    node's value stays on its line)."""
    text = without_escapes(text).translate(_SPACE_LIKE)
    return text if text.isprintable() else "".join(c for c in text if c.isprintable())


def as_markup(text: str) -> str:
    """`text` printable, inside a line of rich markup: its brackets are text too (`[red]` in a name stays `[red]`)."""
    from rich.markup import escape

    return escape(printable(text))
