"""Round 6's trust findings (F0: X1, X2; F7: K2) as data: an untrusted recipe's environment is an allow-list of the
community corpus's 40 names, each with a reviewed value shape, so torch's logging variables (which wrote an
attacker's key into ~/.ssh/authorized_keys), the places, addresses and interfaces of X2, and response logging are
refused naming the variable and the way out (--trust), by `recipes show` and by `serve --check` before anything
connects; the corpus's recipes and trusted recipes are unaffected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkcluster import cli
from sparkcluster.engine.errors import EXIT_OK, EXIT_USAGE
from sparkcluster.recipes import trustgate
from sparkcluster.recipes.load import load_recipe
from sparkcluster.recipes.trustenv import ALLOWED

from tests.support.recipes import private_home, two_node_inventory  # noqa: F401 (fixtures)
from tests.support.recipes import refused, registry

CORPUS = json.loads((Path(__file__).parents[2] / "fixtures" / "recipes" / "community-corpus-settings.json").read_text())

# The report's X1 payload (recipes/torchlogs.yaml of the untrusted registry `evil`).
TORCH_LOGS = """\
recipe_version: "2"
model: local/tiny-llama
runtime: vllm
env:
  TORCH_LOGS: "+all"
  TORCH_LOGS_OUT: ".ssh/authorized_keys"
  TORCH_LOGS_FORMAT: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIattacker attacker %(message)s"
command: vllm serve {model} --max-model-len 512 --enforce-eager
"""
# X2: what the gate of c930bdd passed besides (gate output in the report), each a place, an address or the network.
X2 = {"TORCH_TRACE": "/home/spark/.ssh", "PYTORCH_TUNABLEOP_FILENAME": ".bashrc",
      "VLLM_TUNED_CONFIG_FOLDER": "/home/spark", "VLLM_HOST_IP": "0.0.0.0", "NCCL_SOCKET_IFNAME": "enP7s7",
      "NCCL_COMM_ID": "10.0.0.66:9999", "HF_HUB_OFFLINE": "0"}
# K2: response logging (recipes/logreq.yaml of the report).
LOG_REQUESTS = """\
recipe_version: "2"
model: local/tiny-llama
runtime: vllm
env:
  VLLM_DEBUG_LOG_API_SERVER_RESPONSE: "true"
command: vllm serve {model} --max-model-len 512 --enable-log-requests --enable-log-outputs
"""


def v2_with_env(env: dict[str, str]) -> str:
    lines = "".join(f"  {name}: {json.dumps(value)}\n" for name, value in env.items())
    return f'recipe_version: "2"\nmodel: local/tiny-llama\nruntime: vllm\nenv:\n{lines}command: vllm serve {{model}}\n'


def test_the_reports_torch_logs_payload_is_refused_naming_each_variable_and_the_way_out(tmp_path):
    registry(tmp_path, "evil", {"recipes/torchlogs.yaml": TORCH_LOGS})
    error = refused("@evil/torchlogs")  # failed on c930bdd: loaded, its three TORCH_* variables in its env
    assert error.message.startswith("@evil/torchlogs is from the registry 'evil', which is not trusted")
    for name in ("TORCH_LOGS", "TORCH_LOGS_OUT", "TORCH_LOGS_FORMAT"):
        assert f"env {name} is not one of the 40 variables an untrusted recipe may set" in error.message
    assert "serve with --trust" in error.fix and "recipes add-registry evil URL --trust" in error.fix
    assert "ssh-ed25519" not in error.message  # a refused name's value is not repeated
    assert load_recipe("@evil/torchlogs", trust=True).env["TORCH_LOGS_OUT"] == ".ssh/authorized_keys"


@pytest.mark.parametrize(("name", "value"), [*X2.items(), ("TORCH_LOGS_OUT", "x"), ("TORCH_LOGS_FORMAT", "%(message)s"),
                                             ("TORCH_LOGS", "+all"), ("VLLM_DEBUG_LOG_API_SERVER_RESPONSE", "true"),
                                             ("VLLM_LOGGING_LEVEL", "DEBUG"), ("NCCL_IB_HCA", "mlx5_0"),
                                             ("CUDA_VISIBLE_DEVICES", "0")])
def test_each_x2_and_k2_variable_is_refused_by_name(name, value):
    assert trustgate.env_refusal(name, value) == (
        "is not one of the 40 variables an untrusted recipe may set (the community's recipes' own, each with a "
        "reviewed value); another name may open a file, a folder or an address of the node")


def test_recipes_show_refuses_every_x2_variable_with_exit_2(tmp_path, capsys, monkeypatch):
    registry(tmp_path, "evil", {"recipes/tracedir.yaml": v2_with_env(X2)})
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["recipes", "show", "@evil/tracedir"])  # c930bdd: exit 0, "(untrusted)", every one listed
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_USAGE, err
    assert all(f"env {name} is not one of the 40 variables" in err for name in X2), err
    assert "--trust" in err
    assert cli.main(["recipes", "show", "@evil/tracedir", "--trust"]) == EXIT_OK


@pytest.mark.usefixtures("no_connection")  # Transport raises: the refusal comes before anything connects
def test_serve_check_refuses_response_logging_before_connecting(tmp_path, capsys, monkeypatch):
    registry(tmp_path, "evil", {"recipes/logreq.yaml": LOG_REQUESTS})
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["serve", "-i", str(two_node_inventory(tmp_path, 1)), "--recipe", "@evil/logreq", "--check"])
    err = " ".join(capsys.readouterr().err.split())
    assert code == EXIT_USAGE, err
    assert "env VLLM_DEBUG_LOG_API_SERVER_RESPONSE is not one of the 40 variables" in err
    assert "flag --enable-log-requests writes every client's prompt into the serving log" in err
    assert "flag --enable-log-outputs writes every client's completion into the serving log" in err
    assert "recipes add-registry evil URL --trust" in err


@pytest.mark.parametrize(("name", "value", "said"), [
    ("VLLM_USE_DEEP_GEMM", "../x", "takes 0 or 1, not '../x'"),
    ("OMP_NUM_THREADS", "4 /tmp", "takes a whole number of at most 9 digits, not '4 /tmp'"),
    ("OMP_NUM_THREADS", "1" * 10, "a whole number of at most 9 digits"),
    ("VLLM_FLOAT32_MATMUL_PRECISION", "high\x1b[2J", "one of highest, high, medium, not 'high\\x1b[2J'"),
    ("PYTORCH_CUDA_ALLOC_CONF", "backend:/tmp/x.so", "comma-separated allocator options"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,", "comma-separated allocator options"),
    ("VLLM_DISTRIBUTED_EXECUTOR_CONFIG", '{"placement_group_options": {"strategy": "SPREAD"}, "runtime_env": '
     '{"pip": ["evil"]}}', "placement_group_options"),
    ("VLLM_DISTRIBUTED_EXECUTOR_CONFIG", "[" * 100_000, "placement_group_options"),
    ("CUTE_DSL_ARCH", "sm_121a/../x", "a GPU architecture"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "4", "one of 0, 1, 2, 3"),
])
def test_an_allowed_variable_takes_only_its_shape(name, value, said):
    reason = trustgate.env_refusal(name, value)
    assert reason is not None and said in reason, reason
    assert "\x1b" not in reason and len(reason) < 400


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--enable-log-requests", None, "writes every client's prompt into the serving log"),
    ("--enable_log_outputs", None, "writes every client's completion into the serving log"),
    # vLLM's parser takes an unambiguous prefix of a flag as the flag (measured: `--trust-remote` sets
    # trust_remote_code, `--enable-log-req --enable-log-o` both loggings)
    ("--enable-log-req", None, "prompt into the serving log (vLLM reads --enable-log-req as --enable-log-requests)"),
    ("--enable-log-o", None, "completion into the serving log (vLLM reads --enable-log-o as --enable-log-outputs)"),
    ("--trust-remote", None, "runs the Python files of the model's repository (vLLM reads --trust-remote as"),
    ("--uvicorn-log-level", "trace", "every request's headers, API keys among them"),
    ("--uvicorn-log-l", "TRACE", "every request's headers"),
    ("--api-key", "sk-known", "replaces the key the endpoint checks"), ("--api-k", "sk-known", "replaces the key"),
    ("--kv-events-config", '{"enable_kv_cache_events": true, "publisher": "zmq"}', "token ids of every request"),
    ("--compilation-config", '{"debug_dump_path": "/home/spark/.ssh"}', "names a place of the node (debug_dump_path"),
    ("--compilation-config", '{"mode": 3, "cache_dir": "/root"}', "names a place of the node (cache_dir"),
    ("--compilation-config.debug_dump_path", "/home/spark", "names a place of the node"),
    ("--compilation-config.debug_dump_path+", "/home/spark", "names a place of the node"),  # vLLM's list append
])
def test_a_flag_that_logs_what_clients_send_or_names_a_place_is_refused(flag, value, said):
    reason = trustgate.flag_refusal(flag, value)
    assert reason is not None and said in reason, reason


@pytest.mark.parametrize(("flag", "value"), [
    ("--model", "a/b"), ("--reasoning-parser", "qwen3"),  # vLLM's own flags that are prefixes of refused ones
    ("--uvicorn-log-level", "info"), ("--no-enable-log-requests", None), ("--max-log-len", "100"),
    ("--", None),  # argparse's end of options, a prefix of nothing
    ("--compilation-config", '{"mode": 3, "cudagraph_mode": "FULL_AND_PIECEWISE"}'),
])
def test_a_flag_near_a_refused_one_passes(flag, value):
    assert trustgate.flag_refusal(flag, value) is None


def test_the_allow_list_is_the_corpus_names_and_every_corpus_setting_passes():
    """Each of the corpus's 96 settings (40 names; tests/fixtures/recipes/community-corpus-settings.json says how they
    were read) passes, and the table holds no name the corpus does not set: a new name is a reviewed change of this
    test and trustenv.py together."""
    assert set(ALLOWED) == set(CORPUS["env"]) and len(ALLOWED) == 40
    settings = [(name, value) for name, values in CORPUS["env"].items() for value in values]
    assert sum(sum(values.values()) for values in CORPUS["env"].values()) == 96
    assert [(name, value, trustgate.env_refusal(name, value)) for name, value in settings
            if trustgate.env_refusal(name, value)] == []


def test_the_corpus_flags_are_refused_only_where_c930bdd_refused_them():
    """The two registries the community trusts carry --trust-remote-code and --reasoning-parser-plugin (refused from
    an untrusted registry before round 6 too); none of their other 135 flags and values is refused."""
    refused_flags = {flag for flag, value in CORPUS["flags"]
                     if trustgate.flag_refusal(flag, tuple(value) if isinstance(value, list) else value)}
    assert refused_flags == {"--trust-remote-code", "--reasoning-parser-plugin"}
    assert len(CORPUS["flags"]) == 137


def test_trusted_recipes_keep_their_env_and_flags(tmp_path):
    registry(tmp_path, "good", {"recipes/torchlogs.yaml": TORCH_LOGS, "recipes/logreq.yaml": LOG_REQUESTS},
             trusted=True)
    assert load_recipe("@good/torchlogs").env["TORCH_LOGS_FORMAT"].startswith("ssh-ed25519")
    logreq = load_recipe("@good/logreq")
    assert "--enable-log-outputs" in logreq.flags and logreq.env["VLLM_DEBUG_LOG_API_SERVER_RESPONSE"] == "true"
    mine = tmp_path / "mine.yaml"
    mine.write_text(v2_with_env(X2))
    assert load_recipe(str(mine)).env["VLLM_HOST_IP"] == "0.0.0.0"  # the user's own file sets what it likes
