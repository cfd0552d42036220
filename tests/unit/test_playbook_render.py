"""A playbook argument's template, rendered per host: its type kept when it is one expression, and each way it
can fail is a usage error naming the playbook's line, the step and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster import stepcatalog
from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.playbook import StepCall, build_args, render


def _call(tmp_path: Path, cmd: str) -> StepCall:
    book = tmp_path / "one.yml"
    book.write_text("plays:\n  - name: p\n    hosts: all\n    steps:\n"
                    f"      - command.run: {{cmd: {cmd!r}}}\n")
    return stepcatalog.load(book).plays[0].steps[0]


def test_one_expression_keeps_its_type_and_text_renders_to_text() -> None:
    assert render("{{ n | default(3) }}", {}) == 3
    assert render({"a": ["{{ xs }}", "x{{ n }}"], "b": "plain"}, {"xs": [1, 2], "n": 5}) == \
        {"a": [[1, 2], "x5"], "b": "plain"}
    assert render("{{ (runtime | default('docker')) == 'docker' }}", {}) is True


def test_a_missing_variable_names_itself_the_line_and_the_fix(tmp_path: Path) -> None:
    call = _call(tmp_path, "echo {{ nowhere }}")
    with pytest.raises(UsageError) as e:
        build_args(call, {})
    assert e.value.message == "line 5: command.run: 'nowhere' is undefined"
    assert "-e NAME=VALUE" in e.value.fix


def test_a_missing_variable_alone_in_its_expression_is_an_error_too(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="'nowhere' is undefined"):
        build_args(_call(tmp_path, "{{ nowhere }}"), {})


def test_a_broken_template_is_a_template_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as e:
        build_args(_call(tmp_path, "echo {{ x + }}"), {"x": 1})
    assert e.value.message.startswith("line 5: command.run: template error: ")
    assert e.value.fix == "fix the template"
    assert build_args(_call(tmp_path, "echo {{ x }}"), {"x": 1}).cmd == "echo 1"
