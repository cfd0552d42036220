"""The environment a recipe from a registry that is not trusted may set: an allow-list of names, each with the shape
its value must have. Round 6 (F0) showed why a family of names minus a list of "place" words cannot hold: torch
reads TORCH_LOGS_OUT as a file to append every log record to and TORCH_LOGS_FORMAT as the text that starts each
record, so three TORCH_* variables wrote an attacker's key into ~/.ssh/authorized_keys; TORCH_TRACE,
PYTORCH_TUNABLEOP_FILENAME and VLLM_TUNED_CONFIG_FOLDER name places, VLLM_HOST_IP and NCCL_COMM_ID addresses,
NCCL_SOCKET_IFNAME an interface, and HF_HUB_OFFLINE=0 sends the nodes to the network. A library adds such a name
in any release; only a name someone has read, with a value that cannot be a place, is safe to take unreviewed.

The names are every variable the community's corpus sets (shared/reference/community-corpus, snapshot 2026-11-25:
eugr's 35 v1 recipes and Spark Arena's 37 v2 recipes; each `env:`, an override's `env:` and each `NAME=value` word
before a command's `vllm`): 40 names in 96 settings. Each value shape was reviewed against what reads it (vLLM
0.32's envs.py where it is vLLM's; the kernel libraries' switches are read as 0/1), and admits the corpus's own
values and nothing that can name a file, a folder, an address, an interface, a program or a format string: whole
numbers, 0/1 switches, a few fixed words, PyTorch's allocator options and Ray's placement strategy. Anything else
is a choice for the user (`--trust`, or trusting the registry), who can read the recipe first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Shape:
    """What a variable's value may be: `pattern` matches the whole value (after `json` compacts it: keys sorted, no
    spaces); `what` says it in words for the refusal."""

    what: str
    pattern: re.Pattern[str]
    json: bool = False

    def admits(self, value: str) -> bool:
        if self.json:
            try:
                value = json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))
            except (ValueError, RecursionError):
                return False
        return self.pattern.fullmatch(value) is not None


def _words(*words: str) -> Shape:
    return Shape(f"one of {', '.join(words)}", re.compile("|".join(map(re.escape, words))))


SWITCH = Shape("0 or 1", re.compile("[01]"))
COUNT = Shape("a whole number of at most 9 digits", re.compile("[0-9]{1,9}"))
# PyTorch's CUDA caching allocator options (c10/cuda/CUDAAllocatorConfig): key:value pairs, comma-separated. Only the
# numeric and boolean keys and the two backends; none of them opens anything.
_ALLOC_OPTION = (r"(?:expandable_segments:(?:True|False)|max_split_size_mb:[0-9]{1,9}"
                 r"|garbage_collection_threshold:(?:0?\.[0-9]{1,6}|1\.0?)|roundup_power2_divisions:[0-9]{1,4}"
                 r"|backend:(?:native|cudaMallocAsync))")
ALLOC_CONF = Shape("comma-separated allocator options (expandable_segments:True|False, max_split_size_mb:N, "
                   "garbage_collection_threshold:0.N, roundup_power2_divisions:N, backend:native|cudaMallocAsync)",
                   re.compile(f"{_ALLOC_OPTION}(?:,{_ALLOC_OPTION})*"))
# Ray's placement group strategies, the only key the corpus's executor config sets (a placement group's other
# options name resources and bundles, and a runtime_env could install and run anything).
PLACEMENT = Shape('{"placement_group_options": {"strategy": PACK|SPREAD|STRICT_PACK|STRICT_SPREAD}}',
                  re.compile(r'\{"placement_group_options":\{"strategy":"(?:PACK|SPREAD|STRICT_PACK|STRICT_SPREAD)"\}\}'),
                  json=True)

# name -> the shape of its value: the one table an untrusted recipe's environment is checked against.
ALLOWED: Final[dict[str, Shape]] = {
    # kernel libraries' switches, read in the vLLM process
    "B12X_MLA_SM120_UNIFIED": SWITCH, "B12X_MOE_FORCE_A8": SWITCH, "DG_JIT_USE_NVRTC": SWITCH,
    "GLM52_BIND_HOST_TRITON": SWITCH, "LAMPORT_RS_SCONV": SWITCH, "TILELANG_CLEANUP_TEMP_FILES": SWITCH,
    "CUTE_DSL_ARCH": Shape("a GPU architecture, sm_NN or sm_NNN with an optional a or f", re.compile("sm_[0-9]{2,3}[af]?")),
    # OpenMP, PyTorch
    "OMP_NUM_THREADS": COUNT,
    "PYTORCH_CUDA_ALLOC_CONF": ALLOC_CONF,
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": _words("0", "1", "2", "3"),
    # vLLM's (0.32 and the community's builds)
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": SWITCH,
    "VLLM_B12X_MLA_CKV_GATHER": SWITCH,
    "VLLM_B12X_MLA_SPEC_EXTEND_AS_DECODE": SWITCH,
    "VLLM_DCP_QUERY_SPLIT": COUNT,
    "VLLM_DISTRIBUTED_EXECUTOR_CONFIG": PLACEMENT,
    "VLLM_FLASHINFER_ALLREDUCE_BACKEND": _words("auto", "trtllm", "mnnvl"),
    "VLLM_FLOAT32_MATMUL_PRECISION": _words("highest", "high", "medium"),
    "VLLM_MARLIN_USE_ATOMIC_ADD": SWITCH,
    "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS": SWITCH,
    "VLLM_MEMORY_PROFILE_INCLUDE_ATTN": SWITCH,
    "VLLM_MOE_SKIP_PADDING": SWITCH,
    "VLLM_SLEEP_WHEN_IDLE": SWITCH,
    "VLLM_SPARSE_INDEXER_MAX_LOGITS_MB": COUNT,
    "VLLM_TRITON_MLA_SPARSE": SWITCH,
    "VLLM_TRITON_MLA_SPARSE_HEAD_BLOCK_SIZE": COUNT,
    "VLLM_TRITON_MLA_SPARSE_QUERY_CHUNK_SIZE": COUNT,
    "VLLM_TRITON_MLA_SPARSE_TOPK_CHUNK_SIZE": COUNT,
    "VLLM_USE_AOT_COMPILE": SWITCH,
    "VLLM_USE_B12X_FP8_GEMM": SWITCH, "VLLM_USE_B12X_MHC": SWITCH, "VLLM_USE_B12X_MOE": SWITCH,
    "VLLM_USE_B12X_SPARSE_INDEXER": SWITCH, "VLLM_USE_B12X_WO_PROJECTION": SWITCH,
    "VLLM_USE_BREAKABLE_CUDAGRAPH": SWITCH,
    "VLLM_USE_DEEP_GEMM": SWITCH,
    "VLLM_USE_FLASHINFER_MOE_FP16": SWITCH,
    "VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": SWITCH,
    "VLLM_USE_FLASHINFER_SAMPLER": SWITCH,
    "VLLM_USE_MEGA_AOT_ARTIFACT": _words("-1", "0", "1"),  # vLLM compares with "1"; a corpus recipe writes -1
    "VLLM_USE_V2_MODEL_RUNNER": SWITCH,
}
