"""What the served cluster delivers, measured the way the DGX Spark community measures it: the bench wing owns
load generation (an asyncio client holding C streamed requests in flight), the measurement (per-request
timelines turned into prefill, generation and peak tok/s and TTFT / ITL / E2E percentiles, with vLLM's
/metrics sampled beside them), and the results as a table, CSV, a PNG and a comparison with published
reference rows. It may import serving (to find the endpoint `serve` recorded, and recipes' reference rows),
nccl, staging and engine; never the CLI, which only wires `bench` to it.
"""
