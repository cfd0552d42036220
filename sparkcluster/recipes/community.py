"""The community's recipe formats turned into a Recipe: eugr/spark-vllm-docker's v1 (`recipe_version: "1"`, a
`command:` template over `defaults`) and sparkrun's v2 (`model`, `runtime`, `defaults`, an optional `command`,
node bounds, `include`/`overrides`). Each is read the way its own tool reads it, then the rendered `vllm serve`
line is taken apart: the flags sparkcluster sets itself become the defaults of its options."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..engine.errors import UsageError
from ..engine.flags import is_image
from ..engine.modelref import revision_problem
from ..engine.yamlsource import SourceList, SourceMap, describe
from . import values as recipe_values
from .command import FlagValue, VllmLine, as_int, canonical, parse_vllm_line, render
from .types import Format, Inputs, Mod, Recipe, RecipeLauncher

EUGR_KEYS = {"recipe_version", "name", "container", "command", "description", "model", "mods", "defaults", "env",
             "build_args", "cluster_only", "solo_only"}
# sparkrun keys that change nothing about what runs on a node (descriptions, benchmarks, timeouts, image builds).
V2_IGNORED = {"recipe_version", "sparkrun_version", "min_sparkrun_version", "name", "description", "metadata",
              "benchmark", "readiness", "capabilities", "unsupported_capabilities", "runtime_version", "builder",
              "builder_config", "runtime_config", "executor_config", "runtime_cache", "maintainer", "build_args",
              "tuning", "mode"}
V2_USED = {"model", "model_revision", "runtime", "container", "command", "defaults", "env", "mods", "min_nodes",
           "max_nodes", "solo_only", "cluster_only", "include", "overrides", "executor"}
# Where and how sparkrun places containers, which sparkcluster's one-container-per-node layout cannot follow.
PLACEMENT = {"containers", "layout", "scheduler", "cluster_config", "distribution_config"}
HOOKS = {"pre_exec", "post_exec", "post_commands", "stop_after_post"}
# sparkrun's launcher per runtime: `vllm` is vllm-distributed (vLLM's own multi-node mode) unless the recipe names
# Ray; its deprecated eugr-vllm runs eugr's launcher, whose default is no Ray either.
VLLM_RUNTIMES: dict[str, RecipeLauncher] = {"vllm": "native", "vllm-distributed": "native", "vllm-ray": "ray",
                                            "eugr-vllm": "native"}
# sparkrun builds a command-less recipe's line from these defaults keys (runtimes/vllm's flag map); others are
# not emitted.
V2_FLAG_MAP = {
    "port": "--port", "host": "--host", "tensor_parallel": "-tp", "pipeline_parallel": "-pp",
    "gpu_memory_utilization": "--gpu-memory-utilization", "max_model_len": "--max-model-len",
    "max_num_batched_tokens": "--max-num-batched-tokens", "max_num_seqs": "--max-num-seqs",
    "served_model_name": "--served-model-name", "dtype": "--dtype", "quantization": "--quantization",
    "enforce_eager": "--enforce-eager", "enable_prefix_caching": "--enable-prefix-caching",
    "trust_remote_code": "--trust-remote-code", "distributed_executor_backend": "--distributed-executor-backend",
    "kv_cache_dtype": "--kv-cache-dtype", "load_format": "--load-format", "speculative_config": "--speculative-config",
    "compilation_config": "--compilation-config", "tool_call_parser": "--tool-call-parser",
    "reasoning_parser": "--reasoning-parser", "enable_auto_tool_choice": "--enable-auto-tool-choice",
    "chat_template": "--chat-template", "block_size": "--block-size",
}
V2_BOOL_KEYS = {"enforce_eager", "enable_prefix_caching", "trust_remote_code", "enable_auto_tool_choice"}
ModResolver = Callable[[str, int], Mod]  # (as written, its line) -> the mod found


def line_of(doc: Any, key: str) -> int:
    return recipe_values.key_line(doc, key)


def eugr_v1(doc: SourceMap, shown: str, name: str, inputs: Inputs, resolve_mod: ModResolver,
            warnings: list[str]) -> Recipe:
    for key in doc:
        if key not in EUGR_KEYS:
            warnings.append(f"{shown}:{line_of(doc, key)}: {key!r} is not an eugr v1 key; ignored, as run-recipe.py does")
    for key in ("name", "container", "command"):
        if key not in doc:
            raise UsageError(f"{shown}:1: an eugr v1 recipe needs `{key}:` (run-recipe.py requires name, "
                             "recipe_version, container and command)", f"add `{key}:`")
    defaults = _solo(doc, _defaults(doc, shown), inputs, shown)
    values = {**defaults, **inputs.options, **inputs.sets}
    where = f"{shown}:{line_of(doc, 'command')}"
    command = _text(doc, "command", shown) or ""
    line = parse_vllm_line(render(command, values, where, "eugr"), where)
    # eugr's runner starts no Ray unless the command names it (its no-Ray default since 2026-07-01)
    return _recipe(doc, shown, name, "eugr v1", line, where, values, inputs, resolve_mod, warnings,
                   cluster_only=_flag(doc, "cluster_only", shown), solo_only=_flag(doc, "solo_only", shown),
                   launcher="native")


def sparkrun_v2(doc: SourceMap, shown: str, name: str, inputs: Inputs, resolve_mod: ModResolver,
                warnings: list[str], nodes: int | None) -> Recipe:
    for key in doc:
        if key in HOOKS:
            raise UsageError(f"{shown}:{line_of(doc, key)}: {key} hooks are not run by sparkcluster",
                             "put what it does in a mod (a directory with run.sh) and list it under mods:")
        if key in PLACEMENT:
            raise UsageError(f"{shown}:{line_of(doc, key)}: {key} places containers in a way sparkcluster cannot "
                             "honour (one vllm_node per node, TP x PP = the nodes selected)",
                             f"remove {key}: and choose the nodes with --limit, --tp and --pp")
        if key not in V2_USED and key not in V2_IGNORED:
            warnings.append(f"{shown}:{line_of(doc, key)}: {key!r} is not a key sparkcluster uses; ignored "
                            "(sparkrun sweeps unknown keys into runtime_config)")
    shm = _executor_shm(doc, shown)
    if shm is not None:
        warnings.append(shm)
    runtime = _text(doc, "runtime", shown, required=False) or ""
    command = _text(doc, "command", shown, required=False)
    if not runtime and command:
        runtime = _sniff(command)
    if runtime and runtime not in VLLM_RUNTIMES:
        raise UsageError(f"{shown}:{line_of(doc, 'runtime')}: runtime {runtime!r} is not vLLM; sparkcluster serves "
                         "vLLM recipes only", "use sparkrun for this recipe, or a vLLM recipe of the same model")
    executor = doc.get("executor")
    if executor not in (None, "docker"):
        raise UsageError(f"{shown}:{line_of(doc, 'executor')}: executor {executor!r} cannot be honoured",
                         "remove it: sparkcluster runs the image with docker, or the host runtime (--runtime host)")
    model = _text(doc, "model", shown) or ""
    revision = _text(doc, "model_revision", shown, required=False)
    defaults = _defaults(doc, shown)
    env_doc = doc
    container_override = None
    for layer in _matching_overrides(doc, shown, nodes, {**defaults, **inputs.sets}, warnings):
        defaults.update(_defaults(layer, shown))
        if "env" in layer:
            env_doc = SourceMap(doc.line)
            for key in doc:
                env_doc._set(key, doc[key], line_of(doc, key))
            env_doc._set("env", {**recipe_values.env(doc, shown), **recipe_values.env(layer, shown)},
                         line_of(layer, "env"))
        if "container" in layer:
            container_override = _container(layer, shown)
    values = {**_solo(doc, defaults, inputs, shown), "model": model, **inputs.options, **inputs.sets}
    _resolve_iteratively(values, shown)
    if command:
        where = f"{shown}:{line_of(doc, 'command')}"
        rendered = render(command, values, where, "sparkrun")
    else:
        where = f"{shown}:{line_of(doc, 'defaults') if 'defaults' in doc else 1}"
        rendered = _built_line(model, values)
    line = parse_vllm_line(rendered, where)
    recipe = _recipe(env_doc if env_doc is not doc else doc, shown, name, "sparkrun v2", line, where, values, inputs,
                     resolve_mod, warnings, cluster_only=_flag(doc, "cluster_only", shown),
                     solo_only=_flag(doc, "solo_only", shown), launcher=VLLM_RUNTIMES.get(runtime or "vllm"))
    min_nodes, max_nodes = _count(doc, "min_nodes", shown), _count(doc, "max_nodes", shown)
    return replace(recipe, flags=_with_revision(recipe.flags, revision, shown, line_of(doc, "model_revision")),
                   min_nodes=min_nodes or recipe.min_nodes, max_nodes=max_nodes or recipe.max_nodes,
                   container=container_override or recipe.container)


def _with_revision(flags: Mapping[str, FlagValue], revision: str | None, shown: str, line: int) -> dict[str, FlagValue]:
    """sparkrun serves `model_revision` as the plain model id with the revision beside it: vLLM takes it as
    `--revision` (and the tokenizer's follows it), where `ORG/NAME@<sha>` is a model vLLM cannot resolve; serve
    stages the revision that flag names. A `--revision` the command writes itself stays."""
    if revision is None or any(canonical(flag) == "--revision" for flag in flags):
        return dict(flags)
    problem = revision_problem(revision)
    if problem:  # it names a path on every node (refs/<revision>)
        raise UsageError(f"{shown}:{line}: model_revision {revision!r} is not a revision: {problem}",
                         "write a commit hash or a branch name (parts joined by /)")
    return {**flags, "--revision": revision}


def _recipe(doc: SourceMap, shown: str, name: str, fmt: Format, line: VllmLine, where: str, values: Mapping[str, Any],
            inputs: Inputs, resolve_mod: ModResolver, warnings: list[str], *, cluster_only: bool, solo_only: bool,
            launcher: RecipeLauncher | None = None) -> Recipe:
    taken: Mapping[str, FlagValue] = line.taken
    backend = taken.get("--distributed-executor-backend")
    if backend == "ray":
        launcher = "ray"
    elif backend == "mp" and launcher is None:
        launcher = "native"
    port = taken.get("--port")
    served = taken.get("--served-model-name")
    mods = doc.get("mods") or []
    if not isinstance(mods, list):
        raise UsageError(f"{shown}:{line_of(doc, 'mods')}: mods must be a list of directories, not {describe(mods)}",
                         "write `mods: [mods/NAME]`")
    resolved: list[Mod] = []
    for i, given in enumerate(mods):
        at = mods.item_line(i) if isinstance(mods, SourceList) else 1
        mod = resolve_mod(str(given), at)
        # a mod lands on the nodes under its directory's name: two of one name would overwrite each other
        twin = next((m for m in resolved if m.name == mod.name), None)
        if twin is not None:
            raise UsageError(f"{shown}:{at}: mod {str(given)!r} ({mod.path}) has the directory name {mod.name!r} "
                             f"of mod {twin.given!r} ({twin.path}); on the nodes one would replace the other",
                             "keep one of them, or rename one mod's directory")
        resolved.append(mod)
    build_args = doc.get("build_args") or []
    return Recipe(
        name=name, description=str(doc.get("description") or doc.get("name") or ""), model=line.model,
        served_model_name=served if isinstance(served, str) else None,
        port=as_int(port, "--port", where) if port is not None else None,
        env={**line.env, **recipe_values.env(doc, shown)}, flags=dict(line.flags), format=fmt, source=shown,
        tp=as_int(taken["--tensor-parallel-size"], "-tp", where) if "--tensor-parallel-size" in taken else None,
        pp=as_int(taken["--pipeline-parallel-size"], "-pp", where) if "--pipeline-parallel-size" in taken else None,
        launcher=launcher, container=_container(doc, shown),
        build_args=tuple(str(a) for a in build_args) if isinstance(build_args, list) else (),
        mods=tuple(resolved), min_nodes=2 if cluster_only else None, max_nodes=1 if solo_only else None,
        warnings=tuple(warnings), sets_used={k: v for k, v in inputs.sets.items()},
    )


def _solo(doc: Any, defaults: dict[str, Any], inputs: Inputs, shown: str) -> dict[str, Any]:
    """A `solo_only` recipe runs on one node: its TP is 1 unless the user gives one (eugr's runner: solo sets
    tensor_parallel=1 unless --tp), whatever its defaults say (gemma4-26b-a4b-nvfp4 keeps a TP 2 default)."""
    if _flag(doc, "solo_only", shown) and "tensor_parallel" not in {**inputs.options, **inputs.sets}:
        return {**defaults, "tensor_parallel": 1}
    return defaults


def _sniff(command: str) -> str:
    """sparkrun's runtime sniffing, for a recipe without `runtime:`."""
    if "sglang" in command:
        return "sglang"
    if "llama-server" in command:
        return "llama-cpp"
    if "trtllm-serve" in command:
        return "trtllm"
    return "vllm"


def _built_line(model: str, values: Mapping[str, Any]) -> str:
    """sparkrun's line for a recipe without `command:`: `vllm serve MODEL` and each mapped defaults key."""
    words = ["vllm", "serve", model]
    for key, flag in V2_FLAG_MAP.items():
        value = values.get(key)
        if value is None or value is False:
            continue
        if key in V2_BOOL_KEYS:
            if value is True:
                words.append(flag)
            continue
        words += [flag, str(value)]
    return shlex.join(words)


def _resolve_iteratively(values: dict[str, Any], shown: str) -> None:
    """sparkrun substitutes `{name}` inside defaults values too (e.g. `served_model_name: "{model}"`)."""
    for _ in range(5):
        changed = False
        for key, value in values.items():
            if isinstance(value, str) and re.search(r"(?<!\{)\{[A-Za-z_]\w*\}(?!\})", value):
                new = re.sub(r"(?<!\{)\{([A-Za-z_]\w*)\}(?!\})",
                             lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), value)
                if new != value:
                    values[key] = new
                    changed = True
        if not changed:
            return


def _matching_overrides(doc: SourceMap, shown: str, nodes: int | None, config: Mapping[str, Any],
                        warnings: list[str]) -> list[SourceMap]:
    layers = doc.get("overrides") or []
    if not isinstance(layers, list):
        raise UsageError(f"{shown}:{line_of(doc, 'overrides')}: overrides must be a list of `- when: ...` layers",
                         "write `overrides: [{when: {nodes: 1}, defaults: {...}}]`")
    matched = []
    for layer in layers:
        when = layer.get("when") if isinstance(layer, dict) else None
        if not isinstance(when, dict):
            raise UsageError(f"{shown}:{getattr(layer, 'line', 1)}: an override needs `when:`", "write `- when: {nodes: 1}`")
        ok = True
        for key, want in when.items():
            if key == "nodes":
                if nodes is None:
                    warnings.append(f"{shown}:{line_of(when, key)}: an override for {want} node(s) is applied only "
                                    "when --tp and --pp say how many nodes serve")
                ok = ok and nodes == want
            elif key == "arch":
                ok = ok and str(want) in ("sm_121", "sm_121a", "gb10")  # a DGX Spark's GB10
            elif key == "config":
                ok = ok and isinstance(want, dict) and all(str(config.get(k)) == str(v) for k, v in want.items())
            else:
                ok = False
        if ok:
            matched.append(layer)
    return matched


def _defaults(doc: Any, shown: str) -> dict[str, Any]:
    value = doc.get("defaults") if isinstance(doc, dict) else None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{shown}:{line_of(doc, 'defaults')}: defaults must map names to values, not {describe(value)}",
                         "write `defaults:` followed by indented `name: value` lines")
    return {str(k): v for k, v in value.items()}


def _executor_shm(doc: Any, shown: str) -> str | None:
    """sparkrun's `executor_config: {shm_size: ...}` sizes its container's /dev/shm; sparkcluster runs eugr's line
    (`--ipc=host`) and applies none of executor_config, so a size asked there would otherwise vanish without a word
    (and on GB10 a large /dev/shm is what powered hosts off: serve bounds --shm-size, serving/headroom.py)."""
    config = doc.get("executor_config")
    size = config.get("shm_size") if isinstance(config, dict) else None
    if size is None:
        return None
    return (f"{shown}:{line_of(config, 'shm_size')}: executor_config.shm_size {size} is not applied: sparkcluster "
            "runs the container with --ipc=host (the node's own /dev/shm); to size it, serve with "
            "--docker-arg=--ipc=private --docker-arg=--shm-size=10g (GB10's bound is 16g: serve refuses more)")


def _text(doc: Any, key: str, shown: str, required: bool = True) -> str | None:
    value = doc.get(key)
    if value is None:
        if required:
            raise UsageError(f"{shown}:1: the recipe needs `{key}:`", f"add `{key}:`")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(f"{shown}:{line_of(doc, key)}: {key} must be text, not {describe(value)}", f"write `{key}: TEXT`")
    return str(value)


def _container(doc: Any, shown: str) -> str | None:
    """`container:` reaches `docker run` as the image: checked as --image is, so that it is never an option
    (`-v/:/host`) nor more than one word."""
    value = _text(doc, "container", shown, required=False)
    if value is None or is_image(value):
        return value
    raise UsageError(f"{shown}:{line_of(doc, 'container')}: container {value!r} is not an image name",
                     "write `container: REPOSITORY[:TAG]`, e.g. `container: vllm-node`")


def _flag(doc: Any, key: str, shown: str) -> bool:
    value = doc.get(key, False)
    if not isinstance(value, bool):
        raise UsageError(f"{shown}:{line_of(doc, key)}: {key} must be true or false, not {describe(value)}",
                         f"write `{key}: true`")
    return value


def _count(doc: Any, key: str, shown: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{shown}:{line_of(doc, key)}: {key} {describe(value)} is not a node count", f"write `{key}: 2`")
    return value


def mods_base(path: Path | None) -> list[Path]:
    """Where a recipe file's mods are looked for: beside it (`<rel>`, `mods/<rel>`), then up its tree as eugr
    resolves them from its repository's root (recipes/3x-spark-cluster/x.yaml names mods/fix)."""
    if path is None:
        return []
    bases = []
    folder = path.resolve().parent
    for _ in range(4):
        bases.append(folder)
        if (folder / ".git").exists() or folder.parent == folder:
            break
        folder = folder.parent
    return bases
