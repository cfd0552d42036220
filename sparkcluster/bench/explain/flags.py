"""What each vLLM flag can do to a measured number, as data: `bench --explain` ranks a flag that differs between two
runs by its effect (speculation first: it scales decode directly; then batching, CUDA graphs, the NCCL settings
verify --tune chooses (the decode all-reduces), caching, memory, weights and kernels), names a flag it does not know as of unknown effect, and one that cannot change speed (ports,
parsers, templates) last. The reasons are vLLM's own documentation of each flag, in the words a reader acts on."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Effect(enum.IntEnum):
    """What a flag changes, most direct first (the order differences are ranked in)."""

    SPECULATION = 1
    BATCHING = 2
    GRAPHS = 3
    # verify --tune's NCCL settings: every decode step waits on 2 all-reduces per layer, a tenth to half of the step
    # on a pair (bench's decode budget), and the best setting moved those by 19-51% on two H200s
    COLLECTIVES = 4
    CACHING = 5
    MEMORY = 6
    WEIGHTS = 7
    UNKNOWN = 8  # a flag not in the table: it may matter, nobody here can say how
    NONE = 9  # cannot change a throughput or latency figure


EFFECT_NAMES = {Effect.SPECULATION: "speculation", Effect.BATCHING: "batching", Effect.GRAPHS: "CUDA graphs",
                Effect.COLLECTIVES: "the decode all-reduces", Effect.CACHING: "caching", Effect.MEMORY: "memory",
                Effect.WEIGHTS: "weights and kernels",
                Effect.UNKNOWN: "effect unknown", Effect.NONE: "no effect on speed"}


@dataclass(frozen=True)
class FlagEffect:
    effect: Effect
    why: str


_S, _B, _G, _C, _M, _W, _N = (Effect.SPECULATION, Effect.BATCHING, Effect.GRAPHS, Effect.CACHING, Effect.MEMORY,
                              Effect.WEIGHTS, Effect.NONE)
# vLLM's flags by their canonical `--long-name`; a `--no-X` form reads as X turned off.
FLAGS: dict[str, FlagEffect] = {
    "--speculative-config": FlagEffect(_S, "speculative decoding: decode scales with its acceptance"),
    "--max-num-seqs": FlagEffect(_B, "the sequences batched per step: a concurrency above it queues"),
    "--max-num-batched-tokens": FlagEffect(_B, "the tokens per scheduler step: how prefill is chunked beside "
                                               "decode (TTFT and prefill under load)"),
    "--enable-chunked-prefill": FlagEffect(_B, "prefill cut into chunks batched with decode (TTFT against ITL)"),
    "--async-scheduling": FlagEffect(_B, "scheduling overlapped with the GPU's step (decode at every concurrency)"),
    "--scheduling-policy": FlagEffect(_B, "the order waiting requests are scheduled in"),
    "--max-num-partial-prefills": FlagEffect(_B, "how many long prompts prefill at once"),
    "--enforce-eager": FlagEffect(_G, "no CUDA graphs: every decode step launches its kernels one by one (decode "
                                      "slower, most at low concurrency)"),
    "--compilation-config": FlagEffect(_G, "torch.compile and the CUDA-graph capture sizes: a batch size not "
                                           "captured pads to the next (c=5 runs as 8)"),
    "--cuda-graph-sizes": FlagEffect(_G, "the CUDA-graph capture sizes: a batch size not captured pads to the next"),
    "-O": FlagEffect(_G, "the compilation level (torch.compile, CUDA graphs)"),
    "--enable-prefix-caching": FlagEffect(_C, "the prefix cache: a prompt seen before skips its prefill (TTFT, "
                                              "prefill tok/s)"),
    "--kv-cache-dtype": FlagEffect(_C, "the KV cache's precision: fp8 halves its bytes (more sequences fit, "
                                       "attention reads less)"),
    "--block-size": FlagEffect(_C, "the KV cache's block size (attention kernels, cache fragmentation)"),
    "--gpu-memory-utilization": FlagEffect(_M, "the memory vLLM may take, the KV cache's room: fewer sequences fit "
                                               "before preemption"),
    "--kv-cache-memory-bytes": FlagEffect(_M, "the KV cache's room: how many sequences fit before preemption"),
    "--max-model-len": FlagEffect(_M, "the longest context: the KV cache a sequence may claim"),
    "--cpu-offload-gb": FlagEffect(_M, "weights kept in CPU memory: every step copies them in"),
    "--swap-space": FlagEffect(_M, "CPU room for preempted sequences"),
    "--quantization": FlagEffect(_W, "the weights' format: bytes read per token, decode scales with them"),
    "--dtype": FlagEffect(_W, "the weights' and activations' precision: bytes read per token"),
    "--attention-backend": FlagEffect(_W, "the attention kernels"),
    "--mxfp4-backend": FlagEffect(_W, "the MXFP4 GEMM kernels"),
    "--mxfp4-layers": FlagEffect(_W, "which layers run MXFP4 kernels"),
    "--moe-backend": FlagEffect(_W, "the MoE kernels"),
    "--enable-expert-parallel": FlagEffect(_W, "experts split across GPUs instead of each tensor"),
    "--host": FlagEffect(_N, "the listening address"),
    "--port": FlagEffect(_N, "the listening port"),
    "--api-key": FlagEffect(_N, "the endpoint's key"),
    "--served-model-name": FlagEffect(_N, "the model's name in the API"),
    "--chat-template": FlagEffect(_N, "the chat template (the prompt's text, not its length, in bench)"),
    "--reasoning-parser": FlagEffect(_N, "how the reply is split into reasoning and content"),
    "--tool-call-parser": FlagEffect(_N, "how tool calls are read from the reply"),
    "--enable-auto-tool-choice": FlagEffect(_N, "tool calls chosen by the model"),
    "--load-format": FlagEffect(_N, "how the weights load (start time only)"),
    "--download-dir": FlagEffect(_N, "where the weights are cached"),
    "--trust-remote-code": FlagEffect(_N, "the model's own code allowed"),
    "--disable-log-requests": FlagEffect(_N, "request logging"),
    "--disable-log-stats": FlagEffect(_N, "stats logging"),
    "--uvicorn-log-level": FlagEffect(_N, "the HTTP server's log level"),
}


def effect_of(flag: str) -> FlagEffect:
    """`flag` canonical (`--max-num-seqs`, `--no-enable-prefix-caching` reads as its positive)."""
    found = FLAGS.get(flag) or FLAGS.get("--" + flag.removeprefix("--no-"))
    return found or FlagEffect(Effect.UNKNOWN, "not in sparkcluster's table of vLLM flags: its effect is unknown")
