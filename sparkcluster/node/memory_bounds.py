"""GB10's unified-memory bounds the field found, as data: a GB10's 128 GB is one pool for the CPU and the GPU, so
what vLLM reserves (`--gpu-memory-utilization`) and what a container's `/dev/shm` tmpfs may fill (`--shm-size`) come
out of the memory the OS itself runs in. Past these the node does not fail politely with an OOM kill: it freezes or
powers off. serve holds its flags to them (serving/headroom.py); the recipe reader names a recipe that asks more."""

from __future__ import annotations

import re

# 0.95 froze hosts (MiaAI's hard reboots, as hasso5703/dgx-spark-qwen38#2 reports them); 0.90 is vLLM's own default.
MAX_GPU_MEMORY_UTILIZATION = 0.90
GPU_MEMORY_SOURCE = "hasso5703/dgx-spark-qwen38#2 (MiaAI's hosts froze and needed hard reboots at 0.95)"
# 64 GB gave about 20 hard power-offs and 10 GB stopped them; eugr's README offers --shm-size=16g in place of
# --ipc=host. Above 16 GiB is refused.
MAX_SHM_BYTES = 16 * 1024**3
MAX_SHM_TEXT = "16g"
SHM_SOURCE = ("tonyd2wild/DeepSeek-v4-Flash-Vision-Exp-DSpark-1M-NVFP4-KV-2x-DGX-Spark#31 (shm_size 64 GB gave hard "
              "power-offs; 10 GB stopped them)")
# Docker's own reading of a size (go-units RAMInBytes): binary multiples, an optional `i` and `b`.
_SIZE = re.compile(r"(\d+(?:\.\d+)?) ?([kmgtp])?i?b?", re.IGNORECASE)
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}


def shm_bytes(text: str) -> int | None:
    """`--shm-size`'s value as Docker reads it ("10g", "10.24g", "64gb", "1024m"), in bytes; None if unreadable."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])
