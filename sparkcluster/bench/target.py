"""What bench measures, and what it records about it: any OpenAI-compatible endpoint (--url), or the cluster
`serve` started, found from the record `serve` keeps on the head (as `status` reads it). Published figures are
only comparable together with their configuration, so the config names everything that produced the numbers
and says null where it cannot be known."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..engine.errors import SparkclusterError
from ..engine.inventory import Host
from ..engine.secret_names import masked_argv
from ..engine.session import Session
from ..observe.endpoint import endpoint_address
from ..serving.apikey import environment_key
from ..serving.nodes import client_api_key
from ..serving.record import ServeRecord, Serving
from ..serving.runtime import RuntimeChoice
from ..serving.status import recorded
from ..serving.top import replica_targets
from ..staging.images import inspect
from .receipt_sources import NodesRead, Served, read_served


@dataclass(frozen=True)
class Target:
    base_url: str  # http://host:port/v1
    model: str | None  # the served name; None: the server's only (first) model
    config: dict[str, Any] = field(default_factory=dict)
    # What the endpoint wants as `Authorization: Bearer` (serving/apikey.py); kept out of the config and of repr(),
    # which bench's outputs and errors show.
    api_key: str | None = field(default=None, repr=False)
    # What the cluster says of the engine (serve record, nodes, comm env), read once for the receipt; None: --url.
    served: Served | None = field(default=None, repr=False)
    # Behind a router, each replica's own /metrics (the receipt's deltas sum them); empty: the endpoint's own.
    engine_metrics: tuple[str, ...] = ()


def base_url(url: str) -> str:
    """`host:8000`, `http://host:8000`, `http://host:8000/v1/` -> `http://host:8000/v1` (observe/endpoint.py: never
    a user or password)."""
    address = endpoint_address(url)
    return address if address.endswith("/v1") else address + "/v1"


def from_url(url: str, model: str | None) -> Target:
    """Any endpoint: its key, if it wants one, from this machine's VLLM_API_KEY."""
    return Target(base_url(url), model, {"endpoint": base_url(url), "source": "--url"}, environment_key())


def from_record(record: ServeRecord | None, image_id: str | None, api_key: str | None = None) -> Target:
    """The endpoint and configuration of the last `serve`, from its record on the head."""
    serving = record.serving if record else None
    if record is None or serving is None:
        raise SparkclusterError("nothing is served: the head holds no record of a `sparkcluster serve`",
                                "serve a model first (`sparkcluster serve --tp N --model M`), or give --url")
    docker = record.runtime == "docker"
    verify = serving.verify
    return Target(serving.endpoint, serving.served_name, {
        "endpoint": serving.endpoint, "source": "inventory", "hf_model": serving.model,
        "runtime": record.runtime, "launcher": record.launcher, "tp": serving.tp, "pp": serving.pp,
        "nodes": list(record.nodes), "replicas": max(1, len(serving.replicas)),  # engines behind the router
        "image": record.image if docker else None, "image_id": image_id if docker else None,
        # Recorded by serve where it keeps them; null otherwise, so a reader sees what is not known.
        "recipe": serving.recipe,
        # Masked again: a record serve wrote before it masked its flags holds them as given.
        "recipe_flags": list(masked_argv(serving.flags)),
        "nccl_verdict": None if verify is None else {"backend": verify.backend, "status": str(verify.status),
                                                     "cause": verify.cause},
    }, api_key)


def from_cluster(session: Session, nodes: NodesRead | None = None) -> Target:
    """Read the head's record (one SSH read) and, where docker serves, the head's image ID; the key the endpoint
    wants from this machine's VLLM_API_KEY, else the inventory's serve_env; and what the receipt says of the engine
    and the nodes (receipt_sources.py; `nodes`: as read earlier in the same run)."""
    record, runtime = recorded(session, RuntimeChoice("docker"))
    image_id = None
    if record and record.serving and runtime.name == "docker":
        image_id = inspect(session.transport(session.head), runtime.image).id
    target = from_record(record, image_id, client_api_key(session.inventory, session.head))
    assert record is not None  # from_record refused a cluster with nothing served
    return replace(target, served=read_served(session, record, image_id, nodes),
                   engine_metrics=engine_metrics(session.inventory.every_host, record.serving))


def engine_metrics(hosts: Sequence[Host], serving: Serving | None) -> tuple[str, ...]:
    """Each replica's own /metrics where it answers itself, as `top` reads them (the router's hands the GET to one
    replica in turn); none for one engine, whose /metrics is the endpoint's."""
    return tuple(t.metrics_url for t in replica_targets(hosts, serving))
