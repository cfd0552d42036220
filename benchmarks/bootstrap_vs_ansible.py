"""`sparkcluster bootstrap` against ansible-playbook doing bootstrap's core work, on the same kind of fresh simulated
Sparks, 2 and 8 nodes, cold (fresh nodes: the first run changes them) and warm (the second run: nothing to do),
in interleaved rounds of one run (each round brings up fresh clusters, one per tool, and alternates which tool goes
first), so both see the same machine load.

The Ansible side (benchmarks/ansible/bootstrap.yml, written here) does what bootstrap does, task for task: facts;
the GPU, driver, QSFP (ibdev2netdev, addresses), disk checks; every node pinging every other over the fabric; rsync
present, the HF cache folder, the comm env file; the ssh mesh (a key per node, every key authorized on every node,
every node's host key recorded for the others' fabric addresses). It gets Ansible's fastest settings: pipelining,
ControlPersist, forks = nodes, the free strategy. Both leave Docker out (`--runtime host`, hosts without Docker).

ansible-core lives in a benchmark-only environment, .venv-ansible (made on the first run with pip; nothing of the
project depends on it). Run as root:  .venv/bin/python benchmarks/bootstrap_vs_ansible.py [--rounds 2]
Prints each timing, the medians, and the ratios: Ansible / sparkcluster at 2 and 8 nodes, cold and warm, and each
tool's 8 nodes / 2 nodes. Every simulated host shares this machine's cores with both tools: see the closing note.

Closing note, measured here (2 cores shared with the other engineers' test suites, so the load differs between
runs; one round each unless said):
  before this session's changes (56f1fd9), run 2 of the last note: 2 nodes 4.04 s cold, 3.20 s warm (3.8x, 3.6x);
  8 nodes 6.02 s, 5.19 s (14.8x, 18.1x); 8/2 1.49x, 1.62x. Discovery then listened 1 s per twin; a later fix made it
  3 s, which a warm 2-node run paid whole.
  Before against after, interleaved on fresh clusters in one run (2 rounds, medians; sparkcluster only):
    2 nodes: before 5.77 s cold, 5.32 s warm; after 2.55 s, 1.82 s (2.3x, 2.9x faster).
    8 nodes: before 9.52 s cold, 7.47 s warm; after 7.12 s, 4.59 s (1.3x, 1.6x faster).
  After (this file, one round, bytecode cached as an installed wheel has it):
    2 nodes: sparkcluster 2.29 s cold, 1.81 s warm; ansible-playbook 12.12 s, 12.62 s: 5.3x, 7.0x.
    8 nodes: sparkcluster 6.59 s cold, 4.18 s warm; ansible-playbook 90.48 s, 89.67 s: 13.7x, 21.4x.
    8 nodes / 2 nodes: sparkcluster 2.88x cold, 2.31x warm; ansible-playbook 7.47x, 7.11x.
  An earlier run of the same code without cached bytecode: 2 nodes 2.45 s, 1.96 s against 18.50 s, 13.78 s (7.5x,
  7.0x); 8 nodes 6.34 s, 4.23 s against 90.92 s, 101.48 s (14.3x, 24.0x).
Then taken back: the early end of discovery (a loaded CI run read a re-bootstrapped pair as mixed direct and
switched). With discovery listening its full 3 s again, one round: 2 nodes sparkcluster 4.75 s cold, 4.25 s warm;
ansible-playbook 9.36 s, 9.39 s: 2.0x, 2.2x. Discovery's 3 s is now most of a warm pair's time.
What changed: a re-run's discovery stopped once every addressed neighbour answered (3 s -> 0.07 s; reverted); a play's read-only
checks go to each node as one exec (Step.reads, engine/batch.py); the ssh mesh's login proof rides in the head's
read; the facts probe runs about 40 fewer processes per node. A warm 2-node run is now one exec per node per play
(two in the cabling play: facts, then discovery, which needs every node's facts), about 1.2 s of plays, and the
process's start: about 0.4 s of CPU for imports (paramiko and Fabric 0.2 s of it, now loaded at the first
connection, not before parsing).
Then (the session after): discovery ends when its evidence is in (a twin without IPv6 link-local sends no
multicast: the benchmark's addressed twins have none, so discovery is one unicast round trip), the cold mesh is two
execs per node, argument templates compile once. One round, sizes 2,8, on a machine loaded by the other engineers'
test suites (each sparkcluster run also prints where its time went):
    2 nodes: sparkcluster 3.70 s cold, 2.76 s warm; ansible-playbook 20.04 s, 16.39 s: 5.4x, 5.9x.
    8 nodes: sparkcluster 7.51 s cold, 5.32 s warm; ansible-playbook 89.62 s, 83.72 s: 11.9x, 15.7x.
    8 nodes / 2 nodes: sparkcluster 2.03x cold, 1.93x warm; ansible-playbook 4.47x, 5.11x.
  Warm 2 nodes, where 2.76 s went: fabric cabling (discovery) 0.09, provision 0.06, ssh mesh 0.51, the other plays'
  steps 0.05; facts (three plays gather them) and the plays' batched reads 1.20; the process's start (imports,
  about 0.5 s of CPU) and exit 0.85. Warm 8 nodes: ssh mesh 2.36 (the head's seven logins and every node's
  ssh-keygen -F per address, all on the same 2 cores), facts and batched reads 1.75, cabling 0.33.
  A second round minutes later, on the code as committed (the probe through a pipe), the machine less loaded:
    2 nodes: sparkcluster 2.82 s cold, 1.73 s warm; ansible-playbook 16.99 s, 21.03 s: 6.0x, 12.2x.
    8 nodes: sparkcluster 7.83 s cold, 5.94 s warm; ansible-playbook 74.40 s, 73.27 s: 9.5x, 12.3x.
    Warm 2 nodes: cabling 0.07, ssh mesh 0.32, provision 0.05, other steps 0.04; facts and batched reads 0.79;
    process start and exit 0.47. Cold 8 nodes: ssh mesh 3.93 (the check reads, the set-up, the check again with
    the logins: every node runs ssh-keygen -F once per other node's address, 14 processes a node, twice).
Then (the step catalogue lazy, the ssh mesh reading known_hosts once and forgetting only entries on record), one round,
sizes 2,8, under the integration-test lock (no other engineer's test running; their edits and builds still were):
    2 nodes: sparkcluster 1.72 s cold, 1.23 s warm; ansible-playbook 10.58 s, 11.90 s: 6.1x, 9.6x.
    8 nodes: sparkcluster 3.91 s cold, 3.69 s warm; ansible-playbook 83.48 s, 85.64 s: 21.4x, 23.2x.
    8 nodes / 2 nodes: sparkcluster 2.27x cold, 2.99x warm; ansible-playbook 7.89x, 7.20x.
  Cold 2 nodes, where 1.72 s went: ssh mesh 0.46 (its reads, the keys, one write a node, the reads again with the
  head's real login), provision 0.20 (hfcache.dir's mkdir, comm.env through SFTP), facts and batched reads 0.53,
  process start and exit 0.43. Warm: ssh mesh 0.25 (the login), facts and reads 0.52, start and exit 0.31.
  Where 8 nodes' time goes (a separate run of the same bootstrap, our process's CPU from its rusage, the machine's
  from /proc/stat; "the rest" is the nodes' sshd, shells and emulated tools, plus any other load):
    2 nodes cold: wall 2.25 s; our process 1.09 CPU s (0.55 a host); the rest 1.01 s (0.50 a host); 0.93 of 2 cores.
    8 nodes cold: wall 3.76 s; our process 1.55 CPU s (0.19 a host); the rest 4.65 s (0.58 a host); 1.65 of 2 cores.
    8 nodes warm: wall 3.86 s; our process 1.62 CPU s (0.20 a host); the rest 4.87 s (0.61 a host); 1.68 of 2 cores.
  So at 8 nodes the machine is nearly saturated: 6.2-6.5 CPU seconds on 2 cores cannot take under 3.1-3.3 s, and
  4.7-4.9 of them are the nodes' own work (about 0.6 s a node at either size), which real Sparks each do on their
  own CPUs in parallel. Our process's share grows 1.4-1.7x for 4x the hosts. The 8/2 wall ratio here measures this
  machine's two cores more than the tool; per host, our CPU falls from 0.5 s to 0.2 s.
Goals not reached, and why: 10x at 2 nodes needs the whole run near 1.2 s against Ansible's 12-18 s here; what is
left is the process start and about ten round trips per node, each 50 ms or more on this machine. 8 nodes take 2.3-2.9x
of 2 (the goal is 1.3x): every simulated node's sshd, shells and emulated tools (nvidia-smi is a Python script) run
on the same 2 cores as the CLI, so 8 nodes' node-side work is 4x 2 nodes' on a machine that cannot run it in
parallel; on real Sparks each node does its own. The cold 8-node run also sets up 56 mesh links, each an exec.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkcluster.sim import SimCluster, UpOptions  # noqa: E402

ANSIBLE_VENV = ROOT / ".venv-ansible"
ANSIBLE_VERSION = "2.19"  # ansible-core, the release line installed into .venv-ansible

PLAYBOOK = """\
- name: preflight and facts
  hosts: all
  gather_facts: true
  strategy: free
  tasks:
    - {name: gpu, command: "nvidia-smi --query-gpu=name,driver_version --format=csv,noheader", register: gpu, changed_when: false}
    - {name: a GB10 with driver >= 590.44, assert: {that: ["'GB10' in gpu.stdout", "gpu.stdout.split(', ')[1] is version('590.44', '>=')"]}}
    - {name: rdma devices, command: ibdev2netdev, register: rdma, changed_when: false}
    - {name: a cabled QSFP twin up, assert: {that: ["'(Up)' in rdma.stdout"]}}
    - {name: disk, command: "df -Pk {{ ansible_env.HOME }}", register: disk, changed_when: false}
    - {name: 50 GB free, assert: {that: ["(disk.stdout_lines[1].split()[3] | int) > 50 * 1024 * 1024"]}}
    - name: the fabric address of the cabled twin
      set_fact:
        fabric_ip: "{{ ansible_facts[rdma.stdout_lines | select('search', 'Up') | first | regex_replace('^.*==> (\\\\S+) .*$', '\\\\1') | replace('-', '_')].ipv4.address }}"
        qsfp: "{{ rdma.stdout_lines | select('search', 'Up') | first | regex_replace('^.*==> (\\\\S+) .*$', '\\\\1') }}"

- name: fabric reachability
  hosts: all
  gather_facts: false
  strategy: free
  tasks:
    - name: every other node answers over the fabric
      command: "ping -c 1 -w 5 -I {{ qsfp }} {{ hostvars[item].fabric_ip }}"
      loop: "{{ groups['all'] | difference([inventory_hostname]) }}"
      changed_when: false

- name: provision
  hosts: all
  gather_facts: false
  strategy: free
  tasks:
    - {name: rsync present, command: "dpkg-query -W rsync", changed_when: false}
    - {name: the HF cache folder, file: {path: "{{ ansible_env.HOME }}/.cache/huggingface", state: directory, mode: "0755"}}
    - {name: the comm env folder, file: {path: "{{ ansible_env.HOME }}/.config/sparkcluster", state: directory, mode: "0755"}}
    - name: the comm env
      copy:
        dest: "{{ ansible_env.HOME }}/.config/sparkcluster/comm.env"
        mode: "0644"
        content: |
          NCCL_SOCKET_IFNAME={{ qsfp }}
          GLOO_SOCKET_IFNAME={{ qsfp }}
          UCX_NET_DEVICES={{ qsfp }}
          NCCL_IB_HCA={{ rdma.stdout_lines | map('regex_replace', ' .*$', '') | join(',') }}
          VLLM_HOST_IP={{ fabric_ip }}
          NCCL_IB_DISABLE=0

- name: ssh mesh
  hosts: all
  gather_facts: false
  strategy: linear
  tasks:
    - {name: a key, command: "ssh-keygen -q -t ed25519 -N '' -f {{ ansible_env.HOME }}/.ssh/id_ed25519", args: {creates: "{{ ansible_env.HOME }}/.ssh/id_ed25519"}}
    - {name: its public half, slurp: {src: "{{ ansible_env.HOME }}/.ssh/id_ed25519.pub"}, register: pub}
    - name: every node's key authorized here (lineinfile, as authorized_key is not in ansible-core)
      lineinfile: {path: "{{ ansible_env.HOME }}/.ssh/authorized_keys", line: "{{ hostvars[item].pub.content | b64decode | trim }}", create: true, mode: "0600"}
      loop: "{{ groups['all'] | difference([inventory_hostname]) }}"
    - name: the others' host keys
      command: "ssh-keyscan -t ed25519 {{ hostvars[item].fabric_ip }}"
      loop: "{{ groups['all'] | difference([inventory_hostname]) }}"
      register: scanned
      changed_when: false
    - name: recorded for their fabric addresses
      known_hosts: {name: "{{ item.item | extract(hostvars, 'fabric_ip') }}", key: "{{ item.stdout }}", path: "{{ ansible_env.HOME }}/.ssh/known_hosts"}
      loop: "{{ scanned.results }}"
"""


def ensure_ansible() -> Path:
    playbook = ANSIBLE_VENV / "bin" / "ansible-playbook"
    if not playbook.exists():
        print(f"making {ANSIBLE_VENV.name} with ansible-core {ANSIBLE_VERSION} (once)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], check=True)
        subprocess.run([str(ANSIBLE_VENV / "bin" / "pip"), "install", "-q", f"ansible-core=={ANSIBLE_VERSION}.*"],
                       check=True)
    return playbook


def ansible_files(cluster: SimCluster, folder: Path) -> tuple[Path, Path]:
    """An Ansible inventory of the cluster (its key, its known_hosts, strict host keys) and the playbook."""
    import yaml

    doc = yaml.safe_load(cluster.inventory_path.read_text())
    settings = doc["vars"]
    ssh_args = f"-o UserKnownHostsFile={settings['known_hosts']} -o StrictHostKeyChecking=yes"
    inventory = {"all": {"vars": {"ansible_user": settings["user"], "ansible_ssh_private_key_file": settings["key"],
                                  "ansible_ssh_common_args": ssh_args, "ansible_python_interpreter": "/usr/bin/python3"},
                         "hosts": {name: {"ansible_host": h["address"]} for name, h in doc["hosts"].items()}}}
    (folder / "inventory.yml").write_text(yaml.safe_dump(inventory))
    (folder / "bootstrap.yml").write_text(PLAYBOOK)
    (folder / "ansible.cfg").write_text(
        "[defaults]\nhost_key_checking = True\nforks = 16\ngathering = explicit\ninterpreter_python = /usr/bin/python3\n"
        "retry_files_enabled = False\n[ssh_connection]\npipelining = True\n"
        "ssh_args = -o ControlMaster=auto -o ControlPersist=60s\n")
    return folder / "inventory.yml", folder / "bootstrap.yml"


def run_ansible(playbook_bin: Path, inventory: Path, playbook: Path) -> float:
    start = time.monotonic()
    done = subprocess.run([str(playbook_bin), "-i", str(inventory), str(playbook)], capture_output=True, text=True,
                          cwd=playbook.parent, env={**os.environ, "ANSIBLE_CONFIG": str(playbook.parent / "ansible.cfg"),
                                                    "ANSIBLE_LOCAL_TEMP": str(playbook.parent / "tmp")})
    took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"ansible-playbook failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    return took


def bytecode_env(scratch: str) -> dict[str, str]:
    """sparkcluster as an installed wheel runs it: its modules' bytecode cached. The checkout is installed editable
    (no bytecode), and PYTHONDONTWRITEBYTECODE may be set, so each run would compile every module from source first
    (about 0.3 s of CPU here): the bytecode goes to a scratch folder instead, made once before the first timing."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(scratch, "pycache"))
    subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c",
                    "import paramiko, fabric, sparkcluster.cli, sparkcluster.bootstrap_cli, sparkcluster.stepcatalog"],
                   check=True, env=env)
    return env


def run_sparkcluster(cluster: SimCluster, config_dir: str, env: dict[str, str]) -> tuple[float, str]:
    """The run's wall time, and where it went: per play, the slowest node's steps (their batched reads and the
    facts it gathered are outside the steps: the run's rest), and the process's start and end outside the run."""
    import json

    start = time.monotonic()
    done = subprocess.run([str(ROOT / ".venv" / "bin" / "sparkcluster"), "bootstrap", str(cluster.inventory_path),
                           "--runtime", "host", "--json"], capture_output=True, text=True,
                          env={**env, "XDG_CONFIG_HOME": config_dir})
    took = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"sparkcluster bootstrap failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    doc = json.loads(done.stdout)
    plays: dict[str, dict[str, float]] = {}
    for step in doc["steps"]:
        per_host = plays.setdefault(step["play"], {})
        per_host[step["host"]] = per_host.get(step["host"], 0.0) + step["duration"]
    slowest = {play: max(hosts.values()) for play, hosts in plays.items()}
    parts = ", ".join(f"{play} {t:.2f}" for play, t in slowest.items())
    where = (f"steps per play (slowest node): {parts}; facts and batched reads {doc['duration'] - sum(slowest.values()):.2f};"
             f" process start and exit {took - doc['duration']:.2f}")
    return took, where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sizes", default="2,8")
    args = parser.parse_args()
    playbook_bin = ensure_ansible()
    sizes = [int(s) for s in args.sizes.split(",")]
    times: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        our_env = bytecode_env(scratch)
        for round_ in range(args.rounds):
            for count in sizes:
                tools = ["sparkcluster", "ansible"] if (round_ + count) % 2 == 0 else ["ansible", "sparkcluster"]
                for tool in tools:
                    cluster = SimCluster.up(UpOptions(count=count, name=f"bva{count}{tool[0]}", docker=False,
                                                      ssh_mesh=False))
                    try:
                        folder = Path(scratch, f"{tool}-{count}-{round_}")
                        folder.mkdir()
                        if tool == "ansible":
                            inventory, playbook = ansible_files(cluster, folder)
                            runs = [(run_ansible(playbook_bin, inventory, playbook), "") for _ in range(2)]
                        else:
                            runs = [run_sparkcluster(cluster, str(folder), our_env) for _ in range(2)]
                    finally:
                        cluster.down()
                    for phase, (took, where) in zip(("cold", "warm"), runs):
                        times.setdefault((tool, count, phase), []).append(took)
                        print(f"round {round_ + 1}: {tool:12} {count} nodes {phase}: {took:.2f} s", flush=True)
                        if where:
                            print(f"    {where}", flush=True)
    median = {key: statistics.median(values) for key, values in times.items()}
    print()
    for count in sizes:
        for phase in ("cold", "warm"):
            ours, theirs = median[("sparkcluster", count, phase)], median[("ansible", count, phase)]
            print(f"{count} nodes {phase}: sparkcluster {ours:.2f} s, ansible-playbook {theirs:.2f} s, "
                  f"ansible / sparkcluster {theirs / ours:.1f}x")
    if len(sizes) > 1:
        low, high = min(sizes), max(sizes)
        for tool in ("sparkcluster", "ansible"):
            for phase in ("cold", "warm"):
                print(f"{tool} {high} nodes / {low} nodes ({phase}): "
                      f"{median[(tool, high, phase)] / median[(tool, low, phase)]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
