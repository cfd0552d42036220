"""The same container image on every node (F16): compare image IDs, and copy the head's image to nodes that
lack it or hold another one, over the fabric (`docker save | ssh node docker load`), with progress."""

from __future__ import annotations

import json
import shlex
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..engine.command import Command
from ..engine.errors import SparkclusterError, UsageError
from ..engine.transport import SSH_FOR_BULK, Transport

# Between `docker save` and ssh on the head: passes the bytes through and reports the count on stderr
# about once a second, so the CLI can show progress while the copy runs.
RELAY_PY = ("import sys,time\nsrc,dst,n,t=sys.stdin.buffer,sys.stdout.buffer,0,0\n"
            "while True:\n b=src.read(1<<20)\n if not b: break\n dst.write(b); n+=len(b)\n"
            " if time.time()-t>=1: t=time.time(); sys.stderr.write('bytes %d\\n'%n); sys.stderr.flush()\n"
            "dst.flush(); sys.stderr.write('bytes %d\\n'%n)\n")


@dataclass(frozen=True)
class ImageInfo:
    id: str | None  # None: the node lacks the image
    size: int = 0
    entrypoint: tuple[str, ...] | None = None


def inspect(transport: Transport, image: str) -> ImageInfo:
    result = transport.run(Command.argv(["docker", "image", "inspect", "--format",
                                         "{{json .Id}} {{json .Size}} {{json .Config.Entrypoint}}", "--", image]))
    if not result.ok:
        if "No such image" in result.stderr or "No such object" in result.stderr:
            return ImageInfo(None)
        # Only docker's own words say whose fault it is: a bad name is the user's, not the docker group's.
        if "invalid reference format" in result.stderr:
            raise UsageError(f"{transport.host.name}: {image!r} is not a valid image name: {result.stderr_tail(1)}",
                             "name an image as REPOSITORY[:TAG], e.g. --image vllm-node or "
                             "--image nvcr.io/nvidia/vllm:25.09-py3")
        if "permission denied" in result.stderr.lower() and "docker" in result.stderr.lower():
            fix = (f"add the login user to the docker group on {transport.host.name} "
                   "(sparkcluster bootstrap does it), then connect again")
        else:
            fix = f"check that Docker runs on {transport.host.name}: docker info"
        raise SparkclusterError(f"{transport.host.name}: docker image inspect {image} failed: {result.stderr_tail(2)}", fix)
    id_, size, entrypoint = (json.loads(w) for w in result.stdout.split(" ", 2))
    return ImageInfo(id_, int(size), tuple(entrypoint) if entrypoint else None)


def copy_from_head(head_ssh: Sequence[str], image: str, user: str, target_ip: str, node: str, size: int,
                   progress: Callable[[str, int, int], None]) -> None:
    """Run `docker save | relay | ssh node docker load` on the head, through `head_ssh` (an OpenSSH command
    to the head), so the image crosses the fabric and the CLI sees the relay's byte counts as they come."""
    pipeline = (f"set -o pipefail; docker save {shlex.quote(image)} | python3 -c {shlex.quote(RELAY_PY)} | "
                f"{SSH_FOR_BULK} {shlex.quote(f'{user}@{target_ip}')} docker load")
    process = subprocess.Popen([*head_ssh, f"bash -c {shlex.quote(pipeline)}"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    errors: list[str] = []

    def read_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            if line.startswith("bytes "):
                progress(node, int(line.split()[1]), size)
            else:
                errors.append(line.rstrip())

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    stdout, _ = process.communicate()
    reader.join(timeout=5)
    if process.returncode != 0:
        raise SparkclusterError(
            f"copying image {image} to {node} over the fabric ({target_ip}) failed (exit {process.returncode}): "
            + ("; ".join(errors[-3:]) or stdout.strip()[-200:]),
            f"check that the head reaches {node} by ssh on {target_ip} (sparkcluster bootstrap sets that up) "
            f"and that {node} has room for the image; or load it there yourself: docker load < image.tar")


def plan_copies(infos: Mapping[str, ImageInfo], head: str, image: str) -> list[str]:
    """The nodes that need the head's image; an error when the head lacks it."""
    if infos[head].id is None:
        raise SparkclusterError(f"the head {head} has no image {image!r}",
                                f"build or pull it on {head} (eugr: ./build-and-copy.sh), or name another with --image")
    return [name for name, info in infos.items() if info.id != infos[head].id]
