"""The exporter as one file a node's Python runs (`python3 sparkcluster-exporter.pyz --listen ADDR`): a zip of
sparkcluster's own Python modules with a __main__, written byte-for-byte the same for the same sources (fixed
times, sorted names), so its sha256 tells `monitor up` whether a node's copy is current. The nodes need no
sparkcluster installed: only python3 and PyYAML (DGX OS ships python3-yaml), as the NCCL probe needs only Python."""

from __future__ import annotations

import hashlib
import io
import zipfile
from functools import cache
from pathlib import Path

MAIN = b"import sys\nfrom sparkcluster.monitor.exporter import main\nsys.exit(main())\n"
# What the exporter imports, with what those import: the wings it reads with (node, nccl; serving for the
# supervisor's file shapes, serving/incidents.py), engine below them. Only what it imports runs on the node.
WINGS = ("engine", "node", "nccl", "serving", "monitor")


@cache
def exporter_zip() -> bytes:
    root = Path(__file__).resolve().parents[1]
    files = [root / "__init__.py", *sorted(p for wing in WINGS for p in (root / wing).rglob("*.py"))]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for path in [None, *files]:
            name = "__main__.py" if path is None else f"sparkcluster/{path.relative_to(root).as_posix()}"
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, MAIN if path is None else path.read_bytes())
    return out.getvalue()


def exporter_sha256() -> str:
    return hashlib.sha256(exporter_zip()).hexdigest()
