"""Issue 39, S5: vLLM's `--api-key` never on a node's command line (it reaches vLLM as VLLM_API_KEY, on stdin), nor
in the serve record, `--check` or `recipes show`; readiness, `status` and `bench` send it; a 401 is named as the
endpoint wanting a key, with where to give it.

The new names are imported inside the tests, so that the reproductions of the report run (and fail) against the
code from before the fix."""

from __future__ import annotations

import asyncio
import json

import pytest

from sparkcluster.engine.errors import UsageError
from sparkcluster.recipes.load import load_recipe
from sparkcluster.serving.layout import Layout
from sparkcluster.serving.lifecycle import vllm_commands
from sparkcluster.serving.phases import ServeOptions
from sparkcluster.serving.readiness import NotReady, wait_ready
from sparkcluster.serving.record import ServeRecord, Serving
from sparkcluster.serving.runtime import RuntimeChoice
from tests.support.helpers import run_cli
from tests.support.openai_stub import running_stub
from tests.support.serving import NODES, cluster

KEY = "sk-" + "CANARY" + "0042"  # the report's canary, in pieces: no test source line holds it whole


@pytest.mark.parametrize("runtime", ["host", "docker"])
@pytest.mark.parametrize("launcher", ["ray", "native"])
def test_the_key_given_after_the_double_dash_is_on_no_command_line_and_reaches_vllm_on_stdin(runtime, launcher):
    """The report's `serve ... -- --api-key sk-CANARY`: every node's vLLM start held `--api-key sk-CANARY` in its
    line (what `ps` shows any user of the node, and what --check prints)."""
    args = ServeOptions(runtime=runtime, launcher=launcher, layout=Layout(1, 2, 1), model="local/tiny-llama",
                        extra=("--max-model-len", "512", "--api-key", KEY)).serve_args()
    commands = vllm_commands(cluster(), RuntimeChoice(runtime), NODES, launcher, args)  # type: ignore[arg-type]
    assert set(commands) == ({"spark-1"} if launcher == "ray" else {"spark-1", "spark-2"})
    for command in commands.values():
        assert KEY not in command.line() and KEY not in command.display()
        assert "--api-key" not in command.line() and "--max-model-len 512" in command.line()
        assert command.stdin is not None and f"VLLM_API_KEY={KEY}\n" in command.stdin  # read into vLLM's env
        if runtime == "docker" and launcher == "ray":  # `docker exec` hands the reader's variable over by name
            assert "-e VLLM_API_KEY vllm_node" in command.line()
    # What the record keeps of the flags (serve.json, `status --json`, bench's config and the Arena's recipe.yaml).
    record = ServeRecord(runtime, launcher, "img", ("spark-1", "spark-2"),
                         Serving(args.model, args.model, 8000, "http://10.0.0.1:8000/v1", 2, None, tuple(args.flags)))
    assert KEY not in json.dumps(record.to_json()) and "--max-model-len" in record.to_json()["serving"]["flags"]


def test_every_spelling_vllm_reads_is_taken_off_and_the_last_wins():
    from sparkcluster.serving.apikey import take_api_key

    assert take_api_key(("--enforce-eager", "--max-model-len", "512")) == (
        ("--enforce-eager", "--max-model-len", "512"), None)
    for given in (["--api-key", KEY], [f"--api-key={KEY}"], ["--api_key", KEY], ["--api-k", KEY], ["--api-ke", KEY]):
        assert take_api_key(("--enforce-eager", *given, "--max-model-len", "512")) == (
            ("--enforce-eager", "--max-model-len", "512"), KEY), given
    assert take_api_key(("--api-key", "first", "--api_key", KEY)) == ((), KEY)
    assert take_api_key(("--api-server-count", "2")) == (("--api-server-count", "2"), None)  # another flag


@pytest.mark.parametrize("extra, message", [
    (("--api-key",), "--api-key needs a key of visible characters, not nothing"),
    (("--api-key=",), "--api-key needs a key of visible characters, not nothing"),
    (("--api-key", "a", "b"), "--api-key gives 2 keys: serve hands vLLM one, as VLLM_API_KEY"),
    (("--api-key=a\tb",), "--api-key needs a key of visible characters, not that"),
])
def test_a_key_serve_cannot_hand_over_is_refused_before_anything_connects(tmp_path, extra, message):
    with pytest.raises(UsageError, match=message) as e:
        ServeOptions(model="local/tiny-llama", extra=extra).serve_args()
    assert e.value.exit_code == 2 and "serve_env: {VLLM_API_KEY: KEY}" in e.value.fix
    # the CLI says the same, before reading an inventory or connecting (exit 2)
    result = run_cli("serve", "-i", str(tmp_path / "none.yml"), "--model", "local/tiny-llama", "--", *extra)
    assert result.returncode == 2 and message.split(":")[0] in " ".join(result.stderr.split()), result.stderr


def test_a_recipe_flag_and_the_inventory_serve_env_give_the_key_too_and_the_flag_wins(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"model: local/tiny-llama\ndefaults: {{api_key: {KEY}}}\n"
                      "command: vllm serve local/tiny-llama --api-key {api_key} --enforce-eager\n")
    args = ServeOptions(runtime="host", launcher="native", layout=Layout(1, 2, 1),
                        recipe=load_recipe(str(recipe))).serve_args()
    assert args.flags == ("--enforce-eager",) and args.env["VLLM_API_KEY"] == KEY
    from sparkcluster.serving.nodes import node_env

    session = cluster({"VLLM_API_KEY": "from-the-inventory"})
    assert node_env(session.inventory, session.head, args.env).api_key == KEY  # as --api-key wins in vLLM
    assert node_env(session.inventory, session.head).api_key == "from-the-inventory"
    plain = ServeOptions(runtime="host", launcher="native", layout=Layout(1, 2, 1),
                         model="local/tiny-llama").serve_args()
    for command in vllm_commands(session, RuntimeChoice("host"), NODES, "native", plain).values():  # type: ignore[arg-type]
        assert "from-the-inventory" not in command.line() and "VLLM_API_KEY=from-the-inventory\n" in (command.stdin or "")


@pytest.mark.parametrize("flag, secret, variable", [("--api-key", KEY, "VLLM_API_KEY"),
                                                    ("--hf-token", "hf_" + "FLAGCANARY77", "HF_TOKEN")])  # issue 46, F3
def test_recipes_show_masks_the_key(flag, secret, variable):
    result = run_cli("recipes", "show", "default", "--model", "local/tiny-llama", "--json", "--", flag, secret)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert secret not in result.stdout + result.stderr and flag not in " ".join(doc["commands"])
    assert doc["env"][variable] == "********"


def test_readiness_sends_the_key_to_a_server_that_wants_one():
    """The report's serve failed at readiness: `/v1/models answered 401 without 'local/tiny-llama' (it lists [])`,
    since readiness asked without the key vLLM had been given."""
    with running_stub(api_key=KEY) as url:
        ready = wait_ready(url.removesuffix("/v1"), "stub-model", 10, lambda: None, lambda: "log",
                           api_key=KEY)  # type: ignore[call-arg]
    assert ready.completion_text.strip()


def test_a_401_at_readiness_is_named_as_the_key_the_endpoint_wants():
    with running_stub(api_key=KEY) as url:
        with pytest.raises(NotReady) as missing:
            wait_ready(url.removesuffix("/v1"), "stub-model", 10, lambda: None, lambda: "log")
        with pytest.raises(NotReady) as wrong:
            wait_ready(url.removesuffix("/v1"), "stub-model", 10, lambda: None, lambda: "log",
                       api_key="sk-other")  # type: ignore[call-arg]
    assert missing.value.message.endswith("/v1/models answered 401: the endpoint wants an API key, and none was sent")
    assert "`-- --api-key KEY` or serve_env: {VLLM_API_KEY: KEY}" in missing.value.fix
    assert wrong.value.message.endswith("/v1/models answered 401: the endpoint wants an API key, and the key sent "
                                        "(VLLM_API_KEY) does not match it")


@pytest.mark.parametrize("method", ["sustained", "llama-benchy", "arena profile"])
def test_bench_sends_this_machines_key_and_names_a_401(tmp_path, method):
    """Each method against a stub that wants a key: measured with VLLM_API_KEY, a named 401 without it (exit 1),
    and a named mismatch with another key."""
    book = tmp_path / "book.txt"
    book.write_text(" ".join(f"word{i % 300}" for i in range(5000)))
    profile = tmp_path / "small.yaml"
    profile.write_text("framework: llama-benchy\nargs: {pp: [8], tg: [2], depth: [0], concurrency: [1], runs: 1, "
                       "skip_coherence: true}\n")
    out = tmp_path / "out"  # the arena profile's, one per run below: a second run would resume the first's cells
    out.mkdir()
    flags = {"sustained": ["--prompt-tokens", "8", "--output-tokens", "2", "--concurrency", "1", "--runs", "1"],
             "llama-benchy": ["--method", "llama-benchy", "--pp", "8", "--tg", "2", "--skip-coherence",
                              "--concurrency", "1", "--runs", "1", "--corpus", str(book)],
             "arena profile": ["--profile", str(profile), "--corpus", str(book)]}[method]
    env = {"HF_HUB_CACHE": str(tmp_path / "hub"), "HOME": str(tmp_path)}

    def bench(url: str, key: str | None) -> tuple[int, dict, str]:
        where = ["--out", str(out / {KEY: "right", None: "none"}.get(key, "wrong"))] if method == "arena profile" else []
        result = run_cli("bench", "--url", url, "--json", *flags, *where, env={**env, "VLLM_API_KEY": key or ""},
                         timeout=120)
        return result.returncode, json.loads(result.stdout), " ".join(result.stderr.split())
    with running_stub(api_key=KEY) as url:
        code, doc, err = bench(url, KEY)
        assert code == 0, err
        assert (doc["rows"] if method == "sustained" else doc["benchmarks"]), doc
        code, doc, err = bench(url, None)
        assert code == 1 and f"{url}/models answered 401: the endpoint wants an API key, and none was sent" in err
        assert "export VLLM_API_KEY=KEY" in err
        code, doc, err = bench(url, "sk-other")
        assert code == 1 and "the key sent (VLLM_API_KEY) does not match it" in err
    assert KEY not in json.dumps(doc)
    if method == "arena profile":
        written = [f for f in out.rglob("*") if f.is_file()]
        assert written and not [f for f in written if KEY in f.read_text()]


def test_a_request_refused_mid_run_says_why():
    """A server that turns the key away after the model list (a key rotated mid-run): each failed request says so."""
    from sparkcluster.bench.endpoint import session
    from sparkcluster.bench.methods.closed_loop.schedule import Endpoint, stream_completion
    from sparkcluster.bench.methods.llama_benchy.chat import Client
    from sparkcluster.bench.methods.llama_benchy.schedule import http_session

    async def both(url: str) -> tuple[str | None, str | None]:
        async with session(1, 30, "sk-other") as client:
            ours = await stream_completion(client, Endpoint(url, "stub-model"), "a b c", 2)
        async with http_session(1) as http:
            theirs = await Client(url, "stub-model", 30).generate(http, "", "a b c", 2)
        return ours.error, theirs.error
    with running_stub(api_key=KEY) as url:
        ours, theirs = asyncio.run(both(url))
    assert ours == "HTTP 401: the endpoint wants an API key (VLLM_API_KEY does not match it)"
    assert theirs == "HTTP 401: the endpoint wants an API key (none was sent: export VLLM_API_KEY=KEY)"


def test_the_key_a_client_sends_is_this_machines_else_the_inventorys(monkeypatch):
    from sparkcluster.bench.target import from_url
    from sparkcluster.serving.nodes import client_api_key

    session = cluster({"VLLM_API_KEY": "from-the-inventory"})
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert client_api_key(session.inventory, session.head) == "from-the-inventory"
    assert client_api_key(cluster().inventory, session.head) is None
    assert from_url("http://h:8000/v1", None).api_key is None
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    assert client_api_key(session.inventory, session.head) == KEY
    target = from_url("http://h:8000/v1", None)
    assert target.api_key == KEY and KEY not in repr(target) + json.dumps(target.config)


def test_a_key_from_the_inventory_is_sent_by_status_and_a_401_is_named(monkeypatch):
    """`status` asks /v1/models with the client's key; a 401 lands in the server's `models_error`."""
    from sparkcluster.serving import status as status_module

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    asked: list[str | None] = []

    def http(url: str, body: object = None, timeout: float = 5.0, api_key: str | None = None) -> tuple[int, str]:
        asked.append(api_key)
        return (401, '{"error": "Unauthorized"}') if url.endswith("/v1/models") else (200, "")
    monkeypatch.setattr(status_module, "http", http)
    monkeypatch.setattr(status_module, "endpoint_figures", lambda url: (None, None))
    session = cluster({"VLLM_API_KEY": "sk-other"})
    server = status_module.server_status(session, Serving("m", "m", 8000, "http://10.0.0.1:8000/v1", 2))
    assert "sk-other" in asked and server.models == ()
    assert server.models_error == ("http://10.0.0.1:8000/v1/models answered 401: the endpoint wants an API key, "
                                   "and the key sent (VLLM_API_KEY) does not match it; give the key the server was "
                                   "started with, in this machine's environment (`export VLLM_API_KEY=KEY`) or as "
                                   "serve_env: {VLLM_API_KEY: KEY} in the inventory")
