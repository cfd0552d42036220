"""Where a model's first copy comes from when no node holds it: a download on the head (huggingface_hub run
there), or this machine's own HF cache pushed to the head. Either way the head then feeds the chain."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from ..engine.command import Command
from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.modelref import ModelRef
from ..engine.remote import python_command
from ..engine.transport import Transport, ssh_destination
from .hfcache import (
    PARTIAL_DIR,
    Manifest,
    finalize_command,
    parse_scan,
    rsync_blobs_argv,
    scan_command,
    source_manifest,
)

DOWNLOAD_PY = r"""
import sys
token = sys.stdin.readline().strip() or None
try:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
except ImportError:
    print("@missing huggingface_hub"); sys.exit(3)
try:
    print("@path", snapshot_download(sys.argv[1], revision=sys.argv[2], token=token))
except GatedRepoError:
    print("@gated"); sys.exit(4)
except RepositoryNotFoundError:
    print("@notfound"); sys.exit(5)
except RevisionNotFoundError:
    print("@norevision"); sys.exit(6)
except OSError as e:
    print("@oserror", e); sys.exit(7)
except Exception as e:
    print("@error", type(e).__name__, str(e).splitlines()[0] if str(e) else ""); sys.exit(8)
"""

DOWNLOAD_ERRORS = {
    "@missing": ("huggingface_hub is not installed on the head", "pip install huggingface_hub on the head, or stage "
                 "from this machine with --source local"),
    "@gated": ("the model is gated and this token has no access", "accept its terms on huggingface.co and set HF_TOKEN"),
    "@notfound": ("no such model on the Hub (or it is private)", "check the name; for a private model set HF_TOKEN"),
    "@norevision": ("no such revision of the model", "check the branch or commit after @"),
    "@oserror": ("the download failed on the head's disk or network", "check free space in the head's HF cache and "
                 "its internet access"),
    "@error": ("the download failed", "check the head's internet access and HF_TOKEN"),
}


def hf_token() -> str:
    """HF_TOKEN from the environment or huggingface_hub's token file; passed on stdin, never in argv."""
    token = os.environ.get("HF_TOKEN", "")
    if token:
        return token
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    path = home / "token"
    return path.read_text().strip() if path.is_file() else ""


def download_on(transport: Transport, model: ModelRef, python: str = "python3") -> None:
    token = hf_token()
    command = python_command(python, DOWNLOAD_PY, model.repo, model.revision, stdin=token + "\n", secrets=(token,),
                             timeout=24 * 3600)
    result = transport.run(command)
    if result.ok:
        return
    tag = (result.stdout.split() or ["@error"])[0]
    message, fix = DOWNLOAD_ERRORS.get(tag, DOWNLOAD_ERRORS["@error"])
    detail = result.stdout.strip() or result.stderr_tail(3)
    # huggingface_hub writes refs/ before the files: a failed download must not leave a ref that looks done.
    scan = parse_scan(transport.run(scan_command(model)).stdout)
    if scan.commit and source_manifest(model, scan) is None and not model.is_commit:
        transport.run(Command.argv(["rm", "-f", f"{scan.model_dir}/refs/{model.revision}"]))
    raise SparkclusterError(f"{model}: {message} ({detail})", fix)


def local_model_dir(model: ModelRef) -> Path:
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return home / "hub" / model.dir_name


def local_manifest(model: ModelRef) -> Manifest:
    """This machine's snapshot, scanned with the same command and parser the nodes use."""
    script = scan_command(model).line()
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout
    manifest = source_manifest(model, parse_scan(out))
    if manifest is None:
        raise SparkclusterError(f"{model} is not complete in this machine's HF cache ({local_model_dir(model)})",
                                f"download it here first: huggingface-cli download {model.repo}")
    return manifest


def push_local(model: ModelRef, head: Host, transport: Transport, ssh_argv: list[str]) -> None:
    """rsync this machine's blobs to the head (over the only route from here: its management address),
    then links and ref, in the same order as everywhere else."""
    manifest = local_manifest(model)
    remote_dir = parse_scan(transport.run(scan_command(model)).stdout).model_dir
    transport.run(Command.argv(["mkdir", "-p", f"{remote_dir}/blobs/{PARTIAL_DIR}"]))
    blobs = local_model_dir(model) / "blobs"
    names = [f.blob for f in manifest.unique_blobs()]
    result = subprocess.run(
        rsync_blobs_argv([str(blobs / n) for n in names], f"{ssh_destination(head)}:{remote_dir}/blobs/",
                         shlex.join(ssh_argv)),
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise SparkclusterError(f"pushing {model} to {head.name} failed: {result.stderr.strip()[-300:]}",
                                f"check ssh to {head.address} and the free space there")
    if not transport.run(finalize_command(remote_dir, manifest)).ok:
        raise SparkclusterError(f"could not link {model}'s snapshot on {head.name}", "check its HF cache")
