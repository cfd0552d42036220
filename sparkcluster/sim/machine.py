"""What the simulator needs of this machine itself: SSH keys made with ssh-keygen, files written into a host's
overlay layer as the real tree has them, whether root lacks capabilities, a path's filesystem type, and the
cgroups dockerd leaves behind."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from ..engine.errors import SparkclusterError


def keygen(path: Path, comment: str) -> None:
    result = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise SparkclusterError(f"ssh-keygen failed: {result.stderr.strip()}", "check that openssh-client works")


def write_into_upper(upper: Path, path: str, content: bytes, mode: int) -> None:
    """Write a file into an overlay's upper layer. Parent dirs copy the mode and owner of the real ones:
    an upper dir's attributes win in the merged view, and a 0700 /usr/local would break every login."""
    target = upper / path.lstrip("/")
    make_dirs_in_upper(upper, target.parent)
    tmp = target.with_name(target.name + ".sim-tmp")
    tmp.write_bytes(content)
    os.chmod(tmp, mode)
    tmp.replace(target)


def make_dirs_in_upper(upper: Path, directory: Path) -> None:
    """Create a directory of an overlay's upper layer and its missing parents, each with the mode and owner of
    the real one (a new one: 0755, root's)."""
    missing = []
    parent = directory
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for d in reversed(missing):
        d.mkdir()
        real = Path("/") / d.relative_to(upper)
        if real.exists():
            st = real.stat()
            os.chmod(d, st.st_mode & 0o7777)
            os.chown(d, st.st_uid, st.st_gid)
        else:
            os.chmod(d, 0o755)


def opaque_dir_in_upper(upper: Path, path: str) -> bool:
    """Make a directory of the host's disk its own: overlayfs shows none of the real one's entries under an opaque
    upper directory (the xattr overlayfs reads; a mounted overlay's upper must not change, so the host is off).
    False where the upper's filesystem refuses the xattr (an overlayfs before Linux 6.7): the real entries then
    show, and what reads the directory must tell them apart (the emulated systemd starts only units of its own)."""
    directory = upper / path.lstrip("/")
    make_dirs_in_upper(upper, directory)
    try:
        os.setxattr(directory, "trusted.overlay.opaque", b"y")
    except OSError:
        return False
    return True


def capabilities_restricted() -> bool:
    """True where root lacks capabilities (this CI kind lacks CAP_SYS_RESOURCE): `--privileged` then needs
    the runc wrapper."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    status = Path("/proc/self/status").read_text()
    mask = int(next(line for line in status.splitlines() if line.startswith("CapBnd:")).split()[1], 16)
    full = (1 << (last + 1)) - 1
    return mask & full != full


def fs_type(path: Path) -> str:
    return subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()


def remove_cgroups(parent: str) -> None:
    """dockerd creates <controller>/.../<parent>/<container> dirs; they outlive the host. Remove them."""
    root = Path("/sys/fs/cgroup")
    if not root.is_dir():
        return
    for dirpath, dirnames, _ in os.walk(root, topdown=True):
        depth = len(Path(dirpath).relative_to(root).parts)
        if parent in dirnames:
            found = Path(dirpath) / parent
            for sub, _, _ in sorted(os.walk(found), key=lambda t: -len(t[0])):
                try:
                    os.rmdir(sub)
                except OSError:
                    pass
            dirnames.remove(parent)
        if depth >= 3:
            dirnames.clear()
