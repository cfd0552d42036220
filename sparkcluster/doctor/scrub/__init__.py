"""What keeps secrets out of a support bundle: the values the inventory and the sudo prompt hold, any value of a
variable named like a secret, Hugging Face tokens, bearer tokens and private keys, wherever they appear. Each
replacement is counted by kind, never shown, so the manifest can say what was scrubbed."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

SCRUBBED = "[scrubbed]"
# A name that holds a secret: HF_TOKEN, HUGGING_FACE_HUB_TOKEN, API_KEY, ansible_become_pass, DB_PASSWORD...
# (not max_num_batched_tokens: the secret word must end the name).
SECRET_NAME = re.compile(r"(?i)(?:^|[_.-])(?:token|secret|password|passwd|pass|passphrase|api[_-]?key|access[_-]?key|"
                         r"secret[_-]?key|private[_-]?key|credentials?|auth)$")
# NAME=value, NAME: value, "NAME": "value", export NAME='a value with spaces'
ASSIGNMENT = re.compile(r"""(?P<pre>(?P<q1>["']?)(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=q1)\s*[:=]\s*)"""
                        r"""(?:"(?P<dq>[^"\n]*)"|'(?P<sq>[^'\n]*)'|(?P<bare>[^\s"',}]+))""")
HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{20,}\b")
BEARER = re.compile(r"(?i)(\bbearer\s+)[A-Za-z0-9._~+/=-]{8,}")
PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?-----END [A-Z0-9 ]*PRIVATE KEY-----", re.S)


def secrets_in(values: Mapping[str, Any]) -> list[str]:
    """Every string held under a secret-like name, however deep (serve_env: {HF_TOKEN: ...})."""
    found: list[str] = []
    for key, value in values.items():
        if isinstance(value, Mapping):
            found += secrets_in(value)
        elif isinstance(value, str) and SECRET_NAME.search(str(key)):
            found.append(value)
    return found


class Scrubber:
    def __init__(self, known: Iterable[str]) -> None:
        # Longest first, so a secret that contains another is replaced whole; very short values would scrub
        # ordinary words, and are caught by their name where they are assigned.
        self.known = sorted({k for k in known if len(k) >= 4}, key=len, reverse=True)

    def scrub(self, text: str) -> tuple[str, Counter[str]]:
        """The text with every secret replaced, and how many of each kind were."""
        counts: Counter[str] = Counter()

        def count(kind: str) -> str:
            counts[kind] += 1
            return SCRUBBED

        text = PRIVATE_KEY.sub(lambda m: count("private key"), text)
        for value in self.known:
            if value in text:
                counts["a secret from the inventory or the sudo prompt"] += text.count(value)
                text = text.replace(value, SCRUBBED)

        def assignment(m: re.Match[str]) -> str:
            value = m["dq"] if m["dq"] is not None else m["sq"] if m["sq"] is not None else m["bare"]
            if not SECRET_NAME.search(m["name"]) or value in ("", SCRUBBED):
                return m[0]
            counts[f"the value of {m['name']}"] += 1
            quote = '"' if m["dq"] is not None else "'" if m["sq"] is not None else ""
            return f"{m['pre']}{quote}{SCRUBBED}{quote}"

        text = ASSIGNMENT.sub(assignment, text)
        text = HF_TOKEN.sub(lambda m: count("a Hugging Face token"), text)
        text = BEARER.sub(lambda m: m[1] + count("a bearer token"), text)
        return text, counts
