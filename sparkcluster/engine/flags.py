"""argparse `type=` checks for the numbers and lists the commands take, so a bad flag is exit 2 with its name
before anything connects. Each raises ArgumentTypeError, which argparse prints as
`argument --FLAG: MESSAGE` and turns into exit 2.

Here in engine so that cli.py and every wing's sub-commands share them without importing cli.
"""

from __future__ import annotations

import argparse
import math
import re

# What a container image reference may hold (docker's grammar, loosely: its own check names the finer errors);
# never a leading '-', which docker would read as an option, nor a space.
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*")


def port(text: str) -> int:
    value = _int(text, "a port number")
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port: give a number from 1 to 65535")
    return value


def count(text: str) -> int:
    """At least 1: forks, streams, runs."""
    value = _int(text, "a count")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def non_negative(text: str) -> int:
    """0 or more: warm-up requests."""
    value = _int(text, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give 0 or more")
    return value


def lines(text: str) -> int:
    value = _int(text, "a number of lines")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give the number of lines to show, e.g. 100")
    return value


def seconds(text: str) -> float:
    """A timeout: finite and above zero (NaN would compare false with every deadline and never fire)."""
    value = _number(text, "a number of seconds")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} must be more than 0 seconds")
    return value


def bandwidth(text: str) -> float:
    """A threshold in GB/s: finite and not negative (NaN would pass or fail every run without a word)."""
    value = _number(text, "a bandwidth in GB/s")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative: give a bandwidth in GB/s, e.g. 20")
    return value


def names(text: str) -> str:
    """A comma-separated list of host or group names with at least one name: `--limit ''` would otherwise
    select nothing, which the commands read as no limit at all."""
    if not [name for name in text.split(",") if name.strip()]:
        raise argparse.ArgumentTypeError(f"{text!r} names no host or group: give e.g. spark-1,spark-2, "
                                         "or leave the flag out")
    return text


def image(text: str) -> str:
    if not _IMAGE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not an image name: give REPOSITORY[:TAG], e.g. vllm-node")
    return text


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what} (a whole number)") from None


def _number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}: give a finite number")
    return value
