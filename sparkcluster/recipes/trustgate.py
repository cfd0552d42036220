"""What a recipe from a registry that is not trusted may set: the environment variables of trustenv.py's allow-list,
each with a value of its reviewed shape, and vLLM flags that neither run code, open the node's files, nor write what
clients send into a log. Anything else is someone else's code (or a way to it) on every node, refused like an
untrusted mod until the user says --trust or trusts the registry: round 5 (S1) ran a shell through
`PYTHONWARNINGS` and `BROWSER`, round 6 (F0) wrote an SSH key into ~/.ssh/authorized_keys through torch's
`TORCH_LOGS_OUT`/`TORCH_LOGS_FORMAT`, which a list of families minus "place" words let through, and (K2) read every
client's completion from the serving log that `--enable-log-outputs` fills.

Flags stay a refusal list (vLLM 0.32 has 430 option strings, the corpus uses a few dozen): 49 of the corpus's 72
recipes carry `--trust-remote-code` (all from the two registries the community trusts), 2
`--reasoning-parser-plugin FILE.py`, 22 `--chat-template NAME.jinja` (a file a mod drops beside vLLM), none a
worker, scheduler or middleware class, nor a logging or place flag. vLLM's parser takes any unambiguous prefix of a
flag (`--trust-remote` is `--trust-remote-code`), so a prefix of a refused flag is refused as that flag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping

from ..engine.nodetext import printable
from .command import FlagValue, canonical
from .trustenv import ALLOWED

# vLLM 0.32's flags that import code by name or from a file, open or write the node's files, send data elsewhere,
# or write what clients send and receive into the serving log (which the node's other users may read); canonical
# names (`--worker_cls` is `--worker-cls`).
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
    "--api-key": "replaces the key the endpoint checks with one the recipe's author knows",
    "--enable-log-requests": "writes every client's prompt into the serving log",
    "--enable-log-outputs": "writes every client's completion into the serving log",
    "--kv-events-config": "publishes the token ids of every request on a network socket",
}
# Flags refused for some values only: flag -> (the values, why).
CODE_VALUES: dict[str, tuple[frozenset[str], str]] = {
    # uvicorn's trace logs each request's scope, its headers with the client's `Authorization: Bearer KEY`
    "--uvicorn-log-level": (frozenset({"trace"}), "at trace writes every request's headers, API keys among them, "
                                                  "into the serving log"),
}
# vLLM's own flags that are a prefix of a refused one (measured on vLLM 0.32's parser): argparse takes an exact
# name as itself, so these are not abbreviations.
EXACT_PREFIXES = frozenset({"--model", "--reasoning-parser"})
# The last word of a key in a flag's JSON config (or of a dotted `--x.key` flag) that says its value is a place:
# `--compilation-config '{"debug_dump_path": "..."}'` writes there, `cache_dir` too, `--kv-events-config`'s
# `endpoint` listens or sends.
PLACE_KEY_WORDS = frozenset({"path", "paths", "dir", "dirs", "file", "files", "folder", "endpoint", "url", "uri",
                             "ip", "addr", "address", "host"})
# A JSON value (or a dotted `--x.key` value) naming Python by import path (`pkg.module.Class`): vLLM's configs
# import such names (the compilation backend, a custom speculative proposer, a pooler activation, ...).
IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
CHAT_TEMPLATE_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.jinja")


def env_refusal(name: str, value: str) -> str | None:
    """Why an untrusted recipe may not set `name` to `value` (None: it is on the allow-list, in its shape)."""
    shape = ALLOWED.get(name)
    if shape is None:
        return (f"is not one of the {len(ALLOWED)} variables an untrusted recipe may set (the community's recipes' "
                "own, each with a reviewed value); another name may open a file, a folder or an address of the node")
    if not shape.admits(value):
        # repr: an escape sequence shows as its characters (`'high\x1b[2J'`), neither run nor dropped
        return f"takes {shape.what}, not {value[:40]!r}{'...' if len(value) > 40 else ''}"
    return None


def flag_refusal(flag: str, value: FlagValue) -> str | None:
    """Why an untrusted recipe may not give `flag` (None: it only tunes)."""
    name = canonical(flag)
    base = name.split(".", 1)[0]
    words = value if isinstance(value, tuple) else (value,) if value is not None else ()
    refused = base if base in CODE_FLAGS or base in CODE_VALUES else _abbreviated(base)
    if refused in CODE_FLAGS:
        return CODE_FLAGS[refused] + ("" if refused == base else f" (vLLM reads {base} as {refused})")
    if refused in CODE_VALUES:
        values, why = CODE_VALUES[refused]
        if any(w.lower() in values for w in words):
            return why + ("" if refused == base else f" (vLLM reads {base} as {refused})")
    if base == "--chat-template":
        if any(not ({"{", "\n"} & set(w)) and not CHAT_TEMPLATE_FILE.fullmatch(w) for w in words):
            return ("reads a file of the node other than a template beside vLLM (write a plain NAME.jinja, which a "
                    "mod drops, or the template itself)")
        return None
    # vLLM reads `--x.key+ V` as appending V to the list under `key`: the `+` is no part of the key's name.
    dotted = name.rsplit(".", 1)[1].removesuffix("+") if "." in name else None
    for key, text in (item for w in words for item in _config_strings(w, dotted)):
        if key is not None and re.split("[_-]", key.lower())[-1] in PLACE_KEY_WORDS:
            return f"names a place of the node ({key}: {printable(text)!r})"
        if IMPORT_PATH.fullmatch(text):
            return f"names Python to import ({text!r})"
    return None


def _abbreviated(flag: str) -> str | None:
    """The refused flag that vLLM's parser would read `flag` as, an unambiguous prefix (any prefix of one, here:
    an ambiguous one only fails vLLM's start)."""
    if not flag.startswith("--") or flag == "--" or flag in EXACT_PREFIXES:
        return None
    return next((f for f in (*CODE_FLAGS, *CODE_VALUES) if f.startswith(flag) and f != flag), None)


def _config_strings(word: str, dotted: str | None) -> Iterator[tuple[str | None, str]]:
    """The strings inside a flag's JSON value (or the value of a `--config.key` flag), each with its key (None for
    one in a list at the top)."""
    if dotted is not None:
        yield dotted, word
    if not word.lstrip().startswith(("{", "[")):
        return
    try:
        doc = json.loads(word)
    except (ValueError, RecursionError):
        return
    yield from _strings(doc, None)


def _strings(doc: object, key: str | None) -> Iterator[tuple[str | None, str]]:
    if isinstance(doc, str):
        yield key, doc
    elif isinstance(doc, Mapping):
        for k, value in doc.items():
            yield from _strings(value, str(k))
    elif isinstance(doc, list):
        for value in doc:
            yield from _strings(value, key)


def refusals(env: Mapping[str, str], flags: Mapping[str, FlagValue]) -> list[str]:
    """Each variable and flag an untrusted recipe may not bring, with why, in the recipe's order."""
    found = [f"env {printable(name)} {why}" for name, value in env.items() if (why := env_refusal(name, value))]
    return found + [f"flag {printable(flag)} {why}" for flag, value in flags.items()
                    if (why := flag_refusal(flag, value))]
