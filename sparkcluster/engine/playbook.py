"""YAML playbooks -> Plays of Steps. Validated before any connection; arguments are Jinja2 templates
rendered per host at run time with StrictUndefined (a missing variable is an error, never "").

jinja2 is imported when the first template is rendered, not when a playbook loads: rendering happens per host
after connecting, so bootstrap's start (parse, validate, first connection) does not pay for it (about a tenth of
the start's imports), and a run whose arguments hold no template never imports it."""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import yamlsource
from .errors import UsageError, did_you_mean
from .steps import REGISTRY, Step

if TYPE_CHECKING:
    import jinja2

PLAY_KEYS = {"name", "hosts", "require", "gather_facts", "refresh_facts", "steps"}


@dataclass(frozen=True)
class StepCall:
    # The step's class; or, in a playbook loaded with defer_steps, its registered name, whose module is imported
    # when the step is first used (the runner does so as its play starts, after connecting).
    ref: type[Step] | str
    args: dict[str, Any]  # raw values; strings are templates
    line: int

    @property
    def step(self) -> type[Step]:
        return REGISTRY[self.ref] if isinstance(self.ref, str) else self.ref

    @property
    def name(self) -> str:
        return self.ref if isinstance(self.ref, str) else self.ref.name


@dataclass(frozen=True)
class Play:
    name: str
    hosts: str  # all | head | workers | a group name | a host name
    steps: tuple[StepCall, ...]
    require_all: bool = False  # tensor parallelism needs every GPU: one failed host stops the run
    gather_facts: bool = True
    # Gather again for hosts an earlier play changed (their addresses, say); otherwise facts are gathered once.
    refresh_facts: bool = False

    def import_steps(self) -> None:
        """Imports the modules of the steps a playbook loaded with defer_steps names (a no-op once done)."""
        for call in self.steps:
            if isinstance(call.ref, str):
                REGISTRY[call.ref]


@dataclass(frozen=True)
class Playbook:
    path: str
    name: str
    plays: tuple[Play, ...]

    def prepare(self) -> None:
        """Does ahead what each play does as it starts: imports its steps' modules (a bundled playbook's) and the
        template engine, and compiles the templates of the steps' arguments. Best effort: a step or template that
        fails here fails again where it is used, and is reported there."""
        for play in self.plays:
            for call in play.steps:
                try:
                    call.step  # noqa: B018 - imports the step's module
                    _compile(call.args)
                except Exception:  # noqa: BLE001 - reported where the step is used
                    continue


def bundled(name: str) -> Path:
    """A playbook shipped inside the package (playbooks/NAME.yml). Found beside this module rather than through
    importlib.resources, which costs bootstrap's start a few milliseconds of imports (zipfile among them) for the
    same path: the package is always a folder on disk (a path is what the loader reads)."""
    return Path(__file__).parents[1] / "playbooks" / f"{name}.yml"


def load_playbook(path: str | Path, *, defer_steps: bool = False) -> Playbook:
    """The playbook at `path`, every step known and its arguments checked against the step's, before any
    connection. `defer_steps`, for the playbooks shipped in the package alone (their unit tests load them with
    every check): each step's module is imported, and its arguments checked, when its play runs rather than
    here, which keeps the node's step machinery out of bootstrap's start."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise UsageError(f"{where}: no such playbook", "check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{where}: cannot read the playbook: {e}", "give a readable YAML file") from None
    try:
        # yamlsource keeps every mapping's line and refuses duplicate keys (PyYAML keeps the last silently).
        doc = yamlsource.load(text, libyaml=defer_steps)  # a bundled playbook: libyaml parses it 9x faster
    except yamlsource.YamlError as e:
        raise UsageError(f"{where}:{e.line}: invalid YAML: {e.problem}", e.fix) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("plays"), list) or not doc["plays"]:
        raise UsageError(f"{where}: a playbook is a mapping with a non-empty `plays:` list",
                         "see playbooks/*.yml in the package for examples")
    plays = tuple(_play(where, raw, defer_steps) for raw in doc["plays"])
    return Playbook(where, str(doc.get("name", Path(path).stem)), plays)


def _play(where: str, raw: Any, defer_steps: bool) -> Play:
    if not isinstance(raw, dict):
        raise UsageError(f"{where}: each play is a mapping with name, hosts and steps")
    line = getattr(raw, "line", 0)
    _no_unknown(where, line, raw, PLAY_KEYS, "play")
    require = raw.get("require", "none")
    if require not in ("all", "none"):
        raise UsageError(f"{where}:{line}: require must be 'all' or 'none', not {require!r}")
    steps = raw.get("steps")
    if not isinstance(steps, list) or not steps:
        raise UsageError(f"{where}:{line}: play {raw.get('name', '?')!r} has no steps", "add a `steps:` list")
    return Play(str(raw.get("name", "play")), str(raw.get("hosts", "all")),
                tuple(_step(where, s, defer_steps) for s in steps), require == "all",
                bool(raw.get("gather_facts", True)),
                bool(raw.get("refresh_facts", False)))


def _step(where: str, raw: Any, defer_steps: bool) -> StepCall:
    if not isinstance(raw, yamlsource.SourceMap) or len(raw) != 1:
        raise UsageError(f"{where}: each step is `- domain.resource: {{args}}`")
    line = raw.line
    name = next(iter(raw))
    if not isinstance(name, str):
        raise UsageError(f"{where}:{line}: a step name must be text like command.run, not {name!r}")
    if name not in REGISTRY:
        raise UsageError(f"{where}:{line}: unknown step {name!r}{did_you_mean(name, REGISTRY)}",
                         f"known steps: {', '.join(sorted(REGISTRY))}")
    args = raw[name] or {}
    if not isinstance(args, dict):
        raise UsageError(f"{where}:{line}: the arguments of {name} must be a mapping")
    if defer_steps:
        return StepCall(name, dict(args), line)
    step = REGISTRY[name]
    fields = step.arg_fields()
    _no_unknown(where, line, args, set(fields), f"{name} argument")
    missing = [f for f, spec in fields.items()
               if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING and f not in args]
    if missing:
        raise UsageError(f"{where}:{line}: {name} needs {', '.join(missing)}")
    return StepCall(step, dict(args), line)


def _no_unknown(where: str, line: int, raw: dict[str, Any], known: set[str], what: str) -> None:
    for key in raw:
        if key not in known:
            raise UsageError(f"{where}:{line}: unknown {what} {key!r}{did_you_mean(key, known)}",
                             f"use one of: {', '.join(sorted(known))}")


# ---- per-host rendering ---------------------------------------------------------------------------
class TemplateProblem(Exception):
    """A template that cannot render: `undefined` names a missing variable (jinja2's UndefinedError), otherwise
    the template itself is wrong. Raised in jinja2's place, so that catching it needs no jinja2 imported."""

    def __init__(self, message: str, *, undefined: bool) -> None:
        super().__init__(message)
        self.message = message
        self.undefined = undefined


@functools.cache
def _jinja() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)


# Compiling is what costs (about 1 ms an expression, against 0.05 ms to evaluate one), and a run renders the same
# few arguments for every host, twice per play (its batched reads, then its run): each text is compiled once.
@functools.lru_cache(maxsize=256)
def _expression(text: str) -> Any:
    return _jinja().compile_expression(text, undefined_to_none=False)


@functools.lru_cache(maxsize=256)
def _template(text: str) -> jinja2.Template:
    return _jinja().from_string(text)


_SINGLE_EXPRESSION = re.compile(r"^\{\{(?P<expr>(?:(?!\}\}).)*)\}\}$", re.S)


def _is_template(text: str) -> bool:
    return "{{" in text or "{%" in text


def _compiled(text: str) -> Any:
    """A template compiled: an expression where `text` is exactly one `{{ expression }}`, else a jinja2 Template."""
    single = _SINGLE_EXPRESSION.match(text.strip())
    return _expression(single["expr"]) if single else _template(text)


def _compile(value: Any) -> None:
    """Compiles every template in `value` into render()'s caches, rendering nothing."""
    if isinstance(value, str) and _is_template(value):
        _compiled(value)
    for v in value if isinstance(value, list) else value.values() if isinstance(value, dict) else ():
        _compile(v)


def render(value: Any, context: dict[str, Any]) -> Any:
    """Strings are templates. A string that is exactly one `{{ expression }}` keeps the expression's type
    (a list stays a list, a bool a bool); anything else renders to text. Raises TemplateProblem."""
    if isinstance(value, str):
        if not _is_template(value):
            return value  # plain text: no template engine needed
        import jinja2  # loaded by _jinja() first; here for its exception and Undefined types

        try:
            compiled = _compiled(value)
            if isinstance(compiled, jinja2.Template):
                return compiled.render(context)
            result = compiled(**context)
            if isinstance(result, jinja2.Undefined):
                str(result)  # StrictUndefined raises here, naming the variable
            return result
        except jinja2.UndefinedError as e:
            raise TemplateProblem(f"{e.message}", undefined=True) from None
        except jinja2.TemplateError as e:
            raise TemplateProblem(str(e), undefined=False) from None
    if isinstance(value, list):
        return [render(v, context) for v in value]
    if isinstance(value, dict):
        return {k: render(v, context) for k, v in value.items()}
    return value


def build_args(call: StepCall, context: dict[str, Any]) -> Any:
    """Render the call's arguments for one host and check them against the step's Args types."""
    try:
        values = render(call.args, context)
    except TemplateProblem as e:
        if e.undefined:
            raise UsageError(f"line {call.line}: {call.name}: {e.message}",
                             "define it in the inventory's vars or pass it with -e NAME=VALUE") from None
        raise UsageError(f"line {call.line}: {call.name}: template error: {e.message}", "fix the template") from None
    hints = typing.get_type_hints(call.step.Args)
    for key, value in values.items():
        hint = hints[key]
        if typing.get_origin(hint) is tuple:
            if isinstance(value, str):
                value = [value]
            value = list(value) if isinstance(value, tuple) else value
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise UsageError(f"line {call.line}: {call.name} {key} must be a list of strings")
            values[key] = tuple(value)
        elif hint is bool and isinstance(value, str) and value.lower() in ("true", "false"):
            values[key] = value.lower() == "true"
        elif hint is bool and not isinstance(value, bool):
            raise UsageError(f"line {call.line}: {call.name} {key} must be true or false, not {value!r}")
        elif hint is str and not isinstance(value, str):
            values[key] = str(value)
        elif hint is int and not isinstance(value, int):
            try:
                values[key] = int(value)
            except (TypeError, ValueError):
                raise UsageError(f"line {call.line}: {call.name} {key} must be a whole number, not {value!r}") from None
    return call.step.Args(**values)
