"""The decode ceiling of the served model at concurrency 1: every generated token reads the active weights once,
so a stream cannot decode faster than memory bandwidth x nodes / bytes read per token (TP splits the weights
across the nodes, each reading its share from its own memory at once). A GB10 has 273 GB/s of unified memory.

Parameters come from the model's config.json (dense and MoE layouts; the experts a token is routed to count,
the others do not), bytes per parameter from its dtype or quantisation; the safetensors index, where the head
has one, gives the stored size. The estimate is rough where it says so (`caveats`): it leaves out KV-cache reads
(they grow with depth), activations and TP's all-reduces (decode_budget.py counts those), and takes MoE routing as
k experts of E per layer."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.session import Session
from ..node.modelconfig import config_int, read_staged, text_config

GB10_BANDWIDTH_GBPS = 273.0  # GB/s of LPDDR5x per node
DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "float8_e4m3fn": 1.0, "fp8": 1.0}
# Bits per weight of each quantisation, scales included: MXFP4 is 4 bits plus an 8-bit scale per 32 weights.
QUANT_BYTES = {"mxfp4": 4.25 / 8, "nvfp4": 4.5 / 8, "modelopt_fp4": 4.5 / 8, "fp8": 1.0, "compressed-tensors": 1.0}


@dataclass(frozen=True)
class Params:
    total: int
    active: int  # read per generated token: attention, dense MLP, the routed experts, the shared ones, the LM head
    expert_total: int  # of `total`, in routed experts
    expert_active: int
    experts: int = 0
    experts_per_token: int = 0


@dataclass(frozen=True)
class Ceiling:
    model: str
    params: Params
    bytes_per_token: float
    bandwidth_gbps: float
    nodes: int
    weight_format: str  # "bfloat16", "mxfp4 experts, bfloat16 elsewhere"...
    caveats: tuple[str, ...]

    @property
    def tokens_per_s(self) -> float:
        return self.bandwidth_gbps * 1e9 * self.nodes / self.bytes_per_token

    def share(self, tg_per_stream: float) -> float:
        return tg_per_stream / self.tokens_per_s

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "total_params": self.params.total, "active_params": self.params.active,
                "bytes_per_token": self.bytes_per_token, "bandwidth_gbps_per_node": self.bandwidth_gbps,
                "nodes": self.nodes, "weights": self.weight_format, "tokens_per_s": self.tokens_per_s,
                "caveats": list(self.caveats)}


def count_params(config: Mapping[str, Any]) -> Params:
    """Weights of a decoder-only transformer from its config.json (norms and biases left out: under 0.1%)."""
    c = text_config(config)
    hidden = config_int(c, "hidden_size", "d_model", "n_embd")
    layers = config_int(c, "num_hidden_layers", "n_layer", "num_layers")
    heads = config_int(c, "num_attention_heads", "n_head")
    if not (hidden and layers and heads):
        raise ValueError("config.json names no hidden_size, num_hidden_layers and num_attention_heads")
    kv_heads = config_int(c, "num_key_value_heads", default=heads)
    head_dim = config_int(c, "head_dim", default=hidden // heads)
    vocab = config_int(c, "vocab_size")
    inter = config_int(c, "intermediate_size", "ffn_dim")
    attention = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    experts = config_int(c, "num_local_experts", "num_experts", "n_routed_experts")
    per_token = config_int(c, "num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk")
    expert_inter = config_int(c, "moe_intermediate_size", default=inter)
    shared = (config_int(c, "shared_expert_intermediate_size")
              or config_int(c, "n_shared_experts") * expert_inter)
    dense_layers = layers
    if experts and per_token:
        first_dense = config_int(c, "first_k_dense_replace")
        only_mlp = c.get("mlp_only_layers") or []
        dense_layers = min(layers, first_dense + (len(only_mlp) if isinstance(only_mlp, list) else 0))
    moe_layers = layers - dense_layers if experts and per_token else 0
    expert = 3 * hidden * expert_inter  # gate, up and down projections
    dense_mlp = 3 * hidden * inter
    moe_fixed = 3 * hidden * shared + hidden * experts  # shared experts and the router
    embedding = vocab * hidden
    lm_head = 0 if c.get("tie_word_embeddings") else vocab * hidden
    expert_total = moe_layers * experts * expert
    expert_active = moe_layers * per_token * expert
    fixed = layers * attention + dense_layers * dense_mlp + moe_layers * moe_fixed
    # The input embedding is looked up (one row per token), the LM head multiplied in full.
    total = fixed + expert_total + embedding + lm_head
    active = fixed + expert_active + (lm_head or embedding)
    return Params(total, active, expert_total, expert_active, experts if moe_layers else 0, per_token if moe_layers else 0)


def weight_bytes(config: Mapping[str, Any]) -> tuple[float, float, str]:
    """(bytes per expert weight, bytes per other weight, how they are stored)."""
    c = text_config(config)
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    base = DTYPE_BYTES.get(dtype, 2.0)
    quant = c.get("quantization_config")
    if not isinstance(quant, Mapping):
        return base, base, dtype
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits") or quant.get("w_bit")
    if isinstance(bits, int) and method in ("awq", "gptq", "autoround", "bitsandbytes"):
        q = bits / 8 + 0.03  # group scales and zeros, about 2 bytes per 64 weights
    else:
        q = QUANT_BYTES.get(method, base)
    if method == "mxfp4":  # gpt-oss: the experts only; attention, router and LM head stay in bfloat16
        return q, base, f"{method} experts, {dtype} elsewhere"
    return q, q, method or dtype


def ceiling(model: str, config: Mapping[str, Any], nodes: int, bandwidth_gbps: float = GB10_BANDWIDTH_GBPS,
            stored_bytes: int | None = None) -> Ceiling:
    params = count_params(config)
    expert_b, other_b, fmt = weight_bytes(config)
    per_token = params.expert_active * expert_b + (params.active - params.expert_active) * other_b
    caveats = ["an upper bound: KV-cache reads (which grow with the context depth), activations and TP's all-reduce "
               "latency are left out (bench's decode budget counts those), so long contexts land further below it"]
    if params.experts:
        caveats.append(f"MoE: {params.experts_per_token} of {params.experts} experts per token and layer, as routed "
                       "at concurrency 1; at higher concurrency tokens route to different experts and each step reads "
                       "more of them")
    if stored_bytes:
        estimated = params.expert_total * expert_b + (params.total - params.expert_total) * other_b
        if abs(stored_bytes - estimated) > 0.15 * stored_bytes:
            caveats.append(f"the safetensors hold {stored_bytes / 1e9:.1f} GB, the config suggests "
                           f"{estimated / 1e9:.1f} GB: the bytes per weight are a guess here")
    return Ceiling(model, params, per_token, bandwidth_gbps, nodes, fmt, tuple(caveats))


def effective_nodes(config: Mapping[str, Any]) -> int:
    """Nodes whose memory a token's weights are read from at once: one replica's TP group (pipeline stages take
    turns; a stream runs on one replica)."""
    nodes = config.get("nodes")
    count = len(nodes) if isinstance(nodes, list) and nodes else 1
    for split in ("replicas", "pp"):
        value = config.get(split)
        count = max(1, count // value) if isinstance(value, int) and value > 0 else count
    return count


def per_stream_decode(generation_tps: float, concurrency: int, itl_p50_s: float | None) -> float:
    """One stream's decode rate: 1 / the median gap between its tokens, else the level's share of generation."""
    if itl_p50_s:
        return 1.0 / itl_p50_s
    return generation_tps / max(1, concurrency)


@dataclass(frozen=True)
class ServedModel:
    """The served model's files on the head, read once for the ceiling and the decode budget."""

    name: str
    config: dict[str, Any]  # its config.json
    stored_bytes: int | None  # the safetensors index's total size


def served_model(session: Session, config: Mapping[str, Any]) -> ServedModel | None:
    """The model `serve` recorded (config: bench's target config), read from the head's snapshot."""
    model = config.get("hf_model")
    if not isinstance(model, str):
        return None
    found = read_staged(session, model)
    return None if found is None else ServedModel(model, found[0], found[1])


def for_served(served: ServedModel, config: Mapping[str, Any], bandwidth_gbps: float) -> Ceiling | None:
    """The ceiling of the served model on the nodes bench's target config names."""
    try:
        return ceiling(served.name, served.config, effective_nodes(config), bandwidth_gbps,
                       stored_bytes=served.stored_bytes)
    except ValueError:
        return None  # a config of a shape this does not know: no ceiling rather than a wrong one


def describe(doc: Mapping[str, Any]) -> str:
    """The ceiling line under bench's table (doc: Ceiling.to_json())."""
    active = doc["active_params"] / 1e9
    lines = [f"decode ceiling at concurrency 1: {doc['tokens_per_s']:.1f} tok/s = {doc['nodes']} node"
             f"{'s' if doc['nodes'] > 1 else ''} x {doc['bandwidth_gbps_per_node']:g} GB/s / "
             f"{doc['bytes_per_token'] / 1e9:.2f} GB read per token ({active:.2f} B active parameters, "
             f"{doc['weights']}; {doc['model']})"]
    lines += [f"  rough: {caveat}" for caveat in doc["caveats"]]
    return "\n".join(lines)


def load_run(path: str) -> dict[str, Any] | None:
    """An earlier `bench --json` document (config and rows), or None where `path` is something else."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list) and isinstance(doc.get("config"), dict):
        return doc
    return None


def speedups(levels: Sequence[Any], baseline: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Generation throughput of this run over the baseline's, at each concurrency both measured."""
    theirs = {r.get("concurrency"): r.get("generation_tps") for r in baseline["rows"] if isinstance(r, dict)}
    out = []
    for level in levels:
        there = theirs.get(level.row.concurrency)
        if isinstance(there, int | float) and there > 0:
            out.append({"concurrency": level.row.concurrency, "generation_tps": level.row.generation_tps,
                        "baseline_generation_tps": there, "speedup": level.row.generation_tps / there})
    return out


def speedup_lines(levels: Sequence[Any], baseline: Mapping[str, Any]) -> str:
    config = baseline.get("config", {})
    nodes = effective_nodes(config) if isinstance(config, Mapping) else 1
    found = speedups(levels, baseline)
    if not found:
        return "speedup: the baseline run measured none of these concurrencies"
    cells = ", ".join(f"c={s['concurrency']} {s['speedup']:.2f}x" for s in found)
    return (f"speedup over the baseline run ({nodes} node{'s' if nodes > 1 else ''}): {cells} (published TP 2 runs "
            "on two Sparks gain 1.2-1.4x over one node at concurrency 1)")


def benchy_shares(runs: Sequence[Any], doc: Mapping[str, Any]) -> list[str]:
    """llama-benchy's tg cells (its BenchmarkRun entries): each request's decode rate as a share of the ceiling,
    printed under its table (which stays exactly llama-benchy's)."""
    out = []
    for run in runs:
        if run.is_context_prefill_phase or run.tg_req_throughput is None:
            continue
        rate = run.tg_req_throughput.mean
        depth = f" @ d{run.context_size}" if run.context_size else ""
        out.append(f"  tg{run.response_size}{depth} c{run.concurrency}: {rate:.1f} t/s per request = "
                   f"{rate / doc['tokens_per_s'] * 100:.0f}% of the ceiling")
    return out
