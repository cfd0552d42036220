"""`sparkcluster serve --tp 2 --runtime host` with a REAL vLLM (the CPU build in .venv-vllm, made by
scripts/setup-vllm.sh) across two simulated Sparks, for both launchers: a tiny Llama generated offline on the
head, staged by sparkcluster, answering OpenAI completions from the head's management address; each rank on
its own node; the traffic between the ranks on the fabric (read from the nodes' sockets). Also: serve refuses
to start vLLM when the probe finds the traffic on the management network.

The pair is a stranger's (as in test_sim_variants.py, which proves its bootstrap and verify): RDMA devices named
mlx5_N and twins that come up with NVIDIA's link-local 169.254/16 addresses, replaced by bootstrap. So every serve
here also proves the real vLLM serves on the mlx5 link-local pair (one cluster and one vLLM start fewer in CI than
a serve of its own there)."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from sparkcluster.serving.readiness import http
from sparkcluster.sim import SimCluster
from tests.support.helpers import git_repo, run_cli, ssh
from tests.support.sim_serving import MODEL, ROOT, VLLM_FLAGS, host_bootstrap, processes, sc, vllm_pair

pytestmark = [pytest.mark.sim, pytest.mark.slow]
CANARY = "hf_SERVEENV" + "CANARY42"  # split: the test's own argv never holds it whole
API_KEY = "sk-" + "APIKEY" + "CANARY39"  # vLLM's --api-key (issue 39, S5), split the same way
HF_FLAG = "hf_" + "FLAGCANARY77"  # vLLM's --hf-token (issue 46, F3), split the same way
BOOK = ROOT / "README.md"  # any text of a few thousand words: bench --method llama-benchy cuts prompts from it
# Each `bench --json` below by what was served (its stdout), so test_bench_explain_... compares two of them with no
# serve of its own.
BENCH_RESULTS: dict[str, str] = {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[SimCluster]:
    with vllm_pair(tmp_path_factory.mktemp("cfg"), "vllm") as c:
        doc = yaml.safe_load(c.inventory_path.read_text())
        doc["vars"]["serve_env"]["HF_TOKEN"] = CANARY  # a secret: never in a command line on a node (issue 28)
        c.inventory_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        yield c


def connections(c: SimCluster, host: str) -> list[tuple[str, str, str]]:
    """(local ip, peer ip, process) of every established TCP connection in the host, ssh excluded."""
    out = c.exec_in(host, ["ss", "-Htnp", "state", "established"], capture_output=True, text=True).stdout
    result = []
    for line in out.splitlines():
        parts = line.split()
        local, peer = parts[2], parts[3]
        if local.endswith(":22") or peer.endswith(":22"):
            continue
        result.append((_ip(local), _ip(peer), parts[-1] if len(parts) > 4 else ""))
    return result


def _ip(endpoint: str) -> str:
    """`10.0.0.1:80`, `[::ffff:10.0.0.1]:80` -> `10.0.0.1`."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    return host.removeprefix("::ffff:")


def serves_tp2_on_the_fabric(c: SimCluster, doc: dict, rank_process: str, api_key: str | None = None) -> None:
    """A served TP 2 answers from the head's management address, with a rank on each node and the traffic between
    the nodes on fabric addresses only: the worker's connections all run over its QSFP address, and some of them
    reach the head's."""
    head, worker = c.topology.hosts
    assert doc["endpoint"] == f"http://{head.mgmt_ip}:8000/v1"
    assert doc["verify"]["verdict"]["status"] == "PASS"
    code, text = http(f"http://{head.mgmt_ip}:8000/v1/completions",
                      {"model": MODEL, "prompt": "The cluster of sparks", "max_tokens": 8, "temperature": 0},
                      timeout=60, api_key=api_key)
    assert code == 200, text
    assert json.loads(text)["usage"]["completion_tokens"] == 8
    # issue 46, F1: one engine's vLLM behind the key guard (failed before: /invocations generated, 200, keyless)
    assert http(f"http://{head.mgmt_ip}:8000/invocations", {"model": MODEL, "prompt": "x", "max_tokens": 2},
                timeout=30, api_key=api_key)[0] == 404
    assert http(f"http://{head.mgmt_ip}:28000/health", None, timeout=10)[0] == 0  # vLLM's own port: the head's only
    assert rank_process in processes(c, "spark-1") and rank_process in processes(c, "spark-2")
    fabric = {head.fabric_ips[0], worker.fabric_ips[0]}
    worker_conns = [(lo, peer, p) for lo, peer, p in connections(c, "spark-2") if peer not in ("127.0.0.1", "::1")]
    off_fabric = [conn for conn in worker_conns if conn[0] not in fabric or conn[1] not in fabric]
    assert worker_conns and not off_fabric, off_fabric
    assert any(peer == head.fabric_ips[0] for _, peer, _ in worker_conns)


def down_leaves_nothing(c: SimCluster) -> None:
    down = sc(c, "down", "--json")
    assert down.returncode == 0, down.stderr
    for host in ("spark-1", "spark-2"):
        assert "vllm serve" not in processes(c, host) and "raylet" not in processes(c, host)


# Another user of the node reads every process's command line as fast as it can, for as long as a serve runs.
# Its arguments: each secret in two halves (so its own command line holds none whole), then the file that stops it.
ARGV_WATCHER = """
import os, sys, time
halves, stop = sys.argv[1:-1], sys.argv[-1]
needles, hits, scans = [(a + b).encode() for a, b in zip(halves[::2], halves[1::2])], set(), 0
while not os.path.exists(stop):
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
        except OSError:
            continue
        if any(needle in line for needle in needles):
            hits.add(line.replace(b"\\0", b" ")[:300].decode(errors="replace"))
    scans += 1
    time.sleep(0.002)  # a scan every few ms, leaving the cores to the serve
print(scans)
print("\\n".join(sorted(hits)))
"""
ARGV_WATCH_STOP = "/tmp/argv-watch.stop"


@contextmanager
def argv_watched(c: SimCluster, hosts: Sequence[str], secrets: Sequence[str]) -> Iterator[dict[str, list[str]]]:
    """While the block runs, `nobody` on each of `hosts` watches every command line for `secrets`; yields the
    host -> [scans, command lines holding one] it fills once the block ends (with an exception too)."""
    halves = [half for secret in secrets for half in (secret[:len(secret) // 2], secret[len(secret) // 2:])]
    watchers = {host: subprocess.Popen(c.ssh_argv(host, "root") + [
        f"setpriv --reuid=nobody --regid=nogroup --clear-groups python3 -c {shlex.quote(ARGV_WATCHER)} "
        f"{shlex.join(halves)} {ARGV_WATCH_STOP}"], stdout=subprocess.PIPE, text=True) for host in hosts}
    seen: dict[str, list[str]] = {}
    try:
        yield seen
    finally:
        for host, watcher in watchers.items():
            ssh(c, host, f"touch {ARGV_WATCH_STOP}", user="root")
            seen[host] = watcher.communicate(timeout=60)[0].splitlines()
            ssh(c, host, f"rm -f {ARGV_WATCH_STOP}", user="root")


def never_seen(seen: dict[str, list[str]]) -> None:
    """Each watcher watched (a hundred scans or more) and never saw a secret."""
    for host, lines in seen.items():
        assert int(lines[0]) > 100 and not any(lines[1:]), (host, lines[1:])


def test_real_vllm_serves_with_tp2_across_two_nodes_over_ray(cluster, tmp_path):
    """The default launcher, Ray (eugr's), with no --runtime or --launcher: what the simulator's inventory sets is
    all the CPU vLLM needs (issue 43: failed before with `current platform cpu does not support ray`); the native
    launcher serves the same way in test_an_eugr_recipe_with_a_mod_serves_tp2_... The inventory's HF_TOKEN reaches
    the serving processes but no command line on a node, nor --check's output. `bench` with its default prompt and
    output fits them to the served 512 tokens. Then a sparkrun recipe serves TP 1 x PP 2 over the same Ray (one Ray
    start and one `down` fewer than a test of its own). While the serve starts Ray, an `up` is refused: the serve
    holds its lock to the end (README audit round 3, item 1: its stop of every node let the lock go)."""
    check = sc(cluster, "serve", "--tp", "2", "--model", MODEL, "--check", "--json", *VLLM_FLAGS)
    assert check.returncode == 0 and "ray start" in check.stdout, check.stderr[-2000:]
    assert CANARY not in check.stdout + check.stderr  # failed before: twice, in the start lines
    try:
        with argv_watched(cluster, ["spark-2"], [CANARY]) as seen:
            serving = subprocess.Popen(
                [sys.executable, "-m", "sparkcluster", "serve", "-i", str(cluster.inventory_path), "--tp", "2",
                 "--model", MODEL, "--ready-timeout", "300", "--json", *VLLM_FLAGS],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                an_up_is_refused_while_the_serve_starts_ray(cluster)
            finally:
                out, err = serving.communicate(timeout=600)
            assert serving.returncode == 0, err[-3000:]
            assert CANARY not in out + err
            served = json.loads(out)
            assert served["launcher"] == "ray" and served["runtime"] == "host", served
            serves_tp2_on_the_fabric(cluster, served, "RayWorkerProc")
            raylet = ssh(cluster, "spark-2", "pgrep -o -f raylet").stdout.strip()
            environ = ssh(cluster, "spark-2", f"cat /proc/{raylet}/environ", user="root").stdout
            assert f"HF_TOKEN={CANARY}" in environ.split("\0")  # it did reach the node, through stdin
            bench_fits_the_served_context(cluster)
            a_sparkrun_recipe_serves_tp1_x_pp2_over_ray(cluster, tmp_path)  # on the Ray cluster up now
    finally:
        down_leaves_nothing(cluster)
    never_seen(seen)  # it watched, and never saw the token


def an_up_is_refused_while_the_serve_starts_ray(cluster: SimCluster) -> None:
    """Once the worker's raylet runs (the serve's Ray phase, after its stop of every node), an `up` is refused at
    once (exit 1), naming the serve that holds the lock, and stops nothing: the serve goes on to answer."""
    deadline = time.monotonic() + 300  # the model is staged to the worker first
    while not ssh(cluster, "spark-2", "pgrep -f '[r]aylet'", check=False).stdout.strip():
        assert time.monotonic() < deadline, "Ray never started on spark-2"
        time.sleep(0.5)
    second = sc(cluster, "up", timeout=120)
    assert second.returncode == 1, second.stdout + second.stderr[-2000:]
    assert "spark-1: a serve or up of this cluster is already running there: " in " ".join(second.stderr.split())


def test_serve_refuses_a_fallback_onto_the_management_network(cluster, tmp_path):
    misbind = "sed -i 's/^GLOO_SOCKET_IFNAME=.*/GLOO_SOCKET_IFNAME=enP7s7/' ~/.config/sparkcluster/comm.env"
    for host in ("spark-1", "spark-2"):
        ssh(cluster, host, misbind)
    try:
        result = sc(cluster, "serve", "--runtime", "host", "--launcher", "native", "--tp", "2", "--model", MODEL,
                    *VLLM_FLAGS)
        err = " ".join(result.stderr.split())
        assert result.returncode == 1, err
        assert "refusing to serve: the NCCL probe found a fallback" in err and "enP7s7" in err
        assert "--allow-fallback" in err
        for host in ("spark-1", "spark-2"):
            assert "vllm serve" not in processes(cluster, host)
    finally:
        host_bootstrap(cluster, tmp_path)  # rewrites the comm env


def bench_fits_the_served_context(cluster: SimCluster) -> None:
    """~15 s: vLLM serves 512 tokens (--max-model-len); bench's default prompt and output (512 and 128: a 400
    before, "maximum context length is 512 tokens", told as "check that the server runs") are halved to fit and
    measured; sizes given that cannot fit are refused up front with the numbers. One request each: sizes are the
    point, not load (the server's own 400 message: tests/unit/bench/test_bench_context.py)."""
    once = ["--concurrency", "1", "--runs", "1", "--requests-per-stream", "1", "--warmup", "0"]
    result = sc(cluster, "bench", *once, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    BENCH_RESULTS["tp 2 over Ray, --max-model-len 512"] = result.stdout
    the_receipt_names_what_produced_the_numbers(cluster, json.loads(result.stdout)["receipt"])
    method = json.loads(result.stdout)["config"]["method"]
    assert (method["prompt_tokens"], method["output_tokens"], method["max_model_len"]) == (256, 64, 512), method
    assert json.loads(result.stdout)["rows"][0]["completion_tokens"] == 64  # all asked for: nothing cut to fit
    refused = sc(cluster, "bench", *once, "--prompt-tokens", "600")
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2, err
    assert "--prompt-tokens 600 cannot fit the served context: the server's max_model_len is 512 tokens" in err, err


def the_receipt_names_what_produced_the_numbers(cluster: SimCluster, receipt: dict) -> None:
    """Issue 41: bench's receipt holds the head's `vllm serve` command line as launched (the running process's own
    argv), the vLLM build that served, and both nodes' kernel and driver as their facts say; no speculation here."""
    engine = receipt["engine"]
    pid = ssh(cluster, "spark-1", "pgrep -o -f 'bin/vllm serve'").stdout.strip()  # vLLM, not its key guard's line
    running = ssh(cluster, "spark-1", f"cat /proc/{pid}/cmdline").stdout.split("\0")[:-1]
    # vLLM itself listens on the head's loopback behind the key guard (issue 46); the record says where clients reach it
    assert running[running.index("--host"):running.index("--port") + 2] == ["--host", "127.0.0.1", "--port", "28000"]
    running[running.index("--host") + 1:running.index("--port") + 2] = ["0.0.0.0", "--port", "8000"]
    assert engine["command"][:3] == ["vllm", "serve", MODEL], engine
    assert running[-(len(engine["command"]) - 1):] == engine["command"][1:], (running, engine["command"])
    assert engine["command"][-3:] == ["--max-model-len", "512", "--enforce-eager"]
    assert engine["vllm_version"] == "0.32.0+cpu" and engine["runtime"] == "host" and engine["python_env"], engine
    nodes = {n["name"]: n for n in receipt["nodes"]}
    assert set(nodes) == {"spark-1", "spark-2"}, receipt["nodes"]
    for name, node in nodes.items():
        assert node["kernel"] == ssh(cluster, name, "uname -r").stdout.strip() and node["driver"], node
        assert receipt["comm_env"][name]["VLLM_HOST_IP"]
    assert receipt["metrics"]["speculative"] is False and receipt["metrics"]["interval_s"] > 0, receipt["metrics"]
    assert CANARY not in json.dumps(receipt)


def vllm_counters(endpoint: str) -> dict[str, float]:
    """vLLM's prompt and generation token counters, summed over its label sets."""
    code, text = http(endpoint.removesuffix("/v1") + "/metrics", None, timeout=30)
    assert code == 200, text[:300]
    totals = {"prompt": 0.0, "generation": 0.0}
    for line in text.splitlines():
        for key in totals:
            if line.startswith(f"vllm:{key}_tokens_total"):
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


def bench_measures_the_served_cluster(cluster: SimCluster, tmp_path: Path, recipe: str, flag: str,
                                      api_key: str) -> None:
    """`bench` finds the endpoint from the inventory (the record serve left on the head), keeps 1, 2 and 4
    requests in flight against the real vLLM, and counts what the server itself counted; then measures it as
    llama-benchy does (~30 s more: chat needs a template, which the recipe's mod gave vLLM; the tiny model cannot
    answer the coherence question, so it is skipped), its token tally equal to vLLM's counters. The endpoint wants
    `api_key`, which both methods send from this machine's VLLM_API_KEY."""
    head = cluster.topology.hosts[0]
    plot = tmp_path / "bench.png"
    with_key = {"VLLM_API_KEY": api_key}
    result = sc(cluster, "bench", "--concurrency", "1,2,4", "--runs", "1", "--output-tokens", "8",
                "--prompt-tokens", "32", "--requests-per-stream", "2", "--plot", str(plot), "--json", env=with_key)
    assert result.returncode == 0, result.stderr[-3000:]
    BENCH_RESULTS["eugr recipe, --max-model-len 384 --chat-template"] = result.stdout
    doc = json.loads(result.stdout)
    assert api_key not in result.stdout + result.stderr  # the record's flags, which bench's config shows, hold none
    assert doc["config"]["endpoint"] == f"http://{head.mgmt_ip}:8000/v1"
    assert doc["config"]["tp"] == 2 and doc["config"]["launcher"] == "native"
    assert doc["config"]["server_version"]  # vLLM's /version
    # What produced the numbers: the recipe and its flags, and the verdict of the probe serve ran first.
    assert doc["config"]["recipe"] == recipe and flag in doc["config"]["recipe_flags"], doc["config"]
    assert doc["config"]["nccl_verdict"]["status"] == "PASS"
    for row, server, c in zip(doc["rows"], doc["server"], (1, 2, 4), strict=True):
        assert row["concurrency"] == c and row["errors"] == 0 and row["requests"] == 2 * c
        assert row["completion_tokens"] == 8 * 2 * c  # the server's usage: exactly --output-tokens each
        assert server["generation_tokens"] == row["completion_tokens"]  # vLLM's own counter agrees
        assert server["prompt_tokens"] == row["prompt_tokens"] > 0
        assert row["generation_tps"] > 0 and row["ttft_s"]["p50"] > 0
    assert plot.read_bytes()[:4] == b"\x89PNG"
    # The receipt names the recipe by its file's sha256 and the mod by its folder's, and no key (issue 41).
    served_recipe = doc["receipt"]["engine"]["recipe"]
    assert served_recipe["sha256"] == hashlib.sha256(Path(served_recipe["source"]).read_bytes()).hexdigest()
    assert [m["name"] for m in served_recipe["mods"]] == ["tiny-template"] and served_recipe["mods"][0]["sha256"]
    assert flag in doc["receipt"]["engine"]["command"] and api_key not in json.dumps(doc["receipt"])

    before = vllm_counters(doc["config"]["endpoint"])
    result = sc(cluster, "bench", "--method", "llama-benchy", "--pp", "64", "--tg", "16", "--depth", "0", "128",
                "--concurrency", "1", "2", "--runs", "1", "--skip-coherence", "--corpus", str(BOOK), "--json",
                env=with_key)
    assert result.returncode == 0, result.stderr[-3000:]
    after = vllm_counters(doc["config"]["endpoint"])
    benchy = json.loads(result.stdout)
    assert [(b["context_size"], b["concurrency"]) for b in benchy["benchmarks"]] == [(0, 1), (0, 2), (128, 1),
                                                                                    (128, 2)]
    assert all(b["pp_throughput"]["mean"] > 0 and b["ttfr"]["mean"] > 0 for b in benchy["benchmarks"])
    # Prompts cut with the model's own tokenizer, read from the head's HF cache (this machine has none).
    assert benchy["sparkcluster"]["tokenizer"].endswith("local--tiny-llama/tokenizer.json")
    tokens = benchy["sparkcluster"]["tokens"]
    assert tokens["prompt_tokens"] == after["prompt"] - before["prompt"] > 0
    assert tokens["completion_tokens"] == after["generation"] - before["generation"] > 0
    # llama-benchy counts the token_ids of chunks that carry text; a token that decodes to nothing (the
    # tiny model's end of sequence) is in vLLM's count only.
    assert 0 < tokens["counted_tokens"] <= tokens["completion_tokens"]
    # llama-benchy's document carries the same engine in its receipt, with its own parameters and prompt set.
    receipt = benchy["sparkcluster"]["receipt"]
    assert receipt["engine"]["command"] == doc["receipt"]["engine"]["command"]
    assert receipt["bench"]["method"] == "llama-benchy" and receipt["bench"]["prompt_digest"]
    assert receipt["metrics"]["speculative"] is False
    # Only what the simulator truly lacks is unknown: no NCCL library on its nodes for the CPU vLLM to load.
    assert receipt["unknown"] == ["nodes[spark-1].nccl", "nodes[spark-2].nccl"], receipt["unknown"]
    # What bench reports alongside either method, llama-benchy's too (beside its own keys): the served context its
    # grid was held to, the decode budget from the closed loop's inputs (its ITL llama-benchy's tg per request),
    # both nodes' GPUs as the run ended; a grid past the context is refused before anything reaches vLLM.
    alongside = benchy["sparkcluster"]
    assert alongside["max_model_len"] == 384
    budget = alongside["decode_budget"]
    assert (budget["tp"], budget["verify"]) == (doc["decode_budget"]["tp"], doc["decode_budget"]["verify"]), budget
    assert [r["concurrency"] for r in budget["rows"]] == [1, 2] and all(r["itl_ms"] > 0 for r in budget["rows"])
    assert set(alongside["gpu_at_end"]) == set(doc["gpu_at_end"]) == {"spark-1", "spark-2"}
    refused = sc(cluster, "bench", "--method", "llama-benchy", "--pp", "400", "--corpus", str(BOOK), env=with_key)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "the largest --pp that fits at --depth 0 with --tg 32 is 352" in " ".join(refused.stderr.split())
    assert vllm_counters(doc["config"]["endpoint"]) == after


# ---- a community recipe, unmodified: eugr's v1 format with a mod (issue 21) -----------------------------
EUGR_RECIPE = """\
recipe_version: "1"
name: Tiny Llama for the simulated Sparks
container: vllm-node
model: local/tiny-llama
mods:
  - mods/tiny-template
defaults:
  port: 8000
  host: 0.0.0.0
  tensor_parallel: 2
  max_model_len: 384
env:
  SPARKCLUSTER_RECIPE_MARK: 21
command: |
  vllm serve local/tiny-llama \\
      --host {host} --port {port} \\
      -tp {tensor_parallel} \\
      --max-model-len {max_model_len} \\
      --enforce-eager \\
      --chat-template tiny-chat.jinja
"""
# The mod drops the template the command names by a relative path, where vLLM starts ($WORKSPACE_DIR).
TEMPLATE_MOD = """#!/bin/sh
set -e
cp template.jinja "$WORKSPACE_DIR/tiny-chat.jinja"
echo "dropped tiny-chat.jinja in $WORKSPACE_DIR"
"""


def eugr_checkout(root: Path, run_sh: str) -> Path:
    """The shape of an eugr checkout: recipes/NAME.yaml naming mods/NAME from the repository's root."""
    (root / "recipes").mkdir(parents=True)
    mod = root / "mods" / "tiny-template"
    mod.mkdir(parents=True)
    (mod / "run.sh").write_text(run_sh)
    (mod / "template.jinja").write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}")
    recipe = root / "recipes" / "tiny-llama.yaml"
    recipe.write_text(EUGR_RECIPE)
    return recipe


def test_an_eugr_recipe_with_a_mod_serves_tp2_unmodified_on_the_mlx5_link_local_pair_and_bench_measures_it(cluster,
                                                                                                        tmp_path):
    """~150 s: vLLM's native multi-node launcher (a rank in each node, the traffic on the fabric) with the recipe's
    TP 2 and max model length, its env in the vLLM process on every node, and the chat template its mod dropped,
    found by the command's relative path. The same served cluster is then measured by `bench`, both methods
    (one vLLM start for both: each costs a minute or more on the CPU). It is served with vLLM's --api-key (issue 39,
    S5): no user of either node sees the key on a command line while it starts, readiness passes with it, a request
    without it is refused, `status` names the refusal and `bench` sends the key. Its --hf-token goes the same way
    (issue 46, F3: it was on both nodes' process lists, in serve.json and in bench's config)."""
    head = cluster.topology.hosts[0]
    recipe = eugr_checkout(tmp_path, TEMPLATE_MOD)
    # --check first: each mod and where it comes from, then every node's lines (the mods', then vLLM's).
    check = sc(cluster, "serve", "--runtime", "host", "--launcher", "native", "--recipe", str(recipe), "--check",
               "--", "--api-key", API_KEY)
    assert check.returncode == 0, check.stderr
    assert API_KEY not in check.stdout + check.stderr and "--api-key" not in check.stdout  # failed before
    assert f"mod tiny-template from {tmp_path / 'mods' / 'tiny-template'} (the recipe's mods/tiny-template)" in \
        check.stdout
    out = check.stdout
    assert out.count("export WORKSPACE_DIR=") == 2 and out.count("SPARKCLUSTER_RECIPE_MARK=21") >= 2, out
    # on each node the mods' command comes before its vLLM rank's
    for rank, host in enumerate(("spark-1", "spark-2")):
        node = out[out.index(f"  {host}: "):]
        assert node.index("mods/tiny-template && chmod +x run.sh && ./run.sh") < node.index(f"--node-rank {rank}"), out
    try:
        with argv_watched(cluster, ["spark-1", "spark-2"], [API_KEY, HF_FLAG]) as seen:  # vLLM starts on both
            result = sc(cluster, "serve", "--runtime", "host", "--launcher", "native", "--recipe", str(recipe),
                        "--ready-timeout", "300", "--json", "--", "--api-key", API_KEY, "--hf-token", HF_FLAG)
        never_seen(seen)  # failed before: `vllm serve ... --api-key sk-...` on both nodes
        assert result.returncode == 0, result.stderr[-3000:]  # readiness asked with the key (failed before: 401)
        served = json.loads(result.stdout)
        assert "mods" in served["phases"] and served["api_key"] is True
        kept = result.stdout + result.stderr + ssh(cluster, "spark-1", "cat ~/.config/sparkcluster/serve.json").stdout
        assert API_KEY not in kept and HF_FLAG not in kept, kept
        serves_tp2_on_the_fabric(cluster, served, "Worker_TP", API_KEY)  # vLLM's native multi-node
        base = f"http://{head.mgmt_ip}:8000/v1"
        assert http(f"{base}/models", None, timeout=30)[0] == 401  # vLLM did get the key, and wants it
        code, text = http(f"{base}/models", None, timeout=30, api_key=API_KEY)
        assert code == 200 and json.loads(text)["data"][0]["max_model_len"] == 384, text
        code, text = http(f"{base}/chat/completions",
                          {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                          timeout=60, api_key=API_KEY)
        assert code == 200, text  # the tiny model has no template of its own: the mod's is the one in use
        for host in ("spark-1", "spark-2"):
            env = ssh(cluster, host, "for p in $(pgrep -f 'vllm serve'); do tr '\\0' '\\n' < /proc/$p/environ; "
                                     "done").stdout
            assert "SPARKCLUSTER_RECIPE_MARK=21" in env and f"VLLM_API_KEY={API_KEY}" in env.split("\n"), host
            assert f"HF_TOKEN={HF_FLAG}" in env.split("\n"), host  # the flag's token, on stdin, wins over serve_env's
            assert "dropped tiny-chat.jinja" not in env
            assert ssh(cluster, host, "cat ~/tiny-chat.jinja").stdout.startswith("{% for m in messages %}")
        status = sc(cluster, "status", "--json")  # this machine has no key, nor does the inventory
        assert json.loads(status.stdout)["server"]["models_error"].startswith(
            f"{base}/models answered 401: the endpoint wants an API key, and none was sent; give it in this "
            "machine's environment (`export VLLM_API_KEY=KEY`)"), status.stdout
        bench_measures_the_served_cluster(cluster, tmp_path, "tiny-llama", "--enforce-eager", API_KEY)
        assert HF_FLAG not in BENCH_RESULTS["eugr recipe, --max-model-len 384 --chat-template"]  # config, receipt
    finally:
        down_leaves_nothing(cluster)


def test_bench_explain_names_the_flags_two_served_benches_differ_in(tmp_path):
    """A second, a file read: `bench --explain` on two bench runs above, the Ray serve's (--max-model-len 512) and
    the eugr recipe's (--max-model-len 384, and its --chat-template), names both flags from the receipts' command
    lines as launched, the memory flag before the template, and the launcher; the nodes' kernels agree. The same
    vLLM, so no version is named. No serve of its own: it reads what those tests kept (BENCH_RESULTS)."""
    names = ["tp 2 over Ray, --max-model-len 512", "eugr recipe, --max-model-len 384 --chat-template"]
    if any(name not in BENCH_RESULTS for name in names):
        pytest.skip("needs the bench runs of test_real_vllm_serves_with_tp2_... and test_an_eugr_recipe_...: "
                    "run the file whole")
    paths = []
    for number, name in enumerate(names):
        path = tmp_path / f"bench-{number}.json"
        path.write_text(BENCH_RESULTS[name])
        paths.append(str(path))
    result = run_cli("bench", "--explain", *paths, "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    doc = json.loads(result.stdout)
    found = {d["field"]: d for d in doc["differences"]}
    order = list(found)
    assert (found["--max-model-len"]["a"], found["--max-model-len"]["b"]) == ("512", "384"), found
    assert found["--chat-template"]["a"] == "not set" and found["--chat-template"]["b"].endswith("tiny-chat.jinja")
    assert order.index("--max-model-len") < order.index("--chat-template"), order
    assert (found["launcher"]["a"], found["launcher"]["b"]) == ("ray", "native")
    assert "vLLM version" in doc["same"] and "--enforce-eager" in doc["same"], doc["same"]
    assert {"spark-1 kernel", "spark-2 kernel", "spark-1 driver"} <= set(doc["same"]), doc["same"]
    assert [n["row"] for n in doc["numbers"] if n["figure"] == "generation tok/s"] == ["c=1"]
    text = run_cli("bench", "--explain", *paths).stdout
    assert "--max-model-len: A 512, B 384  [flag: memory]" in text, text


def test_a_failing_mod_stops_serve_everywhere_with_its_output(cluster, tmp_path):
    """A few seconds: the mod fails before vLLM starts; exit 1 with the mod's own output, and nothing runs."""
    recipe = eugr_checkout(tmp_path, "#!/bin/sh\necho 'patching vllm: hunk 2 FAILED'\nexit 3\n")
    result = sc(cluster, "serve", "--runtime", "host", "--launcher", "native", "--recipe", str(recipe),
                "--no-verify")
    err = " ".join(result.stderr.split())
    assert result.returncode == 1, err
    assert "a mod failed on spark-" in err and "patching vllm: hunk 2 FAILED" in err and "exit 3" in err
    for host in ("spark-1", "spark-2"):
        assert "vllm serve" not in processes(cluster, host)


# ---- a registry's recipe given by file, on one node (issue 29) -------------------------------------------------
ONE_NODE_RECIPE = """\
recipe_version: "2"
model: local/tiny-llama
runtime: vllm
mods: [mods/tiny-template]
defaults:
  tensor_parallel: 1
  max_model_len: 320
  served_model_name: tiny-one
  enforce_eager: true
  chat_template: tiny-chat.jinja
"""


def registry_checkout(root: Path) -> Path:
    """A registry's repository as sparkrun lays it out: its manifest puts the recipes in `recipes/` and the mods in
    `registry-mods/`, so a recipe given by file finds its mod only as its registry would (not beside it)."""
    (root / ".sparkrun").mkdir(parents=True)
    (root / ".sparkrun" / "registry.yaml").write_text(
        "registries:\n  - {name: lab, recipes: recipes, mods: registry-mods}\n")
    mod = root / "registry-mods" / "tiny-template"
    mod.mkdir(parents=True)
    (mod / "run.sh").write_text(TEMPLATE_MOD)
    (mod / "template.jinja").write_text("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")
    (root / "recipes" / "tiny").mkdir(parents=True)
    recipe = root / "recipes" / "tiny" / "tiny-one.yaml"
    recipe.write_text(ONE_NODE_RECIPE)
    return recipe


def test_a_registry_recipe_by_file_serves_on_one_node_with_its_mod_and_no_ray(cluster, tmp_path):
    """~60 s: one node runs vLLM alone (no Ray, no launcher flag, as eugr's solo mode and sparkrun on one host),
    after the mod found in the registry's mods folder ran; the chat template it dropped is the one in use. The probe
    is skipped, saying why: one node has no link between nodes to probe."""
    head = cluster.topology.hosts[0]
    recipe = registry_checkout(tmp_path)
    result = sc(cluster, "serve", "--limit", "spark-1", "--runtime", "host", "--recipe", str(recipe),
                "--ready-timeout", "300", "--json")
    try:
        assert result.returncode == 0, result.stderr[-3000:]
        doc = json.loads(result.stdout)
        assert doc["launcher"] == "native" and "mods" in doc["phases"] and "ray" not in doc["phases"], doc
        # Failed before without --no-verify: `probe (gloo): FAIL no connection between the ranks was seen` (issue 46)
        assert "verify" not in doc["phases"] and doc["skipped"]["verify"].startswith("one node: "), doc
        code, text = http(f"http://{head.mgmt_ip}:8000/v1/chat/completions",
                          {"model": "tiny-one", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                          timeout=60)
        assert code == 200, text  # the tiny model has no template of its own: the mod's is the one in use
        running = processes(cluster, "spark-1")
        vllm = [line for line in running.splitlines() if "vllm serve" in line]
        assert vllm and "raylet" not in running and "gcs_server" not in running, running
        assert not [w for w in ("--distributed-executor-backend", "--nnodes", "--master-addr") if w in vllm[0]], vllm
        assert "vllm serve" not in processes(cluster, "spark-2")
        the_logs_are_private_and_bounded_after_a_flood(cluster, vllm[0])
    finally:
        down = sc(cluster, "down", "--limit", "spark-1", "--json")
    assert down.returncode == 0, down.stderr
    assert "split -a 12" not in processes(cluster, "spark-1")  # down left no keeper


FLOOD_REQUESTS, FLOOD_PATH_BYTES = 1300, 15_000  # 19.6 MB of vLLM's access log: past the kept 8 to 16 MiB


def the_logs_are_private_and_bounded_after_a_flood(c: SimCluster, vllm: str) -> None:
    """Issue 46, F7: the log (K1: it may hold clients' prompts) and the record are private, and (K3) a flood of
    access-log lines, 1300 GETs of 15 KB paths to vLLM's own port as any local user may send them (18 MB in 2.4 s
    before, no bound), leaves the last 8 to 16 MiB kept, read by `logs` up to the flood's last line."""
    host = next(iter(re.findall(r"--host (\S+)", vllm)), "0.0.0.0")
    address = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    port = int(re.findall(r"--port (\d+)", vllm)[-1])
    flood = (f"import http.client\nc = http.client.HTTPConnection({address!r}, {port})\n"
             f"for i in range({FLOOD_REQUESTS}):\n"
             f"    c.request('GET', '/' + 'A' * {FLOOD_PATH_BYTES} + '-flood-' + str(i)); c.getresponse().read()\n")
    c.exec_in("spark-1", ["python3", "-c", flood], check=True, timeout=300)
    state = ".cache/sparkcluster/serve"
    listing = ssh(c, "spark-1", f"sleep 1; stat -c '%a %s %n' {state} {state}/main.log {state}/main.log.1 "
                                ".config/sparkcluster .config/sparkcluster/serve.json").stdout
    seen = {name: (mode, int(size)) for mode, size, name in (line.split(" ", 2) for line in listing.splitlines())}
    assert {name: mode for name, (mode, _) in seen.items()} == {
        state: "700", f"{state}/main.log": "600", f"{state}/main.log.1": "600", ".config/sparkcluster": "700",
        ".config/sparkcluster/serve.json": "600"}, listing
    assert seen[f"{state}/main.log.1"][1] == 8 << 20 and seen[f"{state}/main.log"][1] <= 8 << 20, listing
    shown = sc(c, "logs", "--node", "spark-1", "-n", "3")
    assert shown.returncode == 0 and f"-flood-{FLOOD_REQUESTS - 1} " in shown.stdout, shown.stdout[-500:]


def test_a_vllm_that_fails_at_start_is_told_by_its_own_reason(cluster):
    """~30 s, the cheapest vLLM start (one node, no probe): vLLM refuses --max-model-len 99999999 for the tiny model
    at its config check. serve gives vLLM's own reason, its first exception with its message, and where to read the
    rest (issue 43: serve printed the log's last 15 lines); nothing is left running."""
    result = sc(cluster, "serve", "--limit", "spark-1", "--model", MODEL, "--no-verify", "--ready-timeout", "300",
                "--", "--max-model-len", "99999999", "--enforce-eager")
    err = " ".join(result.stderr.split())
    assert result.returncode == 1, err
    assert ("vLLM's error: pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig Value "
            "error, User-specified max_model_len (99999999) is greater than the derived max_model_len") in err, err
    assert "(spark-1's vLLM log)" in err and "last lines of the vLLM log" not in err, err
    assert "the whole log: `sparkcluster logs --runtime host --node spark-1 -n 1000`" in err, err
    assert "vllm serve" not in processes(cluster, "spark-1")


RAY_PP_RECIPE = """\
model: local/tiny-llama
runtime: vllm-ray
defaults:
  tensor_parallel: 1
  pipeline_parallel: 2
  max_model_len: 256
  served_model_name: tiny-ray-pp
  # a later pipeline stage allocates its receive buffer in the CPU worker's warm-up, which --enforce-eager skips
  compilation_config: '{"mode": 1, "backend": "eager"}'
"""


def a_sparkrun_recipe_serves_tp1_x_pp2_over_ray(cluster: SimCluster, tmp_path: Path) -> None:
    """~60 s: pipeline parallel with the Ray launcher (the recipe's runtime: vllm-ray), a stage per node."""
    head = cluster.topology.hosts[0]
    recipe = tmp_path / "tiny-ray-pp.yaml"
    recipe.write_text(RAY_PP_RECIPE)
    # --no-verify: the probe before a Ray serve is proven by test_real_vllm_serves_with_tp2_across_two_nodes_over_ray
    result = sc(cluster, "serve", "--runtime", "host", "--recipe", str(recipe), "--no-verify", "--ready-timeout", "300",
                "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["launcher"] == "ray" and doc["served_name"] == "tiny-ray-pp"
    code, text = http(f"http://{head.mgmt_ip}:8000/v1/completions",
                      {"model": "tiny-ray-pp", "prompt": "Two stages", "max_tokens": 8, "temperature": 0},
                      timeout=60)
    assert code == 200 and json.loads(text)["usage"]["completion_tokens"] == 8, text
    line = [p for p in cluster.exec_in("spark-1", ["ps", "-eww", "-o", "args"], capture_output=True,
                                       text=True).stdout.splitlines() if "vllm serve" in p]
    assert line and "--pipeline-parallel-size 2 --distributed-executor-backend ray" in line[0], line
    assert "RayWorkerProc" in processes(cluster, "spark-2")  # the second stage runs on the worker


# ---- round 5, S1: an untrusted registry's recipe env runs nothing on a node ------------------------------------
# The report's payload: Python's warnings filter imports antigravity at vLLM's start, which runs $BROWSER (a shell).
ENV_RCE = """\
recipe_version: "2"
model: /nowhere/tiny
runtime: vllm
env:
  PYTHONWARNINGS: "all:0:antigravity.x:0:0"
  BROWSER: '/bin/sh -c ''id > "$HOME/pwned-by-env-rce"'' #%s'
"""


def test_an_untrusted_registrys_env_payload_is_refused_and_runs_on_no_node_but_does_with_trust(cluster, tmp_path):
    """~20 s: the recipe from the untrusted registry `evil` is refused (exit 2, naming the variable, the registry
    and --trust) and no node holds the canary; served with --trust (the control), vLLM's Python starts on both nodes
    and the canary lands on both as the login user, so it would have shown. Its model is a path: nothing is staged,
    and vLLM, which fails on it, is not waited for."""
    import time

    user = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    evil = git_repo(tmp_path / "evil", {"recipes/envrce.yaml": ENV_RCE})
    added = run_cli("recipes", "add-registry", "evil", str(evil), env=user)
    assert added.returncode == 0, added.stderr

    def serve(*more: str) -> subprocess.CompletedProcess:
        return run_cli("serve", "-i", str(cluster.inventory_path), "--tp", "2", "--runtime", "host", "--launcher",
                       "native", "--no-verify", "--recipe", "@evil/envrce", *more, env=user)

    def canaries() -> dict[str, str]:
        return {h: ssh(cluster, h, "cat ~/pwned-by-env-rce 2>/dev/null", check=False).stdout
                for h in ("spark-1", "spark-2")}

    refused = serve("--ready-timeout", "5")  # were it served, vLLM's failure on the path would not be waited for
    err = " ".join(refused.stderr.split())
    assert refused.returncode == 2, err  # failed before: served, and the shell ran on every node
    assert "registry 'evil', which is not trusted" in err and "env PYTHONWARNINGS" in err and "--trust" in err, err
    assert canaries() == {"spark-1": "", "spark-2": ""}
    assert all("vllm serve" not in processes(cluster, h) for h in ("spark-1", "spark-2"))
    try:
        ran = serve("--trust", "--ready-timeout", "5")
        landed = canaries()
        for _ in range(20):  # the headless rank's Python may start a moment after serve gives up waiting
            if all(landed.values()):
                break
            time.sleep(1)
            landed = canaries()
        assert all(text.startswith("uid=") for text in landed.values()), (landed, ran.stderr[-2000:])
    finally:
        for host in ("spark-1", "spark-2"):
            ssh(cluster, host, "rm -f ~/pwned-by-env-rce", check=False)
        run_cli("down", "-i", str(cluster.inventory_path), env=user)


def test_two_replicas_answer_through_vllms_router_and_one_that_dies_is_named_while_the_endpoint_answers(cluster):
    """Issue 40: `serve --replicas 2` puts one engine on each node (two 1-node vLLM starts at once) behind
    vllm-router on the head at the endpoint's port; requests through it reach both replicas; `status --json` lists
    both; killing spark-2's vLLM leaves the endpoint answering and `status` naming spark-2 (exit 1); `logs` shows
    the router's and each replica's; `top --once --json` lists both replicas, each from its own /metrics, then names
    the dead one; `down` leaves no vLLM or router on either node."""
    head, worker = cluster.topology.hosts
    check = sc(cluster, "serve", "--replicas", "2", "--model", MODEL, "--check", "--json", *VLLM_FLAGS)
    assert check.returncode == 0, check.stderr[-2000:]
    lines = json.loads(check.stdout)["commands"]
    # issue 46: each server on its node's loopback, behind the key guard at its public port
    assert "--listen 0.0.0.0:8001 --upstream 28001 -- vllm serve local/tiny-llama --tensor-parallel-size 1 --host " \
           "127.0.0.1 --port 28001" in lines["spark-1"][0]
    assert "--port 28002" in lines["spark-2"][0] and "ray start" not in check.stdout
    assert f"--listen 0.0.0.0:8000 --upstream 28000 -- vllm-router --host 127.0.0.1 --port 28000 --worker-urls " \
           f"http://{head.fabric_ips[0]}:8001 http://{worker.fabric_ips[0]}:8002" in lines["spark-1"][1]
    try:
        served = sc(cluster, "serve", "--replicas", "2", "--model", MODEL, "--no-verify", "--no-supervise", "--json",
                    *VLLM_FLAGS, "--api-key", API_KEY)  # by flag: the guards get it as the replicas do (issue 46)
        assert served.returncode == 0, served.stderr[-3000:]
        doc = json.loads(served.stdout)
        assert doc["endpoint"] == f"http://{head.mgmt_ip}:8000/v1" and doc["launcher"] == "native"
        assert [(r["nodes"], r["port"]) for r in doc["replicas"]] == [(["spark-1"], 8001), (["spark-2"], 8002)]
        replicas = [f"http://{head.mgmt_ip}:8001/v1", f"http://{worker.mgmt_ip}:8002/v1"]
        before = [vllm_counters(r)["generation"] for r in replicas]
        body = {"model": MODEL, "prompt": "The cluster of sparks", "max_tokens": 4, "temperature": 0}
        for _ in range(4):
            code, text = http(f"{doc['endpoint']}/completions", body, timeout=60, api_key=API_KEY)
            assert code == 200, text
        after = [vllm_counters(r)["generation"] for r in replicas]
        assert all(a > b for a, b in zip(after, before)), (before, after)  # round robin: both replicas served
        every_path_that_runs_the_model_needs_the_key(cluster, body)

        status = sc(cluster, "status", "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        state = json.loads(status.stdout)
        assert [(r["nodes"], r["healthy"]) for r in state["replicas"]] == [(["spark-1"], True), (["spark-2"], True)]
        assert state["nodes"]["spark-1"]["router"] == "running" and state["server"]["health"] == 200
        assert sorted(state["router"]["workers"]) == [f"http://{head.fabric_ips[0]}:8001",
                                                      f"http://{worker.fabric_ips[0]}:8002"], state["router"]
        assert state["router"]["problems"] == [], state["router"]
        the_routers_admin_api_takes_no_order_from_the_lan_and_status_names_a_stranger(cluster)
        # each replica's own /metrics, the endpoint's their sum (the router's /metrics is one replica in turn)
        assert all(r["figures"] is not None for r in state["replicas"]), state["replicas"]
        assert state["server"]["figures"]["running"] == sum(r["figures"]["running"] for r in state["replicas"])
        logs = sc(cluster, "logs", "--node", "spark-1", "-n", "50")
        assert logs.returncode == 0 and "== router ==" in logs.stdout and "Router ready" in logs.stdout, logs.stdout
        top = sc(cluster, "top", "--once", "--json")  # each replica's own /metrics, not the router's (one in turn)
        assert top.returncode == 0, top.stdout + top.stderr
        seen = json.loads(top.stdout)
        assert [(r["name"], r["metrics_url"], r["error"]) for r in seen["replicas"]] == [
            ("spark-1", f"http://{head.mgmt_ip}:8001/metrics", None),
            ("spark-2", f"http://{worker.mgmt_ip}:8002/metrics", None)], seen["replicas"]
        assert seen["endpoint"]["summed_from"] == ["spark-1", "spark-2"]
        assert seen["endpoint"]["figures"]["running"] == sum(r["figures"]["running"] for r in seen["replicas"])
        logs = sc(cluster, "logs", "-n", "1000")  # every node's: spark-2's is its replica's vLLM, which top asked
        worker_log = logs.stdout.split("== spark-2 ==", 1)[-1]
        assert logs.returncode == 0 and "POST /v1/completions" in worker_log and "GET /metrics" in worker_log, \
            logs.stdout[-3000:]

        ssh(cluster, "spark-2", 'kill -KILL -- -"$(cat ~/.cache/sparkcluster/serve/main.pid)"')
        for _ in range(6):  # at once and while the router's health checks take it out: every request answered
            code, text = http(f"{doc['endpoint']}/completions", body, timeout=60, api_key=API_KEY)
            assert code == 200, text
        status = sc(cluster, "status")
        assert status.returncode == 1, status.stdout + status.stderr
        assert "replica 1 on spark-2 at" in status.stdout and "vLLM not running on spark-2" in status.stdout, status.stdout
        state = json.loads(sc(cluster, "status", "--json").stdout)
        assert [r["down"] for r in state["replicas"]] == [[], ["spark-2"]]
        top = sc(cluster, "top", "--once", "--json")
        assert top.returncode == 1, top.stdout + top.stderr  # not everything answered
        seen = json.loads(top.stdout)
        alive, dead = seen["replicas"]
        assert alive["name"] == "spark-1" and alive["error"] is None and alive["figures"] is not None, alive
        assert dead["name"] == "spark-2" and "did not answer" in dead["error"] and dead["figures"] is None, dead
        assert seen["endpoint"]["summed_from"] == ["spark-1"] and seen["nodes"]["spark-2"]["processes"]["main"] == "stopped"
    finally:
        down = sc(cluster, "down", "--json")
    assert down.returncode == 0, down.stderr
    assert "router" in json.loads(down.stdout)["stopped"]["spark-1"]
    for host in ("spark-1", "spark-2"):
        left = processes(cluster, host)
        assert "vllm serve" not in left and "vllm-router" not in left and "vllm::router" not in left, left


def lan_request(c: SimCluster, host: str, url: str, body: dict | None = None) -> int:
    """The HTTP status `host` (standing in for any host on the management LAN) gets for `url`, POST with `body`
    (GET without); 0: refused, nothing answered."""
    code = ("import json, sys, urllib.request, urllib.error\n"
            "data = sys.argv[2].encode() if sys.argv[2] else None\n"
            "req = urllib.request.Request(sys.argv[1], data=data, headers={'Content-Type': 'application/json'})\n"
            "try:\n    print(urllib.request.urlopen(req, timeout=30).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print(0)\n")
    out = c.exec_in(host, ["python3", "-c", code, url, json.dumps(body) if body is not None else ""],
                    capture_output=True, text=True, timeout=60)
    return int(out.stdout.strip())


def every_path_that_runs_the_model_needs_the_key(c: SimCluster, body: dict) -> None:
    """Issue 46, F1 (failed before: /invocations generated without the key, 200, on each replica's port and through
    the router; /tokenize too). From this machine and from spark-2's namespace: the router's and the replicas' ports
    answer the API only with the key and nothing else at all; the servers' own ports answer only their node."""
    head, worker = c.topology.hosts
    for base in (f"http://{head.mgmt_ip}:8000", f"http://{head.mgmt_ip}:8001", f"http://{worker.mgmt_ip}:8002"):
        assert http(f"{base}/invocations", body, timeout=30)[0] == 404, base
        assert http(f"{base}/invocations", body, timeout=30, api_key=API_KEY)[0] == 404, base  # never forwarded
        assert http(f"{base}/tokenize", {"model": MODEL, "prompt": "x"}, timeout=30)[0] == 404, base
        assert http(f"{base}/v1/completions", body, timeout=30)[0] == 401, base
        assert lan_request(c, "spark-2", f"{base}/invocations", body) == 404, base
        assert http(f"{base}/health", None, timeout=30)[0] == 200, base  # what status reads, without the key
    for ip, port in ((head.mgmt_ip, 28000), (head.mgmt_ip, 28001), (worker.mgmt_ip, 28002)):
        assert http(f"http://{ip}:{port}/health", None, timeout=10)[0] == 0, (ip, port)  # loopback only
    assert lan_request(c, "spark-1", f"http://{head.fabric_ips[0]}:28001/health") == 0


STRANGER = ("import http.server, json, sys\n"
            "class H(http.server.BaseHTTPRequestHandler):\n"
            "    def do_GET(self):\n"
            "        out = json.dumps({'object': 'list', 'data': []}).encode()\n"
            "        self.send_response(200); self.send_header('Content-Length', str(len(out))); self.end_headers()\n"
            "        self.wfile.write(out)\n"
            "    do_POST = do_GET\n"
            "http.server.ThreadingHTTPServer(('0.0.0.0', 9999), H).serve_forever()\n")


def the_routers_admin_api_takes_no_order_from_the_lan_and_status_names_a_stranger(c: SimCluster) -> None:
    """Issue 46, F2 (failed before: /add_worker from the LAN, no key, 200, and the stranger got clients' prompts and
    key while `status` said healthy, exit 0): from this machine and spark-2's namespace every admin route of the
    router is 404 at the endpoint; a worker added on the head itself (where alone the router's admin API answers)
    is named by `status`, exit 1, until it is removed."""
    head, worker = c.topology.hosts
    stranger = f"http://{worker.mgmt_ip}:9999"
    for path in (f"/add_worker?url={stranger}", f"/remove_worker?url=http://{worker.fabric_ips[0]}:8002",
                 "/flush_cache"):
        assert http(f"http://{head.mgmt_ip}:8000{path}", {}, timeout=30)[0] == 404, path
        assert lan_request(c, "spark-2", f"http://{head.mgmt_ip}:8000{path}", {}) == 404, path
    for path in ("/list_workers", "/workers", "/get_loads"):
        assert http(f"http://{head.mgmt_ip}:8000{path}", None, timeout=30)[0] == 404, path
        assert lan_request(c, "spark-2", f"http://{head.mgmt_ip}:8000{path}") == 404, path
    c.exec_in("spark-2", ["sh", "-c", f"python3 -c {shlex.quote(STRANGER)} >/dev/null 2>&1 & echo $! > /tmp/stranger.pid"],
              check=True, timeout=30)
    try:
        assert lan_request(c, "spark-1", f"http://127.0.0.1:28000/add_worker?url={stranger}", {}) == 200
        status = sc(c, "status")
        assert status.returncode == 1, status.stdout + status.stderr
        said = " ".join(status.stdout.split())
        assert f"problem: the router sends requests to '{stranger}', a worker serve did not start" in said, said
        state = json.loads(sc(c, "status", "--json").stdout)
        assert stranger in state["router"]["workers"] and len(state["router"]["problems"]) == 1, state["router"]
    finally:
        lan_request(c, "spark-1", f"http://127.0.0.1:28000/remove_worker?url={stranger}", {})
        c.exec_in("spark-2", ["sh", "-c", "kill $(cat /tmp/stranger.pid)"], timeout=30)
    assert sc(c, "status").returncode == 0


# ---- issue 40: the layout chosen by measurement -------------------------------------------------------------------
LAYOUT_FLAGS = ["--", "--max-model-len", "256", "--enforce-eager"]


def test_bench_layouts_serves_and_measures_each_layout_then_resumes_without_serving_again(cluster, tmp_path):
    """~100 s, the smallest profile (one concurrency, two requests of 16 tokens out): `bench --layouts tp,replicas`
    stages the model once, serves TP 2 (over Ray) then two replicas behind the router through serve's phases (no
    probe: the serves above prove it) and measures each with the sweep; --json holds `layouts` ({layout, rows}) and
    `best`, says the figures are the CPU vLLM's and splits the wall time; the replicas stay served. The same command
    again serves nothing (a replica's vLLM keeps its process) and prints the table from the state, the best marked."""
    out = tmp_path / "layouts"
    command = ["bench", "--layouts", "tp,replicas", "--model", MODEL, "--no-verify", "--ready-timeout", "300",
               "--concurrency", "1", "--runs", "1", "--requests-per-stream", "2", "--prompt-tokens", "16",
               "--output-tokens", "16", "--out", str(out)]
    try:
        result = sc(cluster, *command, "--json", *LAYOUT_FLAGS, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        doc = json.loads(result.stdout)
        tp, replicas = doc["layouts"]
        assert (tp["layout"], tp["shape"]["name"], replicas["layout"], replicas["shape"]["name"]) == (
            "tp", "tp2", "replicas", "2x tp1")
        assert "ray" in tp["phases"] and "ray" not in replicas["phases"]  # TP 2 over Ray; each replica alone
        for entry in doc["layouts"]:
            (row,) = entry["rows"]
            assert row["concurrency"] == 1 and row["errors"] == 0 and row["completion_tokens"] == 2 * 16, entry
            assert row["generation_tps"] > 0 and row["ttft_s"]["p50"] > 0 and row["itl_s"]["p50"] > 0
            assert entry["serve_s"] > 0 and entry["measure_s"] > 0 and "ready" in entry["phases"], entry
        fastest = max(doc["layouts"], key=lambda entry: entry["rows"][0]["generation_tps"])["layout"]
        assert doc["best"] == {"1": fastest}
        assert doc["cpu_vllm"].startswith("these figures are a CPU build of vLLM's (vLLM 0.32.0+cpu"), doc["cpu_vllm"]
        assert doc["wall_s"]["serve"] > 0 and doc["wall_s"]["measure"] > 0 and doc["wall_s"]["stage"] >= 0
        assert [entry["layout"] for entry in json.loads((out / "layouts-state.json").read_text())["done"]] == [
            "tp", "replicas"]
        assert json.loads((out / "layouts.json").read_text())["best"] == doc["best"]
        layouts_have_receipts_that_explain_them(tp, replicas, out)
        # The last layout stays served, as serve leaves it: two replicas behind the router.
        served = json.loads(sc(cluster, "status", "--json").stdout)
        assert [(r["nodes"], r["healthy"]) for r in served["replicas"]] == [(["spark-1"], True), (["spark-2"], True)]
        replica_before = ssh(cluster, "spark-2", "pgrep -o -f 'vllm serve'").stdout.strip()

        again = sc(cluster, *command, *LAYOUT_FLAGS, timeout=120)
        assert again.returncode == 0, again.stderr[-3000:]
        err = " ".join(again.stderr.split())
        for kind in ("tp (TP 2 x PP 1)", "replicas (2 replicas of TP 1 x PP 1 behind a router)"):
            assert f"{kind}: measured before, kept from {out / 'layouts-state.json'}" in err, err
        assert "serving " not in err and "launch ..." not in err, err  # nothing served again
        assert ssh(cluster, "spark-2", "pgrep -o -f 'vllm serve'").stdout.strip() == replica_before
        table = [" ".join(line.split()) for line in again.stdout.splitlines()]
        assert any(line.startswith("1 tp (tp2) ") for line in table), again.stdout
        marked = [line for line in table if line.endswith("<- best")]
        assert len(marked) == 1 and f"{fastest} (" in marked[0], again.stdout
        assert "note: these figures are a CPU build of vLLM's" in " ".join(again.stdout.split())
        assert (f"why two layouts' figures differ: sparkcluster bench --explain {out / 'layouts.json'}:tp "
                f"{out / 'layouts.json'}:replicas") in " ".join(again.stdout.split()), again.stdout
    finally:
        down_leaves_nothing(cluster)


def layouts_have_receipts_that_explain_them(tp: dict, replicas: dict, out: Path) -> None:
    """Issue 41 for `bench --layouts`: each layout's entry holds the receipt of its own measurement (its serve's
    command line as launched, the vLLM build, both nodes, /metrics over its sweep), the state keeps the same, and
    `bench --explain` between the two names the layout first, then the command line's tensor parallelism."""
    for entry, tp_size, replica_count in ((tp, "2", 1), (replicas, "1", 2)):
        receipt = entry["receipt"]
        engine = receipt["engine"]
        assert engine["command"][:5] == ["vllm", "serve", MODEL, "--tensor-parallel-size", tp_size], engine
        assert engine["vllm_version"] == "0.32.0+cpu" and engine["runtime"] == "host", engine
        assert (engine["tp"], engine["replicas"]) == (int(tp_size), replica_count), engine
        assert engine["command"][-3:] == ["--max-model-len", "256", "--enforce-eager"], engine
        assert [n["name"] for n in receipt["nodes"]] == ["spark-1", "spark-2"] and receipt["nodes"][0]["kernel"]
        assert receipt["bench"]["method"] == "sustained" and receipt["bench"]["parameters"]["output_tokens"] == 16
        # /metrics over its own sweep; behind the router each replica's own, summed (the router's is one in turn)
        assert receipt["metrics"]["interval_s"] > 0 and receipt["metrics"]["prefix_cache_hit_rate"] is not None
        assert receipt["unknown"] == ["nodes[spark-1].nccl", "nodes[spark-2].nccl"], receipt["unknown"]
    assert "--distributed-executor-backend" in tp["receipt"]["engine"]["command"]  # TP 2 over Ray
    assert replicas["receipt"]["engine"]["command"][replicas["receipt"]["engine"]["command"].index("--port") + 1] \
        == "8001"  # replica 0's own vLLM, behind the router at 8000
    assert [e["receipt"] for e in json.loads((out / "layouts-state.json").read_text())["done"]] == [
        tp["receipt"], replicas["receipt"]]
    explained = run_cli("bench", "--explain", f"{out / 'layouts.json'}:tp", f"{out / 'layouts.json'}:replicas")
    assert explained.returncode == 0, explained.stderr
    ranked = [line for line in explained.stdout.splitlines() if line.startswith(("  1. ", "  2. "))]
    assert ranked == ["  1. layout: A tp (TP 2 x PP 1), B replicas (2 replicas of TP 1 x PP 1 behind a router)  "
                      "[model and layout] what `bench --layouts` served and measured: TP ranks, pipeline stages, "
                      "replicas behind the router",
                      "  2. --tensor-parallel-size: A 2, B 1  [model and layout] the serve command line's "
                      "parallelism, as launched"], explained.stdout

