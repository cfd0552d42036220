"""The shape a receipt's JSON must have before bench/receipt.py builds one from it: a receipt comes from someone
else's file (the point of `bench --explain`, and a resumed `bench --layouts` state), so each field is checked for the
kind of value it holds, and a figure for fitting a float (a 400-digit integer does not), before any code relies on
it. A field of the wrong kind is a ValueError naming its path (`nodes[2].connectx_firmware`), never an
AttributeError or OverflowError deep in the code that reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

ENGINE_TEXT = ("vllm_version", "runtime", "launcher", "image", "image_id", "image_digest", "python_env")
ENGINE_COUNTS = ("tp", "pp", "replicas")
NODE_TEXT = ("kernel", "driver", "bios", "nccl", "cuda")
METRICS_FIGURES = ("prefix_cache_hit_rate", "preemptions", "interval_s")
SPEC_FIGURES = ("drafts", "draft_tokens", "accepted_tokens")


def text(value: Any) -> bool:
    return isinstance(value, str)


def count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 63


def figure(value: Any) -> bool:
    """A number a float holds: NaN and infinity as JSON writes them are figures (unknown ones), a 400-digit integer
    is not."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _texts(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _need(ok: bool, path: str, value: Any, kind: str) -> None:
    if not ok:
        shown = repr(value)
        raise ValueError(f"{path} is {shown if len(shown) <= 40 else shown[:37] + '...'}, not {kind}")


def _fields(doc: dict[str, Any], at: str, names: tuple[str, ...], check: Check, kind: str) -> None:
    for name in names:
        _need(check(doc.get(name)), f"{at}{name}", doc.get(name), kind)


def check(doc: dict[str, Any]) -> None:
    """Raises ValueError naming the first field of the wrong kind; a missing field is the reader's to name."""
    for name in ("endpoint", "sparkcluster", "created"):
        _need(name not in doc or text(doc[name]), name, doc.get(name), "text")
    if "engine" in doc:
        _engine(doc["engine"])
    comm_env = doc.get("comm_env")
    _need(comm_env is None or (isinstance(comm_env, dict) and all(_texts(v) for v in comm_env.values())),
          "comm_env", comm_env, "an object of node -> {variable: value}")
    nodes = doc.get("nodes")
    _need(nodes is None or isinstance(nodes, list), "nodes", nodes, "a list of nodes")
    for index, node in enumerate(nodes or ()):
        _need(isinstance(node, dict), f"nodes[{index}]", node, "an object")
        _need(text(node.get("name")), f"nodes[{index}].name", node.get("name"), "text")
        _fields(node, f"nodes[{index}].", NODE_TEXT, _optional(text), "text or null")
        _need(node.get("connectx_firmware") is None or _texts(node["connectx_firmware"]),
              f"nodes[{index}].connectx_firmware", node.get("connectx_firmware"), "an object of netdev -> version")
    if "bench" in doc:
        _bench(doc["bench"])
    _metrics(doc.get("metrics"))


def _bench(bench: Any) -> None:
    _need(isinstance(bench, dict), "bench", bench, "an object")
    _need(text(bench.get("method")), "bench.method", bench.get("method"), "text")
    _need(isinstance(bench.get("parameters", {}), dict), "bench.parameters", bench.get("parameters"), "an object")
    _need(_optional(text)(bench.get("prompt_digest")), "bench.prompt_digest", bench.get("prompt_digest"),
          "text or null")


def _engine(engine: Any) -> None:
    _need(isinstance(engine, dict), "engine", engine, "an object")
    _fields(engine, "engine.", ENGINE_TEXT, _optional(text), "text or null")
    _fields(engine, "engine.", ENGINE_COUNTS, _optional(count), "a whole number or null")
    command = engine.get("command")
    _need(command is None or (isinstance(command, list) and all(map(text, command))), "engine.command", command,
          "a list of words")
    recipe = engine.get("recipe")
    if recipe:
        _need(isinstance(recipe, dict) and text(recipe.get("source")), "engine.recipe", recipe,
              "an object with a source")
        _need(_optional(text)(recipe.get("sha256")), "engine.recipe.sha256", recipe.get("sha256"), "text or null")
        mods = recipe.get("mods") or []
        _need(isinstance(mods, list) and all(isinstance(m, dict) and text(m.get("name"))
                                             and _optional(text)(m.get("sha256")) for m in mods),
              "engine.recipe.mods", mods, "a list of {name, sha256}")


def _metrics(metrics: Any) -> None:
    if metrics is None:
        return
    _need(isinstance(metrics, dict), "metrics", metrics, "an object")
    _need(metrics.get("speculative") in (None, True, False), "metrics.speculative", metrics.get("speculative"),
          "true, false or null")
    _fields(metrics, "metrics.", METRICS_FIGURES, _optional(figure), "a number or null")
    spec = metrics.get("spec_decode")
    if spec:
        _need(isinstance(spec, dict), "metrics.spec_decode", spec, "an object")
        _fields(spec, "metrics.spec_decode.", SPEC_FIGURES, figure, "a number")
        positions = spec.get("accepted_per_position") or []
        _need(isinstance(positions, list) and all(map(figure, positions)),
              "metrics.spec_decode.accepted_per_position", positions, "a list of numbers")
