"""The case tables, pyinfra's way: each case a piece of data in tests/fixtures/cases/*.json (its `kind` says which
driver below runs it), so adding a case is adding data. nccl-verdict: an NCCL log to the verdict it gets;
refused-input: bad input to exit 2 and the message, before anything connects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sparkcluster.engine.errors import EXIT_USAGE
from sparkcluster.nccl.logs import read_log
from sparkcluster.nccl.verdict import judge
from tests.support.refusals import exit_and_stderr

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CASES = FIXTURES / "cases"
KINDS = ("nccl-verdict", "refused-input")


def tables() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, json.loads(path.read_text(encoding="utf-8"))) for path in sorted(CASES.glob("*.json"))]


def cases(kind: str) -> list[Any]:
    return [pytest.param(case, id=f"{path.stem}: {case.get('name') or case.get('log')}")
            for path, doc in tables() if doc["kind"] == kind for case in doc["cases"]]


def test_every_table_is_of_a_kind_a_driver_runs_and_holds_cases():
    found = tables()
    assert found and all(doc["kind"] in KINDS and doc["cases"] for _, doc in found)
    assert {doc["kind"] for _, doc in found} == set(KINDS)


@pytest.mark.parametrize("case", cases("nccl-verdict"))
def test_an_nccl_log_gets_its_verdict(case: dict[str, Any]) -> None:
    name = case["log"]
    verdict = judge(read_log((FIXTURES / "nccl" / name).read_text(), name))
    assert (verdict.status, verdict.transports, verdict.intra_node_only) == (
        case["status"], tuple(case["transports"]), case["intra_node_only"])
    assert verdict.cause.startswith(case["cause"]), verdict.cause
    assert case.get("fix", "") in verdict.fix


@pytest.mark.parametrize("case", cases("refused-input"))
def test_bad_input_is_refused_with_its_message_before_anything_connects(
        case: dict[str, Any], tmp_path: Path, no_connection: None, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    paths = {}
    for name, text in case.get("files", {}).items():
        paths[name] = tmp_path / name
        paths[name].write_text(text)

    def filled(text: str) -> str:
        for name, path in paths.items():
            text = text.replace("{" + name + "}", str(path))
        return text
    code, err = exit_and_stderr(monkeypatch, capsys, [filled(word) for word in case["argv"]])
    assert code == case.get("exit", EXIT_USAGE), err
    for said in case["stderr"]:
        assert filled(said) in err, err
