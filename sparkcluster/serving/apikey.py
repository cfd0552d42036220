"""vLLM's API key and its other secret flags. Given to vLLM as `--api-key KEY` it would be on the node's process list for every user of the
node to read; vLLM reads the same key from VLLM_API_KEY (vllm/entrypoints/serve/middleware/register.py: a
--api-key, else VLLM_API_KEY), so serve takes the flag off vLLM's line and hands the key over as that variable,
which travels on stdin as every secret of the serving env does (serving/runtime.py:NodeEnv).

The clients (serve's readiness, `status`, `bench`) send it as `Authorization: Bearer KEY`; the key guard in front of
vLLM (serving/keyguard.py) checks it on every path but /health, /metrics and /version, and answers 401 without it,
which they name as what it is.

Every other secret vLLM takes by flag goes the same way: `--hf-token T` leaves the line for HF_TOKEN (vLLM hands the
Hugging Face hub no token of its own then, and the hub reads that variable), so no secret is on a node's process list,
and the serve record, bench's config and receipt and the Arena recipe mask what is left (engine/secret_names.py's
masked_argv)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..engine.errors import UsageError
from ..engine.secret_names import MASKED, is_secret_name, masked_argv
from ..recipes.command import flag_argv, flag_words

API_KEY_ENV = "VLLM_API_KEY"
HF_TOKEN_ENV = "HF_TOKEN"
WANTS_KEY = "the endpoint wants an API key"


@dataclass(frozen=True)
class SecretFlag:
    flag: str
    env: str  # the variable that gives vLLM the same secret
    what: str  # "key", "token"
    bare_ok: bool  # the flag alone means something (`--hf-token`: the token of `hf auth login`) and stays

    @property
    def spellings(self) -> re.Pattern[str]:
        """Every spelling vLLM's parser takes: `_` for `-` (`--api_key`) and argparse's unambiguous abbreviations,
        down to the second word's first letter (`--api-k`, `--hf-t`; `--api` alone is also `--api-server-count`'s
        prefix, `--hf` `--hf-overrides`')."""
        first, _, rest = self.flag.removeprefix("--").partition("-")

        def optional(tail: str) -> str:
            return f"(?:{re.escape(tail[0])}{optional(tail[1:])})?" if tail else ""
        return re.compile(f"--{re.escape(first)}[-_]{re.escape(rest[0])}{optional(rest[1:])}")

    @property
    def fix(self) -> str:
        return (f"give one {self.what} of visible characters: `-- {self.flag} {self.what.upper()}`, or serve_env: "
                f"{{{self.env}: {self.what.upper()}}} in the inventory (off this machine's process list too)")


# vLLM's flags that carry a secret: VLLM_API_KEY (vllm/entrypoints/serve/middleware/register.py: a --api-key, else
# VLLM_API_KEY), HF_TOKEN (vllm/config/model.py passes hf_token None to the hub, which then reads HF_TOKEN).
API_KEY_FLAG = SecretFlag("--api-key", API_KEY_ENV, "key", bare_ok=False)
SECRET_FLAGS = (API_KEY_FLAG, SecretFlag("--hf-token", HF_TOKEN_ENV, "token", bare_ok=True))
# Where a client (`status`, `bench`) finds the key; serve itself gives vLLM the one it was given.
CLIENT_WHERE = ("in this machine's environment (`export VLLM_API_KEY=KEY`) or as serve_env: {VLLM_API_KEY: KEY} "
                "in the inventory")


def is_api_key_flag(flag: str) -> bool:
    return API_KEY_FLAG.spellings.fullmatch(flag) is not None


def take_secret(flags: Sequence[str], secret: SecretFlag) -> tuple[tuple[str, ...], str | None]:
    """(vLLM's flags without `secret`'s flag, the value it gave; None where none, or where the flag stands alone and
    may: then it stays). The last one given wins, as in vLLM. Raises UsageError (before anything connects) for a
    flag without exactly one usable value."""
    parsed = flag_words(list(flags), "the vLLM flags")
    given = [(flag, value) for flag, value in parsed.items() if secret.spellings.fullmatch(flag)]
    if not given or (given[-1][1] is None and secret.bare_ok):
        return tuple(flags), None
    flag, value = given[-1]
    if isinstance(value, tuple):
        raise UsageError(f"{flag} gives {len(value)} {secret.what}s: serve hands vLLM one, as {secret.env}",
                         secret.fix)
    # One line of visible characters: a header value and an environment line (stdin) carry nothing else.
    if not value or not value.isprintable() or value != value.strip():
        raise UsageError(f"{flag} needs a {secret.what} of visible characters, not "
                         f"{'nothing' if not value else 'that'}", secret.fix)
    return flag_argv({f: v for f, v in parsed.items() if not secret.spellings.fullmatch(f)}), value


def take_api_key(flags: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """(vLLM's flags without its API key flag, the key it gave; None where none)."""
    return take_secret(flags, API_KEY_FLAG)


def key_to_env(flags: Sequence[str], env: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """vLLM's flags and env as serve hands them over: each secret a flag gives (the API key, the Hugging Face token)
    moved from the flags into the env under the variable vLLM reads instead (where it wins over the env's own, as
    the flag wins in vLLM)."""
    rest, moved = tuple(flags), dict(env)
    for secret in SECRET_FLAGS:
        rest, value = take_secret(rest, secret)
        if value is not None:
            moved[secret.env] = value
    return rest, moved


def figure_inputs(flags: Sequence[str]) -> tuple[str, ...]:
    """vLLM's flags as what its figures depend on, to record and compare (`bench --layouts`' state): without the
    secrets serve moves to the env (a rotated key measures the same), any other secret flag's value masked."""
    return masked_argv(key_to_env(flags, {})[0])


def figure_set(key: str, value: str) -> tuple[str, str]:
    """A recipe's `--set KEY=VALUE` as a figure input: a secret's value (`--set api_key=KEY`) masked."""
    return key, MASKED if is_secret_name(key) else value


def environment_key() -> str | None:
    """This machine's VLLM_API_KEY (where a client finds the key without an inventory); None where unset."""
    return os.environ.get(API_KEY_ENV) or None


def bearer(api_key: str | None) -> dict[str, str]:
    """The header that carries the key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def unauthorized(url: str, sent: bool, where: str = CLIENT_WHERE) -> tuple[str, str]:
    """(message, fix) for a 401 from `url`: no key was sent, or the one sent is not the server's; `where` says
    where the client takes its key from."""
    if not sent:
        return f"{url} answered 401: {WANTS_KEY}, and none was sent", f"give it {where}"
    return (f"{url} answered 401: {WANTS_KEY}, and the key sent ({API_KEY_ENV}) does not match it",
            f"give the key the server was started with, {where}")


def request_error(status: int, text: str, sent: bool) -> str:
    """One request's error, as bench records it per request: a 401 named, anything else as the server said."""
    if status == 401:
        return f"HTTP 401: {WANTS_KEY}" + (f" ({API_KEY_ENV} does not match it)" if sent else
                                           f" (none was sent: export {API_KEY_ENV}=KEY)")
    return f"HTTP {status}: {text}"
