"""A generated model in Hugging Face's cache layout, written inside a simulated host (nothing can be
downloaded here): config and tokenizer files named by git blob hash, safetensors-like shards named by
sha256, relative snapshot links, refs/main. Shards are random bytes: staging moves and checks them like
real weights, but they are not loadable by a model runtime."""

from __future__ import annotations

import json
import shlex
import subprocess

from .cluster import SimCluster

GENERATE_PY = r"""
import hashlib, json, os, sys
spec = json.loads(sys.argv[1])
root = os.path.join(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub",
                    "models--" + spec["repo"].replace("/", "--"))
commit = spec["commit"]
os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
os.makedirs(os.path.join(root, "snapshots", commit), exist_ok=True)
os.makedirs(os.path.join(root, "refs"), exist_ok=True)

def put(path, data_chunks, kind):
    tmp = os.path.join(root, "blobs", ".gen.tmp")
    h = hashlib.sha256() if kind == "lfs" else None
    size = 0
    with open(tmp, "wb") as f:
        for chunk in data_chunks:
            f.write(chunk); size += len(chunk)
            if h: h.update(chunk)
    if kind == "git":
        with open(tmp, "rb") as f:
            data = f.read()
        name = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    else:
        name = h.hexdigest()
    os.replace(tmp, os.path.join(root, "blobs", name))
    link = os.path.join(root, "snapshots", commit, path)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    depth = path.count("/")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink("../" * (2 + depth) + "blobs/" + name, link)

put("config.json", [json.dumps({"architectures": ["FakeForCausalLM"], "model_type": "fake"}).encode()], "git")
put("tokenizer_config.json", [b'{"model_max_length": 2048}'], "git")
n = spec["shards"]
for i in range(1, n + 1):
    size = spec["shard_bytes"]
    chunks = (os.urandom(min(1 << 22, size - off)) for off in range(0, size, 1 << 22))
    put(f"model-{i:05d}-of-{n:05d}.safetensors", chunks, "lfs")
with open(os.path.join(root, "refs", "main"), "w") as f:
    f.write(commit)
print(root)
"""


def generate(cluster: SimCluster, host: str, repo: str, total_bytes: int, shards: int = 4,
             commit: str = "0123456789abcdef0123456789abcdef01234567") -> str:
    """Write the model into `host`'s HF cache as its login user; returns the model directory."""
    spec = json.dumps({"repo": repo, "commit": commit, "shards": shards, "shard_bytes": total_bytes // shards})
    argv = cluster.ssh_argv(host) + [f"python3 -c {shlex.quote(GENERATE_PY)} {shlex.quote(spec)}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"generating {repo} on {host} failed: {result.stderr.strip()}")
    return result.stdout.strip()
