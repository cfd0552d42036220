"""One model served across the nodes: eugr's command lines as values (`launch`), where they run (`runtime`:
the vllm_node container or a Python environment), Ray membership, readiness, recipes, the per-node operations
(`nodes`), the phases of `up`/`serve` (`phases`), the day-2 views (`status`) and the wing's sub-commands
(`commands`).

It may import nccl, staging and the engine; never bench or the CLI.
"""
