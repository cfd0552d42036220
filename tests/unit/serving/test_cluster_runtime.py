"""Issue 43 (part B): the runtime chosen at bootstrap is the cluster's. `bootstrap --runtime host` records it in the
inventory's vars (the user's file kept as written: comments, order, quoting, line ends), every later command reads
it there and `--runtime` overrides it; `sim up --vllm-env` writes it. And doctor passes a clean cluster: an image
not there yet is a warning saying how it gets there (an error only when --image names it), never an empty reason."""

from __future__ import annotations

import argparse
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from sparkcluster.bootstrap import cli as bootstrap_cli
from sparkcluster.doctor import cli as doctor_cli
from sparkcluster.doctor.run import missing_image
from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.inventory import InventoryError, load_inventory
from sparkcluster.engine.inventory.writeback import edited, set_shared_var
from sparkcluster.node.health import health_command, parse_health, parse_image
from sparkcluster.node.parity import Node, Severity, parity
from sparkcluster.recipes.types import Recipe
from sparkcluster.serving.launch import DEFAULT_IMAGE
from sparkcluster.serving.record import ServeRecord
from sparkcluster.serving.runtime import ClusterRuntime, cluster_launcher, cluster_runtime, remember_runtime
from sparkcluster.sim import SimCluster
from sparkcluster.sim.state import ClusterState
from tests.support.doctor import healthy
from tests.support.helpers import run_cli

INVENTORY = """\
# my two Sparks
name: lab
vars:
  # who logs in
  user: spark   # not root
  key: "id_test"
hosts:
  spark-1: {address: 127.0.0.1, port: 9, role: head}
  spark-2: {address: 127.0.0.2, port: 9}
"""


def written(tmp_path: Path, text: str = INVENTORY, name: str = "inventory.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    (tmp_path / "id_test").write_text("a key")  # the inventory's key, which a load checks exists
    return path


# ---- the record: the inventory's vars, edited in place ---------------------------------------------------------

def test_recording_adds_one_line_and_keeps_every_comment_order_and_quote(tmp_path):
    path = written(tmp_path)
    path.chmod(0o640)
    assert set_shared_var(load_inventory(path, check_files=False), "runtime", "host") is True
    assert path.read_text() == INVENTORY.replace("  user: spark", "  runtime: host\n  user: spark")
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    assert all(h.vars["runtime"] == "host" for h in load_inventory(path, check_files=False).hosts)
    assert set_shared_var(load_inventory(path, check_files=False), "runtime", "host") is False  # said already


def test_recording_replaces_only_the_value_where_the_key_is_written(tmp_path):
    path = written(tmp_path, INVENTORY.replace("  user: spark", "  runtime: 'docker'  # for now\n  user: spark"))
    set_shared_var(load_inventory(path, check_files=False), "runtime", "host")
    assert path.read_text() == INVENTORY.replace("  user: spark", "  runtime: host  # for now\n  user: spark")


@pytest.mark.parametrize(("text", "expected"), [
    ("name: x\nhosts: {a: {address: h}}\n", "vars:\n  runtime: host\nname: x\nhosts: {a: {address: h}}\n"),
    ("vars: {user: me}\nhosts: {a: {address: h}}\n", "vars: {runtime: host, user: me}\nhosts: {a: {address: h}}\n"),
    ("vars: {}\nhosts: {a: {address: h}}\n", "vars: {runtime: host}\nhosts: {a: {address: h}}\n"),
    ("vars:   # later\nhosts: {a: {address: h}}\n", "vars: {runtime: host}   # later\nhosts: {a: {address: h}}\n"),
    ("vars:\n  runtime:\nhosts: {a: {address: h}}\n", "vars:\n  runtime: host\nhosts: {a: {address: h}}\n"),
    ("vars:\r\n  user: me\r\nhosts: {a: {address: h}}\r\n",
     "vars:\r\n  runtime: host\r\n  user: me\r\nhosts: {a: {address: h}}\r\n"),
])
def test_every_shape_of_vars_takes_the_record_in_its_own_style(text, expected):
    assert edited(text, ("vars",), "runtime", "host") == expected


def test_an_ansible_inventory_gets_it_under_all_vars(tmp_path):
    path = written(tmp_path, "all:\n  hosts:\n    spark-1: {ansible_host: 127.0.0.1, sparkcluster_role: head}\n")
    set_shared_var(load_inventory(path, check_files=False), "runtime", "host")
    assert path.read_text() == ("all:\n  vars:\n    runtime: host\n  hosts:\n"
                                "    spark-1: {ansible_host: 127.0.0.1, sparkcluster_role: head}\n")


def test_a_linked_inventory_is_edited_at_its_target_and_the_link_stays(tmp_path):
    target = written(tmp_path, name="real.yml")
    link = tmp_path / "inventory.yml"
    link.symlink_to(target)
    set_shared_var(load_inventory(link, check_files=False), "runtime", "host")
    assert link.is_symlink() and "runtime: host" in target.read_text()


@pytest.mark.parametrize("text", [
    "vars:\n  runtime: >-\n    docker\n  user: me\nhosts: {a: {address: h}}\n",
    "vars:\n  runtime: |\n    docker\n\n  user: me\nhosts: {a: {address: h}}\n",
])
def test_a_block_scalar_value_is_replaced_keeping_the_line_breaks_after_it(text):
    """Round 6 W9: `runtime: >-` then `docker` on its own line took its line break with it, joining the next key."""
    done = edited(text, ("vars",), "runtime", "host")
    assert yaml.safe_load(done)["vars"] == {"runtime": "host", "user": "me"}
    assert done.startswith("vars:\n  runtime: host\n")


def test_a_read_only_inventory_is_left_alone_and_named(tmp_path):
    """Round 6 W2: a 0444 file was rewritten anyway (replacing it needs only the folder's write bit)."""
    path = written(tmp_path)
    path.chmod(0o444)
    with pytest.raises(InventoryError, match="is read-only, so it is left as it is") as refused:
        set_shared_var(load_inventory(path, check_files=False), "runtime", "host")
    assert "chmod u+w" in refused.value.fix and path.read_text() == INVENTORY
    assert oct(path.stat().st_mode & 0o777) == "0o444"


def test_a_hard_linked_inventory_is_left_alone_so_its_names_keep_one_text(tmp_path):
    """Round 6 W8: the rename gave one name the new text and left the other with the old."""
    path = written(tmp_path)
    other = tmp_path / "other.yml"
    os.link(path, other)
    with pytest.raises(InventoryError, match="has 2 names \\(hard links\\)"):
        set_shared_var(load_inventory(path, check_files=False), "runtime", "host")
    assert path.read_text() == other.read_text() == INVENTORY and path.stat().st_ino == other.stat().st_ino


def test_an_edit_saved_while_recording_is_kept_and_the_record_refused(tmp_path, monkeypatch):
    """Round 6 W3: an edit saved between the read and the rename was silently lost."""
    import sparkcluster.engine.inventory as inventory_package

    path = written(tmp_path)
    real_load = inventory_package.load_inventory

    def load_while_the_user_saves(file, **kw):  # the validation of the edited copy runs in that window
        with open(path, "a") as f:
            f.write("# USER EDIT\n")
        return real_load(file, **kw)

    inventory = load_inventory(path, check_files=False)
    monkeypatch.setattr(inventory_package, "load_inventory", load_while_the_user_saves)
    with pytest.raises(InventoryError, match="changed while runtime was being recorded in it; left as it now is"):
        set_shared_var(inventory, "runtime", "host")
    assert path.read_text() == INVENTORY + "# USER EDIT\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["id_test", "inventory.yml"]  # no temporary left


def test_a_host_that_sets_its_own_runtime_is_named_and_the_file_left_alone(tmp_path):
    text = INVENTORY.replace("{address: 127.0.0.2, port: 9}", "{address: 127.0.0.2, port: 9, vars: {runtime: docker}}")
    path = written(tmp_path, text)
    with pytest.raises(InventoryError, match="spark-2 sets `runtime` in its own or a group's vars") as refused:
        set_shared_var(load_inventory(path, check_files=False), "runtime", "host")
    assert refused.value.exit_code == 2 and "remove `runtime` there" in refused.value.fix
    assert path.read_text() == text and sorted(p.name for p in tmp_path.iterdir()) == ["id_test", "inventory.yml"]


def test_a_misspelt_runtime_or_launcher_is_refused_at_load_with_its_line(tmp_path):
    path = written(tmp_path, INVENTORY.replace("  user: spark", "  runtime: hots\n  launcher: rey\n  user: spark"))
    with pytest.raises(InventoryError) as refused:
        load_inventory(path, check_files=False)
    message = refused.value.message
    assert f"{path}:5: runtime must be docker or host, not 'hots' (did you mean 'host'?)" in message
    assert f"{path}:6: launcher must be ray or native, not 'rey' (did you mean 'ray'?)" in message


# ---- who decides: --runtime, else the inventory's, else docker ---------------------------------------------------

def test_the_flag_overrides_the_inventory_which_overrides_the_default(tmp_path):
    plain = load_inventory(written(tmp_path), check_files=False)
    host = load_inventory(written(tmp_path, INVENTORY.replace("  user: spark", "  runtime: host\n  user: spark"),
                                  "host.yml"), check_files=False)
    assert cluster_runtime(plain, None).name == "docker" and "the default" in cluster_runtime(plain, None).shown()
    assert cluster_runtime(host, None) == ClusterRuntime("host", f"the inventory's runtime, in {host.path}")
    assert cluster_runtime(host, "docker") == ClusterRuntime("docker", "from --runtime")
    assert cluster_launcher(plain) is None


def test_hosts_told_different_runtimes_are_bad_input(tmp_path):
    text = INVENTORY.replace("{address: 127.0.0.2, port: 9}", "{address: 127.0.0.2, port: 9, vars: {runtime: host}}")
    with pytest.raises(UsageError, match=r"different runtimes \(spark-1: docker \(unset\), spark-2: host\)") as bad:
        cluster_runtime(load_inventory(written(tmp_path, text), check_files=False), None)
    assert bad.value.exit_code == 2


def test_docker_on_an_inventory_that_says_nothing_writes_nothing(tmp_path):
    path = written(tmp_path)
    assert remember_runtime(load_inventory(path, check_files=False), "docker") is False
    assert path.read_text() == INVENTORY


def bootstrap_args(path: Path, **flags: object) -> argparse.Namespace:
    defaults = dict(inventory_arg=str(path), inventory=None, limit=None, json=False, check=False, min_driver=None,
                    driver_policy=None, allow_other_gpu=False, runtime="host")
    return argparse.Namespace(**{**defaults, **flags})


def test_bootstrap_records_the_runtime_it_is_given_but_not_in_check_mode(tmp_path, monkeypatch):
    """The report: after `bootstrap --runtime host`, doctor, status and logs went on with Docker."""
    ran: list[object] = []
    monkeypatch.setattr(bootstrap_cli, "run_playbook",
                        lambda playbook, inventory, args, extra: ran.append(extra) or SimpleNamespace(exit_code=1))
    path = written(tmp_path)
    assert bootstrap_cli.cmd_bootstrap(bootstrap_args(path, check=True), lambda: None) == 1
    assert path.read_text() == INVENTORY  # --check changes nothing, the inventory included
    assert bootstrap_cli.cmd_bootstrap(bootstrap_args(path), lambda: None) == 1
    assert ran == [{"runtime": "host"}, {"runtime": "host"}]
    assert cluster_runtime(load_inventory(path, check_files=False), None).name == "host"


def test_status_and_logs_follow_the_recorded_runtime_and_the_flag_overrides_it(tmp_path):
    """With `runtime: host` recorded and no python_env (a vLLM environment not made yet), status and logs follow the
    host runtime and connect (issue 46: they were refused, exit 2, as if they started an engine); `--runtime docker`
    overrides it and connects too. The nodes (a closed port) are unreachable: exit 1."""
    path = written(tmp_path, INVENTORY.replace("  user: spark", "  runtime: host\n  user: spark"))
    for command in ("status", "logs"):
        followed = run_cli(command, "-i", str(path), timeout=60)
        assert followed.returncode == 1 and "python_env" not in followed.stderr, followed.stderr
        assert f"runtime: host (the inventory's runtime, in {path})" in followed.stderr
    overridden = run_cli("status", "-i", str(path), "--runtime", "docker", timeout=60)
    assert "python_env" not in overridden.stderr and "runtime: docker (from --runtime)" in overridden.stderr
    assert overridden.returncode == 1  # the nodes (a closed port) are unreachable: it connected


def test_the_simulators_inventory_with_a_vllm_env_names_the_host_runtime(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCLUSTER_SIM_ROOT", str(tmp_path))
    for vllm_env, runtime in (("/opt/vllm-env", "host"), ("", None)):
        state = ClusterState(name=f"lab{bool(vllm_env):d}", count=2, k=120, drivers=["590.48.01"], port0_hosts=[],
                             docker=False, lan_rate="500mbit", user="spark", uid=1500, ssh_mesh=True, vllm_env=vllm_env)
        cluster = SimCluster(state)
        state.dir.mkdir()
        cluster.client_key.write_text("key")
        cluster.known_hosts.write_text("hosts")
        cluster.write_inventory()
        assert yaml.safe_load(cluster.inventory_path.read_text())["vars"].get("runtime") == runtime
        assert cluster_runtime(load_inventory(cluster.inventory_path), None).name == (runtime or "docker")


# ---- doctor: which image, and an image not there yet ---------------------------------------------------------------

def record(runtime: str, image: str = "vllm-node:mine") -> ServeRecord:
    return ServeRecord(runtime, "ray", image, ("spark-1", "spark-2"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("given", "runtime", "served", "image"), [
    (None, ClusterRuntime("host", "the inventory's"), None, ""),
    (None, ClusterRuntime("docker", "the default"), None, DEFAULT_IMAGE),
    (None, ClusterRuntime("docker", "from --runtime"), None, DEFAULT_IMAGE),
    (None, ClusterRuntime("docker", "the default"), "host", ""),  # what runs decides where nothing is named
    (None, ClusterRuntime("docker", "the default"), "docker", "vllm-node:mine"),
    (None, ClusterRuntime("host", "from --runtime"), "docker", ""),  # the flag overrides the last serve
    (None, ClusterRuntime("docker", "from --runtime"), "host", DEFAULT_IMAGE),
    ("other:1", ClusterRuntime("host", "from --runtime"), None, "other:1"),
])
def test_the_image_the_doctor_checks(monkeypatch, given, runtime, served, image):
    session = SimpleNamespace(head=SimpleNamespace(name="spark-1"), facts={"spark-1": object()})
    monkeypatch.setattr(doctor_cli, "read_record", lambda session: record(served) if served else None)
    assert doctor_cli.image_to_check(session, given, runtime) == image  # type: ignore[arg-type]


def absent(node: Node) -> Node:
    return replace(node, health=replace(node.health, image=parse_image("vllm-node", [
        "absent Error response from daemon: No such image: vllm-node:latest"])))


def test_a_fresh_cluster_without_the_image_is_warned_how_it_gets_there_not_failed():
    """The report: doctor FAILed "no image 'vllm-node': " on a clean, bootstrapped Docker cluster."""
    nodes = {n: absent(healthy()) for n in ("spark-1", "spark-2")}
    found = parity(nodes) + missing_image(nodes, "spark-1", "vllm-node", named=False)
    assert not [f for f in found if f.severity is Severity.FAIL], [f.summary for f in found]
    (warned,) = [f for f in found if f.severity is Severity.WARN]
    assert warned.summary == ("spark-1, spark-2: no image 'vllm-node' yet; serve copies the head's (spark-1) to every "
                              "node, so it needs to be on spark-1 first (not needed with --runtime host)")
    assert "./build-and-copy.sh -t vllm-node" in warned.fix and "sparkcluster image sync vllm-node" in warned.fix


def test_a_worker_without_the_head_s_image_is_warned_that_serve_copies_it():
    nodes = {"spark-1": healthy(), "spark-2": absent(healthy())}
    found = parity(nodes) + missing_image(nodes, "spark-1", "vllm-node", named=False)
    assert not [f for f in found if f.severity is Severity.FAIL], [f.summary for f in found]
    (warned,) = [f for f in found if f.severity is Severity.WARN]
    assert warned.summary == "spark-2: no image 'vllm-node' yet; serve copies the head's over the fabric before it starts"
    assert warned.nodes == ("spark-2",) and "sparkcluster image sync vllm-node" in warned.fix


def test_an_image_named_with_image_that_is_missing_fails():
    nodes = {n: absent(healthy()) for n in ("spark-1", "spark-2")}
    (failed,) = missing_image(nodes, "spark-1", "vllm-node", named=True)
    assert failed.severity is Severity.FAIL and "which --image names" in failed.summary


def test_a_docker_error_that_begins_with_an_empty_line_still_gives_its_reason(tmp_path):
    """Docker's CLI prints "\\nCannot connect to the Docker daemon ...": the probe kept its empty first line."""
    fake = tmp_path / "docker"
    fake.write_text("#!/bin/sh\n[ \"$1\" = version ] && exit 1\n"
                    "printf '\\nCannot connect to the Docker daemon at unix:///var/run/docker.sock.\\n' >&2; exit 1\n")
    fake.chmod(0o755)
    out = subprocess.run(["bash", "-c", health_command("vllm-node").script], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    image = parse_health(out.stdout, "vllm-node").image
    assert image.error == "no image 'vllm-node': Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    assert not image.absent
    assert parse_image("x", ["absent"]).error == "no image 'x': docker gave no reason"


# ---- serve: the cluster's runtime and launcher --------------------------------------------------------------------

@pytest.mark.parametrize(("vars_text", "flags", "recipe", "runtime", "launcher"), [
    ("  runtime: host\n  launcher: native\n", {}, Recipe("default"), "host", "native"),  # both from the inventory
    ("  runtime: host\n  launcher: native\n", {"runtime": "docker", "launcher": "ray"}, Recipe("default"),
     "docker", "ray"),  # the flags override both
    ("  launcher: native\n", {}, Recipe("r", launcher="ray"), "docker", "ray"),  # a recipe's own launcher wins
    ("", {}, Recipe("default"), "docker", "ray"),  # nothing said: docker and Ray, as eugr's
])
def test_serve_takes_the_cluster_runtime_and_launcher_where_no_flag_says(tmp_path, vars_text, flags, recipe, runtime,
                                                                        launcher):
    from sparkcluster.serving import cli as serving_cli
    from sparkcluster.serving.layout import Layout
    from sparkcluster.serving.phases import ServeOptions

    inventory = load_inventory(written(tmp_path, INVENTORY.replace("  user: spark", vars_text + "  user: spark")),
                               check_files=False)
    chosen = serving_cli._on_cluster(ServeOptions(layout=Layout(1, 2, 1), recipe=recipe,
                                                  runtime_flag=flags.get("runtime"),
                                                  launcher_flag=flags.get("launcher")), inventory)
    assert (chosen.runtime, chosen.launcher) == (runtime, launcher)


def test_an_inventory_that_cannot_take_the_record_warns_and_bootstrap_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bootstrap_cli, "run_playbook",
                        lambda playbook, inventory, args, extra: SimpleNamespace(exit_code=0))
    text = INVENTORY.replace("{address: 127.0.0.2, port: 9}", "{address: 127.0.0.2, port: 9, vars: {runtime: docker}}")
    path = written(tmp_path, text)
    assert bootstrap_cli.cmd_bootstrap(bootstrap_args(path, limit="spark-1"), lambda: None) == 0
    said = " ".join(capsys.readouterr().err.split())
    assert "warning: runtime host not recorded:" in said and "spark-2 sets `runtime`" in said, said
    assert "give later commands --runtime host" in said and path.read_text() == text
