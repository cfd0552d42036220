"""Secrets known by their shape wherever they stand, named or not: a password in a URL's userinfo
(`https://alice:PASS@host/`, `git clone https://bob:PASS@github.com/...`), tokens whose prefix says what they are
(Hugging Face `hf_`, GitHub `ghp_`/`github_pat_`, OpenAI-style `sk-`, GitLab `glpat-`, Slack `xox?-`), and a bearer
token after its scheme. Each pattern starts where a word can begin and scans a bounded run: one pass, linear."""

from __future__ import annotations

import re

from .marks import SCRUBBED, Tally

URL_PASSWORD = re.compile(r"""(?<![\w+.-])(?P<keep>[A-Za-z][\w+.-]{0,31}+://[^\s:/?#@"'<>\[\]]{0,256}+:)"""
                          r"""[^\s@"'<>]{1,512}@""")
TOKEN_SHAPES = re.compile(r"""(?<![\w-])(?:(?P<hf>hf_[A-Za-z0-9]{20,}+)|(?P<github>gh[pousr]_[A-Za-z0-9]{20,}+|"""
                          r"""github_pat_\w{20,}+)|(?P<sk>sk-[\w-]{16,}+)|(?P<gitlab>glpat-[\w-]{16,}+)|"""
                          r"""(?P<slack>xox[abprs]-[\w-]{10,}+))""")
SHAPE_KINDS = {"hf": "a Hugging Face token", "github": "a GitHub token", "sk": "an API key (sk-...)",
               "gitlab": "a GitLab token", "slack": "a Slack token"}
BEARER = re.compile(r"(?i)(?<![\w-])(bearer[ \t]++)[\w.~+/=-]{8,}+")


def url_passwords(text: str, tally: Tally) -> str:
    def scrub(match: re.Match[str]) -> str:
        tally["a password in a URL"] += 1
        return f"{match['keep']}{SCRUBBED}@"
    return URL_PASSWORD.sub(scrub, text)


def token_shapes(text: str, tally: Tally) -> str:
    def scrub(match: re.Match[str]) -> str:
        tally[SHAPE_KINDS[str(match.lastgroup)]] += 1
        return SCRUBBED
    return TOKEN_SHAPES.sub(scrub, text)


def bearer_tokens(text: str, tally: Tally) -> str:
    def scrub(match: re.Match[str]) -> str:
        tally["a bearer token"] += 1
        return match[1] + SCRUBBED
    return BEARER.sub(scrub, text)
