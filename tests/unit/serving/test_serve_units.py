"""The pure parts of serving: eugr's command lines, the container line, recipes and their overrides, --tp
checks, Ray membership judgement and readiness over a real local HTTP server."""

from __future__ import annotations

import http.server
import json
import shlex
import threading
from pathlib import Path

import pytest

from sparkcluster.engine.errors import SparkclusterError, UsageError
from sparkcluster.engine.inventory import load_inventory
from sparkcluster.recipes.load import bundled_names, load_recipe, merged_flags, parse_flags
from sparkcluster.recipes.types import Recipe
from sparkcluster.serving.launch import (
    Node,
    ServeArgs,
    container_command,
    docker_run_line,
    ray_start_argv,
    vllm_serve_argv,
)
from sparkcluster.serving.layout import LayoutAsk
from sparkcluster.serving.membership import Member, judge_members, parse_members
from sparkcluster.serving.parallel import size_layout
from sparkcluster.serving.readiness import Diagnosis, NotReady, wait_ready

HEAD = Node("spark-1", 0, "192.168.177.11", "192.168.177.11")
WORKER = Node("spark-2", 1, "192.168.177.12", "192.168.177.11")


def test_ray_start_lines_are_eugrs_exactly():
    assert shlex.join(ray_start_argv(HEAD)) == (
        "ray start --block --head --port 6379 --node-ip-address 192.168.177.11 --include-dashboard=True "
        "--dashboard-host 127.0.0.1 --dashboard-port 8265 --disable-usage-stats")
    assert shlex.join(ray_start_argv(WORKER)) == (
        "ray start --block --address=192.168.177.11:6379 --node-ip-address 192.168.177.12")
    assert ray_start_argv(WORKER, num_gpus=1)[-2:] == ["--num-gpus", "1"]


def test_vllm_serve_for_each_launcher():
    args = ServeArgs("openai/gpt-oss-120b", 2, served_name="gpt-oss", flags=("--max-num-seqs", "4"))
    assert shlex.join(vllm_serve_argv(args, "ray", HEAD, 2)) == (
        "vllm serve openai/gpt-oss-120b --tensor-parallel-size 2 --distributed-executor-backend ray "
        "--host 0.0.0.0 --port 8000 --served-model-name gpt-oss --max-num-seqs 4")
    head = shlex.join(vllm_serve_argv(args, "native", HEAD, 2))
    worker = shlex.join(vllm_serve_argv(args, "native", WORKER, 2))
    common = ("--distributed-executor-backend mp --nnodes 2 --node-rank {} --master-addr 192.168.177.11 "
              "--master-port 29501")
    assert common.format(0) in head and "--host 0.0.0.0 --port 8000" in head and "--headless" not in head
    assert common.format(1) in worker and worker.endswith("--headless --max-num-seqs 4") and "--port" not in worker


def test_docker_run_line_has_eugrs_flags_and_the_nodes_own_env_file():
    line = docker_run_line("vllm-node", '"$HOME"/.config/sparkcluster/comm.env', ray_start_argv(WORKER),
                           env={"HF_HUB_OFFLINE": "1"})
    assert line.startswith("docker run -d --privileged --gpus all --rm --ipc=host --network host --name vllm_node "
                           "--env-file \"$HOME\"/.config/sparkcluster/comm.env -e HF_HUB_OFFLINE=1 ")
    assert '-v "${HF_HOME:-$HOME/.cache/huggingface}":/root/.cache/huggingface' in line
    assert ") vllm-node ray start --block --address=" in line
    twin = docker_run_line("vllm-node", "f", ["python3", "-"], detached=False)
    assert twin.startswith("docker run --rm -i --privileged --gpus all --ipc=host --network host --env-file f ")
    assert "--name" not in twin and " -d " not in twin


@pytest.mark.parametrize("entrypoint, argv, expected", [
    (None, ["ray", "start"], ([], ["ray", "start"])),
    (["/opt/nvidia/nvidia_entrypoint.sh"], ["vllm", "serve", "m"], ([], ["vllm", "serve", "m"])),  # kept: a wrapper
    (["vllm", "serve"], ["vllm", "serve", "m", "--tp"], ([], ["m", "--tp"])),  # `unrecognized arguments: serve`
    (["vllm", "serve"], ["ray", "start"], (["--entrypoint", "ray"], ["start"])),
    (["python3", "-m", "vllm.entrypoints.openai.api_server"], ["vllm", "serve", "m"], ([], ["m"])),
])
def test_images_whose_entrypoint_is_vllm_serve(entrypoint, argv, expected):
    assert container_command(argv, entrypoint) == expected


def test_bundled_recipes_load_and_gpt_oss_captures_5_and_10():
    assert {"default", "gpt-oss-120b", "nemotron-3-super"} <= set(bundled_names())
    recipe = load_recipe("gpt-oss-120b")
    sizes = json.loads(recipe.flags["--compilation-config"])["cudagraph_capture_sizes"]
    assert {5, 10} <= set(sizes) and sizes[:6] == [1, 2, 4, 5, 8, 10] and sizes[-1] == 1024
    assert recipe.env == {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}
    assert recipe.flags["--enable-auto-tool-choice"] is None and recipe.served_model_name == "gpt-oss-120b"
    nemotron = load_recipe("nemotron-3-super")
    assert nemotron.flags["--tool-call-parser"] == "qwen3_coder" and nemotron.served_model_name == "nemotron-3-super"


def test_extra_arguments_override_recipe_flags_by_name():
    recipe = load_recipe("gpt-oss-120b")
    flags = merged_flags(recipe, ["--max-num-seqs", "64", "--kv-cache-dtype=auto", "--enforce-eager"])
    text = " ".join(flags)
    assert "--max-num-seqs 64" in text and "256" not in text.split("--max-num-seqs")[1].split()[0]
    assert "--kv-cache-dtype auto" in text and text.endswith("--enforce-eager")
    assert parse_flags(["--x=1", "--y", "2", "--z"]) == {"--x": "1", "--y": "2", "--z": None}


@pytest.mark.parametrize("args, message", [
    (["--tensor-parallel-size", "2"], "set by sparkcluster"),
    (["-tp", "2"], "set by sparkcluster"),
    (["model-name"], "is not a flag"),
])
def test_bad_extra_arguments_are_usage_errors(args, message):
    with pytest.raises(UsageError, match=message):
        parse_flags(args)


@pytest.mark.parametrize("text, message", [
    ("flags: {--port: 9000}\n", "set by sparkcluster"),
    ("flagz: {}\n", "unknown key 'flagz'"),
    ("flags: {max-num-seqs: 4}\n", "must start with --"),
    ("port: 99999\n", "is not a TCP port"),
    ("flags: [\n", "recipe.yml:"),
])
def test_bad_recipe_files_name_the_problem(tmp_path, text, message):
    path = tmp_path / "recipe.yml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_recipe(str(path))


def test_unknown_recipe_suggests_the_close_one():
    with pytest.raises(UsageError, match="did you mean 'gpt-oss-120b'"):
        load_recipe("gpt-oss-12b")


def _inventory(tmp_path: Path, count: int):
    hosts = "".join(f"  spark-{i}: {{address: 192.168.1.{10 + i}, role: {'head' if i == 1 else 'worker'}}}\n"
                    for i in range(1, count + 1))
    (tmp_path / "inv.yml").write_text(f"name: t\nvars: {{user: spark}}\nhosts:\n{hosts}")
    return load_inventory(tmp_path / "inv.yml")


def test_tp_must_equal_the_nodes_selected(tmp_path):
    four, recipe = _inventory(tmp_path, 4), Recipe("plain")

    def check_tp(tp, inventory):
        return size_layout(LayoutAsk(tp=tp), inventory, recipe).tp

    assert check_tp(None, four) == 4 and check_tp(4, four) == 4
    with pytest.raises(UsageError, match=r"TP 2 x PP 1 on 4 nodes.*") as e:
        check_tp(2, four)
    assert "--limit spark-1,spark-2" in e.value.fix
    with pytest.raises(UsageError, match="TP 5 x PP 1 needs 5 GPUs, but the selection has 4"):
        check_tp(5, four)
    with pytest.raises(UsageError):
        check_tp(0, four)
    assert check_tp(2, four.limit(["spark-1", "spark-3"])) == 2


FABRIC = {"spark-1": "10.0.0.11", "spark-2": "10.0.0.12"}
OTHER = {"spark-1": ["192.168.1.11"], "spark-2": ["192.168.1.12"]}


def test_ray_membership_judgement():
    good = [Member("10.0.0.11", "spark-1", 1), Member("10.0.0.12", "spark-2", 1)]
    assert judge_members(good, FABRIC, OTHER) == []
    on_mgmt = judge_members([good[0], Member("192.168.1.12", "spark-2", 1)], FABRIC, OTHER)
    assert len(on_mgmt) == 1 and on_mgmt[0].startswith("spark-2 joined Ray on 192.168.1.12, its management address")
    missing = judge_members(good[:1], FABRIC, OTHER)
    assert missing == ["spark-2 did not join Ray (expected on 10.0.0.12); see `sparkcluster logs --node spark-2`"]
    no_gpu = judge_members([good[0], Member("10.0.0.12", "spark-2", 0)], FABRIC, OTHER)
    assert "spark-2 joined Ray on 10.0.0.12 with 0 GPU(s)" in no_gpu[0]
    stranger = judge_members([*good, Member("10.0.0.99", "lab-box", 1)], FABRIC, OTHER)
    assert "does not name joined Ray: lab-box on 10.0.0.99" in stranger[0]


def test_ray_membership_output_parsing():
    assert parse_members('noise\n{"nodes": [{"ip": "10.0.0.11", "hostname": "a", "gpus": 1.0}]}\n') == [
        Member("10.0.0.11", "a", 1.0)]
    with pytest.raises(SparkclusterError, match="port 10.0.0.11:6379 is closed"):
        parse_members('{"error": "the Ray head\'s port 10.0.0.11:6379 is closed"}')
    with pytest.raises(SparkclusterError, match="no answer from Ray"):
        parse_members("Traceback ...")


class _Server:
    """A local HTTP server answering like vLLM at a chosen stage of its start-up."""

    def __init__(self, health: int = 200, models: tuple[str, ...] = ("m",), completion: int = 200) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, code: int, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._send(outer.health, {})
                else:
                    self._send(200, {"data": [{"id": m} for m in outer.models]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                self._send(outer.completion, {"choices": [{"text": " ok"}]} if outer.completion == 200 else {})

            def log_message(self, *args: object) -> None:
                pass

        self.health, self.models, self.completion = health, models, completion
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"


def test_readiness_passes_all_three_checks():
    server = _Server()
    ready = wait_ready(server.url, "m", 5, lambda: None, lambda: Diagnosis("", "log"))
    assert ready.completion_text == " ok" and ready.health_s <= ready.models_s <= ready.completion_s


@pytest.mark.parametrize("server, served, message", [
    (dict(models=("other",)), "m", "without 'm'"),
    (dict(completion=500), "m", "a completion failed with HTTP 500"),
    (dict(health=503), "m", "did not answer /health within 1 s"),
])
def test_readiness_failures_name_the_step_and_carry_the_diagnosis(server, served, message):
    with pytest.raises(NotReady, match=message) as e:
        wait_ready(_Server(**server).url, served, 1, lambda: None, lambda: Diagnosis("", "the log tail"))
    assert e.value.fix == "the log tail"


def test_readiness_stops_waiting_when_the_server_died():
    with pytest.raises(NotReady, match="stopped before it answered /health: vLLM on spark-1 exited"):
        wait_ready("http://127.0.0.1:9", "m", 30, lambda: "vLLM on spark-1 exited", lambda: Diagnosis("", "tail"))


@pytest.mark.parametrize("rows, message", [
    ("[{concurrency: true, generation_tps: 1}]", "needs a concurrency"),
    ("[{concurrency: 1, generation_tps: .nan}]", "generation_tps nan is not a non-negative number"),
    ("[{concurrency: 1, peak_tps: .inf}]", "peak_tps inf is not a non-negative number"),
    ("[{concurrency: 1, generation_tps: -3}]", "generation_tps -3 is not a non-negative number"),
])
def test_published_reference_rows_are_checked(tmp_path, rows, message):
    recipe = tmp_path / "r.yml"
    recipe.write_text(f"model: a/b\nreference: {{source: s, hardware: h, nodes: 1, rows: {rows}}}\n")
    with pytest.raises(UsageError, match=message) as e:
        load_recipe(str(recipe))
    assert e.value.message.startswith(f"{recipe}:2: ")
