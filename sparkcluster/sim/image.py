"""A registry-free container image for the simulated cluster (nothing can be pulled here).

The rootfs is assembled from this machine's own binaries: bash and core tools, Debian's python3 with its
standard library, and every shared library they load (found with ldd). It is written as a tar and handed
to `docker import` inside a simulated host.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from ..engine.errors import SparkclusterError
from .state import sim_root

if TYPE_CHECKING:  # cluster.py imports this module
    from .cluster import SimCluster

DEFAULT_TAG = "vllm-node"
TOOLS = (
    "bash", "sh", "env", "cat", "ls", "sleep", "ps", "hostname", "mkdir", "rm", "id", "true", "false", "echo",
    "grep", "sed", "tail", "head", "cp", "mv", "ln", "chmod", "touch", "wc", "tr", "cut", "sort", "uname",
    "kill", "ip", "ss", "python3", "python3.11",
)
PYTHON_STDLIB = Path("/usr/lib/python3.11")
STDLIB_SKIP = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "turtledemo", "__pycache__"}
PASSWD = "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
IMAGE_FILES = resources.files("sparkcluster.sim") / "image_files"
VENV_IN_IMAGE = "/opt/venv"  # a Ray environment, when the image is built with one
IMPORT_CHANGES = ("WORKDIR /workspace", f"ENV PATH={VENV_IN_IMAGE}/bin:/usr/local/bin:/usr/bin:/bin", 'CMD ["bash"]')


# PyTorch in the Ray environment (the probe's collectives need it): several hundred MB, so an image can leave
# it out where the probe is not run, which makes every copy to a node three times faster.
TORCH_PACKAGES = ("torch", "torchgen", "functorch")


def tar_path(tag: str, with_ray: bool = False, with_torch: bool = True) -> Path:
    suffix = ("+ray" if with_ray else "") + ("" if with_torch or not with_ray else "-torch")
    return sim_root() / "images" / (re.sub(r"[^A-Za-z0-9_.-]", "_", tag) + suffix + ".tar")


def _is_torch(path: Path, env: Path) -> bool:
    """A file or folder of PyTorch inside the environment's site-packages."""
    parts = path.relative_to(env).parts
    return len(parts) > 3 and parts[2] == "site-packages" and parts[3].split("-")[0] in TORCH_PACKAGES


def build(tag: str = DEFAULT_TAG, rebuild: bool = False, ray_env: Path | None = None,
          with_torch: bool = True) -> Path:
    """Write the rootfs tar for `tag` (cached; about 1 s to build, a few more with Ray) and return its path.
    `ray_env`: a virtual environment made with Debian's /usr/bin/python3 and holding ray[default]; it
    becomes /opt/venv, first on the image's PATH, so the image runs a real Ray."""
    out = tar_path(tag, with_ray=ray_env is not None, with_torch=with_torch)
    if out.exists() and not rebuild:
        return out
    if ray_env is not None:
        _check_ray_env(ray_env)
    out.parent.mkdir(parents=True, exist_ok=True)
    venv_elves = [p for p in _elf_files(ray_env) if with_torch or not _is_torch(p, ray_env)] if ray_env else []
    files = _closure([*(_which(t) for t in TOOLS), *PYTHON_STDLIB.glob("lib-dynload/*.so"), *venv_elves])
    if ray_env is not None:  # the environment's own libraries go in once, under /opt/venv
        inside = (os.path.abspath(ray_env) + "/", os.path.realpath(ray_env) + "/")
        files = {f for f in files if not f.startswith(inside) and not os.path.realpath(f).startswith(inside)}
    tmp = out.with_suffix(f".{os.getpid()}.partial")  # two test processes may build the same tag at once
    with tarfile.open(tmp, "w") as tar:
        added: set[str] = set()
        for d, mode in (("workspace", 0o755), ("tmp", 0o1777), ("root", 0o700), ("etc", 0o755),
                        ("proc", 0o755), ("sys", 0o755), ("dev", 0o755), ("usr/local/bin", 0o755)):
            _add_dir(tar, d, mode, added)
        for name, text in (("etc/passwd", PASSWD), ("etc/group", GROUP), ("etc/hostname", "vllm-node\n")):
            _add_bytes(tar, name, text.encode(), 0o644)
        for path in sorted(files):
            _add_with_links(tar, Path(path), added)
        for dirpath, dirnames, filenames in os.walk(PYTHON_STDLIB):
            dirnames[:] = [d for d in dirnames if d not in STDLIB_SKIP]
            for f in filenames:
                _add_with_links(tar, Path(dirpath) / f, added)
        standin = (IMAGE_FILES / "vllm").read_bytes()
        _add_bytes(tar, "usr/local/bin/vllm", standin, 0o755)
        if ray_env is not None:
            _add_venv(tar, ray_env, added, with_torch)
    tmp.replace(out)  # a half-written tar never looks like a finished image
    return out


def _check_ray_env(env: Path) -> None:
    python = env / "bin" / "python"
    if not (env / "bin" / "ray").exists() or not python.exists():
        raise SparkclusterError(f"{env} is not a virtual environment with ray",
                                f"/usr/bin/python3 -m venv {env} && {env}/bin/pip install 'ray[default]'")
    if os.path.realpath(python) != os.path.realpath("/usr/bin/python3"):
        raise SparkclusterError(f"{env} was not made with /usr/bin/python3 (the image's interpreter)",
                                f"rm -rf {env}; /usr/bin/python3 -m venv {env} && {env}/bin/pip install 'ray[default]'")


def _elf_files(root: Path) -> list[Path]:
    """Shared objects and executables whose libraries the image must also carry (Ray's gcs_server, raylet)."""
    out = []
    for dirpath, _, filenames in os.walk(root):
        for f in filenames:
            path = Path(dirpath) / f
            if path.is_symlink() or not path.is_file():
                continue
            if ".so" in f or os.access(path, os.X_OK):
                with open(path, "rb") as fh:
                    if fh.read(4) == b"\x7fELF":
                        out.append(path)
    return out


def _add_venv(tar: tarfile.TarFile, env: Path, added: set[str], with_torch: bool) -> None:
    """The environment under /opt/venv; its scripts' `#!<env>/bin/python` lines are rewritten to match."""
    # pip wrote the absolute path it was given when the venv was made: match both spellings.
    old_shebangs = {f"#!{os.path.abspath(env)}/bin/".encode(), f"#!{os.path.realpath(env)}/bin/".encode()}
    for dirpath, dirnames, filenames in os.walk(env):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and (with_torch or not _is_torch(Path(dirpath) / d, env))]
        rel_dir = Path(VENV_IN_IMAGE[1:]) / Path(dirpath).relative_to(env)
        _add_dir(tar, str(rel_dir), 0o755, added)
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            arcname = str(rel_dir / name)
            if path.is_symlink():
                info = tarfile.TarInfo(arcname)
                info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
                tar.addfile(info)
            elif path.is_file():
                data = path.read_bytes()
                for old in old_shebangs:
                    if data.startswith(old):
                        data = f"#!{VENV_IN_IMAGE}/bin/".encode() + data[len(old):]
                        break
                _add_bytes(tar, arcname, data, path.stat().st_mode & 0o7777)


def _which(tool: str) -> str:
    path = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
    if not path:
        raise SparkclusterError(f"cannot build the test image: {tool} is not installed on this machine")
    return path


def _closure(paths: Sequence[str | Path]) -> set[str]:
    """The files plus every shared library (and the loader) they need, by ldd."""
    out = {str(p) for p in paths}
    for p in paths:
        result = subprocess.run(["ldd", str(p)], capture_output=True, text=True)
        for line in result.stdout.splitlines():
            m = re.search(r"(/\S+) \(0x", line)
            if m:
                out.add(m.group(1))
    return out


def _add_dir(tar: tarfile.TarFile, name: str, mode: int, added: set[str]) -> None:
    parts = Path(name).parts
    for i in range(1, len(parts) + 1):
        sub = "/".join(parts[:i])
        if sub not in added:
            info = tarfile.TarInfo(sub)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, int(time.time())
            tar.addfile(info)
            added.add(sub)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _add_with_links(tar: tarfile.TarFile, path: Path, added: set[str]) -> None:
    """Add `path` as the image sees it: every symlink on the way (merged /usr: /lib -> usr/lib) is added
    as a symlink, and its target too, so the loader finds files under their usual names."""
    current = Path("/")
    for part in path.parts[1:]:
        current = current / part
        name = str(current)[1:]
        if name in added:
            if current.is_symlink():
                target = Path(os.path.normpath(current.parent / os.readlink(current)))
                _add_with_links(tar, target, added)
                current = target
            continue
        if current.is_symlink():
            added.add(name)
            link = os.readlink(current)
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
            target = Path(os.path.normpath(current.parent / link))
            _add_with_links(tar, target, added)
            current = target
        elif current.is_dir():
            _add_dir(tar, name, current.stat().st_mode & 0o7777, added)
        elif current.is_file():
            added.add(name)
            tar.add(str(current), arcname=name, recursive=False)


def import_into(cluster: SimCluster, host_names: list[str], tag: str, tar: Path) -> None:
    """`docker import` the rootfs tar as `tag` inside each named host (as its own engine sees it)."""
    argv = ["docker", "import", *[a for c in IMPORT_CHANGES for a in ("-c", c)], "-", tag]
    for name in host_names:
        with open(tar, "rb") as stdin:
            result = cluster.exec_in(name, argv, stdin=stdin, capture_output=True, text=False)
        if result.returncode != 0:
            raise SparkclusterError(
                f"docker import on {name} failed: {result.stderr.decode(errors='replace').strip()}",
                "is the cluster up with Docker? (`sparkcluster sim up N` without --no-docker)",
            )
