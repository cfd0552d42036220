"""One replica started again alone, while the router keeps serving the others: its nodes' main processes stopped,
then started by the very commands serve gives them (router.replica_commands), then waited for as serve waits. What
the supervisor does for a replica that died, wedged, or whose node came back."""

from __future__ import annotations

from ..engine.session import Session
from .image import check_images
from .layout import Placement
from .lifecycle import gone, start
from .nodes import node_env, read_nodes
from .phases import ServeOptions
from .readiness import Diagnosis, Readiness, wait_ready
from .router import replica_commands


def restart_replica(session: Session, opts: ServeOptions, placement: Placement) -> Readiness:
    args = opts.serve_args()
    runtime = opts.runtime_choice()
    if opts.runtime == "docker":
        runtime = runtime.with_image(check_images(session, opts.image)[0])
    nodes = read_nodes(session, opts.layout.tp)
    members = session.only(placement.nodes)
    members.each(lambda h: members.run(h, runtime.on(h).stop_main()))
    start(members, replica_commands(session, runtime, nodes, [placement], args), f"replica {placement.index}",
          runtime.start_fix())
    address = next(h.address for h in session.hosts if h.name == placement.head)
    return wait_ready(f"http://{address}:{placement.port}", args.served_name or args.model, opts.ready_timeout,
                      lambda: gone(members, runtime, "native"),
                      lambda: Diagnosis("", f"read its log: `sparkcluster logs --node {placement.head}`"),
                      node_env(session.inventory, session.head, args.env).api_key)
