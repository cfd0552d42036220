"""Every server serve starts that answers HTTP (a vLLM's API server, the router) listens on its node's loopback,
behind the key guard (keyguard.py, its parent) at the port clients use: these are those command lines, as values.

vLLM checks its API key only under /v1 (its SageMaker route, /invocations, generates without it), and vllm-router
checks none (its admin API, /add_worker and the like, would take a stranger's worker from anyone on the LAN): no
option of either closes a path, so the guard does (issue 46, F1/F2). The server's own port, the guard's + 20000, is
reached only on its node."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from . import keyguard
from .launch import Launcher, Node, ServeArgs, vllm_serve_argv

LOOPBACK = "127.0.0.1"
INNER_OFFSET = 20000  # a guarded server's own port: its public port + this (8000 -> 28000), on the loopback only


def _program(path: str) -> str:
    """A module's code as a node's `python3 -c` runs it: without its docstring and comments, which stay here."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    tree.body = [node for node in tree.body if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                                                    and isinstance(node.value.value, str))]
    return ast.unparse(tree)


GUARD_SOURCE = _program(keyguard.__file__)


def inner_port(port: int) -> int:
    """Where a guarded server listens on its node's loopback: the guard's port shifted clear of the replicas' ports
    (port+1...), Ray's (6379, 8265, 10002-19999) and vLLM's."""
    return port + INNER_OFFSET if port + INNER_OFFSET <= 65535 else port - INNER_OFFSET


def guarded(argv: Sequence[str], port: int) -> list[str]:
    """`argv` (a server listening on the loopback at inner_port(port)) as the key guard's child, the guard answering
    on every address at `port`. The key reaches the guard as VLLM_API_KEY, on stdin as every secret (runtime.py)."""
    return ["python3", "-c", GUARD_SOURCE, "--listen", f"0.0.0.0:{port}", "--upstream", str(inner_port(port)),
            "--", *argv]


def engine_argv(args: ServeArgs, launcher: Launcher, node: Node, nnodes: int) -> list[str]:
    """`vllm serve` for one node (launch.vllm_serve_argv): the rank that answers HTTP (rank 0; the others are headless
    or Ray's) on its node's loopback, behind the key guard at `args.port`."""
    if not node.is_head:
        return vllm_serve_argv(args, launcher, node, nnodes)
    return guarded(vllm_serve_argv(replace(args, port=inner_port(args.port), host=LOOPBACK), launcher, node, nnodes),
                   args.port)
