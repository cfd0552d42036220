"""The same container image on every node (F16): the head's image is the reference; nodes that lack it or hold
another ID get the layers they lack from the head over the fabric, then every ID is compared again.
`sparkcluster image sync` and serve's image phase both run `sync_image`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.errors import SparkclusterError
from ..engine.session import Session
from ..staging.hops import image_hops
from ..staging.images import ImageBytes, ImageInfo, inspect, plan_copies, sync_along
from .record import fabric_ips


@dataclass
class ImageSync:
    image: str
    head: ImageInfo
    sent: dict[str, int] = field(default_factory=dict)  # bytes that crossed the fabric to each node that needed it
    ids: dict[str, str | None] = field(default_factory=dict)  # every node's image ID afterwards


class MissingImage(SparkclusterError):
    """The head lacks the image: what to build is the caller's to say (a recipe knows its build command)."""

    def __init__(self, head: str, image: str) -> None:
        super().__init__(f"the head {head} has no image {image!r}",
                         f"build or pull it on {head} (eugr: ./build-and-copy.sh), or name another with --image")
        self.head, self.image = head, image


def check_images(session: Session, image: str) -> tuple[ImageInfo, list[str]]:
    """The head's image and the nodes that need it copied (MissingImage where the head has none). Changes
    nothing."""
    infos = dict(zip((h.name for h in session.hosts), session.each(lambda h: inspect(session.transports[h.name], image))))
    if infos[session.head.name].id is None:
        raise MissingImage(session.head.name, image)
    return infos[session.head.name], plan_copies(infos, session.head.name, image)


def sync_image(session: Session, image: str, progress: Callable[[ImageBytes], None]) -> ImageSync:
    """Copies the head's image where it is missing or different, then checks the ID on every node."""
    head_info, need = check_images(session, image)
    hosts = {h.name: h for h in session.hosts}
    # Along the cables, with the addresses from the facts (not the comm env): the head to every node at once where
    # one subnet joins them, else a chain through neighbours (a ring), each hop after the one that fed its source.
    sent = sync_along(image_hops(session.head.name, list(hosts), need, session.facts, fabric_ips(session)), hosts,
                      session.transports, image, head_info, progress)
    ids = dict(zip((h.name for h in session.hosts),
                   session.each(lambda h: inspect(session.transports[h.name], image).id)))
    wrong = {name: got for name, got in ids.items() if got != head_info.id}
    if wrong:
        name, got = next(iter(wrong.items()))
        raise SparkclusterError(f"{name} holds image {image} as {got}, not the head's {head_info.id}",
                                f"remove it there (docker rmi {image}) and run `sparkcluster image sync {image}` again")
    return ImageSync(image, head_info, sent, ids)
