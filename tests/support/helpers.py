"""Helpers shared by the tests: the simulator's prerequisites and running commands on simulated hosts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparkcluster.engine.errors import UsageError
from sparkcluster.sim import SimCluster, prerequisites

# CI sets this so that a machine without the simulator's prerequisites fails loudly instead of skipping.
REQUIRE_SIM = os.environ.get("SPARKCLUSTER_REQUIRE_SIM") == "1"
SESSION_HOSTS = 3
SESSION_DRIVERS = ("590.48.01", "580.95.05", "590.44.01")


def require_sim(docker: bool = True) -> None:
    try:
        prerequisites.check(docker)
    except UsageError as e:
        if REQUIRE_SIM:
            pytest.fail(f"simulated cluster unavailable: {e}")
        pytest.skip(f"simulated cluster unavailable: {e.message}")


def unique_name(tag: str) -> str:
    return f"t{os.getpid() % 100000}-{tag}"


def ssh(cluster: SimCluster, host: str, command: str, user: str | None = None, via: str = "mgmt",
        check: bool = True) -> subprocess.CompletedProcess:
    """Run `command` on a simulated host with the real OpenSSH client, the cluster's key and strict host keys."""
    result = subprocess.run(cluster.ssh_argv(host, user, via) + [command], capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"ssh {host} {command!r} exited {result.returncode}: {result.stderr.strip()}")
    return result


def run_cli(*args: str, env: dict | None = None, stdin: str | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "sparkcluster", *args], capture_output=True, text=True,
                          input=stdin, timeout=timeout, env={**os.environ, **(env or {})})


def bootstrapped(cluster: SimCluster, config_dir: Path) -> SimCluster:
    """Run bootstrap on a fresh cluster (the last-used record goes to `config_dir`, not the user's)."""
    result = run_cli("bootstrap", str(cluster.inventory_path), env={"XDG_CONFIG_HOME": str(config_dir)})
    assert result.returncode == 0, result.stdout + result.stderr
    return cluster


def git_repo(root: Path, files: dict[str, str], links: dict[str, Path] | None = None) -> Path:
    """A local git repository holding `files` (path -> text) and symlinks, as a registry's author publishes one."""
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for rel, target in (links or {}).items():
        (root / rel).symlink_to(target)
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "HOME": str(root), "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-q", "-m", "files"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, env=env)
    return root
