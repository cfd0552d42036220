"""The same container image on every node (F16): the head's image is the reference; nodes that lack it or hold
another ID get the head's copy over the fabric, then every ID is compared again."""

from __future__ import annotations

from collections.abc import Callable

from ..engine.errors import SparkclusterError
from ..engine.transport import openssh_argv, ssh_destination
from ..staging.images import ImageInfo, copy_from_head, inspect, plan_copies
from .nodes import Cluster


def check_images(cluster: Cluster, image: str) -> tuple[ImageInfo, list[str]]:
    """The head's image and the nodes that need it copied. Changes nothing."""
    infos = dict(zip((h.name for h in cluster.hosts), cluster.each(lambda h: inspect(cluster.transports[h.name], image))))
    return infos[cluster.head.name], plan_copies(infos, cluster.head.name, image)


def sync_image(cluster: Cluster, image: str, progress: Callable[[str, int, int], None]) -> ImageInfo:
    """Copies the head's image where it is missing or different; returns the head's image."""
    head_info, need = check_images(cluster, image)
    fabric = cluster.fabric_ips()  # from the facts, not the comm env: the image goes over the QSFP link
    users = {h.name: h.user or "root" for h in cluster.hosts}
    for name in need:  # one at a time: the head's disk and CPU feed every copy
        copy_from_head([*openssh_argv(cluster.head), ssh_destination(cluster.head)], image, users[name],
                       fabric[name], name, head_info.size, progress)
    for name in need:
        got = inspect(cluster.transports[name], image).id
        if got != head_info.id:
            raise SparkclusterError(f"{name} holds image {image} as {got}, not the head's {head_info.id}",
                                    f"remove it there (docker rmi {image}) and serve again")
    return head_info
