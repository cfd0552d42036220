"""The wheel a user installs on the machine they run sparkcluster from: built from this tree, installed into a fresh
virtual environment by an ordinary user (no root, no simulator), and run there: --version, a command's help, and
nccl-report on a log (what `pipx install` / `uv tool install` do, with pip and the venv module of the system's
Python). The dependencies come as wheels built here first (from pip's cache when it has them), so the user's
install reads no index: what the wheel declares is all it gets."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkcluster.cli import WINGS

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
USER = "sc-wheel-user"
SYSTEM_PYTHON = "/usr/bin/python3"  # what a user's machine has; not this tree's .venv


def as_user(argv: list[str], home: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_NO_CACHE_DIR": "1", "PIP_CONFIG_FILE": os.devnull}
    if os.geteuid() == 0:
        argv = ["runuser", "-u", USER, "--", "env", *(f"{k}={v}" for k, v in env.items()), *argv]
        env = dict(os.environ)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=home)


@pytest.fixture(scope="module")
def user_home() -> Iterator[Path]:
    """An ordinary user's home: a user made for the test when run as root (CI), else the user running it."""
    if os.geteuid() != 0:
        with tempfile.TemporaryDirectory() as home:
            yield Path(home)
        return
    created = False
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
        created = True
    home = Path(pwd.getpwnam(USER).pw_dir)
    try:
        yield home
    finally:
        if created:
            subprocess.run(["userdel", "--remove", USER], capture_output=True)


@pytest.fixture(scope="module")
def wheels() -> Iterator[Path]:
    """sparkcluster's wheel and every dependency's, in a folder any user can read."""
    folder = Path(tempfile.mkdtemp(prefix="sc-wheels-", dir="/tmp"))
    folder.chmod(0o755)
    try:
        built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "-w", str(folder),
                                str(ROOT)], capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stderr[-3000:]
        for wheel in folder.iterdir():
            wheel.chmod(0o644)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_wheel_installs_and_runs_for_an_ordinary_user(user_home: Path, wheels: Path) -> None:
    names = {w.name.split("-")[0].lower() for w in wheels.glob("*.whl")}
    # The simulator needs nothing beyond what the CLI needs: no test or simulator-only package is pulled in.
    assert "sparkcluster" in names and not names & {"pytest", "hypothesis", "torch", "mypy", "ruff"}
    venv = user_home / "sparkcluster-venv"
    made = as_user([SYSTEM_PYTHON, "-m", "venv", "--without-pip", str(venv)], user_home)
    assert made.returncode == 0, made.stderr
    installed = as_user([SYSTEM_PYTHON, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                         "--no-compile", "--no-index", "--find-links", str(wheels), "sparkcluster"], user_home)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert venv.stat().st_uid != 0 and (venv / "bin" / "sparkcluster").stat().st_uid == venv.stat().st_uid

    cli = str(venv / "bin" / "sparkcluster")
    version = as_user([cli, "--version"], user_home)
    assert version.returncode == 0 and version.stdout.startswith("sparkcluster "), version.stderr
    help_ = as_user([cli, "facts", "--help"], user_home)
    assert help_.returncode == 0 and "--trust-new-host-keys" in help_.stdout, help_.stderr
    # Every command's wing is in the wheel (a hand-kept package list once left `doctor` out): each one's help runs.
    script = "; ".join(f"{cli} {name} --help >/dev/null || echo {name}" for wing in WINGS for name, _ in wing.commands)
    missing = as_user(["sh", "-c", script], user_home)
    assert missing.stdout == "" and missing.returncode == 0, missing.stdout + missing.stderr[-2000:]

    log = wheels / "roce-both-twins.log"
    shutil.copy(ROOT / "tests" / "fixtures" / "nccl" / "roce-both-twins.log", log)
    log.chmod(0o644)
    report = as_user([cli, "nccl-report", str(log)], user_home)
    assert report.returncode == 0 and report.stdout.startswith("PASS  RDMA: NET/IB"), report.stdout + report.stderr
    # The package's data came along: the bundled playbook, recipes and example inventories.
    data = as_user([str(venv / "bin" / "python"), "-c", "from importlib.resources import files; "
                    "p = files('sparkcluster'); print(all((p / f).is_file() for f in ("
                    "'playbooks/bootstrap.yml', 'inventories/two-sparks.yml', 'templates/comm.env.j2')))"], user_home)
    assert data.stdout.strip() == "True", data.stdout + data.stderr
