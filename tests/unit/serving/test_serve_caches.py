"""The per-node compile/JIT caches as command values: mounted and pointed at by both runtimes, off with
--no-cache-dirs, measured by status and deleted by `down --purge-caches` (run for real in a temporary home)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sparkcluster.engine.inventory import Host
from sparkcluster.serving.caches import CACHE_VARIABLES, CONTAINER_CACHE_DIR, parse_size, purge_command, size_command
from sparkcluster.serving.runtime import DockerRuntime, HostRuntime, NodeEnv, RuntimeChoice

ENV = NodeEnv("~/.config/sparkcluster/comm.env", {"HF_HUB_OFFLINE": "1"})
EXPECTED_VARIABLES = {"VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE",
                      "CUTE_DSL_CACHE_DIR", "CUDA_CACHE_PATH"}


def test_every_library_has_its_variable_and_its_own_directory():
    assert set(CACHE_VARIABLES) == EXPECTED_VARIABLES
    subdirs = [sub for sub, _ in CACHE_VARIABLES.values()]
    assert len(set(subdirs)) == len(subdirs)


def test_the_docker_runtime_mounts_the_nodes_cache_and_points_every_library_into_it():
    on = DockerRuntime("vllm-node", caches=True).start_main(["ray", "start"], ENV).script
    assert on.startswith('mkdir -p "$HOME"/.cache/sparkcluster/jit && docker run -d ')
    assert f'-v "$HOME"/.cache/sparkcluster/jit:{CONTAINER_CACHE_DIR} ' in on
    for name, (sub, _) in CACHE_VARIABLES.items():
        assert f"-e {name}={CONTAINER_CACHE_DIR}/{sub} " in on
    # The recipe's env comes after the cache's, so a recipe may point one library elsewhere (docker: last -e wins).
    assert on.index("-e CUDA_CACHE_PATH") < on.index("-e HF_HUB_OFFLINE=1")
    twin = DockerRuntime("vllm-node", caches=True).run_in_env(["python3", "-"], ENV, twin=True).script
    assert f'-v "$HOME"/.cache/sparkcluster/jit:{CONTAINER_CACHE_DIR} ' in twin  # the probe's twin too


def test_no_cache_dirs_removes_the_mount_and_the_variables():
    off = DockerRuntime("vllm-node", caches=False).start_main(["ray", "start"], ENV).script
    assert "sparkcluster/jit" not in off and not any(name in off for name in CACHE_VARIABLES)
    host_off = HostRuntime("/v", caches=False).start_main(["ray", "start"], ENV).script
    assert "sparkcluster/jit" not in host_off


def test_runtime_choice_keeps_caches_by_default_and_passes_the_switch_on():
    host = Host("spark-1", "10.0.0.1", role="head", vars={"python_env": "/v"})
    assert RuntimeChoice("docker").on(host) == DockerRuntime("vllm-node", caches=True)
    assert RuntimeChoice("host", caches=False).on(host) == HostRuntime("/v", caches=False)


def test_the_host_runtime_exports_the_caches_after_the_comm_env_and_before_serve_env(tmp_path: Path):
    script = HostRuntime("/v", caches=True).run_in_env(["env"], NodeEnv("c.env", {"TRITON_CACHE_DIR": "/mine"})).script
    (tmp_path / "c.env").write_text("VLLM_HOST_IP=10.0.0.1\n")
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)},
                         check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    base = f"{tmp_path}/.cache/sparkcluster/jit"
    assert env["VLLM_CACHE_ROOT"] == f"{base}/vllm" and env["TORCHINDUCTOR_CACHE_DIR"] == f"{base}/inductor"
    assert env["TRITON_CACHE_DIR"] == "/mine"  # the inventory's serve_env wins
    assert (tmp_path / ".cache/sparkcluster/jit").is_dir()


def test_size_and_purge_run_in_a_real_shell(tmp_path: Path):
    def sh(script: str) -> str:
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True,
                              env={**os.environ, "HOME": str(tmp_path)}).stdout
    assert parse_size(sh(size_command().script)) == 0  # none yet
    d = tmp_path / ".cache/sparkcluster/jit/triton"
    d.mkdir(parents=True)
    (d / "kernel.cubin").write_bytes(b"x" * 300_000)
    size = parse_size(sh(size_command().script))
    assert size is not None and 300_000 <= size < 400_000
    assert parse_size(sh(purge_command("vllm-node").script)) == size
    assert not (tmp_path / ".cache/sparkcluster/jit").exists()
    assert parse_size("du: cannot read") is None and parse_size("") is None
