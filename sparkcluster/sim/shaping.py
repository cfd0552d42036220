"""A cabled twin held to a rate, delayed each way, or both (`sim degrade`), and the rates and delays tc takes,
checked before anything changes."""

from __future__ import annotations

import re
from pathlib import Path

from ..engine.errors import SparkclusterError, UsageError
from . import delay as delaying
from . import netns
from .topology import HostSpec


def shape(lab: Path, host: HostSpec, netdev: str, rate: str | None, delay: str | None) -> None:
    """`host`'s `netdev` held to `rate`, delayed by `delay` each way, both, or lifted (both None): tc on both
    ends of the twin's veth; a delay by netem, or by an NFQUEUE daemon where the kernel has no netem (delay.py)."""
    delayed = delaying.stop(lab, host.netns, netdev)
    try:
        _tc(host, netdev, rate, delay)
    except SparkclusterError as e:
        if delay is not None and "kind is unknown" in e.message:
            if rate:
                _tc(host, netdev, rate, None)
            else:
                _untc(host, netdev)
            delaying.start(lab, host.netns, netdev, _seconds(delay))
        elif not (delayed and rate is None and delay is None):  # lifting a delay that took no qdisc
            raise


def _tc(host: HostSpec, netdev: str, rate: str | None, delay: str | None) -> None:
    root_lines, host_lines = netns.degrade_lines(host, netdev, rate, delay)
    netns.run_batch("tc", root_lines)
    netns.run_batch("tc", host_lines, host.netns)


def _untc(host: HostSpec, netdev: str) -> None:
    """Whatever qdisc an earlier degrade left, lifted; none is fine."""
    try:
        _tc(host, netdev, None, None)
    except SparkclusterError:
        pass


def check_degrade(rate: str | None, delay: str | None) -> None:
    """A rate and a delay tc takes, refused before anything changes."""
    if rate is not None and not tc_rate(rate):
        raise UsageError(f"invalid rate {rate!r}", "give a tc rate such as 2gbit or 500mbit")
    if delay is not None and not _tc_time(delay):
        raise UsageError(f"invalid delay {delay!r}", "give a tc time such as 2ms or 500us (not negative)")
    if delay is not None and _seconds(delay) > LONGEST_DELAY_S:
        raise UsageError(f"invalid delay {delay!r}: longer than {LONGEST_DELAY_S:g}s",
                         f"give at most {LONGEST_DELAY_S:g}s each way, e.g. 500ms")


# tc keeps a delay in a 32-bit count of its ticks (about 4295 s at most, its error then is "Illegal ... time (too
# large)"); past a minute each way nothing the simulator serves or verifies would finish anyway.
LONGEST_DELAY_S = 60.0


def tc_rate(rate: str) -> bool:
    return rate[:-4].replace(".", "").isdigit() and rate.endswith(("kbit", "mbit", "gbit"))


def _tc_time(delay: str) -> bool:
    """A netem delay: a number of us, ms or s (tc's own units), e.g. 2ms."""
    return re.fullmatch(r"\d+(?:\.\d+)?(?:us|ms|s)", delay) is not None


def _seconds(delay: str) -> float:
    number = re.fullmatch(r"[\d.]+", delay.rstrip("usm"))
    assert number is not None  # _tc_time checked it
    return float(number[0]) * {"us": 1e-6, "ms": 1e-3}.get(delay[-2:], 1.0)
