"""The one rule for which names hold secrets, read by serve (secret env on stdin, masked wherever shown), `recipes
show` and the support bundle's scrubber alike, so that what one hides the others hide too.

A name is cut into words (snake_case, kebab-case, dotted and camelCase alike) and is a secret's when a word names
one: HF_TOKEN, HF_TOKEN_2, OPENAI_KEY, apiKey, SECRET_KEY_BASE, MYSQL_PWD, ansible_become_pass, X-Auth-Token,
Set-Cookie (not a bare `key`); or when the name says password or secret anywhere (PGPASSWORD, CLIENTSECRET). Words only, not any
substring: TOKENIZERS_PARALLELISM, max_num_batched_tokens (a count of tokens), KEYRING_BACKEND and author are not
secrets, so their values stay readable where a stranger diagnoses the cluster; nor is a secret word next to one that
makes the name a measure of it (long_prefill_token_threshold, num_experts_per_token, returned_token_ids): masked,
a recipe's figures would be lost from every record and published recipe.

`masked_argv` is the one masking of a command line, shared by the serve record, the lock file, bench's config and
receipt, and the Arena recipe, so that what one hides the others hide too."""

from __future__ import annotations

import re
from collections.abc import Sequence

MASKED = "***"  # what stands for a secret's value in a record or a receipt

# The words of a name: runs of capitals not followed by lowercase (HTTP in HTTPProxy), capitalised or lowercase
# runs (Api, key), and digits. Separators (_ - . space) are whatever lies between.
_WORDS = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
# A word that names a secret: it ends in one of these (hftoken, apikey, mysqlpwd, sessioncookie), or is one.
# `tokens` alone is a count (max_tokens, prompt_tokens), never a secret's name; `keys`, `cookies` are secrets.
_SECRET_WORD = re.compile(r"[a-z0-9]*(?:token|keys?|pwd|cookies?|credentials?|auth|passphrase)|pass|authorization")
# Anywhere in the name, even glued to other words: PGPASSWORD, DBPASSWD, CLIENTSECRET.
_SECRET_ANYWHERE = re.compile(r"passw|secret|credential", re.IGNORECASE)
# Whole names that merely look like a secret's: the shell's working folders, and a bare `key` (a key/value pair's
# key, sparkcluster's own `key:` path to the SSH key, comm.env's "KEY=value lines" comment).
_NOT_SECRETS = frozenset({"pwd", "oldpwd", "key", "keys"})
# Words that, right after a secret word, make the name a measure of it (a threshold of tokens, token ids), and `per`
# right before one (experts per token). Not `id`: AWS_ACCESS_KEY_ID is kept as the credential it is half of.
_MEASURES = frozenset({"threshold", "thresholds", "ids", "num", "prob", "budget", "budgets", "count", "limit", "size",
                       "len", "length"})


def is_secret_name(name: str) -> bool:
    """Whether the value under `name` (an environment variable, a YAML or JSON key, a command-line flag without
    its dashes) is a secret."""
    if name.lower() in _NOT_SECRETS:
        return False
    if _SECRET_ANYWHERE.search(name):
        return True
    words = [word.lower() for word in _WORDS.findall(name)]
    return any(_SECRET_WORD.fullmatch(word) and (i + 1 == len(words) or words[i + 1] not in _MEASURES)
               and (i == 0 or words[i - 1] != "per") for i, word in enumerate(words))


def masked_argv(argv: Sequence[str]) -> tuple[str, ...]:
    """The command line with a secret flag's value masked (`--api-key KEY`, `--hf-token=T`), and a secret's value
    assigned in a word (`--set api_key=KEY`), for what anyone reading the head's files, a lock, or a published receipt
    or recipe may see. A flag without a value (`--hf-token` alone: vLLM's stored login) stays as it is."""
    out: list[str] = []
    masking_next = False
    for word in argv:
        if masking_next and not word.startswith("--"):
            out.append(MASKED)
            masking_next = False
            continue
        flag = word.startswith("--")
        name, eq, value = word.removeprefix("--").partition("=")
        secret = (is_secret_name(name) or flag and _abbreviates_secret_flag(name)) and (
            flag or (bool(eq) and not name.startswith("-")))
        inner, inner_eq, _ = value.partition("=")  # `--set=api_key=KEY`: a secret assigned inside the flag's value
        if flag and not secret and inner_eq and is_secret_name(inner):
            out.append(f"--{name}={inner}={MASKED}")
            continue
        out.append(f"{'--' if flag else ''}{name}={MASKED}" if secret and eq else word)
        masking_next = flag and secret and not eq
    return tuple(out)


# The secret flags of the programs sparkcluster starts (vLLM's), which their parsers also take abbreviated
# (`--api-k KEY`, `--hf-tok=T`): argparse's prefix matching. A prefix no longer than the first word is ambiguous there
# (`--api` is also `--api-server-count`), so it names no flag and is not one of them.
_SECRET_FLAGS = ("api-key", "hf-token")


def _abbreviates_secret_flag(name: str) -> bool:
    name = name.replace("_", "-")
    return any(full.startswith(name) and len(name) > full.index("-") + 1 for full in _SECRET_FLAGS)
