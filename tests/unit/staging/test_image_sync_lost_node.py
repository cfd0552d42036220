"""Round 5's M8: `image sync` on a ring, its middle node lost mid-load. The chain stops there, and the error says
so: "spark-2 went away; spark-3 was not synced", with bringing spark-2 back as the fix (not a check of reach and
disk room). A load that fails on a node still there names the nodes after it too.

The nodes are scripted: their commands answer as docker and the blob sender do, and the OpenSSH client that
streams the image into `docker load` on a node exits as OpenSSH does when that node goes away."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparkcluster.engine.command import Command
from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result, Unreachable
from sparkcluster.serving import image as serving_image
from sparkcluster.staging import images
from sparkcluster.staging.hops import Hop

NAMES = ("spark-1", "spark-2", "spark-3")
HOSTS = tuple(Host(n, f"192.168.103.1{i}", "head" if i == 1 else "worker", user="spark")
              for i, n in enumerate(NAMES, 1))
RING_HOPS = [Hop("spark-1", ("spark-2",), {"spark-1": "10.103.0.11", "spark-2": "10.103.0.12"}),
             Hop("spark-2", ("spark-3",), {"spark-2": "10.103.2.12", "spark-3": "10.103.2.13"})]


class Node:
    def __init__(self, host: Host, gone: set[str]) -> None:
        self.host, self.gone = host, gone

    def run(self, command: Command) -> Result:
        if self.host.name in self.gone:
            raise Unreachable(f"{self.host.address} dropped off", "power it on")
        line = command.script
        if "docker image inspect" in line and "RootFS.Layers}} {{json .Config" in line:
            if self.host.name != "spark-1":
                return Result(command, 1, "", "Error: No such image: vllm-node", 0.0)
            return Result(command, 0, '"sha256:abc" 100 ["sha256:l1"] null\n', "", 0.0)
        if command.name.startswith("`blobwire serve`"):
            return Result(command, 0, "40000 99\n", "", 0.0)
        if "setsid sh -c" in line:  # the growing save, started in the background: its pid
            return Result(command, 0, "4242\n", "", 0.0)
        return Result(command, 0, "", "", 0.0)  # layer chains (none held), mkdir, df, the save's status, cleanup

    def write_file_atomic(self, path: str, content: bytes, mode: int) -> None: ...


class OpenSsh:
    """`ssh NODE 'blobwire stream | docker load'`: exits 255 as OpenSSH does where the node went away."""

    fails: dict[str, tuple[int, str]] = {}
    gone: set[str] = set()

    def __init__(self, argv: list[str], **_: Any) -> None:
        node = next(h for h in HOSTS if argv[-2].endswith(h.address))
        code, error = self.fails.get(node.name, (0, ""))
        if code == 255:
            self.gone.add(node.name)
        self.returncode = code
        self.stderr = iter([f"{error}\n"] if error else ["bytes 100\n"])
        self.stdin = self.stdout = self

    def write(self, _text: str) -> None: ...
    def close(self) -> None: ...
    def read(self) -> str:
        return ""

    def wait(self) -> int:
        return self.returncode


def sync_with(monkeypatch: pytest.MonkeyPatch, fails: dict[str, tuple[int, str]]) -> SparkclusterError:
    gone: set[str] = set()
    monkeypatch.setattr(OpenSsh, "fails", fails)
    monkeypatch.setattr(OpenSsh, "gone", gone)
    monkeypatch.setattr(images.subprocess, "Popen", OpenSsh)
    monkeypatch.setattr(serving_image, "image_hops", lambda *args: RING_HOPS)
    monkeypatch.setattr(serving_image, "fabric_ips", lambda session: {})
    session = Session(Inventory(Path("inv.yml"), "t", HOSTS, {}), {h.name: Node(h, gone) for h in HOSTS})  # type: ignore[misc]
    with pytest.raises(SparkclusterError) as caught:
        serving_image.sync_image(session, "vllm-node", lambda progress: None)
    return caught.value


def test_a_middle_node_lost_mid_load_names_the_nodes_after_it_as_not_synced(monkeypatch):
    error = sync_with(monkeypatch, {"spark-2": (255, "Connection to 192.168.103.12 closed by remote host.")})
    assert (error.message, error.fix) == (
        "spark-2 went away during the sync of vllm-node; spark-3 was not synced",
        "bring spark-2 back (check that it is powered on and reachable: ssh -p 22 192.168.103.12 true), then run "
        "`sparkcluster image sync vllm-node` again: the layers already loaded are not sent again")


def test_a_load_failing_on_a_node_still_there_also_names_the_nodes_after_it(monkeypatch):
    error = sync_with(monkeypatch, {"spark-2": (1, "write /var/lib/docker/tmp: no space left on device")})
    assert error.message == (
        "loading image vllm-node on spark-2 from the head's sender at 10.103.0.11:40000 failed (exit 1): write "
        "/var/lib/docker/tmp: no space left on device; spark-3 was not synced (the image reaches it through spark-2)")
    assert error.fix.startswith("check that spark-2 reaches 10.103.0.11:40000 over the fabric and has room")
