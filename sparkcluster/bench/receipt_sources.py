"""What the served cluster says of the engine bench measures, read once before measuring (none of it changes during
the run): the serve record, the vLLM build in the serving environment, the image's digest, each node's comm env and
doctor's node facts (the session's facts and node/health.py's one-round-trip probe, as `doctor` runs it)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..engine.command import Command
from ..engine.inventory import Host
from ..engine.session import Session
from ..engine.transport import remote_path
from ..node.health import NodeHealth, health_command, parse_health
from ..node.network import comm_env_path
from ..serving.record import ServeRecord
from ..serving.runtime import RuntimeChoice
from .layouts.build import served_vllm
from .receipt import BenchParams, Engine, Mod, NodeReceipt, Receipt, RecipeUsed, masked_env
from .receipt_metrics import EngineDeltas


@dataclass(frozen=True)
class Served:
    record: ServeRecord
    image_id: str | None  # the head's image (docker), as bench's target inspected it
    vllm_build: str | None  # the distribution's version in the serving environment (0.32.0+cpu), or None
    image_digest: str | None
    python_env: str | None  # the host runtime's environment on the head
    comm_env: dict[str, dict[str, str]]  # node -> its comm env, secrets masked
    nodes: tuple[NodeReceipt, ...]


@dataclass(frozen=True)
class NodesRead:
    """Each node's comm env and doctor's facts: the same for every serve of one run (`bench --layouts` reads them
    once and shares them between its layouts)."""

    comm_env: dict[str, dict[str, str]]  # node -> its comm env, secrets masked
    nodes: tuple[NodeReceipt, ...]


def read_nodes(session: Session, record: ServeRecord) -> NodesRead:
    """In parallel, one round trip per node; the NCCL the engine loads is the served image's where docker serves."""
    image = record.image if record.runtime == "docker" else ""
    hosts = [h for h in session.hosts if h.name in session.facts]

    def node(host: Host) -> tuple[dict[str, str], NodeReceipt]:
        return comm_env(session, host), node_receipt(session, host, image)
    per_node = session.each(node, hosts)
    return NodesRead({h.name: env for h, (env, _) in zip(hosts, per_node)}, tuple(n for _, n in per_node))


def read_served(session: Session, record: ServeRecord, image_id: str | None, nodes: NodesRead | None = None) -> Served:
    """`nodes`: as read earlier in the same run, else read now."""
    docker = record.runtime == "docker"
    found = nodes or read_nodes(session, record)
    return Served(record, image_id, served_vllm(session, RuntimeChoice(record.runtime, image=record.image)),
                  image_digest(session, record.image) if docker else None,
                  None if docker else str(session.head.vars.get("python_env") or "") or None,
                  found.comm_env, found.nodes)


def comm_env(session: Session, host: Host) -> dict[str, str]:
    """The comm env file bootstrap wrote on the node (what Ray, NCCL and vLLM get), secrets masked."""
    data = session.transport(host).read_file(remote_path(comm_env_path(host))) or b""
    lines = data.decode(errors="replace").splitlines()
    return masked_env(dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#")))


def node_receipt(session: Session, host: Host, image: str) -> NodeReceipt:
    """Kernel and GPU driver from the session's facts; BIOS, ConnectX firmware, NCCL and CUDA from doctor's probe."""
    facts = session.facts[host.name]
    result = session.run(host, health_command(image))
    health = parse_health(result.stdout, image) if result.ok else None
    return NodeReceipt(host.name, facts.kernel or None, facts.gpu.driver_version if facts.gpu else None,
                       *_from_health(health))


def _from_health(health: NodeHealth | None) -> tuple[str | None, dict[str, str] | None, str | None, str | None]:
    if health is None:
        return None, None, None, None
    bios = " ".join(v for v in (health.bios_vendor, health.bios_version, health.bios_date) if v) or None
    # The NCCL the engine loads: the image's where a container serves, the host's otherwise.
    return bios, health.firmware or None, health.image.nccl or health.host_nccl, health.cuda


def image_digest(session: Session, image: str) -> str | None:
    """The head image's repository digest (name@sha256:...), None for an image built locally and never pushed."""
    result = session.run(session.head, Command.argv(["docker", "image", "inspect", "--format",
                                                     "{{json .RepoDigests}}", "--", image]))
    try:
        digests = json.loads(result.stdout) if result.ok else []
    except ValueError:
        return None
    return str(digests[0]) if isinstance(digests, list) and digests else None


def assemble(endpoint: str, served: Served | None, server_version: str | None, bench: BenchParams,
             metrics: EngineDeltas | None) -> Receipt:
    """The receipt of one result. Without `served` (a bare --url) only what the endpoint itself said is known."""
    if served is None:
        return Receipt(endpoint, Engine(vllm_version=server_version), bench, metrics=metrics)
    record, serving = served.record, served.record.serving
    launched = serving.launched if serving else None
    docker = record.runtime == "docker"
    recipe = (RecipeUsed(launched.recipe_source, launched.recipe_sha256, tuple(Mod(n, h) for n, h in launched.mods))
              if launched and launched.recipe_source else None)
    engine = Engine(
        vllm_version=served.vllm_build or server_version, command=launched.command if launched else None,
        runtime=record.runtime, launcher=record.launcher, image=record.image if docker else None,
        image_id=served.image_id if docker else None, image_digest=served.image_digest,
        python_env=served.python_env, recipe=recipe, tp=serving.tp if serving else None,
        pp=serving.pp if serving else None, replicas=serving.layout.replicas if serving else None)
    return Receipt(endpoint, engine, bench, served.comm_env, served.nodes, metrics)
