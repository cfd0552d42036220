"""The Ansible-like core: inventories (validated before any SSH), one SSH transport per host, commands as values,
facts gathered once, playbooks of typed idempotent steps (`steps/`), the runner with its
events and reports, and the parallel map.

It knows nothing of DGX Sparks, vLLM, Ray or NCCL, and imports nothing from the wings above it (node, staging, nccl,
serving, bench, sim, cli); tests/unit/test_layout.py keeps it so.
"""
