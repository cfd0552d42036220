"""Build a tiny random Llama, fully offline and deterministically, in Hugging Face's cache layout.

    .venv-vllm/bin/python sparkcluster/sim/tinymodel.py HF_HOME_DIR [--repo local/tiny-llama]

or, on a simulated host, `generate_on(cluster, host, python)`. This file runs as a script with the python of
a vLLM environment (it imports nothing of sparkcluster's there).

writes HF_HOME_DIR/hub/models--local--tiny-llama/ (blobs/, snapshots/<commit>/, refs/main) and prints the
snapshot directory. The model: LlamaForCausalLM, hidden 256, 4 layers, 4 attention heads, 2 KV heads (both
divisible by tensor parallelism 2), vocab 2048, ~3.4 M parameters in bf16 safetensors (6.8 MB), with a
byte-level BPE tokenizer trained here on generated text. It is random: it produces text, not sense. Used by
the end-to-end tests that serve it with a real vLLM (CPU build) across simulated hosts; vLLM loads it with
HF_HOME=HF_HOME_DIR HF_HUB_OFFLINE=1 `vllm serve local/tiny-llama`.

Blobs follow the hub's naming (as sparkcluster/sim/fakemodel.py does): the sha256 of the content for the
safetensors file (an LFS file on the hub), the git blob sha1 for small text files. The commit is derived from
the files, so the same inputs give the same commit; running it again replaces nothing that is already there.
Needs torch, transformers, tokenizers and safetensors (all in .venv-vllm); takes a few seconds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this file also runs alone, as a script on a simulated host
    from .cluster import SimCluster

HIDDEN, LAYERS, HEADS, KV_HEADS, INTERMEDIATE, VOCAB, MAX_POS = 256, 4, 4, 2, 512, 2048, 2048
SEED = 1234
SPECIAL = ["<unk>", "<s>", "</s>"]

WORDS = """the a an and or but of to in on at by for with from into over under between across through node
nodes cluster spark sparks host hosts fabric network link links cable port ports switch rank ranks tensor
parallel model models weight weights layer layers token tokens cache memory disk file files request reply
server client serve serving start stop ready health check test tests run runs time fast slow small large
tiny one two three four five six seven eight nine ten first second last next every each some all none
is are was were be been has have had do does did can will would should may might must not no yes
red green blue light dark warm cold old new good bad high low long short open closed up down left right
river mountain forest city village road bridge house garden window door table chair book letter word
sentence story song music water fire stone wood iron glass paper bread apple orange tea coffee milk
morning evening night day week month year spring summer autumn winter rain snow wind sun moon star
walk walks walked talk talks talked read reads write writes wrote build builds built send sends sent
""".split()
SYLLABLES = "ka ri to na me lo su vi pe da mo ne ru sa ti ko la be gi fu ze ho ja wu xi qu yo".split()



def _json_bytes(doc: object) -> bytes:
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

def corpus(seed: int = SEED, lines: int = 6000) -> list[str]:
    """Deterministic text with enough variety for 2048 BPE merges: words, pseudo-words, numbers, code-ish."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        kind = i % 4
        if kind == 0:
            words = [rng.choice(WORDS) for _ in range(rng.randint(5, 16))]
            out.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ","]))
        elif kind == 1:
            words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(4, 12))]
            out.append(" ".join(words))
        elif kind == 2:
            out.append(f"spark-{rng.randint(1, 8)} 10.{rng.randint(0, 255)}.{rng.randint(0, 1)}.{rng.randint(10, 99)} "
                       f"rank={rng.randint(0, 7)} t={rng.random():.3f}s {rng.choice(WORDS)}_{rng.choice(WORDS)}")
        else:
            out.append(f"def {rng.choice(WORDS)}_{rng.choice(WORDS)}(x, y={rng.randint(0, 99)}):\n"
                       f"    return x {rng.choice('+-*/')} y  # {' '.join(rng.choice(WORDS) for _ in range(5))}")
    return out


def build_tokenizer(path: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(path)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def build_files(tmp: str) -> dict[str, bytes]:
    """The repository's files, name -> content; deterministic for a given torch/transformers/tokenizers."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    tok_path = os.path.join(tmp, "tokenizer.json")
    build_tokenizer(tok_path)
    with open(tok_path, "rb") as f:
        tokenizer_json = f.read()
    vocab = json.loads(tokenizer_json)["model"]["vocab"]
    bos, eos = vocab["<s>"], vocab["</s>"]

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=bos, eos_token_id=eos,
        pad_token_id=None, torch_dtype="bfloat16", initializer_range=0.02)
    config.architectures = ["LlamaForCausalLM"]
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    state = {k: v.contiguous() for k, v in sorted(model.state_dict().items())}
    st_path = os.path.join(tmp, "model.safetensors")
    save_file(state, st_path, metadata={"format": "pt"})
    with open(st_path, "rb") as f:
        weights = f.read()

    cfg = config.to_dict()
    cfg.pop("transformers_version", None)  # keep the bytes independent of the transformers release
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    return {
        "config.json": _json_bytes(cfg),
        "generation_config.json": _json_bytes({"bos_token_id": bos, "eos_token_id": eos, "do_sample": False}),
        "model.safetensors": weights,
        "tokenizer.json": tokenizer_json,
        "tokenizer_config.json": _json_bytes({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
            "model_max_length": MAX_POS}),
        "special_tokens_map.json": _json_bytes({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    }


def write_cache(hf_home: str, repo: str, files: dict[str, bytes]) -> str:
    root = os.path.join(hf_home, "hub", "models--" + repo.replace("/", "--"))
    names = {}
    for path, data in files.items():
        names[path] = hashlib.sha256(data).hexdigest() if path.endswith(".safetensors") else git_blob_sha1(data)
    # A commit id derived from the tree, so that the same files always give the same snapshot.
    commit = hashlib.sha1("".join(f"{p}\0{names[p]}\n" for p in sorted(names)).encode()).hexdigest()
    snap = os.path.join(root, "snapshots", commit)
    os.makedirs(os.path.join(root, "blobs"), exist_ok=True)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(root, "refs"), exist_ok=True)
    for path, data in files.items():
        blob = os.path.join(root, "blobs", names[path])
        if not os.path.exists(blob):
            tmp = blob + ".incomplete"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, blob)
        link = os.path.join(snap, path)
        target = "../" * (2 + path.count("/")) + "blobs/" + names[path]
        if os.path.lexists(link) and os.readlink(link) != target:
            os.remove(link)
        if not os.path.lexists(link):
            os.symlink(target, link)
    tmp = os.path.join(root, "refs", ".main.tmp")
    with open(tmp, "w") as f:
        f.write(commit)
    os.replace(tmp, os.path.join(root, "refs", "main"))
    return snap


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("hf_home", help="the HF_HOME directory (the model goes under HF_HOME/hub)")
    ap.add_argument("--repo", default="local/tiny-llama", help="repository id (default: local/tiny-llama)")
    args = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        files = build_files(tmp)
    snap = write_cache(os.path.abspath(args.hf_home), args.repo, files)
    print(f"tiny_model: {args.repo} built in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    print(snap)
    return 0


def generate_on(cluster: SimCluster, host: str, python: str, repo: str = "local/tiny-llama") -> str:
    """Build the model in `host`'s HF cache as its login user, with `python` (a vLLM environment's
    interpreter); returns the snapshot directory."""
    import shlex
    import subprocess
    argv = cluster.ssh_argv(host) + [f"{shlex.quote(python)} {shlex.quote(os.path.abspath(__file__))} "
                                     f"~/.cache/huggingface --repo {shlex.quote(repo)}"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"building {repo} on {host} failed: {result.stderr.strip()[-2000:]}")
    return result.stdout.strip().splitlines()[-1]


if __name__ == "__main__":
    sys.exit(main())
