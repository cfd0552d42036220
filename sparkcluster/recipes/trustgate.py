"""What a recipe from a registry that is not trusted may set: environment variables that only tune, and vLLM flags
that neither run code nor open the node's files. Anything else is someone else's code on every node (round 5, S1:
`PYTHONWARNINGS=all:0:antigravity.x:0:0` with `BROWSER="/bin/sh -c ..."` runs a shell at vLLM's start), refused
like an untrusted mod until the user says --trust or trusts the registry.

The allow-list was measured on the community's real corpus (shared/reference/community-corpus, snapshot
2026-11-25: eugr's 35 v1 recipes and Spark Arena's 37 v2 recipes; every `env:` key, an override's `env:`, and every
`NAME=value` word before a command's `vllm`): 40 distinct names in 96 settings, by family VLLM_* 78 settings (30
names), PYTORCH_* 4 (1), TORCH_* 3 (1), OMP_* 2 (1), and 9 settings of 7 names that are kernel libraries' own
switches (B12X_* 2, CUTE_DSL_ARCH 2, TILELANG_CLEANUP_TEMP_FILES 2, DG_JIT_USE_NVRTC, GLM52_BIND_HOST_TRITON,
LAMPORT_RS_SCONV), taken here by exact name. No recipe sets NCCL_*, CUDA_* or HF_* (allowed as tuning families all
the same), nor any LD_*, PYTHON*, shell or browser variable; every one of the 40 passes this gate. Flags: 49 of the
72 recipes carry `--trust-remote-code` (all from the two registries the community trusts), 2
`--reasoning-parser-plugin FILE.py`, 22 `--chat-template NAME.jinja` (a file a mod drops beside vLLM), none a
worker, scheduler or middleware class.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping

from ..engine.secret_names import is_secret_name
from .command import FlagValue, canonical

ENV_FAMILIES = ("VLLM_", "NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_", "HF_")
# Kernel libraries' switches that community recipes set by name (each a flag or an architecture, read by the library
# in the vLLM process): allowed by exact name, never as a family.
CORPUS_NAMES = frozenset({"B12X_MLA_SM120_UNIFIED", "B12X_MOE_FORCE_A8", "CUTE_DSL_ARCH", "DG_JIT_USE_NVRTC",
                          "TILELANG_CLEANUP_TEMP_FILES", "GLM52_BIND_HOST_TRITON", "LAMPORT_RS_SCONV"})
# The last word of a name, in any family, that says its value is a place, a program or an address rather than a
# setting: CUDA_INJECTION64_PATH and NCCL_NET_PLUGIN load a library, NCCL_CONF_FILE reads more variables,
# NCCL_DEBUG_FILE overwrites a file, CUDA_HOME picks the compiler JIT runs, VLLM_RUST_FRONTEND_PATH is a program,
# HF_ENDPOINT receives the user's HF token. Only the last word, and not in a switch: VLLM_XGRAMMAR_CACHE_MB and
# VLLM_DISABLE_COMPILE_CACHE are settings, VLLM_ASSETS_CACHE and HF_HUB_CACHE are folders.
PLACE_WORDS = frozenset({"PATH", "PATHS", "FILE", "DIR", "HOME", "ROOT", "CACHE", "PLUGIN", "PLUGINS", "LIB",
                         "LIBS", "LIBRARY", "LIBRARIES", "SO", "BIN", "EXE", "EXECUTABLE", "CMD", "COMMAND", "SCRIPT",
                         "HOOK", "MODULE", "MODULES", "CLS", "CLASS", "ENDPOINT", "URL", "URI", "PRELOAD"})
SWITCH_WORDS = frozenset({"DISABLE", "ENABLE", "USE", "SKIP"})  # a name that turns something on or off
# Names of the families that run code, change what the server lets its clients do, or send data elsewhere,
# whatever their last word.
NAMED_REFUSALS = {
    "VLLM_SERVER_DEV_MODE": "opens vLLM's development endpoints (collective_rpc runs methods on every worker)",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "lets vLLM unpickle what its processes are sent",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "lets API clients load adapters from any path of the node",
    "VLLM_USAGE_STATS_SERVER": "sends the node's usage reports to another server",
    "OMP_TOOL_VERBOSE_INIT": "writes the OpenMP runtime's log to a file it names",
    "VLLM_LOGGING_STREAM": "names what Python logging imports (ext://module.object)",
    "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "lets torch.load unpickle a checkpoint, which runs the code it holds",
}

# vLLM 0.32's flags that import code by name or from a file, open or write the node's files, or send data
# elsewhere; canonical names (`--worker_cls` is `--worker-cls`).
CODE_FLAGS = {
    "--trust-remote-code": "runs the Python files of the model's repository",
    "--worker-cls": "imports a worker class by name", "--worker-extension-cls": "imports a class into every worker",
    "--scheduler-cls": "imports a scheduler class by name", "--middleware": "imports ASGI middleware by name",
    "--logits-processors": "imports logits processors by name",
    "--tool-parser-plugin": "runs a Python file", "--reasoning-parser-plugin": "runs a Python file",
    "--io-processor-plugin": "loads a plugin", "--model-class-overrides": "replaces model classes by name",
    "--config": "reads more flags from a file of the node, past this check",
    "--logging-config": "configures Python logging, whose configuration can construct any class",
    "--log-config-file": "configures Python logging from a file, which can construct any class",
    "--kv-transfer-config": "loads a KV connector module by path", "--ec-transfer-config": "loads a connector module",
    "--ec-manager-config": "imports an encoder cache manager class",
    "--allowed-local-media-path": "lets every API client read the node's files through file:// media URLs",
    "--trust-request-chat-template": "runs chat templates that API clients send",
    "--tool-server": "has the model call tools on another server",
    "--otlp-traces-endpoint": "sends request traces to another server",
    "--hf-config-path": "reads a model configuration from a path of the node",
    "--download-dir": "writes downloads to a folder of the node",
    "--lora-modules": "loads adapters from paths of the node",
    "--ssl-keyfile": "reads a file of the node", "--ssl-certfile": "reads a file of the node",
    "--ssl-ca-certs": "reads a file of the node", "--uds": "creates a socket at a path of the node",
    "--mm-encoder-fp8-scale-path": "reads a file of the node",
    "--mm-encoder-fp8-scale-save-path": "writes a file of the node",
    "--profiler-config": "writes traces to a folder of the node",
    "--hf-token": "is a secret, which no recipe should carry",
}
# A JSON value (or a dotted `--x.key` value) naming Python by import path (`pkg.module.Class`): vLLM's configs
# import such names (the compilation backend, a custom speculative proposer, a pooler activation, ...).
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
CHAT_TEMPLATE_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.jinja")


def env_refusal(name: str) -> str | None:
    """Why an untrusted recipe may not set `name` (None: it only tunes)."""
    if name in CORPUS_NAMES:
        return None
    if not name.startswith(ENV_FAMILIES):
        return (f"is not a tuning variable (those are {', '.join(f + '*' for f in ENV_FAMILIES)} and a few kernel "
                "switches); the dynamic loader, Python, the shell and other programs read such names to run code")
    if is_secret_name(name):  # masked in every display: the user could not read what they would run
        return "has a secret's name, whose value no display shows"
    if name in NAMED_REFUSALS:
        return NAMED_REFUSALS[name]
    if "TRUST_REMOTE_CODE" in name:
        return "lets a library run the Python files of what it downloads"
    words = name.split("_")
    last = words[-1]
    if last in PLACE_WORDS and not SWITCH_WORDS & set(words):
        return f"names a {last.lower()} (a place, a program or an address), not a setting"
    return None


def flag_refusal(flag: str, value: FlagValue) -> str | None:
    """Why an untrusted recipe may not give `flag` (None: it only tunes)."""
    name = canonical(flag)
    base = name.split(".", 1)[0]
    if base in CODE_FLAGS:
        return CODE_FLAGS[base]
    words = value if isinstance(value, tuple) else (value,) if value is not None else ()
    if base == "--chat-template":
        if any(not ({"{", "\n"} & set(w)) and not CHAT_TEMPLATE_FILE.fullmatch(w) for w in words):
            return ("reads a file of the node other than a template beside vLLM (write a plain NAME.jinja, which a "
                    "mod drops, or the template itself)")
        return None
    named = next((s for w in words for s in _config_strings(w, dotted="." in name) if IMPORT_PATH.fullmatch(s)), None)
    if named is not None:
        return f"names Python to import ({named!r})"
    return None


def _config_strings(word: str, dotted: bool) -> Iterator[str]:
    """The strings inside a flag's JSON value (or the value of a `--config.key` flag)."""
    if dotted:
        yield word
    if not word.lstrip().startswith(("{", "[")):
        return
    try:
        doc = json.loads(word)
    except ValueError:
        return
    yield from _strings(doc)


def _strings(doc: object) -> Iterator[str]:
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, Mapping):
        for value in doc.values():
            yield from _strings(value)
    elif isinstance(doc, list):
        for value in doc:
            yield from _strings(value)


def refusals(env: Mapping[str, str], flags: Mapping[str, FlagValue]) -> list[str]:
    """Each variable and flag an untrusted recipe may not bring, with why, in the recipe's order."""
    found = [f"env {name} {why}" for name in env if (why := env_refusal(name)) is not None]
    return found + [f"flag {flag} {why}" for flag, value in flags.items() if (why := flag_refusal(flag, value))]
