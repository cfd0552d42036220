"""Watching a served cluster: vLLM's /metrics read and parsed (`prometheus`, `scrape`), each node's GPU, memory
and serving processes probed (`nodeprobe`), and what `top` shows (`top`). Shared by serving (`status`, `top`'s
wiring) and bench (its server-side figures).

It is told what to look for (an endpoint, each node's process checks) as values; it may import node and the
engine, never serving.
"""
