"""vLLM's API key. Given to vLLM as `--api-key KEY` it would be on the node's process list for every user of the
node to read; vLLM reads the same key from VLLM_API_KEY (vllm/entrypoints/serve/middleware/register.py: a
--api-key, else VLLM_API_KEY), so serve takes the flag off vLLM's line and hands the key over as that variable,
which travels on stdin as every secret of the serving env does (serving/runtime.py:NodeEnv).

The clients (serve's readiness, `status`, `bench`) send it as `Authorization: Bearer KEY`; vLLM guards /v1 with
it (not /health, /metrics nor /version), and answers 401 without it, which they name as what it is."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from ..engine.errors import UsageError
from ..recipes.command import flag_argv, flag_words

API_KEY_ENV = "VLLM_API_KEY"
WANTS_KEY = "the endpoint wants an API key"
# Every spelling vLLM's parser takes for the flag: `--api_key` (its parser reads `_` as `-`) and argparse's
# unambiguous abbreviations (`--api-k`, `--api-ke`; `--api` alone is also `--api-server-count`'s prefix).
_FLAG = re.compile(r"--api[-_]k(?:e(?:y)?)?")
_KEY_FIX = ("give one key of visible characters: `-- --api-key KEY`, or serve_env: {VLLM_API_KEY: KEY} in the "
            "inventory (off this machine's process list too)")
# Where a client (`status`, `bench`) finds the key; serve itself gives vLLM the one it was given.
CLIENT_WHERE = ("in this machine's environment (`export VLLM_API_KEY=KEY`) or as serve_env: {VLLM_API_KEY: KEY} "
                "in the inventory")


def is_api_key_flag(flag: str) -> bool:
    return _FLAG.fullmatch(flag) is not None


def take_api_key(flags: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """(vLLM's flags without its API key flag, the key it gave; None where none). The last one given wins, as in
    vLLM. Raises UsageError (before anything connects) for a flag without exactly one usable key."""
    parsed = flag_words(list(flags), "the vLLM flags")
    given = [(flag, value) for flag, value in parsed.items() if is_api_key_flag(flag)]
    if not given:
        return tuple(flags), None
    flag, value = given[-1]
    if isinstance(value, tuple):
        raise UsageError(f"{flag} gives {len(value)} keys: serve hands vLLM one, as {API_KEY_ENV}", _KEY_FIX)
    # One line of visible characters: a header value and an environment line (stdin) carry nothing else.
    if not value or not value.isprintable() or value != value.strip():
        raise UsageError(f"{flag} needs a key of visible characters, not {'nothing' if not value else 'that'}",
                         _KEY_FIX)
    return flag_argv({f: v for f, v in parsed.items() if not is_api_key_flag(f)}), value


def key_to_env(flags: Sequence[str], env: Mapping[str, str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """vLLM's flags and env as serve hands them over: the API key, if a flag gives one, moved from the flags into the
    env as VLLM_API_KEY (where it wins over the env's own, as --api-key wins in vLLM)."""
    rest, api_key = take_api_key(flags)
    return rest, {**env, **({API_KEY_ENV: api_key} if api_key else {})}


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
