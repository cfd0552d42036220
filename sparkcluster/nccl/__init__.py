"""Proof of the path the GPUs talk over: the NCCL_DEBUG=INFO log reader, the verdict with its causes and fixes,
the probe (`probe.py`, a standalone script copied to the nodes: standard library at import time, torch inside),
`verify` (the probe across the nodes in their comm env) and the reports of both.

It may import the engine; never staging, serving, bench or the CLI.
"""
