"""The bus bandwidth a pass needs on real Sparks, per topology, from what owners measured in the field.

Each floor sits about a quarter under its field figure: the probe stops at 1 GiB (16 GB froze Sparks), which costs
a few GB/s against nccl-tests' 16 GB runs, and MTU 1500 alone costs 10-20%. The simulator has no real link speed, so
there verify compares links with each other instead (links.py, twins.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Floor:
    topology: str  # "pair", "ring", "switch"; "twin" for one twin of a link alone
    min_busbw_gbps: float
    field: str  # the measurement it is held against

    def __str__(self) -> str:
        return f"{self.topology}: {self.min_busbw_gbps:g} GB/s ({self.field})"


PAIR = Floor("pair", 18.0, "2 nodes, one cable, both twins: all_gather 23.7 GB/s; NVIDIA warns under 21.9")
RING = Floor("ring", 10.0, "3-node ring: all_reduce 13.9 GB/s at 256 MB; NVIDIA's ring pass mark is 10")
SWITCH = Floor("switch", 14.0, "8 nodes through a switch: all_reduce about 17.6 GB/s")
TWIN = Floor("twin", 9.0, "one twin alone: about 12.3 GB/s, at most 12.5 (100 Gb/s)")
FLOORS = (PAIR, RING, SWITCH, TWIN)

# Small-message latency on a direct pair, as owners measured it inside vLLM's containers: NCCL all_reduce median per
# call by message bytes (41 us at 8 KB, 105-127 us at 64 KB, about 2,100 us at 1 MB, i.e. 0.45 GB/s), and the wire's
# own floor (`ib_write_lat`: 8.8 us for 48 KB). The whole group's all_reduce is held to LATENCY_CEILING_RATIO times
# the field's figure, interpolated between them; sizes outside 8 KB-1 MB are shown, not judged.
LATENCY_FIELD = ((8 << 10, 41.0), (64 << 10, 127.0), (1 << 20, 2100.0))
LATENCY_WIRE_FLOOR = (48 << 10, 8.8)
LATENCY_CEILING_RATIO = 2.0


def floor_for(topology: str | None, nodes: int | None) -> Floor:
    """The whole collective's floor: any two nodes are a pair (one link, both twins); more are a ring or a switch.
    Logs alone do not say which, so three or more nodes without a topology get the ring's (lower) floor."""
    if nodes is not None and nodes <= 2:
        return PAIR
    if topology == "switch":
        return SWITCH
    if topology == "pair" and nodes is None:
        return PAIR
    return RING if nodes is not None or topology == "ring" else PAIR


def help_text() -> str:
    """What `verify --help` and `nccl-report --help` show as the defaults."""
    return "; ".join(str(f) for f in FLOORS)
