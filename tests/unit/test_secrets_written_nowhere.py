"""Issue 46 (round 6): no token or password is written anywhere. F3: `serve -- --hf-token T` put T on every node's
process list, in the head's serve.json, bench's config and the Arena files; F4: a password in `bench --url` / `top
--url` reached results, receipts, the plot and errors (and crashed llama-benchy); F5: `bench --layouts -- --api-key
KEY` kept the key in layouts-state.json and printed the old and new keys; F9: a receipt's comm env was masked by name
only; F14: the serve lock file kept the key of the command line.

The canaries are the report's, in pieces: no test source line holds one whole. The new names are imported inside the
tests, so that each reproduction runs (and fails) against the code from before the fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from sparkcluster.bench.methods.llama_benchy import arena
from sparkcluster.bench.target import Target, from_record, from_url
from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.inventory import Host
from sparkcluster.engine.secret_names import is_secret_name
from sparkcluster.serving.layout import Layout
from sparkcluster.serving.lifecycle import vllm_commands
from sparkcluster.serving.phases import ServeOptions
from sparkcluster.serving.record import ServeRecord, Serving
from sparkcluster.serving.runtime import RuntimeChoice
from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub
from tests.support.serving import NODES, cluster

HF = "hf_" + "FLAGCANARY77"
PASSWORD = "S3CRET" + "PW"
LAYOUT_KEY, ROTATED_KEY = "sk-" + "LAYOUTCANARY5", "sk-" + "ROTATEDKEY6"
MASKED = "***"  # what stands for a secret in a record, a receipt or a published recipe


# ---- F3: a secret flag leaves vLLM's command line for its environment, and every record masks what is left -------

@pytest.mark.parametrize("runtime", ["host", "docker"])
@pytest.mark.parametrize("launcher", ["ray", "native"])
def test_the_hf_token_flag_is_on_no_command_line_and_reaches_vllm_as_hf_token_on_stdin(runtime, launcher):
    """The report's B1: `--hf-token hf_FLAGCANARY77` on every node's process list (`nobody` read it 320 times)."""
    args = ServeOptions(runtime=runtime, launcher=launcher, layout=Layout(1, 2, 1), model="local/tiny-llama",
                        extra=("--max-model-len", "512", "--hf-token", HF)).serve_args()
    assert args.flags == ("--max-model-len", "512") and args.env["HF_TOKEN"] == HF
    for command in vllm_commands(cluster(), RuntimeChoice(runtime), NODES, launcher, args).values():  # type: ignore[arg-type]
        assert HF not in command.line() and HF not in command.display() and "--hf-token" not in command.line()
        assert command.stdin is not None and f"HF_TOKEN={HF}\n" in command.stdin  # the hub reads it there


def test_every_spelling_of_the_hf_token_flag_is_taken_and_the_flag_alone_stays():
    for given in (["--hf-token", HF], [f"--hf-token={HF}"], ["--hf_token", HF], ["--hf-t", HF], ["--hf-tok", HF]):
        args = ServeOptions(model="m", extra=("--enforce-eager", *given)).serve_args()
        assert args.flags == ("--enforce-eager",) and args.env["HF_TOKEN"] == HF, given
    # alone it names no secret (vLLM uses `hf auth login`'s token): nothing to move
    bare = ServeOptions(model="m", extra=("--hf-token", "--enforce-eager")).serve_args()
    assert bare.flags == ("--hf-token", "--enforce-eager") and "HF_TOKEN" not in bare.env
    # --hf-overrides shares the prefix: it is no secret and stays
    other = ServeOptions(model="m", extra=("--hf-overrides", "{}")).serve_args()
    assert other.flags == ("--hf-overrides", "{}")
    with pytest.raises(UsageError, match="--hf-token gives 2 tokens: serve hands vLLM one, as HF_TOKEN") as e:
        ServeOptions(model="m", extra=("--hf-token", "a", "b")).serve_args()
    assert e.value.exit_code == 2 and "serve_env: {HF_TOKEN: TOKEN}" in e.value.fix


def record_with(flags: tuple[str, ...]) -> ServeRecord:
    return ServeRecord("docker", "ray", "vllm-node:1", ("spark-1", "spark-2"),
                       Serving("org/model", "model", 8000, "http://10.0.0.1:8000/v1", 2, "qwen3", flags))


def test_the_record_bench_config_and_arena_files_mask_a_secret_flag_with_one_masking():
    """B2-B4: serve.json's `flags`, bench's config.recipe_flags (from the record; one written before the fix holds
    the token as given) and the Arena's recipe.yaml and metadata.json held the token raw."""
    flags = ("--max-model-len", "512", "--hf-token", HF, f"--api-key={LAYOUT_KEY}", "--long-prefill-token-threshold",
             "2048")
    shown = ["--max-model-len", "512", "--hf-token", MASKED, f"--api-key={MASKED}", "--long-prefill-token-threshold",
             "2048"]
    record = record_with(flags)
    assert record.to_json()["serving"]["flags"] == shown
    assert ServeRecord.from_json(json.loads(json.dumps(record.to_json()))).serving.flags == tuple(shown)  # type: ignore[union-attr]
    target = from_record(record, "sha256:abc")
    assert target.config["recipe_flags"] == shown
    text = arena.recipe_text(target)
    assert HF not in text and LAYOUT_KEY not in text
    assert yaml.safe_load(text)["command"].endswith(
        "--hf-token '***' '--api-key=***' --long-prefill-token-threshold 2048")
    # a Target built elsewhere with raw flags: the Arena masks them itself
    raw = arena.recipe_text(Target("http://h:8000/v1", "m", {"recipe_flags": list(flags)}))
    assert HF not in raw and LAYOUT_KEY not in raw


def test_a_measure_of_tokens_is_no_secret_and_a_secret_word_still_is():
    """A corpus recipe's `--long-prefill-token-threshold 2048`, masked, would leave a broken recipe in the Arena."""
    from sparkcluster.engine.secret_names import masked_argv

    for name in ("long-prefill-token-threshold", "num-experts-per-token", "returned_token_ids",
                 "encoder-cudagraph-token-budgets", "suffix-decoding-min-token-prob", "max_num_batched_tokens"):
        assert not is_secret_name(name), name
    for name in ("HF_TOKEN", "HF_TOKEN_2", "hf-token", "api-key", "X-Auth-Token", "OPENAI_API_KEY", "PGPASSWORD",
                 "ansible_become_pass", "s3-secret-access-key", "SECRET_KEY_BASE", "AWS_ACCESS_KEY_ID"):
        assert is_secret_name(name), name
    assert masked_argv(["--set", "api_key=K", "--hf-token", "--enforce-eager", "--x", "1"]) == (
        "--set", f"api_key={MASKED}", "--hf-token", "--enforce-eager", "--x", "1")


# ---- F14: the lock file keeps who holds it, never the key of its command line -----------------------------------

def test_the_lock_holder_line_masks_a_key_given_after_the_double_dash(monkeypatch):
    """R8: serve.lock kept `sparkcluster serve ... -- ... --api-key sk-ROUTERCANARY1`, and a refused serve printed it."""
    from sparkcluster.engine.locks import hold_command, this_run

    key = "sk-" + "ROUTERCANARY1"
    monkeypatch.setattr(sys, "argv", ["sparkcluster", "serve", "--replicas", "2", "--", "--api-key", key,
                                      f"--hf-token={HF}"])
    holder = this_run()
    assert holder.startswith("`sparkcluster serve --replicas 2 -- --api-key '***' '--hf-token=***'` (pid ")
    # vLLM's parser takes a flag abbreviated, and --set a secret inside its value: masked the same (review of round 6)
    monkeypatch.setattr(sys, "argv", ["sparkcluster", "serve", "--set=api_key=" + key, "--", "--api-k", key,
                                      f"--hf-tok={HF}", "--hf_token", HF, "--api-server-count", "2"])
    assert this_run().startswith("`sparkcluster serve '--set=api_key=***' -- --api-k '***' '--hf-tok=***' --hf_token "
                                 "'***' --api-server-count 2` (pid ")
    command = hold_command("serve", holder)
    assert key not in (command.stdin or "") + command.line() and HF not in (command.stdin or "")


# ---- F4: a user and password in --url are refused before anything connects, never shown -------------------------

@pytest.mark.parametrize("url", [f"http://alice:{PASSWORD}@127.0.0.1:8000/v1", f"alice:{PASSWORD}@127.0.0.1:8000",
                                 f"https://{PASSWORD}@h/v1", f"ftp://alice:{PASSWORD}@h/",
                                 # odd forms a parser reads as a path or an empty host (the round-6 review's)
                                 f"http:/alice:{PASSWORD}@h/v1", f"//alice:{PASSWORD}@h"])
def test_a_url_with_a_password_is_refused_without_repeating_it(url):
    from sparkcluster.observe.top import url_of

    for parse in (lambda: from_url(url, None), lambda: url_of(url)):
        with pytest.raises(UsageError) as e:
            parse()
        assert e.value.exit_code == 2 and PASSWORD not in e.value.message + e.value.fix
    assert from_url("http://h:8000/v1/", None).base_url == "http://h:8000/v1"  # what is kept of an address
    assert url_of("h:8000/v1") == "http://h:8000/metrics"


def test_bench_and_top_with_a_password_in_url_exit_2_writing_and_printing_none_of_it(tmp_path):
    """B5-B7: bench measured and wrote PASS into config.endpoint, receipt.endpoint, FILE.csv.receipt.json and the
    plot's title; llama-benchy echoed it then crashed (aiohttp ValueError); top printed it in its error."""
    csv, plot = tmp_path / "out.csv", tmp_path / "out.png"
    with running_stub() as stub:
        url = stub.replace("http://", f"http://alice:{PASSWORD}@")
        runs = [run_cli("bench", "--url", url, "--concurrency", "1", "--runs", "1", "--requests-per-stream", "1",
                        "--prompt-tokens", "16", "--output-tokens", "4", "--json", "--csv", str(csv), "--plot",
                        str(plot)),
                run_cli("bench", "--url", url, "--method", "llama-benchy", "--pp", "16", "--tg", "4", "--depth", "0",
                        "--concurrency", "1", "--runs", "1", "--skip-coherence", "--corpus", str(Path(__file__))),
                run_cli("top", "--url", url, "--once")]
    for result in runs:
        said = result.stdout + result.stderr
        assert result.returncode == 2 and PASSWORD not in said and "Traceback" not in said, said[-2000:]
        assert "holds a user name or password (an `@` before its path)" in " ".join(said.split()), said
    assert not csv.exists() and not plot.exists() and not list(tmp_path.glob("*.receipt.json"))


# ---- F9: a receipt's comm env scrubbed as the support bundle scrubs it -------------------------------------------

def test_a_receipts_comm_env_is_scrubbed_by_value_as_the_bundle_is():
    """B8: values with a URL password or an `hf_` token under names that do not say so reached receipt.comm_env."""
    from sparkcluster.bench.receipt_sources import comm_env

    text = ("# written by sparkcluster bootstrap: do not edit by hand\nNCCL_SOCKET_IFNAME=enp1s0f0np0\n"
            f"HTTPS_PROXY=http://alice:{'PROXY' + 'PASS99'}@proxy.lan:3128\n"
            f"MODEL_SOURCE=https://user:{'hf_' + 'URLTOKEN99'}@huggingface.co/org/x\n"
            f"CACHE_NOTE=token {'hf_' + 'ABCDEFGHIJKLMNOPQRSTUV'}\nOPENAI_API_KEY={'sk-' + 'COMMENVKEY99'}\n")
    transport = SimpleNamespace(read_file=lambda path: text.encode())
    session = SimpleNamespace(transport=lambda host: transport)
    env = comm_env(session, Host("spark-2", "10.0.0.2", "worker"))  # type: ignore[arg-type]
    assert env == {"NCCL_SOCKET_IFNAME": "enp1s0f0np0", "HTTPS_PROXY": "http://alice:[scrubbed]@proxy.lan:3128",
                   "MODEL_SOURCE": "https://user:[scrubbed]@huggingface.co/org/x", "CACHE_NOTE": "token [scrubbed]",
                   "OPENAI_API_KEY": MASKED}


# ---- F5: bench --layouts keeps no key in its state, and a rotated key resumes --------------------------------------

def test_bench_layouts_keeps_no_key_in_its_state_and_a_rotated_key_resumes(tmp_path, capsys, monkeypatch):
    """S1/S2: layouts-state.json held `"--api-key", "sk-LAYOUTCANARY5"`; the same command with a rotated key was
    refused (exit 2), printing both keys."""
    from sparkcluster import cli
    from sparkcluster.bench.cli import cmd_bench
    from tests.support.bench_layouts import Cluster, inventory_file, on_cluster

    out = tmp_path / "out"
    argv = ["bench", "-i", str(inventory_file(tmp_path, 2)), "--layouts", "tp", "--model", "org/m", "--concurrency",
            "1", "--set", f"api_key={LAYOUT_KEY}", "--out", str(out)]

    def bench(key: str, measured: Cluster) -> int:
        args = cli.build_parser(["bench"]).parse_args(argv)
        args.remote = ["--max-model-len", "256", "--api-key", key, "--hf-token", HF]
        return cmd_bench(args, on_cluster(monkeypatch, measured, staged_s=1.0))

    first = Cluster()
    assert bench(LAYOUT_KEY, first) == 0 and first.served == ["tp"]
    kept = (out / "layouts-state.json").read_text() + (out / "layouts.json").read_text()
    printed = capsys.readouterr()
    for secret in (LAYOUT_KEY, HF):
        assert secret not in kept + printed.out + printed.err
    assert json.loads((out / "layouts-state.json").read_text())["inputs"]["vllm_flags"] == ["--max-model-len", "256"]
    again = Cluster()
    assert bench(ROTATED_KEY, again) == 0 and again.served == []  # resumed: nothing measured again
    printed = capsys.readouterr()
    assert LAYOUT_KEY not in printed.out + printed.err and ROTATED_KEY not in printed.out + printed.err
