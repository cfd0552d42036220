"""A playbook argument's template, rendered per host: its type kept when it is one expression, and each way it
can fail is a usage error naming the playbook's line, the step and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.bootstrap import stepcatalog
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


def test_prepare_compiles_each_template_once_ahead_and_leaves_a_broken_one_to_its_step(tmp_path: Path) -> None:
    # The runner prepares the playbook while the first facts come in: what a play would compile as it starts is
    # compiled then, and a template that cannot compile fails where its step renders it, as without preparing.
    from sparkcluster.engine import playbook as pb

    book = tmp_path / "two.yml"
    book.write_text("plays:\n  - name: p\n    hosts: all\n    steps:\n"
                    "      - command.run: {cmd: 'echo {{ greeting }} {{ host_name }} prepared'}\n"
                    "      - command.run: {cmd: 'echo {{ broken ( }}'}\n")
    loaded = stepcatalog.load(book)
    misses = pb._template.cache_info().misses
    loaded.prepare()  # does not raise for the broken template
    assert pb._template.cache_info().misses == misses + 2
    hits = pb._template.cache_info().hits
    good, broken = loaded.plays[0].steps
    assert build_args(good, {"greeting": "hi", "host_name": "spark-1"}).cmd == "echo hi spark-1 prepared"
    assert pb._template.cache_info().hits == hits + 1 and pb._template.cache_info().misses == misses + 2
    with pytest.raises(UsageError, match="line 6: command.run: template error"):
        build_args(broken, {})
