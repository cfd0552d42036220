"""Issue 15, the adversarial run: every input bounded and refused before anything connects, with `file:line`, what is
wrong and the fix; no library traceback; the failure blamed on the node that has it."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkcluster import cli
from sparkcluster.bootstrap import cli as bootstrap_cli
from sparkcluster.engine.command import ENV_NAME
from sparkcluster.engine.errors import EXIT_USAGE, SparkclusterError, UsageError
from sparkcluster.engine.inventory import InventoryError, load_inventory
from sparkcluster.engine.modelref import ModelRef
from sparkcluster.engine.transport import Unreachable
from sparkcluster.nccl.logs import read_probe_output
from sparkcluster.recipes.load import load_recipe
from sparkcluster.staging import images
from sparkcluster.staging.hfcache import PARTIAL_DIR, Manifest, SnapshotFile, finalize_command
from tests.support.fake_transport import FakeTransport
from tests.support.memory import report_child
from tests.support.refusals import run_cli

INJECTION = "A;touch /tmp/sparkcluster-pwned;B"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- 1. env names reach a shell: refused where they are written ----------------------------------------
SERVE_ENV_CASES = [
    # (inventory text, the line the error names, what it says)
    (f"vars:\n  serve_env:\n    '{INJECTION}': '1'\nhosts:\n  s1: {{address: 10.0.0.1, role: head}}\n", 3,
     "is not an environment variable name"),
    ("hosts:\n  s1:\n    address: 10.0.0.1\n    role: head\n    vars:\n      serve_env: {'1X': a}\n", 6,
     "is not an environment variable name"),
    ("groups:\n  g: {hosts: [s1], vars: {serve_env: {A B: x}}}\nhosts:\n  s1: {address: 10.0.0.1, role: head}\n", 2,
     "is not an environment variable name"),
    ("vars:\n  serve_env: [A=1]\nhosts:\n  s1: {address: 10.0.0.1, role: head}\n", 2, "serve_env must map"),
    ("vars:\n  serve_env:\n    A: {b: 1}\nhosts:\n  s1: {address: 10.0.0.1, role: head}\n", 3, "must be one value"),
    # Ansible's format reads the same vars
    (f"all:\n  vars:\n    serve_env:\n      '{INJECTION}': '1'\n  children:\n    head:\n      hosts:\n        s1:\n"
     "          ansible_host: 10.0.0.1\n", 4, "is not an environment variable name"),
]


@pytest.mark.parametrize("text, line, message", SERVE_ENV_CASES)
def test_serve_env_names_are_refused_when_the_inventory_loads(tmp_path, text, line, message):
    # Failed before the fix: these loaded, and the host runtime exported the name into a shell line.
    path = write(tmp_path, "inv.yml", text)
    with pytest.raises(InventoryError) as raised:
        load_inventory(path, check_files=False)
    assert raised.value.message.startswith(f"{path}:{line}: ") and message in raised.value.message
    assert raised.value.fix and raised.value.exit_code == EXIT_USAGE


def test_a_serve_env_injection_is_exit_2_before_any_connection(tmp_path, no_connection, monkeypatch, capsys):
    path = write(tmp_path, "inv.yml", SERVE_ENV_CASES[0][0])
    code, err = run_cli(monkeypatch, capsys, "serve", "-i", str(path), "--runtime", "host", "--model", "Qwen/Qwen3-0.6B")
    assert code == EXIT_USAGE
    assert f"{path}:3: serve_env: {INJECTION!r} is not an environment variable name" in err


def test_valid_serve_env_still_loads(tmp_path):
    path = write(tmp_path, "inv.yml", "vars:\n  serve_env: {VLLM_X: 1, _Y: ''}\nhosts:\n  s1: {address: 10.0.0.1, role: head}\n")
    assert load_inventory(path).vars["serve_env"] == {"VLLM_X": 1, "_Y": ""}


# ---- 1 and 3. recipe files: env names, and the shape of every value, at file:line ----------------------
RECIPE_CASES = [
    # (recipe text, the line the error names, what it says); each ended in a traceback or loaded before the fix
    (f"description: x\nenv:\n  '{INJECTION}': '1'\n", 3, "is not an environment variable name"),
    ("env:\n  1X: a\n", 2, "is not an environment variable name"),
    ("env:\n  A: {b: 1}\n", 2, "must be one value"),
    ("env:\n  A:\n", 2, "must be one value"),
    ("env: [A=1]\n", 1, "env must map"),
    ("env: A=1\n", 1, "env must map"),
    ("flags: [--enforce-eager]\n", 1, "flags must map"),
    ("description: x\nflags: --enforce-eager\n", 2, "flags must map"),
    ("flags:\n  --max-num-seqs: {a: 1}\n", 2, "must be one value"),
    ("flags:\n  --max-num-seqs: [1, 2]\n", 2, "must be one value"),
    ("flags:\n  --max-num-seqs:\n", 2, "must be one value"),
    ("flags:\n  3: x\n", 2, "must start with --"),
    ("flags:\n  '--x; rm -rf /': 1\n", 2, "is not a flag name"),
    ("description: {a: 1}\n", 1, "description must be text"),
    ("model: [a, b]\n", 1, "model must be text"),
    ("served_model_name: {x: y}\n", 1, "served_model_name must be text"),
    ("port: true\n", 1, "is not a TCP port"),
    ("\n\nport: 0\n", 3, "is not a TCP port"),
    ("- flags\n", 1, "a recipe is a mapping"),
    ("just text\n", 1, "a recipe is a mapping"),
    ("1: x\nflagz: y\n", 1, "unknown key 1"),
]


@pytest.mark.parametrize("text, line, message", RECIPE_CASES)
def test_bad_recipes_name_file_line_and_fix(tmp_path, text, line, message):
    path = write(tmp_path, "r.yml", text)
    with pytest.raises(UsageError) as raised:
        load_recipe(str(path))
    assert raised.value.message.startswith(f"{path}:{line}: ") and message in raised.value.message, raised.value.message
    assert raised.value.fix and raised.value.exit_code == EXIT_USAGE


def test_a_recipe_env_injection_is_exit_2_before_any_connection(tmp_path, no_connection, monkeypatch, capsys):
    inventory = write(tmp_path, "inv.yml", "hosts:\n  s1: {address: 10.0.0.1, role: head}\n")
    recipe = write(tmp_path, "r.yml", RECIPE_CASES[0][0])
    code, err = run_cli(monkeypatch, capsys, "serve", "-i", str(inventory), "--runtime", "host",
                        "--model", "Qwen/Qwen3-0.6B", "--recipe", str(recipe))
    assert code == EXIT_USAGE and f"{recipe}:3: env: {INJECTION!r} is not an environment variable name" in err


def test_recipe_values_keep_their_meaning(tmp_path):
    path = write(tmp_path, "r.yml", "env: {A: 1, B: x}\nflags: {--enforce-eager: true, --max-num-seqs: 4, --x: false}\n"
                                    "port: 8001\nmodel: org/m\n")
    recipe = load_recipe(str(path))
    assert recipe.env == {"A": "1", "B": "x"} and recipe.flags == {"--enforce-eager": None, "--max-num-seqs": "4"}
    assert (recipe.port, recipe.model) == (8001, "org/m")


# ---- 5. flags checked before anything connects -----------------------------------------------------------
# The flags refused before anything connects, the nccl-report threshold and an unknown node: the case table
# tests/fixtures/cases/refused-input.json (tests/unit/test_case_tables.py).
INVENTORY = "hosts:\n  s1: {address: 10.0.0.1, role: head}\n  s2: {address: 10.0.0.2}\n"


def test_good_flags_still_parse():
    args = cli.build_parser().parse_args(["serve", "--port", "65535", "--up-timeout", "0.5", "--min-busbw", "0",
                                          "--forks", "1", "--limit", "s1,s2"])
    assert (args.port, args.up_timeout, args.min_busbw, args.forks, args.limit) == (65535, 0.5, 0.0, 1, "s1,s2")


# ---- 2. nccl-report reads logs line by line, and only regular files --------------------------------------
NCCL_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "nccl" / "roce-both-twins.log"


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_nccl_report_refuses_a_device(device):
    # Failed before: /dev/zero grew until the cap (a MemoryError traceback, exit 1); /dev/null read as an empty log.
    code, _, err, _ = report_child(device)
    assert code == EXIT_USAGE and f"{device}: not a regular file (a character device)" in err, err
    assert "Traceback" not in err


def test_nccl_report_refuses_a_fifo_without_hanging(tmp_path):
    # Failed before: opening a FIFO with no writer blocked forever.
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    code, _, err, _ = report_child(str(fifo))
    assert code == EXIT_USAGE and f"{fifo}: not a regular file (a FIFO)" in err, err


def test_nccl_report_refuses_a_directory(tmp_path):
    code, _, err, _ = report_child(str(tmp_path))
    assert code == EXIT_USAGE and "not a regular file (a directory)" in err, err


def test_nccl_report_streams_a_huge_line_in_bounded_memory(tmp_path):
    # Failed before: a 300 MB line needs more than the child's 1 GiB cap as read_text() + splitlines() copies.
    log = tmp_path / "huge.log"
    with log.open("w") as f:
        for _ in range(300):
            f.write("x" * (1 << 20))
        f.write("\n" + NCCL_LOG.read_text())
    code, out, err, peak = report_child(str(log))
    small_code, small_out, _, small_peak = report_child(str(NCCL_LOG))
    assert (code, out.replace(str(log), "LOG")) == (small_code, small_out.replace(str(NCCL_LOG), "LOG")), err
    assert out.startswith("PASS  RDMA: NET/IB")
    assert peak - small_peak < 50, f"{peak} MB for a 300 MB line, {small_peak} MB without it"


def test_read_probe_output_skips_malformed_marker_lines():
    # Failed before: a marker line with a JSON document of the wrong shape was a KeyError traceback.
    text = ('SPARKCLUSTER_PROBE_RESULT {"rows": [{"op": "all_reduce"}]}\nSPARKCLUSTER_PROBE_RESULT {"rows": 5}\n'
            'SPARKCLUSTER_PROBE_RANK {"rank": "x"}\nSPARKCLUSTER_PROBE_RANK {}\n')
    assert read_probe_output(text) == ([], [])


# ---- 6. a library's tracebacks never reach the user ------------------------------------------------------
@pytest.fixture
def not_ssh() -> Iterator[Callable[[str], int]]:
    """Opens, on a loopback address, a port that accepts TCP and answers like a web server, not an SSH server."""
    stop = threading.Event()
    threads: list[threading.Thread] = []

    def serve(server: socket.socket) -> None:
        with server:
            while not stop.is_set():
                try:
                    peer, _ = server.accept()
                except TimeoutError:
                    continue
                with peer:
                    peer.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

    def open_port(address: str) -> int:
        server = socket.create_server((address, 0))
        server.settimeout(0.2)
        threads.append(threading.Thread(target=serve, args=(server,), daemon=True))
        threads[-1].start()
        return server.getsockname()[1]
    yield open_port
    stop.set()
    for thread in threads:
        thread.join()


def test_a_peer_that_is_not_an_ssh_server_is_one_line_per_host(tmp_path, not_ssh):
    # Failed before: paramiko's own logger printed a traceback for every attempt (right exit code, right message).
    ports = {address: not_ssh(address) for address in ("127.0.0.1", "127.0.0.2")}
    inventory = write(tmp_path, "inv.yml", "hosts:\n  s1: {address: 127.0.0.1, port: %d, role: head}\n"
                                           "  s2: {address: 127.0.0.2, port: %d}\n" % tuple(ports.values()))
    done = subprocess.run([sys.executable, "-m", "sparkcluster", "facts", "-i", str(inventory)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "1000"})
    assert done.returncode == 1
    assert "Traceback" not in done.stderr + done.stdout and "paramiko" not in done.stderr, done.stderr
    unreachable = [line for line in done.stdout.splitlines() if line.startswith("unreachable")]
    assert [line.split()[1] for line in unreachable] == ["s1", "s2"]
    assert all(f"cannot connect to {a}:{p} after 3 attempts" in line for line, (a, p) in zip(unreachable, ports.items()))


# ---- 8. a bad image name is not blamed on the docker group -----------------------------------------------
def test_an_invalid_image_reference_is_the_users_error_not_the_docker_groups():
    # Failed before: "check ... the user is in the docker group" for a name docker could not parse.
    transport = FakeTransport(answer=(1, "", "invalid reference format: repository name must be lowercase\n"))
    with pytest.raises(UsageError) as raised:
        images.inspect(transport, "Vllm-Node")  # type: ignore[arg-type]
    assert "spark-1: 'Vllm-Node' is not a valid image name" in raised.value.message
    assert "docker group" not in raised.value.fix and "--image" in raised.value.fix
    assert transport.commands[0].script.endswith("-- Vllm-Node")  # never read as an option of docker's


@pytest.mark.parametrize("stderr, fix", [
    ("permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock", "docker group"),
    ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?", "docker info"),
])
def test_docker_failures_name_the_cause_docker_gave(stderr, fix):
    with pytest.raises(SparkclusterError) as raised:
        images.inspect(FakeTransport(answer=(1, "", stderr)), "vllm-node")  # type: ignore[arg-type]
    assert fix in raised.value.fix and "spark-1" in raised.value.fix


@pytest.mark.parametrize("image", ["-v", "two words", "", "a;b"])
def test_a_malformed_image_flag_is_exit_2_before_any_connection(tmp_path, no_connection, monkeypatch, capsys, image):
    with pytest.raises(SystemExit) as raised:
        run_cli(monkeypatch, capsys, "status", f"--image={image}", "-i", str(write(tmp_path, "inv.yml", INVENTORY)))
    assert raised.value.code == EXIT_USAGE and "argument --image" in capsys.readouterr().err


# ---- 7. staging: leftovers cleaned when a copy completes; --json always prints a document ------------------
def test_finalizing_a_copy_removes_rsyncs_leftovers(tmp_path):
    # Failed before: an interrupted transfer's temp file and the partial dir stayed in blobs/ for good.
    blob = "a" * 64
    model_dir = tmp_path / "models--acme--m"
    (model_dir / "blobs" / PARTIAL_DIR).mkdir(parents=True)
    (model_dir / "blobs" / blob).write_text("weights")
    (model_dir / "blobs" / PARTIAL_DIR / blob).write_text("half")
    (model_dir / "blobs" / f".{blob}.Xy12Zq").write_text("rsync's temp")
    manifest = Manifest(ModelRef.parse("acme/m"), "c" * 40, (SnapshotFile("model.safetensors", blob, 7),))
    subprocess.run(["sh", "-c", finalize_command(str(model_dir), manifest).script], check=True)
    assert sorted(p.name for p in (model_dir / "blobs").iterdir()) == [blob]
    assert (model_dir / "snapshots" / ("c" * 40) / "model.safetensors").read_text() == "weights"
    assert (model_dir / "refs" / "main").read_text() == "c" * 40


def stage_json(*argv: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "sparkcluster", "stage", *argv, "--json"], capture_output=True,
                          text=True, timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout)


def test_stage_json_prints_an_error_document_for_bad_input(tmp_path):
    # Failed before: the error went to stderr only, and stdout was empty (not JSON).
    code, doc = stage_json("not a model", "-i", str(write(tmp_path, "inv.yml", INVENTORY)))
    assert code == EXIT_USAGE and "not a model" in doc["error"] and doc["fix"]


def test_stage_json_prints_an_error_document_when_nodes_are_unreachable(tmp_path):
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: every connection is refused
    inventory = write(tmp_path, "inv.yml", f"hosts:\n  s1: {{address: 127.0.0.1, port: {port}, role: head}}\n")
    code, doc = stage_json("acme/m", "-i", str(inventory))
    assert code == 1 and doc["model"] == "acme/m" and "cannot connect to" in doc["unreachable"]["s1"]["error"]
    assert doc["unreachable"]["s1"]["fix"]


# ---- never a traceback: recipe files and the CLI's numbers, fuzzed ----------------------------------------
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
RECIPE_WORDS = st.sampled_from(["description", "model", "served_model_name", "port", "env", "flags", "reference",
                                "--max-num-seqs", "--port", "-tp", "--enforce-eager", "VLLM_X", "A;B", "1X", "8000"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | RECIPE_WORDS
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(RECIPE_WORDS | st.text(max_size=6) | st.integers(), inner, max_size=4), max_leaves=12)
RECIPES = st.dictionaries(RECIPE_WORDS, VALUES | st.dictionaries(RECIPE_WORDS, SCALARS, max_size=4), max_size=6)


def loads_or_explains(path: Path) -> None:
    try:
        recipe = load_recipe(str(path))
    except UsageError as e:
        assert e.message.startswith(f"{path}:") and e.fix and e.exit_code == EXIT_USAGE, e.message
    else:
        assert all(ENV_NAME.fullmatch(name) for name in recipe.env)
        assert all(isinstance(v, str) for v in recipe.env.values())
        assert all(isinstance(v, str | None) for v in recipe.flags.values())


@FUZZ
@given(doc=RECIPES | VALUES)
def test_random_recipes_load_or_explain(tmp_path, doc):
    loads_or_explains(write(tmp_path, "r.yml", yaml.safe_dump(doc, sort_keys=False)))


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_random_recipe_bytes_load_or_explain(tmp_path, data):
    path = tmp_path / "r.yml"
    path.write_bytes(data)
    loads_or_explains(path)


NUMBER_TEXT = (st.integers(-10**6, 10**6).map(str) | st.floats(allow_nan=True, allow_infinity=True).map(repr)
               | st.sampled_from(["nan", "-nan", "inf", "-inf", "1e309", "0", "-0", "65535", "65536", "", " ", ",", "0x10",
                                  "1_000", "٣", "s1,,s2", "--x"]) | st.text(max_size=6))
NUMBER_FLAGS = {  # flag: (command, what a value that parses must satisfy)
    "--port": ("serve", lambda v: 1 <= v <= 65535), "--up-timeout": ("up", lambda v: 0 < v < math.inf),
    "--ready-timeout": ("serve", lambda v: 0 < v < math.inf), "--min-busbw": ("verify", lambda v: 0 <= v < math.inf),
    "--forks": ("facts", lambda v: v >= 1), "--streams": ("stage", lambda v: v >= 1), "--tp": ("serve", lambda v: v >= 1),
    "--lines": ("logs", lambda v: v >= 0), "--limit": ("down", lambda v: any(n.strip() for n in v.split(","))),
}


@FUZZ
@given(flag=st.sampled_from(sorted(NUMBER_FLAGS)), text=NUMBER_TEXT)
def test_random_flag_values_parse_in_range_or_exit_2(capsys, flag, text):
    command, valid = NUMBER_FLAGS[flag]
    argv = [command, *(["acme/m"] if command == "stage" else []), f"{flag}={text}"]
    try:
        args = cli.build_parser().parse_args(argv)
    except SystemExit as e:
        assert e.code == EXIT_USAGE and f"{flag}: " in capsys.readouterr().err  # `argument [-n/]--lines: ...`
    else:
        assert valid(getattr(args, flag[2:].replace("-", "_")))


def test_a_lost_connection_that_reaches_the_top_names_the_node(monkeypatch, capsys):
    # Failed before the fix: serve printed "lost the connection to 192.168.103.12", and the user had to map the
    # address back to the node that was powered off.
    def lose_spark_2(args: object, connect: object) -> int:
        raise Unreachable("lost the connection to 192.168.103.12", "power it on", host="spark-2")
    monkeypatch.setattr(bootstrap_cli, "cmd_facts", lose_spark_2)
    code, err = run_cli(monkeypatch, capsys, "facts", "-i", "unused.yml")
    assert code == 1
    assert "error: spark-2: lost the connection to 192.168.103.12" in err and "fix: power it on" in err


# ---- host vars the code reads are typed where the inventory is written: the case table
# tests/fixtures/cases/refused-input.json (tests/unit/test_case_tables.py)