"""Round 5's H1 as data: a recipe holds no YAML alias (refused at its line), and its file and what its template
renders to are bounded before anything is rendered (the report's merge and render bombs ran minutes and
gigabytes)."""

from __future__ import annotations

import pytest

from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.recipes.load import load_recipe

from tests.support.recipes import private_home  # noqa: F401 (private_home: autouse fixture)


def refused(ref: str) -> UsageError:
    with pytest.raises(UsageError) as e:
        load_recipe(ref)
    assert e.value.exit_code == EXIT_USAGE
    return e.value


def alias_tree(name: str, levels: int, width: int = 9) -> str:
    """The report's alias bomb: each level a list of `width` aliases of the one below."""
    lines = [f"  l0: &{name}0 [x]"]
    for i in range(1, levels):
        lines.append(f"  l{i}: &{name}{i} [{', '.join([f'*{name}{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def test_a_recipe_alias_is_refused_at_its_line_before_the_include_merge_expands_it(tmp_path):
    """The report's merge bomb (9 keys x 11 levels in a recipe and its base): ran past 90 s and 2.6 GB before."""
    (tmp_path / "base.yaml").write_text("recipe_version: '2'\nmodel: a/b\ndefaults:\n" + alias_tree("b", 11))
    top = tmp_path / "top.yaml"
    top.write_text("recipe_version: '2'\ninclude: base\nmodel: a/b\ndefaults:\n" + alias_tree("b", 11))
    error = refused(str(top))
    assert error.message == f"{top}:6: the alias *b0 repeats a value" and "anchors and aliases" in error.fix


def test_a_render_bomb_with_an_alias_is_refused_at_its_line(tmp_path):
    top = tmp_path / "rend.yaml"
    top.write_text("recipe_version: '2'\nmodel: a/b\ndefaults:\n" + alias_tree("a", 9) +
                   "  x: *a8\ncommand: vllm serve {model} --max-num-seqs {x}\n")
    assert refused(str(top)).message.startswith(f"{top}:5: the alias *a0")


def test_placeholders_that_repeat_each_other_are_refused_before_they_render(tmp_path):
    """No alias at all: five rounds of sparkrun's substitution over values of a thousand `{next}` each."""
    chain = "".join(f"  v{i}: '{('{v' + str(i + 1) + '}') * 1000}'\n" for i in range(5)) + "  v5: xxxxxxxx\n"
    top = tmp_path / "chain.yaml"
    top.write_text("recipe_version: '2'\nmodel: a/b\ndefaults:\n" + chain)
    error = refused(str(top))
    assert error.message.endswith("renders to more than 256 KiB (its placeholders repeat each other)")
    assert error.message.startswith(f"{top}:")


def test_a_command_that_renders_past_the_bound_is_refused_at_its_line(tmp_path):
    top = tmp_path / "wide.yaml"
    top.write_text("recipe_version: '1'\nname: x\ncontainer: c\ndefaults:\n  x: '" + "9" * 20000 + "'\n"
                   "command: vllm serve a/b --max-num-seqs " + "{x}" * 20 + "\n")
    assert refused(str(top)).message == f"{top}:6: the command renders to more than 256 KiB"


def test_a_recipe_file_past_the_bound_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("recipe_version: '2'\nmodel: a/b\n# " + "x" * 300_000 + "\n")
    assert refused(str(big)).message == f"{big}: the recipe is more than 256 KiB"
