"""The README's shell-completion lines, pasted as an ordinary user with an empty home, work in bash, zsh and fish.

The lines are read from README.md itself (the fenced block after COMPLETION_MARKER), so what the test runs is what a
newcomer pastes. Each shell's section runs in that shell as uid 65534 (`nobody`, as root: CI) or as the user running
the tests, with HOME an empty folder; then a new shell of that kind, started as a user's would be, must complete
`sparkcluster boots` to `bootstrap` from the file the lines wrote. `sparkcluster` on that user's PATH is a stand-in
printing the package's own scripts: whether the wheel installs for such a user is tests/integration/test_install.py's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkcluster.completion import SHELLS, script

README = Path(__file__).resolve().parents[2] / "README.md"
COMPLETION_MARKER = "<!-- completion lines: tests/unit/test_readme_completion.py runs them -->"
NOBODY = 65534
REQUIRE_SHELLS = os.environ.get("SPARKCLUSTER_REQUIRE_SIM", "1") != "0" and os.geteuid() == 0

# A new shell as a user's terminal starts it, asked to complete `sparkcluster boots`, printing the candidates.
# bash: a login shell reads /etc/profile.d/bash_completion.sh (the bash-completion package) as Ubuntu's does, and
# the package loads a command's completion on its first TAB; this calls that loader, then the function it set.
COMPLETES = {
    "bash": ["bash", "-lic", '_completion_loader sparkcluster; '
             'spec=$(complete -p sparkcluster) || exit 1; fn=${spec##*-F }; fn=${fn%% *}; '
             'COMP_WORDS=(sparkcluster boots); COMP_CWORD=1; COMP_LINE="sparkcluster boots"; '
             'COMP_POINT=${#COMP_LINE}; "$fn" sparkcluster boots sparkcluster; printf "%s\\n" "${COMPREPLY[@]}"'],
    # zsh: an interactive shell reads ~/.zshrc; compinit maps each command to the _NAME function found on $fpath.
    "zsh": ["zsh", "-ic", 'print -r -- "${_comps[sparkcluster]}"'],
    "fish": ["fish", "-c", "complete -C 'sparkcluster boots'"],
}
EXPECTED = {"bash": "bootstrap", "zsh": "_sparkcluster", "fish": "bootstrap"}


def readme_sections() -> dict[str, str]:
    """The marked block's lines, split into one section per shell at its `# bash` / `# zsh` / `# fish` comment."""
    text = README.read_text()
    assert COMPLETION_MARKER in text, f"README.md lost its marker {COMPLETION_MARKER!r}"
    block = re.search(r"```\w*\n(.*?)\n```", text[text.index(COMPLETION_MARKER):], re.S)
    assert block is not None, "no fenced block after the completion marker"
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in block.group(1).splitlines():
        heading = re.match(r"#\s*(\w+)", line)
        if heading and heading.group(1) in SHELLS:
            current = sections.setdefault(heading.group(1), [])
        elif current is not None:
            current.append(line)
    return {shell: "\n".join(lines) for shell, lines in sections.items()}


@pytest.fixture()
def stage() -> Iterator[Path]:
    """A folder the ordinary user can read: bin/ with the stand-in `sparkcluster`, and home/, empty, theirs."""
    folder = Path(tempfile.mkdtemp(prefix="sc-completion-", dir="/tmp"))
    try:
        folder.chmod(0o755)
        (folder / "bin").mkdir(mode=0o755)
        for shell in SHELLS:
            (folder / "bin" / f"completion.{shell}").write_text(script(shell))
            (folder / "bin" / f"completion.{shell}").chmod(0o644)
        stand_in = folder / "bin" / "sparkcluster"
        stand_in.write_text(f'#!/bin/sh\n[ "$1" = completion ] && exec cat "{folder}/bin/completion.$2"\nexit 2\n')
        stand_in.chmod(0o755)
        (folder / "home").mkdir(mode=0o700)
        if os.geteuid() == 0:
            os.chown(folder / "home", NOBODY, NOBODY)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def as_user(argv: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(folder / "home"), "PATH": f"{folder / 'bin'}:/usr/bin:/bin", "LANG": "C.UTF-8",
           "TERM": "dumb"}
    drop = (["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if os.geteuid() == 0 else [])
    return subprocess.run([*drop, "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
                          capture_output=True, text=True, timeout=60, cwd=folder / "home", stdin=subprocess.DEVNULL)


def test_the_readme_has_completion_lines_for_every_shell() -> None:
    sections = readme_sections()
    assert sorted(sections) == sorted(SHELLS)
    for shell, lines in sections.items():
        assert f"sparkcluster completion {shell} >" in lines


@pytest.mark.parametrize("shell", SHELLS)
def test_the_readme_completion_lines_work_for_an_ordinary_user_with_an_empty_home(shell: str, stage: Path) -> None:
    if shutil.which(shell) is None or (shell == "bash" and not Path("/etc/profile.d/bash_completion.sh").exists()):
        if REQUIRE_SHELLS:  # CI's machine has them (scripts/setup.sh --system): a skip there is a failure
            pytest.fail(f"{shell} (or bash-completion) is missing: scripts/setup.sh --system installs it")
        pytest.skip(f"{shell} (or bash-completion) is not installed (scripts/setup.sh --system installs it)")
    pasted = as_user([shell, "-c", readme_sections()[shell]], stage)
    assert pasted.returncode == 0, f"the README's {shell} lines failed: {pasted.stderr}"
    completes = as_user(COMPLETES[shell], stage)
    assert EXPECTED[shell] in completes.stdout.split(), (
        f"a new {shell} did not load the completion the README's lines wrote:\n{completes.stdout}{completes.stderr}")
