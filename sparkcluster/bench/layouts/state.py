"""What a `bench --layouts` run keeps beside its results so that a run cut short resumes: the inputs the figures depend
on, and each layout measured so far with its rows, timings and receipt (what produced its figures, as `bench
--json`'s: a resumed run keeps the receipts of the layouts measured before it). Written after every layout
(atomically: a Ctrl-C mid-write never leaves half a file that a resume would trust); read before anything connects,
so a state of other inputs is refused up front rather than mixed with new figures."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from ...engine.errors import UsageError
from ...engine.inventory import Inventory
from ...engine.localfiles import read_json, write_text
from ...serving.layout import LAYOUT_KINDS, Layout, LayoutKind
from ..methods.closed_loop.arithmetic import Distribution, Row
from ..methods.closed_loop.table import DISTRIBUTIONS
from ..methods.llama_benchy.arithmetic import BenchmarkRun
from ..metrics import ServerSide
from ..receipt import Receipt

STATE_VERSION = 2  # 2: each layout's receipt; a state of version 1 reads with none (unknown), its figures the same
READABLE_VERSIONS = (1, 2)
STATE_FILE = "layouts-state.json"


@dataclass(frozen=True)
class Measured:
    """One layout's figures: a row per concurrency (with vLLM's own counters beside it), or llama-benchy's entries
    for --method llama-benchy, and where its time went."""

    layout: LayoutKind  # as --layouts names it: tp, pp, replicas
    shape: Layout  # what it served on these nodes: TP 2, or 2 replicas of TP 1
    rows: tuple[Row, ...]
    server: tuple[ServerSide | None, ...]
    server_version: str | None
    serve_s: float  # the serve phases, staging included (a no-op check once the first layout staged)
    measure_s: float  # the sweep: calibration, warm-up and every concurrency
    phases: dict[str, float] = field(default_factory=dict)
    vllm_build: str | None = None  # the vLLM distribution's version where it served (build.py): 0.32.0+cpu on CPU
    receipt: Receipt | None = None  # what produced these figures: this layout's serve, /metrics over its sweep
    benchmarks: tuple[BenchmarkRun, ...] | None = None  # llama-benchy's entries (its rows stay empty); None: sustained

    def to_json(self) -> dict[str, Any]:
        doc = {"layout": self.layout, "shape": self.shape.to_json(), "rows": [r.to_json() for r in self.rows],
               "server": [asdict(s) if s else None for s in self.server], "server_version": self.server_version,
               "serve_s": self.serve_s, "measure_s": self.measure_s, "phases": self.phases,
               "vllm_build": self.vllm_build, "receipt": None if self.receipt is None else self.receipt.to_json()}
        if self.benchmarks is not None:  # only llama-benchy's: the closed loop's entries stay as they were
            doc["benchmarks"] = [b.to_json() for b in self.benchmarks]
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Measured:
        """Raises ValueError, KeyError or TypeError for an entry that does not read (a receipt's among them); every
        figure a finite number (a state is a file anyone can edit: 1e999 reads as infinity, 400 digits overflow)."""
        receipt, benchmarks = doc.get("receipt"), doc.get("benchmarks")
        return cls(kind(doc["layout"]), Layout.from_json(doc["shape"]), tuple(row_from_json(r) for r in doc["rows"]),
                   tuple(_server_from_json(s) if s else None for s in doc["server"]),
                   _text(doc["server_version"], "server_version"), _number(doc["serve_s"], "serve_s"),
                   _number(doc["measure_s"], "measure_s"),
                   {str(k): _number(v, f"phases.{k}") for k, v in doc["phases"].items()},
                   _text(doc["vllm_build"], "vllm_build"), None if receipt is None else Receipt.from_json(receipt),
                   None if benchmarks is None else tuple(_benchmark(b) for b in benchmarks))


def kind(text: object) -> LayoutKind:
    found = next((k for k in LAYOUT_KINDS if k == text), None)
    if found is None:
        raise ValueError(f"{text!r} is not a layout ({', '.join(LAYOUT_KINDS)})")
    return found


def row_from_json(doc: dict[str, Any]) -> Row:
    """The inverse of Row.to_json, each figure checked as Measured.from_json checks its own."""
    values: dict[str, Any] = {}
    for f in fields(Row):
        value, where = doc[f.name], f"rows' {f.name}"
        if f.name in DISTRIBUTIONS:
            values[f.name] = Distribution(**{k: _number(v, f"{where}.{k}", optional=True) for k, v in value.items()})
        else:
            values[f.name] = _number(value, where, whole=f.type == "int")
    return Row(**values)


def _benchmark(doc: dict[str, Any]) -> BenchmarkRun:
    """llama-benchy's entry, each figure finite (as a row's)."""
    run = BenchmarkRun.from_json(doc)
    for name, value in dataclasses.asdict(run).items():
        if isinstance(value, dict):
            for figure in (value["mean"], value["std"], *value["values"]):
                _number(figure, f"benchmarks' {name}")
    return run


def _server_from_json(doc: dict[str, Any]) -> ServerSide:
    return ServerSide(**{f.name: _number(doc[f.name], f"server.{f.name}", optional=True, whole="int" in str(f.type))
                         for f in fields(ServerSide)})


def _number(value: object, where: str, optional: bool = False, whole: bool = False) -> Any:
    """A finite float (an int where `whole`: 3.0 reads as 3), None where `optional`; ValueError naming `where`."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} is {str(value)[:40]!r}, not a number")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{where} is a number of {len(str(value))} digits, more than a figure holds") from None
    if not math.isfinite(number):
        raise ValueError(f"{where} is {value}, not a finite number")
    if whole and not number.is_integer():
        raise ValueError(f"{where} is {value}, not a whole number")
    return int(value) if whole else number


def _text(value: object, where: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{where} is {str(value)[:40]!r}, not text")
    return value


@dataclass
class LayoutState:
    """The file's contents: `inputs` must equal this run's for its layouts to count as measured."""

    path: Path
    inputs: dict[str, Any]
    done: dict[LayoutKind, Measured] = field(default_factory=dict)  # layout name -> its figures, in the order measured

    def record(self, measured: Measured) -> None:
        self.done[measured.layout] = measured
        self.save()

    def save(self) -> None:
        """Through engine/localfiles.py: never through a link planted at the file or its temporary."""
        doc = {"version": STATE_VERSION, "inputs": self.inputs, "done": [m.to_json() for m in self.done.values()]}
        write_text(self.path, json.dumps(doc, indent=1) + "\n")


def load(path: Path, inputs: dict[str, Any]) -> LayoutState:
    """The state in `path` (none yet: an empty one). A file that does not parse, or was measured with other inputs,
    is refused (exit 2) naming what differs: its figures are not comparable with this run's."""
    if not path.exists() and not path.is_symlink():
        return LayoutState(path, inputs)
    start_afresh = f"give another --out, or delete {path} to measure every layout afresh"
    doc = read_json(path, str(path), "a bench --layouts state file", start_afresh)
    try:
        if doc.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"version {doc.get('version')!r}, not {' or '.join(map(str, READABLE_VERSIONS))}")
        recorded: dict[str, Any] = doc["inputs"]
        if not isinstance(recorded, dict):
            raise ValueError(f"inputs is {str(recorded)[:40]!r}, not an object")
        done = [Measured.from_json(m) for m in doc["done"]]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path} is not a bench --layouts state file ({e})", start_afresh) from None
    differs = [f"{key} {recorded.get(key)!r}, now {value!r}" for key, value in inputs.items()
               if recorded.get(key) != value]
    if differs:
        raise UsageError(f"{path} holds layouts measured with other settings ({'; '.join(differs)}), whose figures "
                         "do not compare with this run's", f"run with the same settings to resume, or {start_afresh}")
    return LayoutState(path, inputs, {m.layout: m for m in done})


def cluster(inventory: Inventory) -> str:
    """Which cluster the figures were measured on, beyond the inventory's path and node names (another cluster
    behind the same ./inventory.yml and names would resume this one's figures): a digest of each node's name,
    address, port and pinned fabric, stable while the inventory says the same of its nodes."""
    hosts = sorted((h.name, h.address, h.port, h.qsfp_interface, h.fabric_ip, list(h.hcas)) for h in inventory.hosts)
    return "sha256:" + hashlib.sha256(json.dumps(hosts).encode()).hexdigest()[:16]
