"""What keeps secrets out of what others may read (the support bundle, a bench receipt): the values the inventory
and the sudo prompt hold (every value under a secret name, whatever its shape), any value text assigns to a secret
name (serve's own rule for names), secrets known by their shape (private keys, URL passwords, tokens), wherever they
appear. Each replacement is counted by kind, never shown, so the manifest can say what was scrubbed. Every pass is
linear in its text, and each item is capped in bytes before it is scrubbed, so what a node prints cannot make the
bundle hang. In engine (it knows no wing) so that doctor and bench share one scrubber."""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..secret_names import is_secret_name
from .blocks import private_keys, putty_keys
from .marks import SCRUBBED, Tally
from .shapes import bearer_tokens, token_shapes, url_passwords
from .values import assignments, flag_values

__all__ = ["ITEM_CAP_BYTES", "SCRUBBED", "Scrubber", "capped", "secrets_in"]

# An item's text beyond this is cut (its first part kept: a cut end leaves a key or a quote open, which the passes
# scrub to the end, where a cut start would orphan the rest of a value). Log tails are 200 to 2,000 lines.
ITEM_CAP_BYTES = 4 * 2**20
MULTI_LINE_PART = 8  # a line of a multi-line secret is looked for alone from this length (shorter: common words)
SHORTEST_KNOWN = 4  # shorter values would scrub ordinary words; they are caught by their name where assigned


def secrets_in(values: Any, secret: bool = False) -> list[str]:
    """Every scalar held under a secret-like name, however deep and whatever its shape (serve_env: {HF_TOKEN: ...},
    passwords: [...], a multi-line string, !!binary bytes), as text would show it."""
    found: list[str] = []
    if isinstance(values, Mapping):
        for key, value in values.items():
            found += secrets_in(value, secret or is_secret_name(str(key)))
    elif isinstance(values, list | tuple | set | frozenset):
        for value in values:
            found += secrets_in(value, secret)
    elif secret and isinstance(values, bytes):
        found += [base64.b64encode(values).decode(), values.decode(errors="ignore")]
    elif secret and isinstance(values, str | int | float) and not isinstance(values, bool):
        text = str(values)
        found.append(text)
        if "\n" in text.strip():  # a literal block: each line may be quoted alone (a key's base64 lines)
            found += [line.strip() for line in text.splitlines() if len(line.strip()) >= MULTI_LINE_PART]
        elif text != text.strip():
            found.append(text.strip())  # a folded block's value ends in a newline the text does not show
    return found


def capped(text: str, limit: int = ITEM_CAP_BYTES) -> tuple[str, int]:
    """`text` cut to `limit` bytes at a line's end, and how many bytes were cut (0: none)."""
    data = text.encode()
    if len(data) <= limit:
        return text, 0
    kept = data[:limit].decode(errors="ignore")
    kept = kept[:kept.rfind("\n") + 1] or kept
    cut = len(data) - len(kept.encode())
    return f"{kept}[... {cut} bytes cut: each item of the bundle is capped at {limit} bytes]\n", cut


class Scrubber:
    def __init__(self, known: Iterable[str]) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self.known = sorted({k for k in known if len(k) >= SHORTEST_KNOWN}, key=len, reverse=True)

    def _known(self, text: str, tally: Tally) -> str:
        for value in self.known:
            if value in text:
                tally["a secret from the inventory or the sudo prompt"] += text.count(value)
                text = text.replace(value, SCRUBBED)
        return text

    def scrub(self, text: str) -> tuple[str, Counter[str]]:
        """The text with every secret replaced, and how many of each kind were. Blocks first (a key's body holds
        nothing else to find), then the known values (counted as such, not again by their name), then by shape."""
        tally: Tally = Counter()
        passes: tuple[Callable[[str, Tally], str], ...] = (
            private_keys, putty_keys, self._known, url_passwords, flag_values, assignments, token_shapes, bearer_tokens)
        for scrub in passes:
            text = scrub(text, tally)
        return text, tally
