"""The decode budget: how much of each decode step the tensor-parallel all-reduces take, from the model's shape,
verify's measured all-reduce latency and bench's measured inter-token latency (ITL).

The model of a step (Megatron-LM's tensor parallelism, Shoeybi et al. 2019, section 3, as vLLM lays it out):
each transformer layer splits attention by heads and the MLP by its intermediate size, and joins each half back
with one all-reduce of the layer's output: attention's o_proj and the MLP's down_proj are RowParallelLinear with
reduce_results (vllm/model_executor/layers/linear.py; an MoE layer's experts reduce the same way), so 2 per layer.
The input embedding is split by vocabulary (VocabParallelEmbedding) and all-reduced once more. In a decode step
every running sequence contributes one token, so at concurrency c each all-reduce carries c x hidden_size
activations of the model's 16-bit dtype: Llama-3-8B (32 layers, hidden 4096, bfloat16) at c=1 runs 2 x 32 + 1 = 65
all-reduces of 8 KiB per token. They run one after another on the critical path (CUDA graphs replay them in
order; nothing overlaps them with compute in decode), so their time adds up.

verify's probe times all_reduce at 8 KiB to 2 MiB on the cluster's own links (`latency_us` of the last verify, kept
on every node); a size between two measured ones is interpolated linearly (latency is about a fixed cost plus
bytes / bandwidth, linear in the size), one past the largest extrapolated along the last segment, one below the
smallest read as the smallest's (an upper bound). Unknown latency (no verify measured it) is a value, never a guess.

Left out, and said so: the LM head's one gather of the logits per step, the pipeline's sends between stages, vLLM
padding a batch to its CUDA graph sizes, and a probe's latency differing from inside vLLM's process."""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..engine.session import Session
from ..nccl.lastverify import LAST_VERIFY_COMMAND
from ..nccl.latency import Latency
from ..node.modelconfig import ALL_REDUCES_PER_LAYER, StepShape, step_shape
from .ceiling import ServedModel

# Thresholds on the share of the step. With TP over N nodes a step takes T/N + C (T: one node's step, C: the
# all-reduces), so one stream decodes N x (1 - share) times as fast as on one node, while N replicas serve N x one
# node's aggregate. Healthy links measure about 10%: a pair at 41 us per 8 KiB all-reduce spends 2.7 ms of a ~30 ms
# Llama-3-8B step, and a 4-node TP 4 5-6 ms of 52 ms (issue 40's field numbers). 30% is three times that: the link
# costs more than it should (channels, one twin down, PFC/ECN). From 50% the all-reduces are the step: TP 2 then
# decodes no faster than one node, and fewer TP ranks or replicas win.
LARGE_SHARE = 0.30
DOMINANT_SHARE = 0.50


class Share(StrEnum):
    OK = "ok"
    LARGE = "large"
    DOMINANT = "dominates"
    UNKNOWN = "unknown"  # no measured latency, or no ITL at this concurrency
    NO_ALL_REDUCE = "no all-reduce"  # TP 1: nothing crosses a link inside a step


@dataclass(frozen=True)
class Curve:
    """verify's all-reduce latency: median microseconds at each message size it measured, smallest first."""

    median_us: tuple[tuple[int, float], ...]
    backend: str | None = None
    measured_at: str | None = None
    settings: tuple[tuple[str, str], ...] = ()  # what verify --tune set in the comm env the latency was timed in

    def at(self, size: int) -> tuple[float, str]:
        """(microseconds for one all-reduce of `size` bytes, how it was read off the measurements)."""
        sizes = [s for s, _ in self.median_us]
        i = bisect.bisect_left(sizes, size)
        if i < len(sizes) and sizes[i] == size:
            return self.median_us[i][1], "measured"
        if i == 0:
            return self.median_us[0][1], "the smallest size's"
        # Past the largest size: the last segment's slope (the bandwidth term) carries on.
        (s0, us0), (s1, us1) = self.median_us[i - 1: i + 1] if i < len(sizes) else self.median_us[-2:]
        how = "interpolated" if i < len(sizes) else "extrapolated"
        return us0 + (us1 - us0) * (size - s0) / (s1 - s0), how

    def to_json(self) -> dict[str, Any]:
        return {"backend": self.backend, "at": self.measured_at, "comm_tuned": {"settings": dict(self.settings)},
                "latency_us": {str(size): us for size, us in self.median_us}}


def latency_of(record: Mapping[str, Any]) -> Curve | None:
    """The whole group's all-reduce latency in a last-verify record (verify writes it on every node, in
    nccl/latency.py's shape); None where it measured none."""
    found = Latency.from_json(record)
    medians = {size: us for size, us in (found.median_us() if found else {}).items() if size > 0 and us > 0}
    if len(medians) < 2:  # one size cannot say how latency grows with the batch
        return None
    backend, at, tuned = record.get("backend"), record.get("at"), record.get("comm_tuned")
    settings = tuned.get("settings") if isinstance(tuned, Mapping) else None
    return Curve(tuple(sorted(medians.items())), backend if isinstance(backend, str) else None,
                 at if isinstance(at, str) else None,
                 tuple(sorted((str(k), str(v)) for k, v in settings.items())) if isinstance(settings, Mapping) else ())


@dataclass(frozen=True)
class Inputs:
    """What the budget needs before the run: the served model's step, its TP, the nodes it spans, and the latency
    (None: no verify measured it). Rides in bench's config as `decode_step`, as the ceiling does."""

    model: str
    shape: StepShape
    tp: int
    nodes: int
    latency: Curve | None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "tp": self.tp, "nodes": self.nodes, "layers": self.shape.layers,
                "hidden_size": self.shape.hidden, "activation_bytes": self.shape.activation_bytes,
                "verify": None if self.latency is None else self.latency.to_json()}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Inputs:
        verify = doc.get("verify")
        return Inputs(str(doc["model"]), StepShape(int(doc["layers"]), int(doc["hidden_size"]),
                                                   int(doc["activation_bytes"])),
                      int(doc["tp"]), int(doc["nodes"]), latency_of(verify) if isinstance(verify, Mapping) else None)


@dataclass(frozen=True)
class StepBudget:
    """One concurrency: the all-reduces' time against the measured ITL."""

    concurrency: int
    message_bytes: int
    all_reduce_us: float | None  # one all-reduce of message_bytes
    latency_read: str | None  # measured, interpolated, extrapolated, the smallest size's
    all_reduces_ms: float | None  # every all-reduce of the step
    itl_ms: float | None
    share: float | None
    verdict: Share


@dataclass(frozen=True)
class DecodeBudget:
    inputs: Inputs
    steps: tuple[StepBudget, ...]

    @property
    def verdict(self) -> Share:
        if self.inputs.tp < 2:
            return Share.NO_ALL_REDUCE
        if self.inputs.latency is None:
            return Share.UNKNOWN
        for worst in (Share.DOMINANT, Share.LARGE, Share.OK):
            if any(s.verdict is worst for s in self.steps):
                return worst
        return Share.UNKNOWN

    def advice(self) -> str | None:
        tp = self.inputs.tp
        if self.verdict is Share.UNKNOWN and self.inputs.latency is None:
            return ("verify's all-reduce latency is unknown (no verify has measured it on the head): run "
                    "`sparkcluster verify`, then bench again")
        check = "check the link's latency: `sparkcluster verify` times every link alone and names a slow one"
        where = "at " + ", ".join(f"c={s.concurrency}" for s in self.steps if s.verdict is self.verdict)
        if self.verdict is Share.DOMINANT:
            fewer = f"TP {tp // 2}" if tp > 2 else "one node per engine"
            return (f"the all-reduces dominate decode {where}: serve fewer TP ranks ({fewer}) if the model fits, "
                    f"or {tp} replicas behind the router (`serve --replicas {tp}`) for throughput; {check}")
        if self.verdict is Share.LARGE:
            return f"the all-reduces take a large share of decode {where} (healthy links: about 10%); {check}"
        return None

    def caveats(self) -> list[str]:
        out = []
        if self.inputs.tp < self.inputs.nodes:
            out.append(f"verify measured the whole group of {self.inputs.nodes} nodes; a TP group of "
                       f"{self.inputs.tp} all-reduces over fewer hops, so its share is an upper bound")
        if any(s.latency_read == "extrapolated" for s in self.steps):
            out.append("sizes past verify's largest are extrapolated along its last measured segment")
        return out

    def to_json(self) -> dict[str, Any]:
        i = self.inputs
        return {"model": i.model, "tp": i.tp, "layers": i.shape.layers, "hidden_size": i.shape.hidden,
                "activation_bytes": i.shape.activation_bytes, "all_reduces_per_step": i.shape.all_reduces,
                "verify": None if i.latency is None else i.latency.to_json(),
                "verdict": str(self.verdict), "advice": self.advice(), "caveats": self.caveats(),
                "rows": [{"concurrency": s.concurrency, "message_bytes": s.message_bytes,
                          "all_reduce_us": s.all_reduce_us, "latency_read": s.latency_read,
                          "all_reduces_ms": s.all_reduces_ms, "itl_ms": s.itl_ms, "share": s.share,
                          "verdict": str(s.verdict)} for s in self.steps]}


def judge(share: float) -> Share:
    return Share.DOMINANT if share >= DOMINANT_SHARE else Share.LARGE if share >= LARGE_SHARE else Share.OK


def step_budget(inputs: Inputs, concurrency: int, itl_s: float | None) -> StepBudget:
    size = inputs.shape.message_bytes(concurrency)
    itl_ms = itl_s * 1000 if itl_s else None
    if inputs.tp < 2:
        return StepBudget(concurrency, size, None, None, 0.0, itl_ms, 0.0, Share.NO_ALL_REDUCE)
    if inputs.latency is None:
        return StepBudget(concurrency, size, None, None, None, itl_ms, None, Share.UNKNOWN)
    one_us, how = inputs.latency.at(size)
    total_ms = one_us * inputs.shape.all_reduces / 1000
    share = total_ms / itl_ms if itl_ms else None
    return StepBudget(concurrency, size, one_us, how, total_ms, itl_ms, share,
                      Share.UNKNOWN if share is None else judge(share))


def budget(inputs: Inputs, itl_by_concurrency: Sequence[tuple[int, float | None]]) -> DecodeBudget:
    """`itl_by_concurrency`: each measured concurrency with its median inter-token latency in seconds."""
    return DecodeBudget(inputs, tuple(step_budget(inputs, c, itl) for c, itl in itl_by_concurrency))


def for_run(config: Mapping[str, Any], itl_by_concurrency: Sequence[tuple[int, float | None]]) -> DecodeBudget | None:
    """The budget of a run, whichever method measured its ITL (each concurrency with its ITL in seconds), from the
    inputs bench's config carries (`decode_step`); None without them."""
    step = config.get("decode_step")
    return budget(Inputs.from_json(step), itl_by_concurrency) if isinstance(step, Mapping) else None


def last_verify_record(session: Session) -> dict[str, Any] | None:
    """The head's last-verify record (every node keeps the same one); None where it never verified."""
    result = session.run(session.head, LAST_VERIFY_COMMAND)
    try:
        doc = json.loads(result.stdout) if result.ok else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def for_served(served: ServedModel, config: Mapping[str, Any], record: Mapping[str, Any] | None) -> Inputs | None:
    """The inputs for what `serve` recorded (config: bench's target config; record: the last verify's); None where
    the model's config is of a shape this does not know: no budget rather than a wrong one."""
    try:
        shape = step_shape(served.config)
    except ValueError:
        return None
    nodes = config.get("nodes")
    tp = config.get("tp")
    return Inputs(served.name, shape, tp if isinstance(tp, int) and tp > 0 else 1,
                  len(nodes) if isinstance(nodes, list) and nodes else 1, latency_of(record) if record else None)


def _size(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def describe(found: DecodeBudget) -> str:
    """The decode budget's section under bench's table."""
    i = found.inputs
    head = (f"decode budget (TP {i.tp}, {i.model}): {i.shape.all_reduces} all-reduces per step = "
            f"{ALL_REDUCES_PER_LAYER} per layer x {i.shape.layers} + the embedding's, each of c x {i.shape.hidden} "
            f"x {i.shape.activation_bytes} bytes")
    if found.verdict is Share.NO_ALL_REDUCE:
        return f"decode budget (TP {i.tp}, {i.model}): no all-reduce crosses a link inside a step"
    lines = [head if i.latency is None else
             f"{head}; verify's latency ({i.latency.backend or '?'}, {i.latency.measured_at or '?'}) with "
             + (" ".join(f"{k}={v}" for k, v in i.latency.settings) + " (verify --tune)" if i.latency.settings
                else "no verify --tune settings")]
    for s in found.steps:
        if s.all_reduce_us is None or s.all_reduces_ms is None:
            lines.append(f"  c={s.concurrency}: {_size(s.message_bytes)} each, latency unknown")
            continue
        itl = f"{s.itl_ms:.1f} ms ITL = {s.share * 100:.0f}%" if s.itl_ms and s.share is not None else "no ITL"
        flag = f" ({s.verdict})" if s.verdict in (Share.LARGE, Share.DOMINANT) else ""
        lines.append(f"  c={s.concurrency}: {_size(s.message_bytes)} each, {s.all_reduce_us:.0f} us ({s.latency_read})"
                     f" x {i.shape.all_reduces} = {s.all_reduces_ms:.1f} ms of a {itl}{flag}")
    advice = found.advice()
    if advice:
        lines.append(f"  {advice}")
    lines += [f"  rough: {caveat}" for caveat in found.caveats()]
    return "\n".join(lines)
