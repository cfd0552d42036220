"""Inventory loading and validation: both formats, every error with its file:line, and which inventory is used."""

import os
import string
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sparkcluster.engine.errors import EXIT_USAGE, UsageError
from sparkcluster.engine.inventory import Host, Inventory, InventoryError, find_inventory, load_inventory, record_last_used
from sparkcluster.sim.cluster import SimCluster
from sparkcluster.sim.state import ClusterState

ROOT = Path(__file__).resolve().parents[3]
MARK = "#<"  # in the YAML of a test case, marks the line the error must point at

TWO_HOSTS = """\
hosts:
  spark-1: {address: 192.168.1.50, role: head}
  spark-2: {address: 192.168.1.51}
"""


def write(tmp_path: Path, text: str | bytes, name: str = "inv.yml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def load(tmp_path: Path, text: str, **kwargs) -> Inventory:
    return load_inventory(write(tmp_path, text), **kwargs)


def error(path: Path, **kwargs) -> InventoryError:
    with pytest.raises(InventoryError) as raised:
        load_inventory(path, **kwargs)
    return raised.value


def marked_line(text: str) -> int:
    return next((i for i, line in enumerate(text.splitlines(), 1) if MARK in line), 1)


def own(host_lines: str, top: str = "") -> str:
    """An own-format inventory: `top` before `hosts:`, then the given host lines (indented by two)."""
    return f"{top}hosts:\n{host_lines}"


HEAD = "  spark-1: {address: 192.168.1.50, role: head}\n"
ANSIBLE_HEAD = "  children:\n    head:\n      hosts:\n        spark-1:\n"

ERRORS = [
    # (id, inventory text with MARK on the line the message must name, text the message must contain)
    ("empty-file", "", ["the inventory is empty"]),
    ("only-comments", "# nothing yet\n", ["the inventory is empty"]),
    ("yaml-tab", "hosts:\n  spark-1:\n\taddress: 192.168.1.50  #<\n", ["invalid YAML", "'\\t'"]),
    ("yaml-unclosed-flow", "hosts:\n  spark-1: {address: 192.168.1.50\n  spark-2: {address: 1.2.3.4}  #<\n", ["invalid YAML", "flow mapping"]),
    ("yaml-unclosed-quote", 'hosts:\n  spark-1: "192.168.1.50  #<\n', ["invalid YAML", "quoted scalar"]),
    ("yaml-bad-indent", "hosts:\n  spark-1:\n    address: 1.2.3.4\n   role: head  #<\n", ["invalid YAML"]),
    ("yaml-unknown-tag", "name: !secret lab  #<\n" + TWO_HOSTS, ["invalid YAML", "!secret"]),
    ("yaml-impossible-date", "name: 2024-02-30  #<\n" + TWO_HOSTS, ["invalid YAML", "'2024-02-30'"]),
    ("yaml-two-documents", TWO_HOSTS + "---  #<\n" + TWO_HOSTS, ["invalid YAML", "single document"]),
    ("top-level-list", "- spark-1  #<\n- spark-2\n", ["the top level must be a mapping", "a list"]),
    ("top-level-scalar", "spark-1 spark-2  #<\n", ["the top level must be a mapping", "'spark-1 spark-2'"]),
    ("unknown-top-level-key", "name: lab\nhost:  #<\n" + HEAD, ["unknown key 'host' at the top level", "did you mean 'hosts'?"]),
    ("unknown-host-key", "hosts:\n  spark-1:\n    adress: 192.168.1.50  #<\n    role: head\n",
     ["unknown key 'adress' in host 'spark-1'", "did you mean 'address'?"]),
    ("hosts-missing", "name: lab  #<\nvars: {user: spark}\n", ["no `hosts:` section"]),
    ("hosts-empty", "name: lab\nhosts: {}  #<\n", ["`hosts` is empty"]),
    ("hosts-null", "name: lab\nhosts:  #<\n", ["`hosts` is empty"]),
    ("hosts-a-list", "hosts:  #<\n  - spark-1\n", ["`hosts` must map host names to settings, not a list"]),
    ("host-settings-scalar", own("  spark-1: 192.168.1.50  #<\n"), ["host 'spark-1' must map settings", "'192.168.1.50'"]),
    ("host-settings-null", own(HEAD + "  spark-2:  #<\n"), ["host 'spark-2' must map settings", "not empty"]),
    ("host-name-not-a-string", own(HEAD + "  1: {address: 192.168.1.51}  #<\n"), ["1 is not a valid host name"]),
    ("host-name-with-space", own(HEAD + "  spark 2: {address: 192.168.1.51}  #<\n"), ["'spark 2' is not a valid host name"]),
    ("missing-address", own(HEAD + "  spark-2: {role: worker}  #<\n"), ["host 'spark-2' has no address"]),
    ("duplicate-host-names", own(HEAD + "  spark-1: {address: 192.168.1.51}  #<\n"), ["duplicate key 'spark-1' (first at line 2)"]),
    ("duplicate-addresses", own(HEAD + "  spark-2: {address: 192.168.1.50}  #<\n"),
     ["spark-2 has the same address as spark-1 (192.168.1.50)"]),
    ("duplicate-ipv6-spelled-differently", own("  spark-1: {address: 'fd00::1', role: head}\n  spark-2: {address: 'fd00:0::1'}  #<\n"),
     ["spark-2 has the same address as spark-1"]),
    ("no-head", "name: lab\nhosts:  #<\n  spark-1: {address: 192.168.1.50}\n", ["no host is the head"]),
    ("two-heads", own(HEAD + "  spark-2: {address: 192.168.1.51, role: head}  #<\n"), ["two heads: spark-1 and spark-2"]),
    ("bad-role", own(HEAD + "  spark-2: {address: 192.168.1.51, role: master}  #<\n"), ["role must be 'head' or 'worker'", "'master'"]),
    ("role-not-a-string", own(HEAD + "  spark-2: {address: 192.168.1.51, role: [head]}  #<\n"), ["role must be 'head' or 'worker'"]),
    ("duplicate-fabric-ip", own("  spark-1: {address: 192.168.1.50, role: head, fabric_ip: 10.0.0.1}\n"
                                "  spark-2: {address: 192.168.1.51, fabric_ip: 10.0.0.1}  #<\n"),
     ["spark-2 has the same fabric_ip as spark-1 (10.0.0.1)"]),
    ("groups-not-a-mapping", own(HEAD, "groups: [rack1]  #<\n"), ["`groups` must be a mapping, not a list"]),
    ("group-not-a-mapping", own(HEAD, "groups:\n  rack1: [spark-1]  #<\n"), ["group 'rack1' must be a mapping with `hosts:`"]),
    ("group-unknown-host", own(HEAD + "  spark-2: {address: 192.168.1.51}\n", "groups:\n  rack1:\n    hosts:\n      - spark-1\n      - spark-3  #<\n"),
     ["group 'rack1' lists 'spark-3', which is not under `hosts:`", "did you mean"]),
    ("group-unknown-key", own(HEAD, "groups:\n  rack1:\n    host: [spark-1]  #<\n"), ["unknown key 'host' in group 'rack1'", "did you mean 'hosts'?"]),
    ("group-hosts-not-a-list", own(HEAD, "groups:\n  rack1:\n    hosts: spark-1  #<\n"), ["the hosts of group 'rack1' must be a list"]),
    ("group-named-like-a-host", own(HEAD, "groups:\n  spark-1: {hosts: [spark-1]}  #<\n"), ["'spark-1' is both a group and a host"]),
    ("group-named-all", own(HEAD, "groups:\n  all: {hosts: [spark-1]}  #<\n"), ["the group name 'all' is reserved"]),
    ("vars-not-a-mapping", own(HEAD, "vars: [user, spark]  #<\n"), ["`vars` must be a mapping, not a list"]),
    ("host-vars-not-a-mapping", own("  spark-1:\n    address: 192.168.1.50\n    role: head\n    vars: 5  #<\n"), ["`vars` must be a mapping, not 5"]),
    ("var-name-not-a-string", own(HEAD, "vars:\n  1: one  #<\n"), ["the var name 1 is not a string"]),
    ("per-host-key-in-shared-vars", own(HEAD, "vars:\n  address: 192.168.1.50  #<\n"), ["address cannot be shared by several hosts"]),
    ("host-setting-in-host-vars", own("  spark-1:\n    address: 192.168.1.50\n    role: head\n    vars: {port: 2222}  #<\n"),
     ["port is a host setting, not a var"]),
    ("duplicate-var", own(HEAD, "vars:\n  user: spark\n  user: admin  #<\n"), ["duplicate key 'user' (first at line 2)"]),
    ("bad-var-in-group-vars", own(HEAD, "groups:\n  rack1:\n    hosts: [spark-1]\n    vars: {port: 0}  #<\n"), ["port must be a port number"]),
    ("key-not-a-string", own(HEAD, "vars:\n  key: [a, b]  #<\n"), ["key must be a file path, not a list"]),
    ("become-not-a-bool", own(HEAD, "vars:\n  become: 'yes'  #<\n"), ["become must be true or false, not 'yes'"]),
    ("hcas-not-a-list", own("  spark-1: {address: 192.168.1.50, role: head, hcas: 5}  #<\n"), ["hcas must be a list of RDMA device names"]),
    ("hcas-bad-item", own("  spark-1:\n    address: 192.168.1.50\n    role: head\n    hcas:\n      - rocep1s0f1\n      - 'roce;reboot'  #<\n"),
     ["hcas: 'roce;reboot' is not an RDMA device name"]),
    ("hcas-bad-in-comma-list", own("  spark-1: {address: 192.168.1.50, role: head, hcas: 'rocep1s0f1, roce p2'}  #<\n"),
     ["hcas: 'roce p2' is not an RDMA device name"]),
    ("models-not-a-list", TWO_HOSTS + "models: Qwen/Qwen3-0.6B  #<\n", ["models must be a list of Hugging Face repo ids"]),
    ("models-bad-id", TWO_HOSTS + "models:\n  - Qwen/Qwen3-0.6B\n  - 'not a repo'  #<\n", ["models: 'not a repo' is not a Hugging Face repo id"]),
    ("models-three-parts", TWO_HOSTS + "models: [a/b/c]  #<\n", ["'a/b/c' is not a Hugging Face repo id"]),
    ("models-empty-revision", TWO_HOSTS + "models: ['Qwen/Qwen3-0.6B@']  #<\n", ["'Qwen/Qwen3-0.6B@' is not a Hugging Face repo id"]),
    ("models-not-strings", TWO_HOSTS + "models: [5]  #<\n", ["models: 5 is not a Hugging Face repo id"]),
    ("name-not-text", "name: [lab]  #<\n" + TWO_HOSTS, ["the inventory name must be one line of text"]),
    # Ansible's YAML inventory
    ("ansible-password", "all:\n  hosts:\n    spark-1:\n      ansible_password: hunter2  #<\n" + ANSIBLE_HEAD,
     ["ansible_password: sparkcluster takes no passwords from the inventory"]),
    ("ansible-ssh-pass-in-all-vars", "all:\n  vars:\n    ansible_ssh_pass: hunter2  #<\n  hosts: {spark-1: }\n" + ANSIBLE_HEAD,
     ["ansible_ssh_pass: sparkcluster takes no passwords"]),
    ("ansible-become-password-in-group", "all:\n  hosts: {spark-1: }\n  children:\n    head:\n      hosts: {spark-1: }\n"
     "      vars: {ansible_become_password: x}  #<\n", ["ansible_become_password: sparkcluster takes no passwords"]),
    ("ansible-no-head", "all:  #<\n  hosts:\n    spark-1:\n    spark-2:\n", ["no host is the head", "sparkcluster_role: head"]),
    ("ansible-no-hosts", "all:  #<\n  vars: {ansible_user: spark}\n", ["the inventory lists no hosts"]),
    ("ansible-two-heads", "all:\n  hosts:\n    spark-1: {sparkcluster_role: head}\n    spark-2: {sparkcluster_role: head}  #<\n",
     ["two heads: spark-1 and spark-2"]),
    ("ansible-unknown-group-key", "all:\n  host:  #<\n    spark-1:\n", ["unknown key 'host' in group 'all'", "did you mean 'hosts'?"]),
    ("ansible-hosts-a-list", "all:\n  hosts:  #<\n    - spark-1\n", ["`hosts` must be a mapping, not a list"]),
    ("ansible-host-vars-scalar", "all:\n  hosts:\n    spark-1: 192.168.1.50  #<\n", ["the vars of host 'spark-1' must be a mapping"]),
    ("ansible-bad-port", "all:\n  hosts:\n    spark-1: {ansible_port: '22a'}  #<\n" + ANSIBLE_HEAD,
     ["ansible_port must be a port number from 1 to 65535, not '22a'"]),
    ("ansible-bad-address", "all:\n  hosts:\n    spark-1: {ansible_host: 'x; reboot'}  #<\n" + ANSIBLE_HEAD,
     ["ansible_host 'x; reboot' is not an IP address or host name"]),
    ("ansible-bad-role", "all:\n  hosts:\n    spark-1: {sparkcluster_role: boss}  #<\n", ["sparkcluster_role must be 'head' or 'worker'"]),
    ("ansible-group-cycle", "all:\n  children:\n    a:  #<\n      children:\n        b:\n          children:\n            a:\n",
     ["groups contain each other: a > b > a"]),
    ("ansible-group-named-like-a-host", "all:\n  hosts: {spark-1: }\n  children:\n    spark-1: {}  #<\n",
     ["'spark-1' is both a group and a host"]),
    ("ansible-range-too-large", "all:\n  hosts:\n    spark-[1:5000]:  #<\n", ["expands to no host or more than 1000"]),
    ("ansible-range-empty", "all:\n  hosts:\n    spark-[4:1]:  #<\n", ["expands to no host"]),
    ("ansible-alpha-range", "all:\n  hosts:\n    spark-[a:c]:  #<\n", ["'spark-[a:c]' is not a valid host name"]),
]

BAD_ADDRESSES = ["spark 2", "a;b", "$(reboot)", "`id`", "-oProxyCommand=sh", "192.168.1.300", "a/b", ""]
BAD_PORTS = ["abc", "'22a'", "true", "0", "65536", "22.5", "-1", "[22]", "''"]
BAD_USERS = ["Spark", "'root;id'", "'-x'", "'a b'", "a" * 33, "5", "''"]
BAD_INTERFACES = ["enp1s0f1np1/x", "'en p1'", "'a:b'", "'x;rm'", "'$(id)'", "abcdefghijklmnop", "'-enp1'", "'..'", "5"]
BAD_FABRIC_IPS = ["10.0.0.300", "'fe80::1'", "127.0.0.1", "0.0.0.0", "224.0.0.1", "5", "spark-1", "'10.0.0.1/24'"]

ERRORS += [(f"bad-address-{v!r}", own(HEAD + f"  spark-2: {{address: '{v}'}}  #<\n"), ["address", "is not an IP address or host name"])
           for v in BAD_ADDRESSES]
ERRORS += [(f"bad-port-{v}", own(HEAD + f"  spark-2: {{address: 192.168.1.51, port: {v}}}  #<\n"), ["port must be a port number from 1 to 65535"])
           for v in BAD_PORTS]
ERRORS += [(f"bad-user-{v[:8]}", own(HEAD, f"vars:\n  user: {v}  #<\n"), ["user", "is not a valid user name"]) for v in BAD_USERS]
ERRORS += [(f"bad-interface-{v}", own(HEAD + f"  spark-2: {{address: 192.168.1.51, qsfp_interface: {v}}}  #<\n"),
            ["qsfp_interface", "is not a network interface name"]) for v in BAD_INTERFACES]
ERRORS += [(f"bad-fabric-ip-{v}", own(HEAD + f"  spark-2: {{address: 192.168.1.51, fabric_ip: {v}}}  #<\n"),
            ["fabric_ip", "is not a usable IPv4 address"]) for v in BAD_FABRIC_IPS]


@pytest.mark.parametrize("text, needles", [pytest.param(t, n, id=i) for i, t, n in ERRORS])
def test_invalid_inventory_names_file_line_problem_and_fix(tmp_path, text, needles):
    path = write(tmp_path, text)
    e = error(path, check_files=False)
    assert e.message.startswith(f"{path}:{marked_line(text)}: "), e.message
    for needle in needles:
        assert needle in str(e)  # the message, then the fix
    assert e.fix
    assert e.exit_code == EXIT_USAGE and isinstance(e, UsageError)


def test_the_message_uses_the_path_as_the_user_gave_it(tmp_path, monkeypatch):
    write(tmp_path, own(HEAD, "bogus: 1\n"))
    monkeypatch.chdir(tmp_path)
    assert str(error(Path("inv.yml"))).startswith("inv.yml:1: unknown key 'bogus'")


def test_missing_file_and_directory(tmp_path):
    missing = error(tmp_path / "nope.yml")
    assert missing.message == f"{tmp_path / 'nope.yml'}: no such file" and missing.fix
    directory = error(tmp_path)
    assert directory.message == f"{tmp_path}: is a directory, not an inventory file"
    assert "inventory.yml" in directory.fix


@pytest.mark.parametrize("data, line", [(b"hosts:\n  spark-1: {address: \xff\xfe}\n", 2), (b"\x00\x01", 1),
                                        ("name: a\x07b\n".encode(), 1)])
def test_binary_content_is_an_inventory_error_at_its_line(tmp_path, data, line):
    path = write(tmp_path, data)
    assert error(path).message.startswith(f"{path}:{line}: ")


@pytest.mark.parametrize("setting, fix_word", [("key", "ssh-keygen"), ("known_hosts", "ssh-keyscan")])
def test_missing_key_files_are_reported_with_their_resolved_path(tmp_path, setting, fix_word):
    text = own(HEAD, f"vars:\n  {setting}: keys/../keys/{setting}_file  #<\n")
    path = write(tmp_path, text)
    e = error(path)
    assert e.message == f"{path}:2: {setting}: {tmp_path / 'keys' / f'{setting}_file'} does not exist"
    assert fix_word in e.fix
    assert getattr(load_inventory(path, check_files=False).head, setting) == str(tmp_path / "keys" / f"{setting}_file")


def test_key_paths_resolve_tilde_and_the_inventory_directory(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("k")
    (tmp_path / "inv" / "keys").mkdir(parents=True)
    (tmp_path / "inv" / "keys" / "known_hosts").write_text("h")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(home)  # a relative path must start at the inventory's directory, not the working directory
    text = own(HEAD + "  spark-2: {address: 192.168.1.51, key: ../home/.ssh/id_ed25519}\n",
               "vars:\n  key: ~/.ssh/id_ed25519\n  known_hosts: keys/known_hosts\n")
    inv = load_inventory(write(tmp_path / "inv", text))
    assert inv.head.key == str(home / ".ssh" / "id_ed25519")
    assert inv.workers[0].key == str(home / ".ssh" / "id_ed25519")
    assert inv.head.known_hosts == str(tmp_path / "inv" / "keys" / "known_hosts")


def test_vars_layer_all_then_groups_in_order_then_host(tmp_path):
    text = """\
vars: {user: alice, port: 2200, become: false, note: all, min_driver: "590.44"}
groups:
  rack1:
    hosts: [spark-1, spark-2]
    vars: {user: bob, port: 2201, note: rack1, qsfp_interface: enp1s0f1np1}
  rack2:
    hosts: [spark-2]
    vars: {port: 2202, note: rack2, hcas: [rocep1s0f1]}
hosts:
  spark-1: {address: 192.168.1.50, role: head, user: carol, vars: {note: host}}
  spark-2: {address: 192.168.1.51}
  spark-3: {address: 192.168.1.52, port: 2203, become: true}
"""
    inv = load(tmp_path, text)
    s1, s2, s3 = inv.hosts
    assert (s1.user, s1.port, s1.become, s1.vars, s1.groups) == ("carol", 2201, False, {"note": "host", "min_driver": "590.44"}, ("rack1",))
    assert (s2.user, s2.port, s2.vars["note"], s2.groups) == ("bob", 2202, "rack2", ("rack1", "rack2"))
    assert (s2.qsfp_interface, s2.hcas) == ("enp1s0f1np1", ("rocep1s0f1",))
    assert (s3.user, s3.port, s3.become, s3.vars["note"], s3.groups, s3.qsfp_interface) == ("alice", 2203, True, "all", (), None)
    assert inv.vars == {"note": "all", "min_driver": "590.44"}  # the connection keys are Host fields, not vars


def test_all_host_settings_load(tmp_path):
    text = own("  spark-1:\n    address: 'fe80::1%enP7s7'\n    role: head\n    user: spark\n    port: '2222'\n    become: false\n"
               "    qsfp_interface: enp1s0f1np1\n    fabric_ip: 192.168.177.11\n    hcas: rocep1s0f1, roceP2p1s0f1\n"
               "  spark-2: {address: spark-2.lan}\n")
    head, worker = load(tmp_path, text).hosts
    assert head == Host(name="spark-1", address="fe80::1%enP7s7", role="head", user="spark", port=2222, become=False,
                        qsfp_interface="enp1s0f1np1", fabric_ip="192.168.177.11", hcas=("rocep1s0f1", "roceP2p1s0f1"))
    assert (worker.address, worker.role, worker.user, worker.port, worker.key, worker.become) == ("spark-2.lan", "worker", None, 22, None, True)
    assert len({head, worker}) == 2  # hosts stay hashable although they hold a vars mapping


def test_same_address_on_another_port_is_another_host(tmp_path):
    inv = load(tmp_path, own(HEAD + "  spark-2: {address: 192.168.1.50, port: 2222}\n"))
    assert [(h.address, h.port) for h in inv.hosts] == [("192.168.1.50", 22), ("192.168.1.50", 2222)]


def test_shell_metacharacters_in_values_stay_literal_strings(tmp_path):
    note = "$(rm -rf /); echo pwned `id` && reboot | tee /etc/passwd > x"
    inv = load(tmp_path, own(HEAD, f"vars:\n  note: {yaml.safe_dump(note).splitlines()[0]}\n"))
    assert inv.head.vars["note"] == note == inv.vars["note"]


def test_yaml_anchors_and_merge_keys_work(tmp_path):
    text = own("  spark-1: &base {address: 192.168.1.50, role: head, port: 2222}\n  spark-2:\n    <<: *base\n"
               "    address: 192.168.1.51\n    role: worker\n")
    head, worker = load(tmp_path, text).hosts
    assert (worker.address, worker.role, worker.port) == ("192.168.1.51", "worker", 2222)
    assert head.role == "head"


def test_inventory_name_defaults_to_the_file_stem(tmp_path):
    assert load_inventory(write(tmp_path, TWO_HOSTS, "lab-rack.yml")).name == "lab-rack"
    assert load(tmp_path, "name: bench\n" + TWO_HOSTS).name == "bench"


@pytest.mark.parametrize("name", ["two-sparks.yml", "four-sparks-switch.yml", "ansible-two-sparks.yml"])
def test_example_inventories_load(name):
    inv = load_inventory(ROOT / "inventories" / name, check_files=False)
    assert inv.head.role == "head" and inv.workers and all(h.user == "spark" for h in inv.hosts)
    assert all(h.key == os.path.expanduser("~/.ssh/id_ed25519") for h in inv.hosts)
    assert inv.head.vars["min_driver"] == "590.44"
    assert len({h.address for h in inv.hosts}) == len(inv.hosts)


def test_ansible_example_matches_the_own_format_example():
    own_format = load_inventory(ROOT / "inventories" / "two-sparks.yml", check_files=False)
    ansible = load_inventory(ROOT / "inventories" / "ansible-two-sparks.yml", check_files=False)
    assert ansible.format == "ansible" and own_format.format == "sparkcluster"
    fields = lambda h: (h.name, h.address, h.role, h.user, h.port, h.key, h.become, dict(h.vars))  # noqa: E731
    assert [fields(h) for h in ansible.hosts] == [fields(h) for h in own_format.hosts]
    assert ansible.models == own_format.models == ("Qwen/Qwen3-0.6B",)


def test_the_simulators_inventory_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCLUSTER_SIM_ROOT", str(tmp_path))
    state = ClusterState(name="lab", count=3, k=120, drivers=["590.48.01"], port0_hosts=[], docker=False,
                         lan_rate="500mbit", user="spark", uid=1500, ssh_mesh=True)
    cluster = SimCluster(state)
    state.dir.mkdir()
    cluster.client_key.write_text("key")
    cluster.known_hosts.write_text("hosts")
    cluster.write_inventory()
    inv = load_inventory(cluster.inventory_path)
    assert (inv.name, inv.format, inv.head.name) == ("lab", "sparkcluster", "spark-1")
    assert [h.address for h in inv.hosts] == [h.mgmt_ip for h in cluster.topology.hosts]
    assert all((h.user, h.key, h.known_hosts) == ("spark", str(cluster.client_key), str(cluster.known_hosts)) for h in inv.hosts)


def test_ansible_groups_nest_and_hosts_merge_like_ansible(tmp_path):
    text = """\
all:
  vars: {ansible_user: spark, ansible_become: false, x: all, sparkcluster_name: lab}
  hosts:
    spark-[01:03]:
  children:
    rack:
      vars: {x: rack, ansible_port: 2222, qsfp_interface: enp1s0f1np1}
      hosts:
        spark-02: {x: host}
      children:
        heads:
          vars: {x: heads, ansible_ssh_private_key_file: /k}
          hosts:
            spark-01:
              ansible_host: 192.168.1.50
              ansible_python_interpreter: /usr/bin/python3
    a_sibling_sorted_first:
      vars: {x: sibling}
      hosts: {spark-03: {ansible_user: root}, spark-02: {}}
"""
    inv = load(tmp_path, text, check_files=False)
    assert (inv.name, inv.format, [h.name for h in inv.hosts]) == ("lab", "ansible", ["spark-01", "spark-02", "spark-03"])
    s1, s2, s3 = inv.hosts
    assert (s1.role, s1.address, s1.user, s1.port, s1.key, s1.become, s1.groups) == (
        "head", "192.168.1.50", "spark", 2222, "/k", False, ("rack", "heads"))
    assert s1.vars == {"x": "heads", "ansible_python_interpreter": "/usr/bin/python3"}  # child group beats parent
    # Two groups of one depth apply in name order; the host's own vars win over both.
    assert (s2.role, s2.address, s2.port, s2.qsfp_interface, s2.vars["x"], s2.groups) == (
        "worker", "spark-02", 2222, "enp1s0f1np1", "host", ("a_sibling_sorted_first", "rack"))
    assert (s3.user, s3.port, s3.vars["x"]) == ("root", 22, "sibling")
    assert inv.vars == {"x": "all"}


def test_ansible_top_level_groups_without_all_and_role_var(tmp_path):
    text = ("workers:\n  hosts:\n    spark-b: {ansible_host: 192.168.1.51, hcas: [rocep1s0f1]}\n"
            "control:\n  hosts:\n    spark-a: {ansible_host: 192.168.1.50, sparkcluster_role: head, fabric_ip: 192.168.177.11}\n")
    inv = load(tmp_path, text)
    assert inv.format == "ansible"
    assert (inv.head.name, inv.head.fabric_ip, inv.workers[0].hcas) == ("spark-a", "192.168.177.11", ("rocep1s0f1",))


def test_sparkcluster_role_overrides_the_head_group(tmp_path):
    text = "all:\n  hosts:\n    a: {sparkcluster_role: worker}\n    b: {sparkcluster_role: head}\n  children:\n    head: {hosts: {a: }}\n"
    assert load(tmp_path, text).head.name == "b"


# ---- limit -----------------------------------------------------------------------------------------------
FOUR = """\
groups:
  rack1: {hosts: [spark-1, spark-2]}
  rack2: {hosts: [spark-3, spark-4]}
hosts:
  spark-1: {address: 10.0.0.1, role: head}
  spark-2: {address: 10.0.0.2}
  spark-3: {address: 10.0.0.3}
  spark-4: {address: 10.0.0.4}
"""


def test_limit_by_host_and_group_keeps_file_order(tmp_path):
    inv = load(tmp_path, FOUR)
    assert [h.name for h in inv.limit(["spark-3", "spark-1"]).hosts] == ["spark-1", "spark-3"]
    assert [h.name for h in inv.limit(["rack2", "spark-1"]).hosts] == ["spark-1", "spark-3", "spark-4"]
    assert [h.name for h in inv.limit(["rack1"]).workers] == ["spark-2"]
    assert inv.limit(["all"]).hosts == inv.hosts


def test_limit_keeps_the_hosts_it_leaves_out_for_what_reaches_them_over_http(tmp_path):
    # Behind the router, `status`, `top` and bench's receipt sum every replica's /metrics: one on a host --limit
    # left out was dropped from the sum before, which still read as the endpoint's.
    inv = load(tmp_path, FOUR)
    narrowed = inv.limit(["spark-1", "spark-3"]).limit(["spark-1"])
    assert [h.name for h in narrowed.hosts] == ["spark-1"]
    assert [h.name for h in narrowed.unselected] == ["spark-2", "spark-4", "spark-3"]
    assert {h.name for h in narrowed.every_host} == {h.name for h in inv.hosts} and inv.unselected == ()


def test_limit_rejects_unknown_names_and_a_selection_without_the_head(tmp_path):
    inv = load(tmp_path, FOUR)
    with pytest.raises(InventoryError, match=r"no host or group named 'rakc1' \(did you mean 'rack1'\?\)"):
        inv.limit(["spark-1", "rakc1"])
    with pytest.raises(InventoryError, match="leaves out the head spark-1") as raised:
        inv.limit(["rack2"])
    assert "spark-1, rack2" in raised.value.fix


# ---- which inventory -------------------------------------------------------------------------------------
@pytest.fixture
def places(tmp_path):
    """A working directory with ./inventory.yml, a config dir with a recorded inventory, and two more files."""
    cwd, config = tmp_path / "cwd", tmp_path / "config"
    cwd.mkdir()
    for name in ("explicit.yml", "from-env.yml", "recorded.yml", "cwd/inventory.yml"):
        (tmp_path / name).write_text(TWO_HOSTS)
    record_last_used(tmp_path / "recorded.yml", config_dir=config)
    return tmp_path, cwd, config


def test_find_inventory_order(places):
    root, cwd, config = places
    env = {"SPARKCLUSTER_INVENTORY": str(root / "from-env.yml")}
    assert find_inventory(str(root / "explicit.yml"), env=env, cwd=cwd, config_dir=config) == (root / "explicit.yml", "from -i")
    assert find_inventory(None, env=env, cwd=cwd, config_dir=config) == (root / "from-env.yml", "from $SPARKCLUSTER_INVENTORY")
    assert find_inventory(None, env={}, cwd=cwd, config_dir=config) == (cwd / "inventory.yml", "./inventory.yml")
    (cwd / "inventory.yml").unlink()
    path, reason = find_inventory(None, env={}, cwd=cwd, config_dir=config)
    assert path == root / "recorded.yml"
    assert reason == f"last used (recorded in {config / 'last-inventory'})"


def test_find_inventory_relative_paths_and_home_shortening(places):
    root, cwd, config = places
    assert find_inventory("../explicit.yml", env={}, cwd=cwd) == (cwd / "../explicit.yml", "from -i")
    (cwd / "inventory.yml").unlink()
    _, reason = find_inventory(None, env={"HOME": str(root)}, cwd=cwd, config_dir=config)
    assert reason == "last used (recorded in ~/config/last-inventory)"


def test_find_inventory_uses_xdg_config_home(places):
    root, cwd, config = places
    (cwd / "inventory.yml").unlink()
    record_last_used(root / "explicit.yml", config_dir=root / "xdg" / "sparkcluster")
    env = {"XDG_CONFIG_HOME": str(root / "xdg"), "HOME": str(root / "elsewhere")}
    assert find_inventory(None, env=env, cwd=cwd)[0] == root / "explicit.yml"
    env = {"XDG_CONFIG_HOME": "relative/ignored", "HOME": str(root / "elsewhere")}
    with pytest.raises(InventoryError):
        find_inventory(None, env=env, cwd=cwd)


def test_find_inventory_explains_every_option_when_there_is_none(places):
    root, cwd, config = places
    (cwd / "inventory.yml").unlink()
    (root / "recorded.yml").unlink()
    with pytest.raises(InventoryError) as raised:
        find_inventory(None, env={}, cwd=cwd, config_dir=config)
    e = raised.value
    for option in ("-i", "$SPARKCLUSTER_INVENTORY", "./inventory.yml", f"{root / 'recorded.yml'}, no longer exists"):
        assert option in e.message
    assert "-i FILE" in e.fix and "SPARKCLUSTER_INVENTORY=FILE" in e.fix and e.exit_code == EXIT_USAGE


@pytest.mark.parametrize("explicit, env, reason", [("missing.yml", {}, "from -i"),
                                                   (None, {"SPARKCLUSTER_INVENTORY": "missing.yml"}, "from $SPARKCLUSTER_INVENTORY")])
def test_find_inventory_names_where_a_missing_path_came_from(places, explicit, env, reason):
    _, cwd, config = places
    with pytest.raises(InventoryError, match=rf"missing.yml \({reason.replace('$', '[$]')}\): no such file"):
        find_inventory(explicit, env=env, cwd=cwd, config_dir=config)


def test_record_last_used_writes_an_absolute_path_atomically(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    record_last_used(Path("sub/../inv.yml"))
    record_last_used(Path("inv.yml"))  # replaces the first record
    config = tmp_path / "xdg" / "sparkcluster"
    assert (config / "last-inventory").read_text() == f"{tmp_path / 'inv.yml'}\n"
    assert os.listdir(config) == ["last-inventory"]  # no temp file left behind


# ---- never a traceback -----------------------------------------------------------------------------------
WORDS = st.sampled_from(["name", "vars", "groups", "hosts", "models", "all", "children", "address", "role", "head", "heads",
                         "worker", "user", "port", "key", "known_hosts", "become", "hcas", "fabric_ip", "qsfp_interface",
                         "ansible_host", "ansible_port", "ansible_user", "ansible_password", "sparkcluster_role",
                         "sparkcluster_models", "spark-1", "spark-2", "192.168.1.50", "~/.ssh/id", "spark-[1:3]"])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12) | WORDS
STRUCTURES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(WORDS | st.text(max_size=8) | st.integers(), inner, max_size=5), max_leaves=30)
# Inventory-shaped documents of both formats, so that the fuzzing reaches host, group and cross-host checks.
VALUES = SCALARS | st.lists(SCALARS, max_size=3) | st.sampled_from(["head", "worker", "192.168.1.51", "10.0.0.1", "enp1s0f1np1"])
SETTINGS = st.dictionaries(WORDS, VALUES, max_size=4)
NAMES = st.sampled_from(["spark-1", "spark-2", "spark-[1:2]", "head", "rack", "all"]) | st.text(max_size=4)
HOSTS = st.dictionaries(NAMES, SETTINGS | st.none(), max_size=3)
OWN_DOCS = st.fixed_dictionaries({"hosts": HOSTS}, optional={
    "vars": SETTINGS, "models": st.lists(SCALARS, max_size=2), "name": SCALARS,
    "groups": st.dictionaries(NAMES, st.fixed_dictionaries({}, optional={"hosts": st.lists(NAMES, max_size=3), "vars": SETTINGS}))})
ANSIBLE_GROUPS = st.recursive(st.fixed_dictionaries({}, optional={"hosts": HOSTS, "vars": SETTINGS}), lambda inner: st.fixed_dictionaries(
    {}, optional={"hosts": HOSTS, "vars": SETTINGS, "children": st.dictionaries(NAMES, inner | st.none(), max_size=3)}), max_leaves=6)
SHAPED = OWN_DOCS | st.dictionaries(NAMES, ANSIBLE_GROUPS, min_size=1, max_size=3)
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def loads_or_explains(path: Path, check_files: bool = True) -> None:
    try:
        inv = load_inventory(path, check_files=check_files)
    except InventoryError as e:
        assert e.message.startswith(str(path)) and e.fix
    else:
        assert inv.head in inv.hosts and inv.hosts


@FUZZ
@given(doc=STRUCTURES)
def test_random_yaml_structures_load_or_explain(tmp_path, doc):
    loads_or_explains(write(tmp_path, yaml.safe_dump(doc, sort_keys=False)))


@FUZZ
@given(doc=SHAPED, check_files=st.booleans())
def test_random_inventory_shaped_documents_load_or_explain(tmp_path, doc, check_files):
    loads_or_explains(write(tmp_path, yaml.safe_dump(doc, sort_keys=False)), check_files)


@FUZZ
@given(data=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_random_bytes_and_text_load_or_explain(tmp_path, data):
    loads_or_explains(write(tmp_path, data))


VALID = (ROOT / "inventories" / "two-sparks.yml").read_text() + "groups:\n  g: {hosts: [spark-a], vars: {port: 22}}\n"


@FUZZ
@given(at=st.integers(0, len(VALID)), cut=st.integers(0, 8), insert=st.text(string.printable + "ä\t", max_size=8))
def test_edited_valid_inventories_load_or_explain(tmp_path, at, cut, insert):
    loads_or_explains(write(tmp_path, VALID[:at] + insert + VALID[at + cut:]), check_files=False)
