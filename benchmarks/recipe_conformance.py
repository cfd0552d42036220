"""Does sparkcluster render a whole tree of community recipes as their own tools render them? Every recipe file of
every repository under TREE (a folder with `.sparkrun/registry.yaml` declares registries; its recipes folders are
walked) is rendered with `recipes show --json` by FILE and, where its registry is known, by `@REG/NAME`, in a
private HOME where each repository is added as the registries it declares (`recipes add-registry NAME URL --trust`,
git told that the repository's GitHub URL is the local folder, so the community's reserved names register offline).

With --expected FILE (a JSON list, or {"entries": [...]}, of {file, ref, model, flags, env, nodes, refused}: the
render each recipe's own tool gives), each listed recipe is compared flag by flag: the model; the flags, with
-tp/-pp/... as their long names, `_` as `-` in a name, `--x=v` as `--x v`, the last value winning and JSON values
compared as data; launcher flags (which depend on how the nodes are joined, not on the recipe) left out of the
comparison, but none allowed on a one-node recipe; the env; the node count. A `refused` entry must exit 2.
Without it, every recipe must render or be refused with a message (exit 2): a traceback or any other exit fails.

Run:  .venv/bin/python benchmarks/recipe_conformance.py TREE [--expected FILE] [--json]
e.g.  .venv/bin/python benchmarks/recipe_conformance.py ../shared/reference/community-corpus \\
          --expected ../shared/reference/community-corpus/expected.json
Exit 0 when every recipe passes, 1 otherwise, 2 when TREE or FILE cannot be read.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkcluster import cli  # noqa: E402

GITHUB = "https://github.com/spark-arena/"  # a reserved registry name registers only from its owners' URLs
LAUNCHER_FLAGS = {"nnodes", "node-rank", "master-addr", "master-port", "headless", "distributed-executor-backend"}
SHORT = {"tp": "tensor-parallel-size", "pp": "pipeline-parallel-size", "dp": "data-parallel-size",
         "q": "quantization", "ep": "enable-expert-parallel", "dcp": "decode-context-parallel-size",
         "cc": "compilation-config", "O": "optimization-level"}
VLLM_DEFAULTS = {"tensor-parallel-size": "1", "pipeline-parallel-size": "1"}  # said or not, the same


# ---------------------------------------------------------------- a vLLM line as (model, {flag: value})

def _is_flag(word: str) -> bool:
    if not word.startswith("-") or len(word) < 2:
        return False
    try:
        float(word)
        return False
    except ValueError:
        return True


def _name(word: str) -> tuple[str, str | None]:
    long = word.startswith("--")
    name, _, inline = word.lstrip("-").partition("=")
    head, dot, tail = name.partition(".")
    if not long and head in SHORT:
        head = SHORT[head]
    elif not long and head[:1] == "O" and head[1:].isdigit():
        head, inline = "optimization-level", inline or head[1:]
    return head.replace("_", "-") + dot + tail, inline or None


def _value(words: list[str]) -> str | None:
    if not words:
        return None
    text = " ".join(words)
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except ValueError:
        return text


def vllm_line(command: str) -> tuple[str | None, dict[str, str | None]]:
    words = shlex.split(command[command.index("vllm serve"):])[2:]
    model = words.pop(0) if words and not _is_flag(words[0]) else None
    flags: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        name, inline = _name(words[i])
        i += 1
        values = [inline] if inline is not None else []
        while inline is None and i < len(words) and not _is_flag(words[i]):
            values.append(words[i])
            i += 1
        flags.pop(name, None)
        flags[name] = _value(values)
    return model, flags


# ---------------------------------------------------------------- one render judged against its entry

def differences(entry: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    head = next((c for c in doc.get("commands", []) if "vllm serve" in c and "--headless" not in c), None)
    if head is None:
        return ["no `vllm serve` line"]
    model, got = vllm_line(head)
    found = []
    if model != entry.get("model"):
        found.append(f"model {model!r}, expected {entry.get('model')!r}")
    want = {k: v for k, v in (entry.get("flags") or {}).items() if k not in LAUNCHER_FLAGS}
    mine = {k: v for k, v in got.items() if k not in LAUNCHER_FLAGS}
    for key in sorted(set(want) | set(mine)):
        if want.get(key, "?") == mine.get(key, "?"):
            continue
        said = want.get(key, mine.get(key))
        if (key not in want or key not in mine) and (VLLM_DEFAULTS.get(key) == said or
                                                      (key == "served-model-name" and said == entry.get("model"))):
            continue
        found.append(f"--{key} {mine[key] if key in mine else '(missing)'}, expected "
                     f"{want[key] if key in want else '(none)'}")
    if entry.get("nodes") == 1 and set(got) & LAUNCHER_FLAGS:
        found.append(f"launcher flags on one node: {', '.join(sorted(set(got) & LAUNCHER_FLAGS))}")
    if entry.get("nodes") is not None and doc.get("nodes") != entry["nodes"]:
        found.append(f"rendered for {doc.get('nodes')} node(s), the recipe is for {entry['nodes']}")
    want_env = {k: str(v) for k, v in (entry.get("env") or {}).items()}
    got_env = {k: str(v) for k, v in (doc.get("env") or {}).items()}
    found += [f"env {k}={got_env.get(k)!r}, expected {want_env.get(k)!r}"
              for k in sorted(set(want_env) | set(got_env)) if want_env.get(k) != got_env.get(k)]
    return found


@dataclass
class Rendered:
    code: int
    doc: dict[str, Any] | None
    said: str


def show(ref: str) -> Rendered:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(["recipes", "show", "--json", ref])
        except Exception as e:  # noqa: BLE001 - a crash is what this check exists to find
            return Rendered(99, None, f"{type(e).__name__}: {e}")
    doc = json.loads(out.getvalue()) if code == 0 else None
    return Rendered(code, doc, " ".join(err.getvalue().split())[:300])


def judge(entry: dict[str, Any] | None, rendered: Rendered) -> list[str]:
    if rendered.code == 99:
        return [f"crashed: {rendered.said}"]
    if entry is not None and entry.get("refused"):
        return [] if rendered.code == 2 and rendered.said else [f"exit {rendered.code}, expected a refusal (exit 2)"]
    if rendered.code != 0:
        # without an expected render, a refusal that says why is an answer (a runtime sparkcluster does not serve)
        return [] if entry is None and rendered.code == 2 and rendered.said else [f"exit {rendered.code}: {rendered.said}"]
    return differences(entry, rendered.doc or {}) if entry is not None else []


# ---------------------------------------------------------------- the tree, its registries, a private HOME

@dataclass
class Recipe:
    file: str  # relative to TREE
    ref: str | None  # @REG/NAME where a registry's recipes folder holds it
    results: dict[str, list[str]] = field(default_factory=dict)  # path -> differences ([]: as the reference)


def declared(repo: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load((repo / ".sparkrun" / "registry.yaml").read_text()) or {}
    return [e for e in doc.get("registries") or [] if isinstance(e, dict) and e.get("name")]


def recipes_of(tree: Path) -> list[Recipe]:
    found = []
    for manifest in sorted(tree.glob("*/.sparkrun/registry.yaml")):
        repo = manifest.parents[1]
        for entry in declared(repo):
            folder = repo / str(entry.get("recipes") or "")
            for path in sorted(p for p in folder.rglob("*") if p.suffix in (".yaml", ".yml") and p.is_file()):
                found.append(Recipe(str(path.relative_to(tree)), f"@{entry['name']}/{path.stem}"))
    return found


@contextlib.contextmanager
def private_home(tree: Path) -> Iterator[Path]:
    """A HOME with each repository of TREE as a git repository, reached at its GitHub URL, then added."""
    tmp = Path(tempfile.mkdtemp(prefix="recipe-conformance-"))
    saved = dict(os.environ)
    try:
        home = tmp / "home"
        home.mkdir()
        os.environ.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"), XDG_CACHE_HOME=str(home / ".cache"),
                          GIT_CONFIG_NOSYSTEM="1", GIT_TERMINAL_PROMPT="0")
        config = ["[user]", "\tname = conformance", "\temail = conformance@localhost", '[protocol "file"]',
                  "\tallow = always", "[init]", "\tdefaultBranch = main"]
        repos = []
        for manifest in sorted(tree.glob("*/.sparkrun/registry.yaml")):
            copy = tmp / "repos" / manifest.parents[1].name
            shutil.copytree(manifest.parents[1], copy, symlinks=True)
            config += [f'[url "{copy}"]', f"\tinsteadOf = {GITHUB}{copy.name}"]
            repos.append(copy)
        (home / ".gitconfig").write_text("\n".join(config) + "\n")
        for repo in repos:
            for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
                subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
            first = declared(repo)[0]["name"]  # the others it declares come with it
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                if cli.main(["recipes", "add-registry", str(first), GITHUB + repo.name, "--trust"]) != 0:
                    raise SystemExit(f"recipe-conformance: adding {repo.name} as registry {first} failed")
        yield tmp / "repos"
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tree", type=Path, help="a folder of recipe repositories (each with .sparkrun/registry.yaml)")
    ap.add_argument("--expected", type=Path, help="expected renders (JSON)")
    ap.add_argument("--json", action="store_true", help="one JSON document")
    a = ap.parse_args()
    tree = a.tree.resolve()
    try:
        data = json.loads(a.expected.read_text()) if a.expected else []
    except (OSError, ValueError) as e:
        print(f"recipe-conformance: cannot read {a.expected}: {e}", file=sys.stderr)
        return 2
    expected = {e["file"]: e for e in (data["entries"] if isinstance(data, dict) else data)}
    recipes = recipes_of(tree)
    if not recipes:
        print(f"recipe-conformance: no repository with .sparkrun/registry.yaml under {tree}", file=sys.stderr)
        return 2
    started = time.monotonic()
    with private_home(tree) as repos:
        for r in recipes:
            entry = expected.get(r.file)
            r.results["file"] = judge(entry, show(str(repos / r.file)))
            if r.ref:
                r.results["ref"] = judge(entry, show(entry.get("ref", r.ref) if entry else r.ref))
    seconds = time.monotonic() - started
    listed = [r for r in recipes if r.file in expected]
    passed = [r for r in listed if not any(r.results.values())]
    others_ok = [r for r in recipes if r.file not in expected and not any(r.results.values())]
    summary = (f"{len(passed)} of {len(listed)} expected renders match, by FILE and @REG/NAME; "
               f"{len(others_ok)} of {len(recipes) - len(listed)} other recipes render or are refused with a reason "
               f"({len(recipes)} recipes, {seconds:.1f} s)")
    if a.json:
        print(json.dumps({"recipes": [{"file": r.file, "ref": r.ref, "expected": r.file in expected,
                                       "pass": not any(r.results.values()),
                                       **{f"by_{path}": d for path, d in r.results.items()}} for r in recipes],
                          "expected_pass": len(passed), "expected_total": len(listed), "summary": summary}, indent=1))
    else:
        for r in recipes:
            problems = "; ".join(f"[{path}] {'; '.join(d)}" for path, d in r.results.items() if d)
            print(f"{'FAIL' if problems else 'PASS'} {r.file}{': ' + problems if problems else ''}")
        print(summary)
    return 0 if len(passed) == len(listed) and len(others_ok) == len(recipes) - len(listed) else 1


if __name__ == "__main__":
    sys.exit(main())
