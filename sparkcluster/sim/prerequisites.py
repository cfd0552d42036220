"""What `sparkcluster sim` needs on this machine, checked before anything is created."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from ..engine.errors import UsageError


@dataclass(frozen=True)
class Requirement:
    what: str  # a program name or an absolute path
    package: str  # the Debian package that provides it

    def present(self) -> bool:
        return os.path.exists(self.what) if self.what.startswith("/") else shutil.which(self.what) is not None


BASE = (
    Requirement("ip", "iproute2"),
    Requirement("tc", "iproute2"),
    Requirement("unshare", "util-linux"),
    Requirement("nsenter", "util-linux"),
    Requirement("pivot_root", "util-linux"),
    Requirement("/usr/sbin/sshd", "openssh-server"),
    Requirement("ssh-keygen", "openssh-client"),
    Requirement("/usr/bin/sudo", "sudo"),
    Requirement("/usr/bin/python3", "python3"),  # the hardware emulators inside each host
)
DOCKER = (
    Requirement("dockerd", "docker.io"),
    Requirement("containerd", "containerd"),
    Requirement("runc", "runc"),
    Requirement("docker", "docker.io"),
)


def require_root() -> None:
    if os.geteuid() != 0:
        raise UsageError(
            "sparkcluster sim needs root: it creates network namespaces, bridges and mounts",
            "run it as root, e.g. `sudo sparkcluster sim up 2`",
        )


def check(docker: bool) -> None:
    """Raise UsageError naming every missing piece and the one command that installs them."""
    require_root()
    missing = [r for r in (*BASE, *(DOCKER if docker else ())) if not r.present()]
    if missing:
        packages = sorted({r.package for r in missing})
        names = ", ".join(f"{r.what} ({r.package})" for r in missing)
        hint = " (or pass --no-docker)" if any(r in DOCKER for r in missing) else ""
        raise UsageError(
            f"sparkcluster sim is missing: {names}",
            f"apt-get update && apt-get install -y {' '.join(packages)}{hint}",
        )
