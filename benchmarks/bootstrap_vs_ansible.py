"""`sparkcluster bootstrap` against ansible-playbook doing bootstrap's core work, on the same kind of fresh simulated
Sparks, 2 and 8 nodes, cold (fresh nodes: the first run changes them) and warm (the second run: nothing to do),
in interleaved rounds of one run (each round brings up fresh clusters, one per tool, and alternates which tool goes
first), so both see the same machine load.

The Ansible side (benchmarks/ansible/bootstrap.yml, written here) does what bootstrap does, task for task: facts;
the GPU, driver, QSFP (ibdev2netdev, addresses), disk checks; every node pinging every other over the fabric; rsync
present, the HF cache folder, the comm env file; the ssh mesh (a key per node, every key authorized on every node,
every node's host key recorded for the others' fabric addresses, then the head's real login to every other node, as
bootstrap proves the mesh). It gets Ansible's fastest settings: pipelining,
ControlPersist, forks = nodes, the free strategy. Both leave Docker out (`--runtime host`, hosts without Docker).

ansible-core lives in a benchmark-only environment, .venv-ansible (made on the first run with pip; nothing of the
project depends on it). Run as root:  .venv/bin/python benchmarks/bootstrap_vs_ansible.py [--rounds 2]
Prints each timing, the medians, and the ratios: Ansible / sparkcluster at 2 and 8 nodes, cold and warm (of the
medians, and each round's own), and each tool's 8 nodes / 2 nodes; after each run, the CPU seconds of the tool's
own processes and of the whole machine, in all and a host. Every simulated host shares this machine's cores with
both tools, so each run also gives the least wall time that the rest of the machine's CPU (the simulated nodes'
sshd, shells and emulated tools) needs on its cores, whatever the tool does.

Where the time goes: each sparkcluster run also prints, per play, the slowest node's steps, the facts and batched
reads outside them, and the process's start and exit (from its --json). The results, and what they mean on a machine
whose two cores also run every simulated node's sshd, shells and emulated tools, are in the closing notes of the
issues that measured them.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    - name: the head logs in to every other node over the fabric (bootstrap's proof, with its ssh options)
      command: "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ConnectTimeout=10 -o KexAlgorithms=^curve25519-sha256,curve25519-sha256@libssh.org {{ hostvars[item].fabric_ip }} true"
      loop: "{{ groups['all'] | difference([inventory_hostname]) }}"
      when: inventory_hostname == groups['all'][0]
      changed_when: false
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


@dataclass
class Run:
    """One tool's run: its wall time; the CPU seconds of the tool's own processes (this process's reaped children:
    sparkcluster, or ansible-playbook with its workers and ssh clients; a ControlPersist master that outlives the run
    is not counted); the whole machine's busy CPU seconds over the run (the nodes' sshd, shells and tools too)."""

    wall: float
    tool_cpu: float
    machine_cpu: float
    where: str = ""

    def cpu_line(self, hosts: int) -> str:
        # What the machine ran besides the tool is the simulated nodes' sshd, shells and tools (and anything else
        # on it): on this many cores, that alone needs the wall time given, however little the tool itself takes.
        cores = os.cpu_count() or 1
        rest = self.machine_cpu - self.tool_cpu
        return (f"CPU: the tool {self.tool_cpu:.2f} s ({self.tool_cpu / hosts:.2f} a host), the machine "
                f"{self.machine_cpu:.2f} s ({self.machine_cpu / hosts:.2f} a host), "
                f"{self.machine_cpu / self.wall:.2f} of {cores} cores busy; the rest of the machine {rest:.2f} s "
                f"needs at least {rest / cores:.2f} s on {cores} cores")


def _busy_cpu_s() -> float:
    """The machine's CPU seconds spent not idle, from /proc/stat's first line."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], **kwargs: Any) -> tuple[subprocess.CompletedProcess[str], Run]:
    before, busy, start = resource.getrusage(resource.RUSAGE_CHILDREN), _busy_cpu_s(), time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    wall, after = time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    tool = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return done, Run(wall, tool, _busy_cpu_s() - busy)


def run_ansible(playbook_bin: Path, inventory: Path, playbook: Path) -> Run:
    done, run = timed([str(playbook_bin), "-i", str(inventory), str(playbook)], cwd=playbook.parent,
                      env={**os.environ, "ANSIBLE_CONFIG": str(playbook.parent / "ansible.cfg"),
                           "ANSIBLE_LOCAL_TEMP": str(playbook.parent / "tmp")})
    if done.returncode != 0:
        raise SystemExit(f"ansible-playbook failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}")
    return run


def bytecode_env(scratch: str) -> dict[str, str]:
    """sparkcluster as an installed wheel runs it: every module's bytecode compiled beforehand, as pip does at
    install. The checkout is installed editable, and PYTHONDONTWRITEBYTECODE may be set, so each run would compile
    what it imports first (jinja2 and the step modules alone cost a run 0.6 s of CPU here): the package and the
    environment's libraries are compiled once, into a scratch folder, before the first timing."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(Path(scratch, "pycache"))
    python = str(ROOT / ".venv" / "bin" / "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, env=env, capture_output=True, text=True).stdout.strip()
    # Not checked: a library may ship a file that is not meant to compile (a template, a test's bad input).
    subprocess.run([python, "-m", "compileall", "-q", "-j", "0", str(ROOT / "sparkcluster"), site],
                   env=env, stdout=subprocess.DEVNULL)
    return env


def run_sparkcluster(cluster: SimCluster, config_dir: str, env: dict[str, str]) -> Run:
    """The run, and where it went: per play, the slowest node's steps (their batched reads and the facts it
    gathered are outside the steps: the run's rest), and the process's start and end outside the run."""
    import json

    done, run = timed([str(ROOT / ".venv" / "bin" / "sparkcluster"), "bootstrap", str(cluster.inventory_path),
                       "--runtime", "host", "--json"], env={**env, "XDG_CONFIG_HOME": config_dir})
    took = run.wall
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
    run.where = where
    return run


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
                            runs = [run_ansible(playbook_bin, inventory, playbook) for _ in range(2)]
                        else:
                            runs = [run_sparkcluster(cluster, str(folder), our_env) for _ in range(2)]
                    finally:
                        cluster.down()
                    for phase, run in zip(("cold", "warm"), runs):
                        times.setdefault((tool, count, phase), []).append(run.wall)
                        print(f"round {round_ + 1}: {tool:12} {count} nodes {phase}: {run.wall:.2f} s", flush=True)
                        for line in (run.where, run.cpu_line(count)):
                            if line:
                                print(f"    {line}", flush=True)
    median = {key: statistics.median(values) for key, values in times.items()}
    print()
    for count in sizes:
        for phase in ("cold", "warm"):
            ours, theirs = median[("sparkcluster", count, phase)], median[("ansible", count, phase)]
            # Each round ran both tools back to back, so a round's own ratio is the least touched by the
            # machine's load changing between rounds.
            paired = [a / b for a, b in zip(times[("ansible", count, phase)], times[("sparkcluster", count, phase)])]
            print(f"{count} nodes {phase}: sparkcluster {ours:.2f} s, ansible-playbook {theirs:.2f} s, "
                  f"ansible / sparkcluster {theirs / ours:.1f}x; by round {', '.join(f'{r:.1f}x' for r in paired)} "
                  f"(median {statistics.median(paired):.1f}x)")
    if len(sizes) > 1:
        low, high = min(sizes), max(sizes)
        for tool in ("sparkcluster", "ansible"):
            for phase in ("cold", "warm"):
                print(f"{tool} {high} nodes / {low} nodes ({phase}): "
                      f"{median[(tool, high, phase)] / median[(tool, low, phase)]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
