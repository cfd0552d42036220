"""argparse `type=` checks for the numbers and lists the commands take, so a bad flag is exit 2 with its name
before anything connects. Each raises ArgumentTypeError, which argparse prints as
`argument --FLAG: MESSAGE` and turns into exit 2.

Here in engine so that cli.py and every wing's sub-commands share them without importing cli.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing: every command's parser imports this module
if TYPE_CHECKING:
    from typing import TypeVar

    N = TypeVar("N", int, float)

DEFAULT_FORKS = 16  # --forks: hosts worked on at once

# What a container image reference may hold (docker's grammar, loosely: its own check names the finer errors);
# never a leading '-', which docker would read as an option, nor a space.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")


def _bounded(parse: Callable[[str, str], N], what: str, within: Callable[[N], bool],
             problem: str) -> Callable[[str], N]:
    """A flag's check: `parse` the text as `what`, then refuse a value outside the bound with `problem` (its
    {text} is the flag's text)."""
    def check(text: str) -> N:
        value = parse(text, what)
        if not within(value):
            raise argparse.ArgumentTypeError(problem.format(text=text))
        return value
    return check


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what} (a whole number)") from None


def _number(text: str, what: str) -> float:
    # Finite only: NaN would compare false with every deadline and never fire, and pass or fail every run
    # without a word as a threshold.
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give a finite number")
    return value


port = _bounded(_int, "a port number", lambda v: 1 <= v <= 65535, "{text} is not a TCP port: give a number from 1 to 65535")
count = _bounded(_int, "a count", lambda v: v >= 1, "{text} must be at least 1")  # forks, streams, runs
non_negative = _bounded(_int, "a whole number", lambda v: v >= 0, "{text} is negative: give 0 or more")  # warm-up
lines = _bounded(_int, "a number of lines", lambda v: v >= 0,
                 "{text} is negative: give the number of lines to show, e.g. 100")
seconds = _bounded(_number, "a number of seconds", lambda v: v > 0, "{text} must be more than 0 seconds")  # timeouts
bandwidth = _bounded(_number, "a bandwidth in GB/s", lambda v: v >= 0,
                     "{text} is negative: give a bandwidth in GB/s, e.g. 20")  # thresholds


def names(text: str) -> str:
    """A comma-separated list of host or group names with at least one name: `--limit ''` would otherwise
    select nothing, which the commands read as no limit at all."""
    if not [name for name in text.split(",") if name.strip()]:
        raise argparse.ArgumentTypeError(f"{text!r} names no host or group: give e.g. spark-1,spark-2, "
                                         "or leave the flag out")
    return text


def is_image(text: str) -> bool:
    """REPOSITORY[:TAG]: one word, never an option (`-v/:/host`) of the `docker run` it reaches."""
    return _IMAGE.fullmatch(text) is not None


def image(text: str) -> str:
    if not is_image(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an image name: give REPOSITORY[:TAG], e.g. vllm-node")
    return text


def webhook_url(text: str) -> str:
    """http(s)://HOST[:PORT]/PATH, with no user:password (it would be in the unit's files and the supervisor's log):
    a webhook carries its secret in its path, as chat services' do."""
    from urllib.parse import urlsplit

    parts = urlsplit(text)
    try:
        parts.port
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: the port is not a number") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL: give http(s)://HOST[:PORT]/PATH")
    if parts.username is not None:
        raise argparse.ArgumentTypeError(f"{text!r}: a user or password in the URL is refused; give the webhook's "
                                         "own URL (its secret in the path)")
    return text
