"""A simulated N-Spark cluster on this machine: create it, power hosts off and on, reset their disks, remove it.

Each host is a network namespace with a Spark's NIC names, its own mount/UTS/IPC/PID namespaces over a
copy-on-write overlay of `/`, a real OpenSSH sshd as PID 1 and, optionally, its own Docker engine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from ..engine.errors import SparkclusterError, UsageError
from ..engine.remote import STRICT_SSH
from . import delay as delaying
from . import hardware, hostproc, machine, netns, prerequisites
from .hostfiles import HOST_FILES, hardware_files, seed_disk
from .inventory import inventory_doc
from .options import DEFAULT_NAME, DEFAULT_UID, UpOptions, validate
from .shaping import check_degrade, shape
from .state import ClusterState, HostState, existing_names, locked, sim_root
from .topology import HostSpec, Subnets, Topology, build_topology


class SimCluster:
    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.topology: Topology = build_topology(
            state.name, state.count, Subnets(state.k), state.drivers, frozenset(state.port0_hosts), state.rdma_names,
            state.topology, state.miscable,
        )

    # ---- paths -------------------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return self.state.dir

    @property
    def inventory_path(self) -> Path:
        return self.dir / "inventory.yml"

    @property
    def client_key(self) -> Path:
        return self.dir / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    def host_dir(self, host: HostSpec) -> Path:
        return self.dir / "hosts" / host.name

    def host(self, name: str) -> HostSpec:
        for h in self.topology.hosts:
            if h.name == name:
                return h
        names = ", ".join(h.name for h in self.topology.hosts)
        raise UsageError(f"cluster {self.state.name!r} has no host {name!r}", f"use one of: {names}")

    # ---- lifecycle ---------------------------------------------------------------------------------
    @classmethod
    def load(cls, name: str = DEFAULT_NAME) -> SimCluster:
        try:
            return cls(ClusterState.load(name))
        except FileNotFoundError:
            known = ", ".join(existing_names()) or "none"
            raise UsageError(f"no simulated cluster named {name!r} (existing: {known})",
                             "create one with `sparkcluster sim up 2`") from None

    @classmethod
    def up(cls, opts: UpOptions) -> SimCluster:
        """Create and boot a cluster. All input is checked before anything is created; on a failure
        half-way, everything created so far is removed again."""
        validate(opts)
        prerequisites.check(opts.docker)
        with locked():
            if (sim_root() / opts.name / "cluster.json").exists():
                raise UsageError(f"a simulated cluster named {opts.name!r} already exists",
                                 f"remove it with `sparkcluster sim down {opts.name}` or pick another --name")
            state = ClusterState(
                name=opts.name, count=opts.count, k=_free_block(), drivers=list(opts.drivers),
                port0_hosts=sorted(opts.port0_hosts), docker=opts.docker, lan_rate=opts.lan_rate,
                user=opts.user, uid=DEFAULT_UID, ssh_mesh=opts.ssh_mesh, vllm_env=opts.vllm_env or "",
                fabric_addresses=opts.fabric_addresses and not opts.link_local, rdma_names=opts.rdma_names,
                link_local=opts.link_local, topology=opts.topology, miscable=opts.miscable,
            )
            state.dir.mkdir(parents=True)
            state.save()  # from here on, `sim down` can find and remove whatever exists
            cluster = cls(state)
            try:
                cluster._prepare_files()
                netns.create(cluster.topology, opts.lan_rate, state.fabric_addresses, state.link_local)
                cluster._open_forwarding()
            except BaseException:
                cluster.down()
                raise
        try:
            cluster._boot_all()
            cluster.write_inventory()
            state.status = "up"
            state.save()
        except BaseException:
            cluster.down()
            raise
        return cluster

    def down(self) -> None:
        """Remove every process, mount, namespace, interface, cgroup, rule and file of this cluster."""
        prerequisites.require_root()
        with ThreadPoolExecutor(max_workers=max(1, len(self.topology.hosts))) as pool:
            list(pool.map(self._power_off, self.topology.hosts))
        delaying.stop_all(self.dir)  # a delayed twin's daemon holds its namespace
        leftovers = netns.destroy(self.topology)
        self._close_forwarding()
        if leftovers:
            raise SparkclusterError(f"could not remove {', '.join(leftovers)}", "check `ip netns pids NAME` for stray processes")
        # A host's Docker layers are tens of thousands of files (23k for the test image): one removal per host at
        # once, since the disk serves several at a time (2 trees: 31 s one after the other, 18 s side by side).
        with ThreadPoolExecutor(max_workers=max(1, len(self.topology.hosts))) as pool:
            list(pool.map(_remove_tree, [self.host_dir(h) for h in self.topology.hosts]))
        shutil.rmtree(self.dir, ignore_errors=True)

    def power_off(self, name: str) -> None:
        prerequisites.require_root()
        self._power_off(self.host(name))
        self.state.hosts[name] = HostState()
        self.state.save()

    def degrade(self, name: str, twin: str, rate: str | None, delay: str | None = None) -> str:
        """Hold one cabled QSFP twin of a host to `rate` (tc, both directions), delay it by `delay` each way (netem:
        a link slow for small messages), both, or lift them (both None). `twin`: its netdev, or 0/1 (the
        eugr-preferred twin first). Returns the netdev."""
        check_degrade(rate, delay)
        prerequisites.require_root()
        host = self.host(name)
        cabled = sorted((n.netdev for n in host.nics if n.hca and n.cabled), key=lambda n: (n.startswith("enP"), n))
        netdev = cabled[int(twin)] if twin in ("0", "1") else twin
        if netdev not in cabled:
            raise UsageError(f"{name} has no cabled QSFP twin {twin!r}", f"name one of {', '.join(cabled)} (or 0/1)")
        shape(self.dir, host, netdev, rate, delay)
        # A rate-held twin's PCIe link shows it too, where preflight reads it (the tree's writable mount, as
        # sim-gid-cache); a delay alone is no PCIe fault.
        speed, width = (hardware.PCIE_SPEED, hardware.PCIE_WIDTH) if rate is None else hardware.DEGRADED_PCIE
        hca = host.nic(netdev).hca
        if self.is_running(host):
            self.exec_in(name, ["sh", "-c", f"echo '{speed}' > /run/sim-infiniband/{hca}/device/current_link_speed; "
                                            f"echo {width} > /run/sim-infiniband/{hca}/device/current_link_width"],
                         capture_output=True)
        return netdev

    def boot(self, name: str) -> None:
        prerequisites.require_root()
        host = self.host(name)
        if self.is_running(host):
            raise UsageError(f"{name} is already running", f"power it off first: `sparkcluster sim power-off {name}`")
        self._boot(host)
        self.state.save()

    def reset(self, name: str) -> None:
        """Power off, give the host a fresh disk (its writes and its Docker images are dropped), boot."""
        prerequisites.require_root()
        host = self.host(name)
        self._power_off(host)
        for sub in ("upper", "work", "docker-data"):
            shutil.rmtree(self.host_dir(host) / sub, ignore_errors=True)
        self._boot(host)
        self.state.save()

    def is_running(self, host: HostSpec) -> bool:
        # Running means its boot process still has exactly the PID 1 we recorded (a dead one has no children).
        st = self.state.hosts.get(host.name)
        return st is not None and bool(st.pid1) and hostproc.children(st.unshare_pid) == [st.pid1]

    def exec_in(self, name: str, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        host = self.host(name)
        if not self.is_running(host):
            raise UsageError(f"{name} is powered off", f"boot it: `sparkcluster sim boot {name}`")
        return hostproc.exec_in(self.state.hosts[name].pid1, argv, **kwargs)

    def ssh_argv(self, name: str, user: str | None = None, via: str = "mgmt") -> list[str]:
        """The OpenSSH command line that logs into a host with the cluster's key and strict host keys."""
        host = self.host(name)
        address = host.mgmt_ip if via == "mgmt" else host.fabric_ips[0]
        return [
            "ssh", "-F", "/dev/null", "-i", str(self.client_key), "-o", "IdentitiesOnly=yes", *STRICT_SSH,
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            f"{user or self.state.user}@{address}",
        ]

    def write_inventory(self) -> None:
        """An inventory in sparkcluster's own format, usable as is: `sparkcluster bootstrap <this file>`."""
        doc = inventory_doc(self.state, self.topology, self.client_key, self.known_hosts)
        header = f"# Simulated DGX Spark cluster {self.state.name!r}, written by `sparkcluster sim up`.\n"
        tmp = self.inventory_path.with_suffix(".tmp")
        tmp.write_text(header + yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.inventory_path)

    def status(self) -> str:
        """creating, up (every host powered on), degraded (some) or down (none)."""
        if self.state.status == "creating":
            return "creating"
        running = sum(self.is_running(h) for h in self.topology.hosts)
        return "up" if running == len(self.topology.hosts) else "degraded" if running else "down"

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.state.name,
            "status": self.status(),
            "inventory": str(self.inventory_path),
            "key": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "docker": self.state.docker,
            "lan_rate": self.state.lan_rate,
            "fabric_addresses": self.state.fabric_addresses,
            "link_local": self.state.link_local,
            "rdma_names": self.state.rdma_names,
            "topology": self.state.topology,
            "miscable": self.state.miscable,
            "cables": [{"bridge": w.bridge, "ends": [{"node": f"spark-{i}", "port": p, "twin": t} for i, p, t in w.ends]}
                       for w in self.topology.wires],
            "subnets": {"lan": str(self.topology.subnets.lan), "fabric": [str(n) for n in self.topology.subnets.fabric]},
            "hosts": [
                {
                    "name": h.name,
                    "running": self.is_running(h),
                    "mgmt_ip": h.mgmt_ip,
                    "fabric_ips": list(h.fabric_ips),
                    "cabled_port": h.cabled_port,
                    "driver": h.driver_version,
                    "netns": h.netns,
                }
                for h in self.topology.hosts
            ],
        }

    # ---- internals ---------------------------------------------------------------------------------
    def _prepare_files(self) -> None:
        d = self.dir
        machine.keygen(self.client_key, "sparkcluster-sim-client")
        if self.state.ssh_mesh:
            machine.keygen(d / "mesh_ed25519", "sparkcluster-sim-mesh")
        for name in ("boot.sh", "sshd_config", "runc-capfilter"):
            (d / name).write_bytes((HOST_FILES / name).read_bytes())
        os.chmod(d / "runc-capfilter", 0o755)
        # The lab dir is read by the hosts through their lower layer: the login user needs to traverse it.
        os.chmod(d, 0o755)
        self.state.docker_runtime = str(d / "runc-capfilter") if machine.capabilities_restricted() else ""
        self.state.storage_driver = "vfs" if machine.fs_type(d) == "overlayfs" else "overlay2"
        known, hosts_lines = [], []
        for host in self.topology.hosts:
            hd = self.host_dir(host)
            hd.mkdir(parents=True)
            machine.keygen(hd / "ssh_host_ed25519_key", f"root@{host.name}")
            pub = (hd / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            names = [host.name, f"{host.name}-fabric", f"{host.name}-fabric2", *host.addresses]
            known.append(f"{','.join(names)} {' '.join(pub)}")
            hosts_lines += [f"{host.mgmt_ip}\t{host.name}", f"{host.fabric_ips[0]}\t{host.name}-fabric",
                            f"{host.fabric_ips[1]}\t{host.name}-fabric2"]
        self.known_hosts.write_text("\n".join(known) + "\n")
        base_hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
        (d / "etc-hosts").write_text(base_hosts + "\n".join(hosts_lines) + "\n")
        self.state.save()

    def set_hardware(self, name: str, settings: dict[str, Any]) -> None:
        """Give one host another driver, kernel, BIOS, CMA pool, ConnectX firmware or twin PCIe width (a value of
        None puts the simulated default back). A running host sees it at once; a reboot keeps it."""
        prerequisites.require_root()
        host = self.host(name)
        unknown = set(settings) - set(hardware.SETTINGS)
        if unknown:
            raise UsageError(f"no hardware setting {', '.join(sorted(unknown))}", f"use {', '.join(hardware.SETTINGS)}")
        current = {**self.state.hardware.get(name, {}), **settings}
        self.state.hardware[name] = {k: v for k, v in current.items() if v is not None}
        self.state.save()
        if not self.is_running(host):
            return
        hd = self.host_dir(host)
        for path, content in hardware_files(self.state, host).items():
            self.exec_in(name, ["sh", "-c", 'mkdir -p "${1%/*}" && cat > "$1"', "sh", "/" + path], input=content,
                         text=True, check=True)
        if "kernel" not in self.state.hardware[name]:
            self.exec_in(name, ["rm", "-f", "/" + hardware.KERNEL_FILE], check=True)
        hardware.write_dmi_tree(self.state.hardware[name], hd / "sys-dmi")
        widths = self.state.hardware[name].get("pcie_width", {})
        for nic in host.nics:
            if nic.hca:
                (hd / "sys-infiniband" / nic.hca / "device" / "current_link_width").write_text(
                    widths.get(nic.netdev, hardware.PCIE_WIDTH) + "\n")
        # /proc/meminfo: drop an earlier CMA pool's copy, then lay the new one over it
        cma = self.state.hardware[name].get("cma_total_kb")
        script = "while umount /proc/meminfo 2>/dev/null; do :; done"
        if cma is not None:
            script += "; cat > /run/sim-meminfo && mount --bind /run/sim-meminfo /proc/meminfo"
        text = hardware.meminfo(Path("/proc/meminfo").read_text(), int(cma)) if cma is not None else ""
        self.exec_in(name, ["sh", "-c", script], input=text, text=True, check=True)

    def _boot_env(self, host: HostSpec) -> dict[str, str]:
        return {
            "SIM_LAB": str(self.dir),
            "SIM_HOST_DIR": str(self.host_dir(host)),
            "SIM_HOSTNAME": host.name,
            "SIM_USER": self.state.user,
            "SIM_UID": str(self.state.uid),
            "SIM_DOCKER": "1" if self.state.docker else "0",
            "SIM_DOCKER_RUNTIME": self.state.docker_runtime,
            "SIM_STORAGE_DRIVER": self.state.storage_driver,
            "SIM_CGROUP_PARENT": self._cgroup_parent(host),
        }

    def _cgroup_parent(self, host: HostSpec) -> str:
        return f"sparkcluster-{self.state.name}-{host.name}"

    def _start(self, host: HostSpec) -> int:
        seed_disk(self.state, host, self.host_dir(host))
        netns.run_batch("ip", netns.host_batch(host, self.state.fabric_addresses), host.netns)
        hd = self.host_dir(host)
        pid = hostproc.start(host.netns, self.dir / "boot.sh", self._boot_env(host), hd / "boot.log")
        self.state.hosts[host.name] = HostState(unshare_pid=pid)
        return pid

    def _await(self, host: HostSpec) -> None:
        st = self.state.hosts[host.name]
        st.pid1 = hostproc.wait_ready(st.unshare_pid, host.mgmt_ip, self.host_dir(host) / "boot.log", host.name)

    def _boot(self, host: HostSpec) -> None:
        self._start(host)
        self.state.save()
        self._await(host)

    def _boot_all(self) -> None:
        for host in self.topology.hosts:
            self._start(host)
        self.state.save()
        with ThreadPoolExecutor(max_workers=len(self.topology.hosts)) as pool:
            list(pool.map(self._await, self.topology.hosts))
        self.state.save()

    def _power_off(self, host: HostSpec) -> None:
        st = self.state.hosts.get(host.name)
        if st:
            hostproc.power_off(st.unshare_pid, self.host_dir(host))
        machine.remove_cgroups(self._cgroup_parent(host))

    def _open_forwarding(self) -> None:
        """Where a Docker engine of this machine set FORWARD to DROP with bridge netfilter on, frames between
        our hosts would be dropped: accept them on our bridges only, and remember the rules to undo them."""
        nf = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
        if not (nf.exists() and nf.read_text().strip() == "1" and shutil.which("iptables")):
            return
        policy = subprocess.run(["iptables", "-S", "FORWARD"], capture_output=True, text=True).stdout
        if "-P FORWARD DROP" not in policy:
            return
        for bridge in self.topology.bridges:
            rule = ["FORWARD", "-i", bridge, "-o", bridge, "-j", "ACCEPT"]
            subprocess.run(["iptables", "-I", *rule], check=True)
            self.state.forward_rules.append(rule)
        self.state.save()

    def _close_forwarding(self) -> None:
        for rule in self.state.forward_rules:
            subprocess.run(["iptables", "-D", *rule], capture_output=True)
        self.state.forward_rules = []


def _remove_tree(path: Path) -> None:
    """rm -rf, staying on the tree's own file system (a mount left under it is not emptied); what it leaves,
    shutil.rmtree still tries."""
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True)


def _free_block() -> int:
    """The first block k (>= 100) whose three /24s overlap nothing on this machine or in another cluster."""
    used = netns.used_networks()
    taken = set()
    for name in existing_names():
        try:
            taken.add(ClusterState.load(name).k)
        except (OSError, ValueError, TypeError):
            continue
    for k in range(100, 255):
        if k in taken:
            continue
        if not any(net.overlaps(u) for net in Subnets(k).all() for u in used):
            return k
    raise SparkclusterError("no free subnets left for a simulated cluster", "remove one with `sparkcluster sim down NAME`")
