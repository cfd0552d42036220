"""A receipt: what produced a bench result, assembled from values that already exist (the serve record, doctor's
node facts, the comm env, the engine's /metrics deltas over the measurement, the bench's own parameters), so that
a number and its cause travel together and `bench --explain` can compare two of them field by field.

Unknown is a value, never a guess: a field that cannot be known (a bare --url to someone else's server has no
serve record, no nodes, no comm env) is None here and null in JSON, and `unknown()` names every such field.
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..engine.scrub import Scrubber
from ..engine.secret_names import MASKED, is_secret_name
from . import receipt_shape
from .receipt_metrics import EngineDeltas

RECEIPT_VERSION = 1
READABLE_VERSIONS = (1,)


@dataclass(frozen=True)
class Mod:
    name: str
    sha256: str | None


@dataclass(frozen=True)
class RecipeUsed:
    source: str  # a file's path or @REGISTRY/NAME, as serve was given it
    sha256: str | None
    mods: tuple[Mod, ...] = ()


@dataclass(frozen=True)
class Engine:
    """The engine as run. runtime docker: image, its ID and digest; runtime host: the Python environment."""

    vllm_version: str | None = None
    command: tuple[str, ...] | None = None  # the head's `vllm serve` argv as launched
    runtime: str | None = None
    launcher: str | None = None
    image: str | None = None
    image_id: str | None = None
    image_digest: str | None = None
    python_env: str | None = None
    recipe: RecipeUsed | None = None
    tp: int | None = None
    pp: int | None = None
    replicas: int | None = None


@dataclass(frozen=True)
class NodeReceipt:
    """One node as doctor sees it (the session's facts and node/health.py's probe)."""

    name: str
    kernel: str | None = None
    driver: str | None = None  # the GPU driver
    bios: str | None = None
    connectx_firmware: dict[str, str] | None = None  # netdev -> firmware-version
    nccl: str | None = None  # the NCCL the engine loads: the image's, else the host's
    cuda: str | None = None


@dataclass(frozen=True)
class BenchParams:
    method: str  # "sustained" or "llama-benchy"
    parameters: dict[str, Any] = field(default_factory=dict)  # the method's own, as its output records them
    prompt_digest: str | None = None  # sha256 of the prompt set (or of what generates it)


@dataclass(frozen=True)
class Receipt:
    endpoint: str
    engine: Engine
    bench: BenchParams
    comm_env: dict[str, dict[str, str]] | None = None  # node -> its comm env, secrets masked
    nodes: tuple[NodeReceipt, ...] | None = None
    metrics: EngineDeltas | None = None  # the engine's /metrics deltas over the measurement
    sparkcluster: str = __version__
    created: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
                          .isoformat(timespec="seconds"))
    version: int = RECEIPT_VERSION

    def unknown(self) -> tuple[str, ...]:
        """Every field that could not be known, by its dotted path (engine.image_digest, nodes, metrics)."""
        return tuple(_unknown(self.to_json(), ""))

    def caption(self) -> str:
        """One line for a plot: the engine, the nodes' platform and the acceptance, each only where known."""
        e, parts = self.engine, []
        parts.append(f"vLLM {e.vllm_version or 'unknown'}")
        if e.tp is not None:
            parts.append(f"TP {e.tp} x PP {e.pp or 1}" + (f" x {e.replicas} replicas" if (e.replicas or 1) > 1 else ""))
        if e.runtime:
            parts.append(f"{e.runtime} ({(e.image_id or e.image or '')[:19] or e.python_env or '?'})")
        platforms = sorted({f"kernel {n.kernel or '?'}, driver {n.driver or '?'}" for n in self.nodes or ()})
        if len(platforms) == 1:
            parts.append(platforms[0])
        elif platforms:  # nodes that differ: the receipt names each, --explain compares them
            parts.append(f"{len(platforms)} node platforms")
        spec = self.metrics.spec_decode if self.metrics else None
        if spec is not None and spec.acceptance_rate is not None:
            parts.append(f"acceptance {spec.acceptance_rate:.0%} (mean length {spec.mean_acceptance_length:.2f})")
        parts.append(f"sparkcluster {self.sparkcluster}, {self.created[:10]}")
        return " · ".join(parts)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "version": self.version, "sparkcluster": self.sparkcluster, "created": self.created,
            "endpoint": self.endpoint, "engine": _plain(self.engine), "comm_env": self.comm_env,
            "nodes": None if self.nodes is None else [_plain(n) for n in self.nodes],
            "bench": _plain(self.bench), "metrics": None if self.metrics is None else self.metrics.to_json(),
        }
        return {**doc, "unknown": list(_unknown(doc, ""))}

    @classmethod
    def from_json(cls, doc: object) -> Receipt:
        """Raises ValueError (with what is wrong) for a receipt this version cannot read."""
        if not isinstance(doc, dict):
            raise ValueError("a receipt is a JSON object")
        version = doc.get("version")
        if version not in READABLE_VERSIONS:
            raise ValueError(f"receipt version {version!r}; this sparkcluster reads "
                             f"{', '.join(map(str, READABLE_VERSIONS))}")
        receipt_shape.check(doc)  # someone else's file: each field of the kind it must be, or named here
        try:
            engine = dict(doc["engine"])
            recipe = engine.pop("recipe", None)
            if engine.get("command") is not None:
                engine["command"] = tuple(engine["command"])
            nodes, metrics = doc.get("nodes"), doc.get("metrics")
            return cls(
                str(doc["endpoint"]),
                Engine(**engine, recipe=None if not recipe else RecipeUsed(
                    recipe["source"], recipe.get("sha256"),
                    tuple(Mod(m["name"], m.get("sha256")) for m in recipe.get("mods") or ()))),
                BenchParams(**doc["bench"]), doc.get("comm_env"),
                None if nodes is None else tuple(NodeReceipt(**n) for n in nodes),
                None if metrics is None else EngineDeltas.from_json(metrics),
                str(doc["sparkcluster"]), str(doc["created"]), int(version))
        except (KeyError, TypeError) as e:
            raise ValueError(f"receipt field {e} missing or malformed") from None


def masked_env(env: dict[str, str]) -> dict[str, str]:
    """A comm env as a receipt shows it: a secret's value (engine/secret_names.py's rule) never leaves the node, and
    any other value is scrubbed as the support bundle scrubs it (a password in a proxy's URL, an `hf_` token under
    a name that does not say so)."""
    scrubber = Scrubber(())
    return {k: MASKED if is_secret_name(k) else scrubber.scrub(v)[0] for k, v in env.items()}


def _plain(value: Any) -> Any:
    """A receipt's dataclass as JSON: tuples as lists, nested values as objects."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value


def _not_applicable(doc: dict[str, Any]) -> set[str]:
    """Fields that are None because they do not apply, not because they are unknown: a host runtime has no image,
    a container no Python environment of its own, a serve record without a recipe used none, and an engine that
    does not speculate has no acceptance."""
    engine, metrics = doc.get("engine") or {}, doc.get("metrics") or {}
    out = set()
    if engine.get("runtime") == "host":
        out |= {"engine.image", "engine.image_id", "engine.image_digest"}
    if engine.get("runtime") == "docker":
        out.add("engine.python_env")
    # serve's record was read and names no recipe: none was used. One it names is read field by field: a sha256
    # that could not be taken (the file gone by then) is unknown, as any other.
    if engine.get("command") is not None and engine.get("recipe") is None:
        out.add("engine.recipe")
    if metrics.get("speculative") is False:
        out.add("metrics.spec_decode")
    return out


def _unknown(doc: Any, path: str, skip: set[str] | None = None) -> list[str]:
    skip = _not_applicable(doc) if skip is None else skip
    if path in skip:
        return []
    if doc is None:
        return [path]
    if isinstance(doc, dict):
        return [p for k, v in doc.items() if k != "unknown"
                for p in _unknown(v, f"{path}.{k}" if path else str(k), skip)]
    if isinstance(doc, (list, tuple)):  # the nodes and a recipe's mods, by name
        return [p for i, v in enumerate(doc)
                for p in _unknown(v, f"{path}[{v.get('name', i) if isinstance(v, dict) else i}]", skip)]
    return []
