"""serve's flags, declared once: serve's parser (and up's, status's... for the runtime's) adds them from here, and so
does `bench --layouts`, which serves each layout as serve does, in its own words (`helps`) and declaring none of its
own. What they become is the typed ServeOptions (serving/cli.options, where argparse's Namespace stops)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine import flags
from ..nccl import thresholds
from .launch import LAUNCHERS, RUNTIMES


def set_value(text: str) -> tuple[str, str]:
    """`--set KEY=VALUE`: a placeholder of the recipe's command template."""
    key, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (KEY a template placeholder, e.g. max_model_len)")
    return key, value


@dataclass(frozen=True)
class Flag:
    """One of serve's flags: its option as the user writes it, and argparse's add_argument keywords (its help too)."""

    option: str
    dest: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def default(self) -> Any:
        """What it holds when not given."""
        if "default" in self.kwargs:
            return self.kwargs["default"]
        return {"store_false": True, "store_true": False}.get(self.kwargs.get("action", ""))


def _flags(*declared: Flag) -> dict[str, Flag]:
    return {f.dest: f for f in declared}


FLAGS = _flags(
    Flag("--runtime", "runtime", {"choices": RUNTIMES, "help": (
        "docker: the vllm_node container per node (eugr's setup); host: processes from the inventory's python_env. "
        "Default: the inventory's `runtime` (which `bootstrap --runtime` records), else docker; a running serve is "
        "read with the runtime it started with")}),
    Flag("--image", "image", {"type": flags.image,
                              "help": "container image (default: the recipe's container, else vllm-node)"}),
    Flag("--docker-arg", "docker_arg", {"action": "append", "metavar": "ARG", "help": (
        "an extra `docker run` argument, e.g. --docker-arg=--shm-size=16g (repeatable)")}),
    Flag("--up-timeout", "up_timeout", {"type": flags.seconds, "default": 180.0,
                                        "help": "seconds for every node to join Ray (default 180)"}),
    Flag("--tp", "tp", {"type": flags.count, "help": (
        "tensor parallel size; TP x PP = the nodes (one GPU each); default: the recipe's, else the nodes / PP")}),
    Flag("--pp", "pp", {"type": flags.count,
                        "help": "pipeline parallel size across nodes (default: the recipe's, else 1)"}),
    Flag("--replicas", "replicas", {"type": flags.count, "help": (
        "engines behind vLLM's router (vllm-router) on the head at the endpoint's port, TP x PP each on nodes/N "
        "nodes; replicas x TP x PP = the nodes (default: the recipe's, else the inventory's `replicas`, else 1)")}),
    Flag("--model", "model", {"help": (
        "ORG/NAME[@REVISION] (staged on every node first), or a path on the nodes (default: the recipe's, else the "
        "inventory's first `models:` entry)")}),
    Flag("--recipe", "recipe", {"help": (
        "a bundled recipe (default, gpt-oss-120b, nemotron-3-super), @REGISTRY/NAME, or a recipe file "
        "(sparkcluster's, eugr's v1 or sparkrun's v2)")}),
    Flag("--launcher", "launcher", {"choices": LAUNCHERS, "help": (
        "ray (eugr's setup) or native (vLLM's own --nnodes multi-node mode); default: the recipe's, else the "
        "inventory's `launcher`, else ray")}),
    Flag("--set", "sets", {"action": "append", "type": set_value, "metavar": "KEY=VALUE", "default": [], "help": (
        "fill a placeholder of the recipe's command template (beats the recipe's defaults and --tp/--pp/--port; "
        "extra flags after -- still win); repeatable")}),
    Flag("--trust", "trust", {"action": "store_true", "help": (
        "let a recipe from a registry that is not trusted run its mods and set the env and vLLM flags that run code "
        "or open the node's files")}),
    Flag("--port", "port", {"type": flags.port, "help": "API port (default 8000)"}),
    Flag("--served-model-name", "served_model_name", {"help": "the name clients ask for (default: the model)"}),
    Flag("--ready-timeout", "ready_timeout", {"type": flags.seconds, "default": 1800.0, "help": (
        "seconds for vLLM to load and answer (default 1800: large models take 10-15 min)")}),
    Flag("--no-verify", "verify", {"action": "store_false", "help": "skip the NCCL probe before vLLM starts"}),
    Flag("--allow-fallback", "allow_fallback", {"action": "store_true", "help": (
        "serve even when the probe finds NCCL off RDMA (socket or management network)")}),
    Flag("--min-busbw", "min_busbw", {"type": flags.bandwidth, "help": (
        "bus bandwidth the probe needs on GPUs, GB/s. Default per topology, as verify's: "
        f"{thresholds.help_text()}. On CPU (gloo, the simulator) no speed is held")}),
    Flag("--force", "force", {"action": "store_true", "help": (
        "serve although a setting is above what GB10 keeps up under (--gpu-memory-utilization above 0.90, "
        "--shm-size above 16g), with a warning")}),
    Flag("--no-cache-dirs", "cache_dirs", {"action": "store_false", "help": (
        "do not keep compile/JIT caches (vLLM, Inductor, Triton, FlashInfer, CuTeDSL) in each node's "
        "~/.cache/sparkcluster/jit between serves")}),
)
RUNTIME_FLAGS = ("runtime", "image", "docker_arg", "up_timeout")  # every serving command's: how the runtime runs
RECIPE_FLAGS = ("sets", "trust")  # what a recipe becomes: serve's and `recipes show`'s


def add_serve_flags(p: argparse.ArgumentParser | argparse._ArgumentGroup, dests: Sequence[str],
                    helps: Callable[[Flag], str] | None = None) -> None:
    """serve's flags named by `dests`, in that order, on `p`; `helps` words them for another command."""
    for dest in dests:
        flag = FLAGS[dest]
        p.add_argument(flag.option, dest=flag.dest, **{**flag.kwargs, **({"help": helps(flag)} if helps else {})})


def given(args: argparse.Namespace, dests: Sequence[str]) -> list[str]:
    """The options of serve's flags among `dests` that were given (hold other than their default), in that order."""
    return [FLAGS[dest].option for dest in dests if getattr(args, dest) != FLAGS[dest].default]


def words(args: argparse.Namespace, dests: Sequence[str]) -> list[str]:
    """serve's flags among `dests` that were given, in that order, as the words that give serve them again (a
    `serve` line to paste: `bench --layouts`' best layout)."""
    out: list[str] = []
    for dest in dests:
        flag, value = FLAGS[dest], getattr(args, dest)
        action = flag.kwargs.get("action")
        if action in ("store_true", "store_false"):
            out += [flag.option] if value != flag.default else []
        elif action == "append":
            for item in value or ():
                out += [flag.option, "=".join(item)] if isinstance(item, tuple) else [f"{flag.option}={item}"]
        elif isinstance(value, float):
            out += [flag.option, f"{value:g}"] if value != flag.default else []
        elif value:
            out += [flag.option, str(value)]
    return out


def add_supervise_flags(p: argparse.ArgumentParser) -> None:
    """serve's own: whether the supervisor watches the serve (serving/supervision.py), and where it posts incidents."""
    p.add_argument("--no-supervise", dest="supervise", action="store_false", help=(
        "leave the supervisor out: nothing watches the serve, nothing restarts it (default: a supervisor on the "
        "head notices a dead, wedged or lost rank within two minutes and serves again; `sparkcluster supervise "
        "on|off` later)"))
    p.add_argument("--notify", type=flags.webhook_url, metavar="URL", help=(
        "POST each of the supervisor's incidents to URL as JSON, with a `text` field a chat webhook shows"))
