"""The package's wings and the one direction their imports run (README "Layout"):

    cli -> (bench, doctor, bootstrap, supervise) -> serving -> (recipes, observe, nccl, staging) -> node -> engine;
    sim -> engine

recipes knows no node (a file or @REG/NAME in, a typed Recipe out: engine only); observe watches what it is told to
(engine and node); bench reads /metrics through observe too. doctor reads what node knows of a Spark and where nccl
and serving keep their records (the last verify, the serve record, the logs); nothing imports doctor. bootstrap (facts,
bootstrap, run and the step catalog) wires the engine's playbooks to the steps the wings declare; nothing imports it.

Walks every module's imports with `ast` (module level and inside functions alike, since a lazy import is still
a dependency), resolves relative imports, and fails on an import that runs upward or sideways, and on cycles.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "sparkcluster"

# wing -> the wings its modules may import (itself included). Modules outside any wing (cli, __main__,
# completion) wire the wings together and may import anything.
ALLOWED: dict[str, frozenset[str]] = {
    "engine": frozenset({"engine"}),
    "node": frozenset({"engine", "node"}),
    "staging": frozenset({"engine", "node", "staging"}),
    "nccl": frozenset({"engine", "node", "nccl"}),
    "sim": frozenset({"engine", "sim"}),
    "recipes": frozenset({"engine", "recipes"}),
    "observe": frozenset({"engine", "node", "observe"}),
    "serving": frozenset({"engine", "node", "staging", "nccl", "recipes", "observe", "serving"}),
    "bench": frozenset({"engine", "node", "staging", "nccl", "recipes", "observe", "serving", "bench"}),
    "doctor": frozenset({"engine", "node", "staging", "nccl", "recipes", "observe", "serving", "doctor"}),
    "bootstrap": frozenset({"engine", "node", "staging", "nccl", "recipes", "observe", "serving", "bootstrap"}),
    # what runs unattended beside a serve (issue 48): watches through observe and serving, acts through serve
    "supervise": frozenset({"engine", "node", "staging", "nccl", "recipes", "observe", "serving", "supervise"}),
    # the cluster seen from outside (issue 49): renders what node and nccl read, scrapes what serving recorded
    "monitor": frozenset({"engine", "node", "staging", "nccl", "recipes", "observe", "serving", "monitor"}),
}


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import of the package inside `path`."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == root.name]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] != root.name:
                continue
            # `from . import x` names modules; `from .m import f` names a module's attributes.
            subs = [f"{target}.{a.name}" for a in node.names]
            found += [(node.lineno, s) for s in subs if _is_module(root, s)] or [(node.lineno, target)]
    return found


def _is_module(root: Path, dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (root / rel).with_suffix(".py").is_file() or (root / rel / "__init__.py").is_file()


def wing_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


def violations(root: Path) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*.py")):
        source = module_name(root, path)
        wing = wing_of(source)
        if wing is None:
            continue
        for line, target in imports_of(root, path):
            target_wing = wing_of(target)
            if target_wing is None and target != root.name:
                problems.append(f"{path.relative_to(root.parent)}:{line}: {wing} imports {target}, "
                                "which sits above every wing")
            elif target_wing is not None and target_wing not in ALLOWED[wing]:
                problems.append(f"{path.relative_to(root.parent)}:{line}: {wing} imports {target} ({target_wing})")
    return problems


def cycles(root: Path) -> list[list[str]]:
    graph = {module_name(root, p): {t for _, t in imports_of(root, p)} for p in root.rglob("*.py")}
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if nxt == node or nxt not in graph:
                continue
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    # A package's __init__ importing its own submodules is how it registers them, not a cycle of concerns.
    return [c for c in found if not any(a.startswith(b + ".") or b.startswith(a + ".") for a, b in zip(c, c[1:]))]


def test_imports_run_one_way() -> None:
    assert violations(PACKAGE) == []


def test_no_import_cycles() -> None:
    assert cycles(PACKAGE) == []


@pytest.mark.parametrize("planted, wing", [
    ("from ..serving import launch\n", "engine imports sparkcluster.serving.launch"),
    ("from ..staging.hfcache import HUB\n", "engine imports sparkcluster.staging.hfcache"),
    ("from .. import cli\n", "engine imports sparkcluster.cli, which sits above every wing"),
    ("from ..bootstrap import stepcatalog\n", "engine imports sparkcluster.bootstrap.stepcatalog"),
])
def test_a_planted_upward_import_is_caught(tmp_path: Path, planted: str, wing: str) -> None:
    root = tmp_path / "sparkcluster"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "engine" / "errors.py"
    target.write_text(target.read_text() + "\n" + planted)
    assert any(wing in v for v in violations(root)), violations(root)


def test_a_planted_sideways_import_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "sparkcluster"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "nccl" / "verdict.py"
    target.write_text(target.read_text() + "\ndef late():\n    from ..staging import chain\n")
    assert [v for v in violations(root) if "nccl imports sparkcluster.staging.chain (staging)" in v]


def test_a_planted_cycle_is_caught(tmp_path: Path) -> None:
    root = tmp_path / "sparkcluster"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__"))
    target = root / "engine" / "command.py"
    target.write_text(target.read_text() + "\nfrom . import transport\n")  # transport imports command
    assert any("sparkcluster.engine.command" in c and "sparkcluster.engine.transport" in c for c in cycles(root))


def test_wings_say_what_they_own() -> None:
    for wing in (w for w in ALLOWED if (PACKAGE / w).is_dir()):
        doc = ast.get_docstring(ast.parse((PACKAGE / wing / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"sparkcluster/{wing}/__init__.py needs a docstring saying what it owns"


@pytest.mark.parametrize("wing", ["recipes", "observe"])
def test_what_crosses_into_a_wing_without_a_cli_is_a_value(wing: str) -> None:
    """argparse stops at each wing's cli.py: recipes is handed Inputs, observe the checks and launcher to show."""
    users = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for path in sorted((PACKAGE / wing).rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, (ast.Import, ast.ImportFrom))
             and any(a.name == "argparse" for a in node.names) or
             isinstance(node, ast.ImportFrom) and node.module == "argparse"]
    assert users == []
