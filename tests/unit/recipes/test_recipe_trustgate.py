"""Round 5's trust findings as data (S1, H1, L1, M7): a recipe from a registry that is not trusted brings no
environment variable or vLLM flag that runs code or opens the node's files, in any format or through an included
base; recipes hold no YAML alias and render to a bounded size; a mod holds no hard link to a file outside it; a mod
of a registry that does not exist says so. Each refused with exit 2 before anything connects."""

from __future__ import annotations

import os
import subprocess

import pytest

from sparkcluster.engine.errors import EXIT_USAGE
from sparkcluster.recipes import trustgate
from sparkcluster.recipes.load import load_recipe

from tests.support.recipes import git, private_home  # noqa: F401 (private_home: autouse fixture)
from tests.support.recipes import refused, registry

# The report's S1 payload: Python's warnings filter imports antigravity, which runs $BROWSER through a shell.
ENV_RCE = """\
recipe_version: "2"
model: Qwen/Qwen3-0.6B
runtime: vllm
env:
  PYTHONWARNINGS: "all:0:antigravity.x:0:0"
  BROWSER: "/bin/sh -c 'touch /tmp/pwned-by-env-rce' #%s"
"""


def test_the_reports_env_payload_from_an_untrusted_registry_is_refused_naming_both_and_the_way_out(tmp_path):
    registry(tmp_path, "evil", {"recipes/envrce.yaml": ENV_RCE})
    error = refused("@evil/envrce")  # failed before: loaded, with both variables in its env
    assert error.message.startswith("@evil/envrce is from the registry 'evil', which is not trusted")
    assert "env PYTHONWARNINGS is not one of the 40 variables" in error.message and "env BROWSER" in error.message
    assert "serve with --trust" in error.fix and "recipes add-registry evil URL --trust" in error.fix
    assert dict(load_recipe("@evil/envrce", trust=True).env)["BROWSER"].startswith("/bin/sh")  # the user's call
    refused("envrce")  # by its bare name too


def test_a_trusted_registrys_recipe_keeps_its_env_and_flags(tmp_path):
    registry(tmp_path, "good", {"recipes/envrce.yaml": ENV_RCE.replace("runtime: vllm", "runtime: vllm\ndefaults:\n"
                                                                       "  trust_remote_code: true")}, trusted=True)
    recipe = load_recipe("@good/envrce")
    assert "PYTHONWARNINGS" in recipe.env and "--trust-remote-code" in recipe.flags


@pytest.mark.parametrize("name", [
    "LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONWARNINGS", "BASH_ENV", "ENV", "BROWSER",
    "PATH", "TORCHINDUCTOR_CACHE_DIR", "HF_TOKEN", "HF_HUB_TOKEN_PATH", "VLLM_API_KEY", "HF_HOME", "HF_HUB_CACHE",
    "HF_ENDPOINT", "HF_DATASETS_TRUST_REMOTE_CODE", "NCCL_NET_PLUGIN", "NCCL_CONF_FILE", "NCCL_DEBUG_FILE",
    "CUDA_INJECTION64_PATH", "CUDA_HOME", "OMP_TOOL_LIBRARIES", "TORCH_HOME", "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_RUST_FRONTEND_PATH", "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_PLUGINS",
    "OMP_TOOL_VERBOSE_INIT", "VLLM_LOGGING_STREAM", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
])
def test_a_variable_that_runs_code_opens_files_or_is_secret_is_refused(name):
    reason = trustgate.env_refusal(name, "1")  # whatever its value: the name is not on the allow-list
    assert reason is not None and reason.startswith("is not one of the 40 variables an untrusted recipe may"), reason


@pytest.mark.parametrize(("name", "value"), [
    # names the community's recipes set, with their values (test_recipe_trustgate_allowlist holds all 96) ...
    ("VLLM_MARLIN_USE_ATOMIC_ADD", "1"), ("VLLM_DISTRIBUTED_EXECUTOR_CONFIG",
                                          '{"placement_group_options":{"strategy":"SPREAD"}}'),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"), ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    ("OMP_NUM_THREADS", "4"), ("CUTE_DSL_ARCH", "sm_121a"), ("B12X_MOE_FORCE_A8", "1"),
    ("TILELANG_CLEANUP_TEMP_FILES", "1"), ("DG_JIT_USE_NVRTC", "0"),
    # ... and other values of the same shapes
    ("VLLM_USE_DEEP_GEMM", "1"), ("VLLM_FLOAT32_MATMUL_PRECISION", "medium"), ("OMP_NUM_THREADS", "16"),
    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False,max_split_size_mb:512"),
    ("VLLM_DISTRIBUTED_EXECUTOR_CONFIG", '{"placement_group_options": {"strategy": "STRICT_SPREAD"}}'),
])
def test_a_variable_that_only_tunes_passes(name, value):
    assert trustgate.env_refusal(name, value) is None


@pytest.mark.parametrize(("flag", "value", "why"), [
    ("--trust-remote-code", None, "Python files of the model"), ("--trust_remote_code", None, "Python files"),
    ("--allowed-local-media-path", "/", "file:// media"), ("--worker-extension-cls", "x.Y", "imports a class"),
    ("--worker-cls", "x.Y", "imports"), ("--scheduler-cls", "x.Y", "imports"), ("--middleware", "x.y", "imports"),
    ("--logits-processors", "x.Y", "imports"), ("--reasoning-parser-plugin", "p.py", "runs a Python file"),
    ("--tool-parser-plugin", "p.py", "runs a Python file"), ("--config", "/etc/x.yaml", "past this check"),
    ("--kv-transfer-config", '{"kv_connector": "X"}', "module"), ("--trust-request-chat-template", None, "send"),
    ("--logging-config.pylogging_config_file", "/x", "any class"), ("--otlp-traces-endpoint", "http://e", "traces"),
    ("--compilation-config", '{"mode": 1, "backend": "antigravity.x"}', "names Python to import ('antigravity.x')"),
    ("--compilation-config.backend", "antigravity.x", "names Python to import"),
    ("--speculative-config", '{"method": "custom_class", "model": "evil.Proposer"}', "names Python to import"),
    ("--chat-template", "/home/spark/.ssh/id_ed25519", "reads a file of the node"),
    ("--chat-template", ".netrc", "reads a file of the node"), ("--chat-template", "../x.jinja", "reads a file"),
    ("--hf-token", "hf_x", "a secret"),
])
def test_a_flag_that_runs_code_or_opens_the_nodes_files_is_refused(flag, value, why):
    reason = trustgate.flag_refusal(flag, value)
    assert reason is not None and why in reason, reason


@pytest.mark.parametrize(("flag", "value"), [
    ("--chat-template", "unsloth.jinja"), ("--chat-template", "fixed_chat_template.jinja"),
    ("--chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}"),
    ("--compilation-config", '{"mode": 1, "backend": "eager"}'), ("--compilation-config.cudagraph_mode", "FULL"),
    ("--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}'),
    ("--speculative-config", '{"model": "z-lab/Qwen3.5-DFlash", "method": "dflash"}'),
    ("--no-trust-remote-code", None), ("--max-model-len", "8192"), ("--hf-overrides", '{"max_position": 1.5}'),
    ("--default-chat-template-kwargs.reasoning_effort", "high"), ("--generation-config", "vllm"),
])
def test_a_flag_that_only_tunes_passes(flag, value):
    assert trustgate.flag_refusal(flag, value) is None


@pytest.mark.parametrize(("text", "said"), [
    # sparkcluster's own format
    ("model: a/b\nenv: {LD_PRELOAD: /tmp/x.so}\nflags: {--max-num-seqs: 4}\n", "env LD_PRELOAD"),
    ("model: a/b\nflags: {--trust-remote-code: true}\n", "flag --trust-remote-code runs the Python files"),
    # eugr v1: env:, a NAME=value word before vllm, a flag in the command
    ("recipe_version: '1'\nname: x\ncontainer: c\nenv: {PYTHONPATH: /tmp}\ncommand: vllm serve a/b\n",
     "env PYTHONPATH"),
    ("recipe_version: '1'\nname: x\ncontainer: c\ncommand: BASH_ENV=/tmp/x vllm serve a/b\n", "env BASH_ENV"),
    ("recipe_version: '1'\nname: x\ncontainer: c\ncommand: vllm serve a/b --allowed-local-media-path /\n",
     "flag --allowed-local-media-path"),
    # sparkrun v2: env:, an override's env, defaults that become a flag, a command template's flag
    ("recipe_version: '2'\nmodel: a/b\nenv: {PYTHONSTARTUP: /tmp/x.py}\n", "env PYTHONSTARTUP"),
    ("recipe_version: '2'\nmodel: a/b\noverrides:\n  - when: {arch: gb10}\n    env: {ENV: /tmp/x}\n", "env ENV "),
    ("recipe_version: '2'\nmodel: a/b\ndefaults: {trust_remote_code: true}\n", "flag --trust-remote-code"),
    ("recipe_version: '2'\nmodel: a/b\ndefaults: {cls: x.Ext}\ncommand: vllm serve a/b --worker-extension-cls {cls}\n",
     "flag --worker-extension-cls"),
])
def test_every_format_of_an_untrusted_registrys_recipe_is_gated(tmp_path, text, said):
    registry(tmp_path, "evil", {"recipes/r.yaml": text})
    error = refused("@evil/r")
    assert "registry 'evil', which is not trusted" in error.message and said in error.message, error.message
    load_recipe("@evil/r", trust=True)


def test_an_untrusted_base_cannot_bring_env_into_a_users_own_recipe(tmp_path):
    registry(tmp_path, "evil", {"recipes/base.yaml": ENV_RCE})
    mine = tmp_path / "mine.yaml"
    mine.write_text("recipe_version: '2'\ninclude: '@evil/base'\nmodel: me/mine\n")
    error = refused(str(mine))  # failed before: the user's own file is trusted, and the base's env came along
    assert error.message.startswith(f"{mine} includes a base recipe from the registry 'evil', which is not trusted")
    assert "env PYTHONWARNINGS" in error.message
    mine.write_text("recipe_version: '2'\ninclude: '@evil/base'\nmodel: me/mine\nenv: {VLLM_USE_DEEP_GEMM: '1'}\n")
    error = refused(str(mine))  # the top's own tuning does not launder the base's
    assert "VLLM_USE_DEEP_GEMM" not in error.message and "env PYTHONWARNINGS" in error.message
    assert load_recipe(str(mine), trust=True).env["PYTHONWARNINGS"]


def test_a_users_own_recipe_sets_what_it_likes(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text(ENV_RCE)
    assert "BROWSER" in load_recipe(str(mine)).env


def test_the_cli_refuses_the_payload_with_exit_2(tmp_path):
    import sys

    registry(tmp_path, "evil", {"recipes/envrce.yaml": ENV_RCE})
    shown = subprocess.run([sys.executable, "-m", "sparkcluster", "recipes", "show", "@evil/envrce", "--tp", "2"],
                           capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert shown.returncode == EXIT_USAGE and "env PYTHONWARNINGS" in shown.stderr, shown.stderr
    assert "--trust" in shown.stderr
