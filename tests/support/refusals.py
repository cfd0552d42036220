"""What the tests of bad input share: a fixture under which any connection fails the test (bad input is refused
before anything connects; transports are built only in engine/session.py), and the CLI run in this process (so the
fixture holds) with its stderr unwrapped. The case tables (tests/fixtures/cases/*.json, tests/unit/test_case_tables.py)
and the tests of each wing's refusals use them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sparkcluster import cli
from sparkcluster.engine import session as session_module


@pytest.fixture
def no_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("connected although the input was invalid")
    monkeypatch.setattr(session_module, "Transport", refuse)


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """The CLI in this process, its stderr unwrapped: (exit code, stderr). argparse's refusals raise SystemExit."""
    monkeypatch.setattr(cli.err_console, "width", 10_000)  # the one stderr console every wing prints through
    code = cli.main(list(argv))
    return code, capsys.readouterr().err


def exit_and_stderr(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                    argv: Sequence[str]) -> tuple[int, str]:
    """As run_cli, with argparse's refusal (SystemExit) read as its exit code too."""
    try:
        return run_cli(monkeypatch, capsys, *argv)
    except SystemExit as exited:
        return int(exited.code or 0), capsys.readouterr().err
