"""The GPU clock cap the field found stopping GB10's hard power-offs (`nvidia-smi -lgc 0,2000`: about 10 C cooler at
no speed loss, MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146), kept across reboots: a oneshot systemd unit
re-applies it at every boot, since a lock lives only until the GPU is reset.

NVML sets a locked range but has no getter for it, and `nvidia-smi -q -d CLOCK` prints the current and the maximum
clocks, not the lock. So what proves the cap in force this boot is two readings together: the unit's own mark in
/run (a tmpfs, empty after every boot, written only once `nvidia-smi -lgc` succeeded) naming the cap, and the
current graphics clock at or under it (a locked GPU never runs above its lock; one found above it was reset, by
`nvidia-smi -rgc` or a driver reload, whatever the mark says)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

UNIT_NAME = "sparkcluster-gpu-clock.service"
UNIT_PATH = f"/etc/systemd/system/{UNIT_NAME}"
WANTS_LINK = f"/etc/systemd/system/multi-user.target.wants/{UNIT_NAME}"  # what `systemctl enable` makes
MARK_DIR = "/run/sparkcluster"
MARK_PATH = f"{MARK_DIR}/gpu-clock-cap"
MIN_CAP_MHZ = 300  # below this a GB10 crawls; a typo (200 for 2000) more likely than a wish
MAX_CAP_MHZ = 5000
SOURCE = "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#146"
CLOCK_QUERY = "nvidia-smi -q -d CLOCK"


@dataclass(frozen=True)
class Clocks:
    """What `nvidia-smi -q -d CLOCK` says of the graphics clock, in MHz; None where it prints N/A."""

    graphics: int | None  # now
    max_graphics: int | None  # the most this GPU runs at


def parse_clock_report(text: str) -> Clocks:
    """The `Clocks` and `Max Clocks` sections' Graphics lines of `nvidia-smi -q -d CLOCK` (other sections, such as
    `Applications Clocks`, also hold a Graphics line: only these two are read)."""
    section = ""
    found: dict[str, int | None] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        key, sep, value = line.strip().partition(":")
        if indent == 4 and not value.strip():
            section = key.strip()
        elif indent >= 8 and sep and key.strip() == "Graphics" and section in ("Clocks", "Max Clocks"):
            match = re.fullmatch(r"(\d+) MHz", value.strip())
            found.setdefault(section, int(match.group(1)) if match else None)
    return Clocks(found.get("Clocks"), found.get("Max Clocks"))


def lock_value(cap_mhz: int) -> str:
    """`-lgc`'s argument: no floor (the GPU still idles down), the cap as the ceiling."""
    return f"0,{cap_mhz}"


def apply_line(cap_mhz: int) -> str:
    """Locks the clock, then marks it done for this boot (the mark's folder is on /run: gone at the next boot). No `$`
    and no `%`: systemd would expand them in ExecStart."""
    return f"nvidia-smi -lgc {lock_value(cap_mhz)} && mkdir -p {MARK_DIR} && echo {lock_value(cap_mhz)} > {MARK_PATH}"


def unit_text(cap_mhz: int) -> str:
    """The oneshot unit that re-applies the cap at boot, once the driver is loaded."""
    return (f"# Written by sparkcluster bootstrap (--gpu-clock-cap {cap_mhz}): caps the GPU clock at {cap_mhz} MHz at "
            "every boot.\n"
            f"# Why: GB10 hard power-offs under sustained load stopped with this cap ({SOURCE}).\n"
            f"# To lift it: sudo systemctl disable --now {UNIT_NAME}; sudo rm {UNIT_PATH}; sudo nvidia-smi -rgc\n"
            "[Unit]\n"
            f"Description=Cap the GPU clock at {cap_mhz} MHz (sparkcluster)\n"
            "After=nvidia-persistenced.service systemd-modules-load.service\n"
            "\n"
            "[Service]\n"
            "Type=oneshot\n"
            "RemainAfterExit=yes\n"
            f"ExecStart=/bin/sh -c {shlex.quote(apply_line(cap_mhz))}\n"
            "\n"
            "[Install]\n"
            "WantedBy=multi-user.target\n")
