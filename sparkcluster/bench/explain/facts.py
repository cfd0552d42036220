"""A receipt (bench/receipt.py) read as facts for `bench --explain`: each field under the cause it can explain, a
vLLM flag under its effect (explain/flags.py), a None the receipt calls unknown kept unknown, and one it does not
(a host runtime's image) shown as n/a."""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...engine.errors import UsageError
from ...nccl.tune import TUNED_VARIABLES, TUNER_PLUGIN_ENV
from ...recipes.command import FlagValue, canonical, flag_words
from ..receipt import Receipt
from ..receipt_shape import figure
from .flags import Effect, effect_of


class Cause(enum.IntEnum):
    """What a difference can explain, most first."""

    ACCEPTANCE = 1
    FLAGS = 2
    LAYOUT = 3
    VERSIONS = 4
    PLATFORM = 5
    LOAD = 6
    CEILING = 7
    OTHER = 8


CAUSES = {
    Cause.ACCEPTANCE: "speculative acceptance (scales decode directly)",
    Cause.FLAGS: "engine flags (batching, CUDA graphs, caching, memory)",
    Cause.LAYOUT: "model and layout",
    Cause.VERSIONS: "versions and images",
    Cause.PLATFORM: "kernel, driver, firmware, NCCL, comm env",
    Cause.LOAD: "concurrency and prompt shape",
    Cause.CEILING: "memory-ceiling share",
    Cause.OTHER: "no effect on speed",
}
NOT_SET = "not set"


@dataclass(frozen=True)
class Fact:
    key: str  # as shown: "--enforce-eager", "spark-2 kernel", "acceptance rate"
    cause: Cause
    value: str | float | None  # None: unknown
    group: str  # the receipt field it comes from; a group one side lacks entirely is unknown there
    why: str = ""
    rank: int = 0  # inside its cause (a flag's effect)
    node: int | None = None  # a node's fact: its index, by which two clusters naming nodes differently align
    label: str = ""  # a node's fact: what it is, without the node's name ("kernel")
    path: str = ""  # the receipt's own path for it (nodes[spark-1].kernel), where it says what is unknown
    share: bool = False  # a fraction, shown as a percentage


def _flag_text(value: FlagValue) -> str:
    return "set" if value is None else " ".join(value) if isinstance(value, tuple) else value


def flag_facts(flags: Mapping[str, FlagValue], group: str) -> list[Fact]:
    """vLLM's flags as facts by canonical name; `--no-X` reads as X off; the parallelism flags are the layout's."""
    out = []
    for given, value in flags.items():
        name = canonical(given)
        if name.startswith("--no-"):
            name, value = "--" + name.removeprefix("--no-"), "off"
        found = effect_of(name)
        cause = Cause.OTHER if found.effect is Effect.NONE else Cause.FLAGS
        out.append(Fact(name, cause, _flag_text(value), group, found.why, int(found.effect)))
    return out


def command_flags(command: Sequence[str]) -> tuple[str | None, dict[str, FlagValue] | None]:
    """The model and the flags of `vllm serve MODEL --flag ...` as launched; flags None where the words cannot be
    read as flags (then they are unknown, not absent)."""
    words = list(command)
    start = next((i + 1 for i, w in enumerate(words) if w == "serve"), len(words))
    model = words[start] if start < len(words) and not words[start].startswith("-") else None
    rest = words[start + 1:]
    if model is None or (rest and not rest[0].startswith("-")):
        return model, None  # no `serve MODEL`, or a word after the model that belongs to no flag
    try:
        return model, flag_words(rest, "the serve command")
    except UsageError:
        return model, None


def _speculation_facts(receipt: Receipt) -> list[Fact]:
    metrics = receipt.metrics
    group = "metrics.spec_decode"
    if metrics is None or metrics.speculative is None:
        return []
    if not metrics.speculative:
        return [Fact("speculative decoding", Cause.ACCEPTANCE, "off", group)]
    spec = metrics.spec_decode
    if spec is None:
        return []
    out = [Fact("speculative decoding", Cause.ACCEPTANCE, "on", group),
           Fact("mean acceptance length", Cause.ACCEPTANCE, spec.mean_acceptance_length, group,
                "tokens each verification step yields: decode scales with it"),
           Fact("acceptance rate", Cause.ACCEPTANCE, spec.acceptance_rate, group,
                "the share of drafted tokens the model kept", share=True)]
    for position, rate in enumerate(spec.per_position_acceptance or ()):
        out.append(Fact(f"acceptance at position {position}", Cause.ACCEPTANCE, rate, group, share=True))
    return out


def receipt_facts(receipt: Receipt) -> tuple[list[Fact], set[str]]:
    """Every fact a receipt holds, and the receipt fields it marks unknown (a None group)."""
    engine, unknown = receipt.engine, set()
    facts = [Fact("sparkcluster", Cause.VERSIONS, receipt.sparkcluster, "sparkcluster",
                  "the client that measured (its method)"),
             Fact("endpoint", Cause.OTHER, receipt.endpoint, "endpoint")]
    for name, group, value, cause, why in (
            ("vLLM version", "vllm_version", engine.vllm_version, Cause.VERSIONS,
             "a release changes kernels and defaults"),
            ("image", "image", engine.image, Cause.VERSIONS, "a tag names whatever was built last under it"),
            ("image ID", "image_id", engine.image_id, Cause.VERSIONS, "the image's content"),
            ("image digest", "image_digest", engine.image_digest, Cause.VERSIONS, "the image's content"),
            ("Python environment", "python_env", engine.python_env, Cause.VERSIONS, "the packages vLLM ran with"),
            ("runtime", "runtime", engine.runtime, Cause.LAYOUT, "where vLLM runs (a container or the host)"),
            ("launcher", "launcher", engine.launcher, Cause.LAYOUT, "how the ranks were started"),
            ("tp", "tp", engine.tp, Cause.LAYOUT, "tensor parallel ranks: decode's bandwidth and all-reduces"),
            ("pp", "pp", engine.pp, Cause.LAYOUT, "pipeline stages"),
            ("replicas", "replicas", engine.replicas, Cause.LAYOUT, "engines behind the router: aggregate "
                                                                    "throughput")):
        facts.append(Fact(name, cause, None if value is None else str(value), f"engine.{group}", why,
                          path=f"engine.{group}"))
    if receipt.nodes is not None:
        facts.append(Fact("nodes", Cause.LAYOUT, str(len(receipt.nodes)), "nodes", "the nodes the engine spans"))
    if engine.recipe is not None:
        facts += [Fact("recipe", Cause.VERSIONS, engine.recipe.source, "engine.recipe"),
                  Fact("recipe sha256", Cause.VERSIONS, engine.recipe.sha256, "engine.recipe",
                       "the recipe's content: its flags and env", path="engine.recipe.sha256")]
        facts += [Fact(f"mod {m.name} sha256", Cause.VERSIONS, m.sha256, "engine.recipe", "code run before vLLM",
                       path=f"engine.recipe.mods[{m.name}].sha256") for m in engine.recipe.mods]
    model, flags = command_flags(engine.command) if engine.command is not None else (None, None)
    if flags is None:
        unknown.add("engine.command")
    else:
        facts.append(Fact("model", Cause.LAYOUT, model, "engine.command", "what is served"))
        facts += flag_facts({k: v for k, v in flags.items() if canonical(k) not in LAYOUT_FLAGS}, "engine.command")
    facts += _node_facts(receipt) + _tuned_facts(receipt)
    if receipt.nodes is None:
        unknown.add("nodes")
    if receipt.comm_env is None:
        unknown.add("comm_env")
    if receipt.metrics is None:
        unknown.add("metrics")
    else:
        facts += _speculation_facts(receipt)
        facts += [Fact("prefix-cache hit rate", Cause.FLAGS, receipt.metrics.prefix_cache_hit_rate, "metrics",
                       "prompt tokens the cache served: prefill skipped", int(Effect.CACHING),
                       path="metrics.prefix_cache_hit_rate", share=True),
                  Fact("preemptions", Cause.FLAGS, receipt.metrics.preemptions, "metrics",
                       "sequences evicted for lack of KV cache: recomputed later", int(Effect.MEMORY),
                       path="metrics.preemptions")]
    facts += [Fact(f"bench {k}", Cause.LOAD, _text(v), "bench", "what was asked of the server")
              for k, v in {"method": receipt.bench.method, **receipt.bench.parameters}.items()]
    facts.append(Fact("prompt set sha256", Cause.LOAD, receipt.bench.prompt_digest, "bench",
                      "the prompts' content", path="bench.prompt_digest"))
    marked_unknown = set(receipt.unknown())  # once: it serialises the whole receipt (per fact: quadratic in nodes)
    return [_applies(f, marked_unknown) for f in facts], unknown


LAYOUT_GROUP = "layout"  # facts only a layout of a `bench --layouts` result has: lined up only against another


def layout_facts(layout: str, receipt: Receipt) -> list[Fact]:
    """One layout of a `bench --layouts` run against another: the layout measured first, then the parallelism of
    its serve command line as launched (which receipt_facts leaves to tp, pp and replicas), ranked before the rest
    of the layout's facts (explain/lineup.py ranks the layout first between two layouts)."""
    _, flags = command_flags(receipt.engine.command) if receipt.engine.command is not None else (None, None)
    launched = [Fact(canonical(given), Cause.LAYOUT, _flag_text(value), LAYOUT_GROUP,
                     "the serve command line's parallelism, as launched", -1)
                for given, value in (flags or {}).items() if canonical(given) in LAYOUT_FLAGS]
    return [Fact("layout", Cause.LAYOUT, layout, LAYOUT_GROUP,
                 "what `bench --layouts` served and measured: TP ranks, pipeline stages, replicas behind the router",
                 -2), *launched]


def _applies(fact: Fact, unknown: set[str]) -> Fact:
    """A field None where the receipt does not call it unknown does not apply (a host runtime has no image)."""
    if fact.value is not None or not fact.path or fact.path in unknown:
        return fact
    return dataclasses.replace(fact, value="n/a")


LAYOUT_FLAGS = {"--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend", "--nnodes",
                 "--node-rank", "--master-addr", "--master-port", "--headless", "--data-parallel-size"}


def _text(value: object) -> str | float | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return float(value) if figure(value) else str(value)  # an integer no float holds is shown whole
    return json.dumps(value, sort_keys=True)


def _node_facts(receipt: Receipt) -> list[Fact]:
    """Per node, keyed by its name ("spark-2 kernel"); `explain` rekeys by position where the names differ."""
    out = []
    for index, node in enumerate(receipt.nodes or ()):
        at = f"nodes[{node.name}]"
        found: list[tuple[str, str | None, str, str]] = [
            ("kernel", node.kernel, "nodes", f"{at}.kernel"), ("driver", node.driver, "nodes", f"{at}.driver"),
            ("BIOS", node.bios, "nodes", f"{at}.bios"), ("NCCL", node.nccl, "nodes", f"{at}.nccl"),
            ("CUDA", node.cuda, "nodes", f"{at}.cuda")]
        found += [(f"{netdev} firmware", fw, "nodes", f"{at}.connectx_firmware")
                  for netdev, fw in sorted((node.connectx_firmware or {}).items())]
        if node.connectx_firmware is None:
            found.append(("ConnectX firmware", None, "nodes", f"{at}.connectx_firmware"))
        found += [(var, value, "comm_env", "comm_env")
                  for var, value in sorted(((receipt.comm_env or {}).get(node.name) or {}).items())
                  if var not in TUNED_VARIABLES]  # those are the cluster's, below
        out += [Fact(f"{node.name} {label}", Cause.PLATFORM, value, group, _platform_why(label, group), 0, index,
                     label, path) for label, value, group, path in found]
    return out


def _tuned_facts(receipt: Receipt) -> list[Fact]:
    """The NCCL settings verify --tune chooses, one fact each for the whole cluster (it writes the same block into
    every node's comm env), ranked with the engine's flags by what they move: the decode all-reduces. Where nodes
    disagree the value says so, node by node."""
    envs = {node: env or {} for node, env in (receipt.comm_env or {}).items()}
    out = []
    for var in sorted({v for env in envs.values() for v in env if v in TUNED_VARIABLES}):
        # the tuner plugin's paths are each node's home's: its file names say which plugin and which table
        values = {node: env.get(var, NOT_SET).rsplit("/", 1)[-1] if var in TUNER_PLUGIN_ENV else env.get(var, NOT_SET)
                  for node, env in envs.items()}
        value = next(iter(values.values())) if len(set(values.values())) == 1 else \
            "differs by node: " + ", ".join(f"{node} {v}" for node, v in sorted(values.items()))
        out.append(Fact(var, Cause.FLAGS, value, "comm_env", TUNED_WHY, int(Effect.COLLECTIVES)))
    return out


TUNED_WHY = ("an NCCL setting (of those verify --tune chooses by measurement): the time of each decode step's "
             "all-reduces, 2 per layer (bench's decode budget says their share)")
PLATFORM_WHY = {"kernel": "the kernel (known-bad kernels: doctor)", "driver": "the GPU driver",
                "BIOS": "the firmware's memory and power settings", "NCCL": "the collectives' library",
                "CUDA": "the CUDA runtime"}


def _platform_why(label: str, group: str) -> str:
    if group == "comm_env":
        return "the comm env NCCL, Gloo and vLLM read (which interface, which transport)"
    return PLATFORM_WHY.get(label) or ("the ConnectX firmware (the fabric's link)" if label.endswith("firmware")
                                       else "")
