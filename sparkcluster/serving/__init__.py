"""One model served across the nodes: eugr's command lines as values (`launch`), where they run (`runtime`:
the vllm_node container or a Python environment), Ray membership, readiness, the per-node operations
(`nodes`), the phases of `up`/`serve` (`phases`), the day-2 views (`status`) and the wing's sub-commands
(`commands`).

It consumes recipes (a typed Recipe and its mods) and observe (/metrics, node probes); it may import nccl,
staging, node and the engine; never bench or the CLI.
"""
