"""Hugging Face's cache layout on a node: what a model snapshot looks like, and whether it is complete.

hub/models--ORG--NAME/
  blobs/<sha256 or git-sha1>          the file contents, named by their hash
  snapshots/<commit>/<path> -> ../../blobs/<hash>   (relative symlinks; deeper paths climb further)
  refs/<branch>                        the commit; written last, so a snapshot without it is not "there"
Paths are resolved on each node (${HF_HOME:-$HOME/.cache/huggingface}), never copied from elsewhere.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from dataclasses import dataclass, field

from ..engine.command import Command
from ..engine.modelref import COMMIT, ModelRef
from ..engine.remote import HF_HOME, python_command

HUB = f'"{HF_HOME}/hub"'
SHA256 = re.compile(r"^[0-9a-f]{64}$")
PARTIAL_DIR = ".sparkcluster-partial"  # rsync keeps interrupted blobs here, never under their final name


@dataclass(frozen=True)
class SnapshotFile:
    path: str  # inside the snapshot, e.g. "model-00001-of-00004.safetensors"
    blob: str  # the blob's name (its hash)
    size: int

    @property
    def link_target(self) -> str:
        """The relative symlink Hugging Face writes: ../../blobs/<hash>, one more ../ per subdirectory."""
        depth = self.path.count("/")
        return "../" * (2 + depth) + "blobs/" + self.blob


@dataclass(frozen=True)
class NodeModel:
    """What one node holds of one model."""

    model_dir: str  # the model's directory under the node's own hub path, resolved there
    commit: str | None  # what refs/<branch> says (or the commit asked for)
    files: tuple[SnapshotFile, ...]  # the snapshot's entries whose blob exists (size from the blob)
    dangling: tuple[str, ...]  # snapshot entries whose blob is missing
    blobs: dict[str, int] = field(default_factory=dict)  # every blob present: name -> size


def scan_command(model: ModelRef) -> Command:
    """One round trip: the hub path, the ref, the snapshot's links and every blob with its size."""
    d = f'{HUB}/{shlex.quote(model.dir_name)}'
    ref = shlex.quote(model.revision)
    commit = ("echo " + ref) if model.is_commit else f"cat {d}/refs/{ref} 2>/dev/null; echo"
    return Command(
        f'echo {HUB}/{shlex.quote(model.dir_name)}; c=$({commit}); echo "@commit $c"; '
        f'if [ -n "$c" ] && [ -d {d}/snapshots/"$c" ]; then '
        f'  (cd {d}/snapshots/"$c" && find . -type l -printf "@link %P\\t%l\\n"); fi; '
        f'if [ -d {d}/blobs ]; then (cd {d}/blobs && find . -maxdepth 1 -type f ! -name ".*" -printf "@blob %f\\t%s\\n"); fi',
        timeout=60,
    )


def parse_scan(text: str) -> NodeModel:
    lines = text.splitlines()
    model_dir = lines[0].strip() if lines else ""
    commit, links, blobs = None, [], {}
    for line in lines[1:]:
        if line.startswith("@commit "):
            # A ref is a 40-hex commit; anything else (a hand-edited file) is treated as no ref at all,
            # since it ends up in paths and commands on other nodes.
            commit = line[8:].strip() if COMMIT.match(line[8:].strip()) else None
        elif line.startswith("@link ") and "\t" in line:
            path, target = line[6:].split("\t", 1)
            links.append((path, posixpath.basename(target)))
        elif line.startswith("@blob ") and "\t" in line:
            name, size = line[6:].split("\t", 1)
            if size.strip().isdigit():
                blobs[name] = int(size)
    files = tuple(SnapshotFile(p, b, blobs[b]) for p, b in sorted(links) if b in blobs)
    dangling = tuple(p for p, b in sorted(links) if b not in blobs)
    return NodeModel(model_dir, commit, files, dangling, blobs)


@dataclass(frozen=True)
class Manifest:
    """The source's complete snapshot: what every node must end up holding."""

    model: ModelRef
    commit: str
    files: tuple[SnapshotFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.unique_blobs())

    def unique_blobs(self) -> tuple[SnapshotFile, ...]:
        seen: dict[str, SnapshotFile] = {}
        for f in self.files:
            seen.setdefault(f.blob, f)
        return tuple(seen.values())


@dataclass(frozen=True)
class NodeStatus:
    state: str  # complete | missing | corrupt | absent
    missing: tuple[str, ...] = ()  # blob names not present
    corrupt: tuple[str, ...] = ()  # blob names present with the wrong size (or, verified, the wrong hash)
    unlinked: bool = False  # blobs fine but the snapshot links or the ref are not all there

    @property
    def complete(self) -> bool:
        return self.state == "complete"


def source_manifest(model: ModelRef, node: NodeModel) -> Manifest | None:
    """A node's snapshot as a manifest, if it looks complete: a ref, links, and every linked blob present."""
    if not node.commit or not node.files or node.dangling:
        return None
    return Manifest(model, node.commit, node.files)


def node_status(manifest: Manifest, node: NodeModel, bad_hashes: frozenset[str] = frozenset()) -> NodeStatus:
    if not node.blobs and not node.files:
        return NodeStatus("absent", missing=tuple(f.blob for f in manifest.unique_blobs()))
    missing = tuple(f.blob for f in manifest.unique_blobs() if f.blob not in node.blobs)
    corrupt = tuple(f.blob for f in manifest.unique_blobs()
                    if f.blob in node.blobs and (node.blobs[f.blob] != f.size or f.blob in bad_hashes))
    linked = {(f.path, f.blob) for f in node.files}
    unlinked = node.commit != manifest.commit or any((f.path, f.blob) not in linked for f in manifest.files)
    if corrupt:
        return NodeStatus("corrupt", missing, corrupt, unlinked)
    if missing or unlinked:
        return NodeStatus("missing", missing, corrupt, unlinked)
    return NodeStatus("complete")


# Hash check on the node itself: sha256-named blobs (LFS files) by sha256, 40-hex names (small files in git)
# by git's blob hash. Prints the names that do not match. python3 is on every DGX OS install.
VERIFY_PY = r"""
import hashlib, os, re, sys
os.chdir(sys.argv[1])
for name in sys.stdin.read().split():
    if re.fullmatch(r"[0-9a-f]{64}", name):
        h = hashlib.sha256()
    elif re.fullmatch(r"[0-9a-f]{40}", name):
        h = hashlib.sha1(b"blob %d\0" % os.path.getsize(name))
    else:
        continue
    try:
        with open(name, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    except OSError:
        print(name)
        continue
    if h.hexdigest() != name:
        print(name)
"""


def rsync_blobs_argv(sources: list[str], target: str, ssh: str) -> list[str]:
    """How blobs travel: times kept, files readable, an interrupted blob kept aside in PARTIAL_DIR (never under
    its final name) to resume from. `ssh` is the remote shell command rsync runs."""
    return ["rsync", "-t", "--partial", f"--partial-dir={PARTIAL_DIR}", "--chmod=F644", "--protect-args",
            "-e", ssh, *sources, target]


def verify_command(python: str, model_dir: str, blobs: list[str]) -> Command:
    return python_command(python, VERIFY_PY, model_dir + "/blobs", stdin="\n".join(blobs) + "\n", timeout=3600)


def finalize_command(model_dir: str, manifest: Manifest) -> Command:
    """Links first, then the ref, atomically: a ref only ever points at a snapshot whose blobs are all there."""
    snap = f"{model_dir}/snapshots/{manifest.commit}"
    lines = ["set -e", f"mkdir -p {shlex.quote(snap)} {shlex.quote(model_dir + '/refs')}"]
    for f in manifest.files:
        target = f"{snap}/{f.path}"
        lines.append(f"mkdir -p {shlex.quote(posixpath.dirname(target))}")
        lines.append(f"ln -sfn {shlex.quote(f.link_target)} {shlex.quote(target)}")
    if not manifest.model.is_commit:
        ref = f"{model_dir}/refs/{manifest.model.revision}"
        lines.append(f"mkdir -p {shlex.quote(posixpath.dirname(ref))}")  # a branch may hold / (refs/pr/1)
        lines.append(f"printf %s {shlex.quote(manifest.commit)} > {shlex.quote(ref + '.tmp')}")
        lines.append(f"mv -f {shlex.quote(ref + '.tmp')} {shlex.quote(ref)}")
    # Every blob is in place: what interrupted transfers left (rsync's `.HASH.XXXXXX` temp files, the partial
    # dir) can never be resumed into anything and only holds disk. Blob names never start with a dot.
    blobs = shlex.quote(model_dir + "/blobs")
    lines.append(f"rm -rf -- {blobs}/{PARTIAL_DIR}")
    lines.append(f"find {blobs} -maxdepth 1 -type f -name '.*' -delete")
    return Command("\n".join(lines), timeout=120)
