"""What bench measures, and what it records about it: any OpenAI-compatible endpoint (--url), or the cluster
`serve` started, found from the record `serve` keeps on the head (as `status` reads it). Published figures are
only comparable together with their configuration, so the config names everything that produced the numbers
and says null where it cannot be known."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from ..engine.errors import SparkclusterError, UsageError
from ..engine.session import Session
from ..serving.nodes import Cluster
from ..serving.runtime import RuntimeChoice
from ..serving.status import recorded
from ..staging.images import inspect


@dataclass(frozen=True)
class Target:
    base_url: str  # http://host:port/v1
    model: str | None  # the served name; None: the server's only (first) model
    config: dict = field(default_factory=dict)


def base_url(url: str) -> str:
    """`host:8000`, `http://host:8000`, `http://host:8000/v1/` -> `http://host:8000/v1`."""
    text = url.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--url {url!r} is not an http(s) address", "e.g. --url http://192.168.1.50:8000/v1")
    path = parts.path.rstrip("/")
    if not path.endswith("/v1"):
        path += "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def from_url(url: str, model: str | None) -> Target:
    return Target(base_url(url), model, {"endpoint": base_url(url), "source": "--url"})


def from_record(record: dict, head_address: str, image_id: str | None) -> Target:
    """The endpoint and configuration of the last `serve`, from its record on the head."""
    serving = record.get("serving") if record else None
    if not serving:
        raise SparkclusterError("nothing is served: the head holds no record of a `sparkcluster serve`",
                                "serve a model first (`sparkcluster serve --tp N --model M`), or give --url")
    endpoint = serving.get("endpoint") or f"http://{head_address}:{serving['port']}/v1"
    docker = record.get("runtime") == "docker"
    return Target(endpoint, serving.get("served_name"), {
        "endpoint": endpoint, "source": "inventory", "hf_model": serving.get("model"),
        "runtime": record.get("runtime"), "launcher": record.get("launcher"), "tp": serving.get("tp"),
        "nodes": record.get("nodes"), "image": record.get("image") if docker else None,
        "image_id": image_id if docker else None,
        # Recorded by serve where it keeps them; null otherwise, so a reader sees what is not known.
        "recipe": serving.get("recipe"), "recipe_flags": serving.get("flags"),
        "nccl_verdict": record.get("verify") or serving.get("verify"),
    })


def from_cluster(session: Session) -> Target:
    """Read the head's record (one SSH read) and, where docker serves, the head's image ID."""
    cluster = Cluster(session.inventory, session.transports, session.facts)
    record, runtime = recorded(cluster, RuntimeChoice("docker"))
    image_id = None
    if record.get("serving") and runtime.name == "docker":
        image_id = inspect(session.transports[cluster.head.name], runtime.image).id
    return from_record(record, cluster.head.address, image_id)
