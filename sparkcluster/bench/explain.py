"""`bench --explain A B`: why two results differ. Each result's receipt (bench/receipt.py) is read as facts, each
fact under the cause it can explain; the two are lined up field by field, every difference named, and ranked by
how much of a number that cause can move: speculative acceptance first (it scales decode directly), then the
engine's flags by effect (bench/flag_effects.py), the layout and model, versions and images, each node's kernel,
driver and firmware, the load's concurrency and prompt shape, the memory ceiling. A field one side does not know is
said to be unknown, never taken as equal; a published row (a recipe's `reference:`) lists what it never recorded."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.errors import UsageError
from ..recipes.command import FlagValue, canonical, flag_words
from ..recipes.load import load_recipe
from ..recipes.types import Recipe
from .flag_effects import EFFECT_NAMES, Effect, effect_of
from .receipt import Receipt

MAX_FILE_BYTES = 64 << 20


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


@dataclass(frozen=True)
class Side:
    name: str  # the file, or the published row's source
    facts: Mapping[str, Fact]
    unknown_groups: frozenset[str]  # receipt fields this side cannot know (or never recorded)
    numbers: Mapping[str, Mapping[str, float]]  # row ("c=4", "pp64 tg16 @ d0 c1") -> figure -> value
    published: bool = False


@dataclass(frozen=True)
class Difference:
    key: str
    cause: Cause
    a: str | float | None
    b: str | float | None
    why: str
    rank: int = 0

    @property
    def kind(self) -> str:
        """The cause as shown; a flag's names its effect."""
        if self.cause is Cause.FLAGS and self.rank:
            return f"{'flag' if self.key.startswith('-') else 'engine, measured'}: {EFFECT_NAMES[Effect(self.rank)]}"
        return CAUSES[self.cause]

    def to_json(self) -> dict[str, Any]:
        return {"field": self.key, "cause": self.cause.name.lower(), "kind": self.kind, "a": self.a, "b": self.b,
                "why": self.why}


@dataclass(frozen=True)
class Figure:
    row: str
    figure: str
    a: float
    b: float

    @property
    def ratio(self) -> float | None:
        return self.b / self.a if self.a else None


@dataclass(frozen=True)
class Explanation:
    a: Side
    b: Side
    figures: tuple[Figure, ...]
    differences: tuple[Difference, ...]  # ranked
    unknown: tuple[str, ...]  # fields one side cannot know: they may explain part of the gap
    never_recorded: tuple[str, ...] = ()  # a published row's: what it never said it ran
    same: tuple[str, ...] = field(default=())  # fields both know and agree on

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a.name, "b": self.b.name,
                "numbers": [{"row": f.row, "figure": f.figure, "a": f.a, "b": f.b, "ratio": f.ratio}
                            for f in self.figures],
                "differences": [d.to_json() for d in self.differences], "unknown": list(self.unknown),
                "never_recorded": list(self.never_recorded), "same": list(self.same)}


# ---- a receipt as facts -------------------------------------------------------------------------------------
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


def command_flags(command: Sequence[str]) -> tuple[str | None, dict[str, FlagValue]]:
    """The model and the flags of `[...] vllm serve MODEL --flag ...` as launched (a `python -m vllm...` too)."""
    words = list(command)
    start = next((i + 1 for i, w in enumerate(words) if w == "serve"), 0)
    model = words[start] if start < len(words) and not words[start].startswith("-") else None
    rest = words[start + (model is not None):]
    first = next((i for i, w in enumerate(rest) if w.startswith("-")), len(rest))
    try:
        return model, flag_words(rest[first:], "the serve command")
    except UsageError:
        return model, {}


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
                "the share of drafted tokens the model kept")]
    for position, rate in enumerate(spec.per_position_acceptance or ()):
        out.append(Fact(f"acceptance at position {position}", Cause.ACCEPTANCE, rate, group))
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
    if engine.command is None:
        unknown.add("engine.command")
    else:
        model, flags = command_flags(engine.command)
        facts.append(Fact("model", Cause.LAYOUT, model, "engine.command", "what is served"))
        facts += flag_facts({k: v for k, v in flags.items() if canonical(k) not in _LAYOUT_FLAGS}, "engine.command")
    facts += _node_facts(receipt)
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
                       path="metrics.prefix_cache_hit_rate"),
                  Fact("preemptions", Cause.FLAGS, receipt.metrics.preemptions, "metrics",
                       "sequences evicted for lack of KV cache: recomputed later", int(Effect.MEMORY),
                       path="metrics.preemptions")]
    facts += [Fact(f"bench {k}", Cause.LOAD, _text(v), "bench", "what was asked of the server")
              for k, v in {"method": receipt.bench.method, **receipt.bench.parameters}.items()]
    facts.append(Fact("prompt set sha256", Cause.LOAD, receipt.bench.prompt_digest, "bench",
                      "the prompts' content", path="bench.prompt_digest"))
    return [_applies(f, set(receipt.unknown())) for f in facts], unknown


def _applies(fact: Fact, unknown: set[str]) -> Fact:
    """A field None where the receipt does not call it unknown does not apply (a host runtime has no image)."""
    if fact.value is not None or not fact.path or fact.path in unknown:
        return fact
    return dataclasses.replace(fact, value="n/a")


_LAYOUT_FLAGS = {"--tensor-parallel-size", "--pipeline-parallel-size", "--distributed-executor-backend", "--nnodes",
                 "--node-rank", "--master-addr", "--master-port", "--headless", "--data-parallel-size"}


def _text(value: object) -> str | float | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return float(value)
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
                  for var, value in sorted(((receipt.comm_env or {}).get(node.name) or {}).items())]
        out += [Fact(f"{node.name} {label}", Cause.PLATFORM, value, group, PLATFORM_WHY.get(label, ""), 0, index,
                     label, path) for label, value, group, path in found]
    return out


PLATFORM_WHY = {"kernel": "the kernel (known-bad kernels: doctor)", "driver": "the GPU driver",
                "BIOS": "the firmware's memory and power settings", "NCCL": "the collectives' library"}


# ---- two sides lined up ---------------------------------------------------------------------------------------
def _differ(a: str | float, b: str | float) -> bool:
    """Figures within 5% of each other (or 0.02 apart, for rates) are the same; text must match exactly."""
    if isinstance(a, float) and isinstance(b, float):
        return not math.isclose(a, b, rel_tol=0.05, abs_tol=0.02)
    return str(a) != str(b)


def _aligned(a: Side, b: Side) -> tuple[dict[str, Fact], dict[str, Fact]]:
    """Node facts keyed by name where both clusters name their nodes alike, else by position ("node 2 kernel")."""
    def names(side: Side) -> list[str]:
        found = {f.node: f.key.removesuffix(" " + f.label) for f in side.facts.values() if f.node is not None}
        return [found[i] for i in sorted(found)]

    if names(a) == names(b) or not names(a) or not names(b):
        return dict(a.facts), dict(b.facts)

    def rekey(side: Side) -> dict[str, Fact]:
        out = {}
        for f in side.facts.values():
            key = f.key if f.node is None else f"node {f.node + 1} {f.label}"
            out[key] = Fact(key, f.cause, f.value, f.group, f.why, f.rank, f.node, f.label)
        return out
    return rekey(a), rekey(b)


def _why(fact: Fact, a: str | float | None, b: str | float | None) -> str:
    if fact.key == "mean acceptance length" and isinstance(a, float) and isinstance(b, float) and a:
        return f"{fact.why}: from this alone B's decode is about {b / a * 100:.0f}% of A's"
    if fact.node is not None and fact.why == "" and fact.group == "nodes":
        return "the node's platform"
    return fact.why


def _shown(value: str | float | None) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, float):
        return f"{value:,.1f}" if abs(value) >= 1 else f"{value:.3g}"
    return value


def _knows(side: Side, group: str) -> bool:
    return not any(group == g or group.startswith(g + ".") for g in side.unknown_groups)


def _who(a_unknown: bool, b_unknown: bool) -> str:
    return "A and B" if a_unknown and b_unknown else "A" if a_unknown else "B"


def _short(value: str | float | None, width: int = 60) -> str:
    """A long value (a --compilation-config) cut for the text; --json keeps it whole."""
    text = _shown(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def explain(a: Side, b: Side) -> Explanation:
    facts_a, facts_b = _aligned(a, b)
    differences, same = [], []
    unknown = [f"{group}: unknown to {_who(group in a.unknown_groups, group in b.unknown_groups)}"
               for group in sorted(a.unknown_groups | b.unknown_groups) if not b.published]
    for key in dict.fromkeys([*facts_a, *facts_b]):
        fa, fb = facts_a.get(key), facts_b.get(key)
        fact = fa or fb
        assert fact is not None
        if not (_knows(a, fact.group) and _knows(b, fact.group)):
            continue  # the whole field is unknown to a side: said once above
        va = NOT_SET if fa is None else fa.value  # a field only one side has: a flag not set, a variable unset
        vb = NOT_SET if fb is None else fb.value
        if va is None or vb is None:
            unknown.append(f"{key}: unknown to {_who(va is None, vb is None)}")
        elif _differ(va, vb):
            differences.append(Difference(key, fact.cause, va, vb, _why(fact, va, vb), fact.rank))
        else:
            same.append(key)
    differences.sort(key=lambda d: (d.cause, d.rank))
    never = tuple(text for group, text in NEVER_RECORDED.items() if group in b.unknown_groups) if b.published else ()
    return Explanation(a, b, tuple(_figures(a, b)), tuple(differences), tuple(unknown), never, tuple(same))


def _figures(a: Side, b: Side) -> Iterable[Figure]:
    for row, figures in a.numbers.items():
        theirs = b.numbers.get(row, {})
        for name, value in figures.items():
            if name in theirs:
                yield Figure(row, name, value, theirs[name])


# ---- the two sides from files ---------------------------------------------------------------------------------
_FIX = "give a file written by `sparkcluster bench --json` (either method), or compare with a published row: " \
       "--explain RESULT --compare RECIPE"
_SUSTAINED = (("generation_tps", "generation tok/s"), ("prefill_tps", "prefill tok/s"), ("peak_tps", "peak tok/s"))
_BENCHY = (("tg_throughput", "tg t/s"), ("pp_throughput", "pp t/s"), ("ttfr", "ttfr ms"))


def _sustained_numbers(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        figures = {label: float(row[key]) for key, label in _SUSTAINED if isinstance(row.get(key), int | float)}
        for key, label in (("ttft_s", "TTFT mean s"), ("itl_s", "ITL mean s")):
            mean = (row.get(key) or {}).get("mean") if isinstance(row.get(key), dict) else None
            if isinstance(mean, int | float):
                figures[label] = float(mean)
        out[f"c={row.get('concurrency')}"] = figures
    return out


def _benchy_numbers(benchmarks: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for b in benchmarks:
        phase = " (context load)" if b.get("is_context_prefill_phase") else ""
        row = f"pp{b.get('prompt_size')} tg{b.get('response_size')} @ d{b.get('context_size')} " \
              f"c={b.get('concurrency')}{phase}"
        out[row] = {label: float(b[key]["mean"]) for key, label in _BENCHY
                    if isinstance(b.get(key), dict) and isinstance(b[key].get("mean"), int | float)}
    return out


def _ceiling(doc: Mapping[str, Any], numbers: Mapping[str, Mapping[str, float]]) -> list[Fact]:
    """The decode ceiling (memory bandwidth over bytes per token) and the c=1 row's share of it."""
    limit = ((doc.get("config") or {}).get("decode_ceiling") or {}).get("tokens_per_s")
    if not isinstance(limit, int | float) or limit <= 0:
        return []
    out = [Fact("decode ceiling tok/s", Cause.CEILING, float(limit), "ceiling",
                "memory bandwidth over the bytes each token reads: no engine decodes one stream faster")]
    single = numbers.get("c=1", {}).get("generation tok/s")
    if single is not None:
        out.append(Fact("c=1 share of the ceiling", Cause.CEILING, single / limit, "ceiling",
                        "how close one stream came to the memory ceiling"))
    return out


def load_result(path: str) -> Side:
    """A result file with its receipt; UsageError (exit 2) naming what is wrong otherwise."""
    shown = f"--explain {path}"
    try:
        if Path(path).stat().st_size > MAX_FILE_BYTES:
            raise UsageError(f"{shown} is larger than {MAX_FILE_BYTES >> 20} MiB: not a bench result", _FIX)
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise UsageError(f"{shown}: {e.strerror or e}", _FIX) from None
    except (UnicodeDecodeError, ValueError):
        raise UsageError(f"{shown} is not a bench result (not JSON; a CSV carries no receipt)", _FIX) from None
    if not isinstance(doc, dict) or not (isinstance(doc.get("rows"), list) or isinstance(doc.get("benchmarks"), list)):
        raise UsageError(f"{shown} is not a bench result (it holds neither `rows` nor `benchmarks`)", _FIX)
    found = doc.get("receipt") or (doc.get("sparkcluster") or {}).get("receipt")
    if found is None:
        raise UsageError(f"{shown} holds no receipt: it was written by a bench without receipts, or by "
                         "llama-benchy itself", "measure again with this sparkcluster's `bench --json`, or compare "
                         "it with a published row: --explain RESULT --compare RECIPE")
    try:
        receipt = Receipt.from_json(found)
    except ValueError as e:
        raise UsageError(f"{shown}: its receipt cannot be read: {e}", "measure again with this sparkcluster's "
                         "`bench --json`") from None
    numbers = (_sustained_numbers(doc["rows"]) if isinstance(doc.get("rows"), list)
               else _benchy_numbers(doc["benchmarks"]))
    facts, unknown = receipt_facts(receipt)
    facts += _ceiling(doc, numbers)
    return Side(path, {f.key: f for f in facts}, frozenset(unknown), numbers)


# What a recipe's published rows never record, by the receipt's fields: a recipe says its model, flags and image
# (its flags are what it asks for, not a command line as launched), its rows the node count and hardware.
NEVER_RECORDED = {
    "engine.vllm_version": "the vLLM version", "engine.image": "the image", "engine.image_id": "the image's ID",
    "engine.image_digest": "the image's digest", "engine.python_env": "the Python environment",
    "engine.recipe": "the recipe's sha256 and its mods'", "engine.runtime": "the runtime",
    "engine.launcher": "the launcher", "engine.tp": "tp", "engine.pp": "pp", "engine.replicas": "replicas",
    "nodes": "each node's kernel, driver, BIOS, ConnectX firmware, NCCL", "comm_env": "the comm env",
    "metrics": "speculative acceptance, prefix-cache hit rate, preemptions (the engine's /metrics)",
    "bench": "the bench's parameters and its prompt set", "sparkcluster": "the client that measured",
    "endpoint": "the endpoint", "ceiling": "the decode ceiling",
}


def published_side(recipe: Recipe) -> Side:
    """A recipe's `reference:` rows with what the recipe says it ran: its model, flags and image."""
    reference = recipe.reference
    if reference is None:
        raise UsageError(f"recipe {recipe.source or recipe.name} has no published reference rows",
                         "compare with a recipe that has `reference:` (gpt-oss-120b), or add one to your file")
    facts = flag_facts({k: v for k, v in recipe.flags.items() if canonical(k) not in _LAYOUT_FLAGS},
                       "engine.command")
    facts.append(Fact("model", Cause.LAYOUT, recipe.model, "engine.command", "what is served"))
    if recipe.container:
        facts.append(Fact("image", Cause.VERSIONS, recipe.container, "engine.image",
                          "a tag names whatever was built last under it"))
    numbers = {f"c={row['concurrency']}": {label: float(row[key]) for key, label in _SUSTAINED if key in row}
               for row in reference.rows}
    nodes = f"{reference.nodes} node{'s' if reference.nodes != 1 else ''}"
    never = set(NEVER_RECORDED) - ({"engine.image"} if recipe.container else set())
    return Side(f"published: {reference.source} ({reference.hardware}, {nodes})", {f.key: f for f in facts},
                frozenset(never), numbers, True)


# ---- output -----------------------------------------------------------------------------------------------------
def render(found: Explanation) -> str:
    """Plain lines: the numbers side by side, then each difference ranked, then what cannot be compared."""
    lines = [f"A: {found.a.name}", f"B: {found.b.name}", ""]
    if found.figures:
        lines.append("numbers, A -> B:")
        width = max(len(f"{f.row}  {f.figure}") for f in found.figures)
        for f in found.figures:
            ratio = "" if f.ratio is None else f"  ({f.ratio * 100:.0f}%)"
            lines.append(f"  {f'{f.row}  {f.figure}':<{width}}  {_shown(f.a)} -> {_shown(f.b)}{ratio}")
    else:
        lines.append("numbers: no row of the same shape on both sides (concurrency, or pp/tg/depth)")
    lines.append("")
    if found.differences:
        lines.append("differences, ranked by what each can explain:")
        for number, d in enumerate(found.differences, start=1):
            lines.append(f"  {number}. {d.key}: A {_short(d.a)}, B {_short(d.b)}  [{d.kind}]"
                         + (f" {d.why}" if d.why else ""))
    else:
        lines.append("differences: none in what both record")
    if found.unknown:
        lines += ["", "unknown, so not ruled out:", *(f"  {u}" for u in found.unknown)]
    if found.never_recorded:
        lines += ["", "the published row never recorded:", *(f"  {n}" for n in found.never_recorded)]
    lines += ["", f"the same on both sides: {len(found.same)} field{'s' if len(found.same) != 1 else ''}"]
    return "\n".join(lines)


def sides(results: Sequence[str], compare: str | None) -> tuple[Side, Side]:
    """`--explain A B`, `--explain A --compare RESULT` or `--explain A --compare RECIPE` (its published rows)."""
    if len(results) > 2 or (len(results) == 2 and compare):
        raise UsageError("--explain compares two results: " + " and ".join([*results, *([compare] if compare else [])]),
                         "give --explain A B, or --explain A --compare RECIPE")
    if len(results) == 1 and not compare:
        raise UsageError(f"--explain {results[0]} needs something to compare with",
                         "give a second result (--explain A B), or a recipe's published rows (--compare RECIPE)")
    first = load_result(results[0])
    if len(results) == 2:
        return first, load_result(results[1])
    assert compare is not None
    if Path(compare).suffix.lower() in (".json", ".csv"):
        return first, load_result(compare)
    return first, published_side(load_recipe(compare, trust=True))  # its rows only: nothing of it runs
