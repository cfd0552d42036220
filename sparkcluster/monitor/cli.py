"""`sparkcluster monitor up | down | status`: the cluster seen from outside. `up` starts each node's exporter and
the distribution's Prometheus on the head (or on this machine with --here), configured for every node, engine or
replica, the router and the supervisor, with sparkcluster's alert and recording rules, and with --notify its
Alertmanager posting alerts to a webhook; idempotent, --check shows what it would do. `down` stops them and keeps Prometheus' data unless --purge. `status` says what runs and which
targets Prometheus sees up."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..engine.cliapp import App, Connect
from ..engine.errors import EXIT_FAILED, EXIT_OK, SparkclusterError
from .alerting import notify_url
from .deploy import DEFAULT_LISTEN

LISTEN = re.compile(r"(?P<host>[0-9A-Za-z.\-]+|\[[0-9a-fA-F:]+\]):(?P<port>\d{1,5})")


def listen_address(text: str) -> str:
    m = LISTEN.fullmatch(text)
    if not m or not 0 < int(m["port"]) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN}, or 0.0.0.0:9095 to "
                                         "open Prometheus to the LAN)")
    return text


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (1-65535)")
    return int(text)


def resolved_addresses(hosts: Any) -> dict[str, str]:
    """Each host's inventory address as ssh resolves it (an ssh_config alias's HostName): what Prometheus can
    reach, where the alias means nothing to it."""
    from ..engine.sshtarget import load_ssh_config

    config = load_ssh_config()
    return {h.name: str(config.lookup(h.address).get("hostname", h.address)) for h in hosts}


def _places(args: argparse.Namespace, session: Any) -> Any:
    from .place import LocalPlace, NodePlace

    if args.here:
        return LocalPlace()
    head = session.head
    if head.name in session.unreachable:
        raise SparkclusterError(f"{head.name} (the head, where Prometheus runs) cannot be reached: "
                         f"{session.unreachable[head.name].message}",
                         "bring the head back, or run Prometheus here with --here")
    return NodePlace(head.name, session.transport(head))


def cmd_up(args: argparse.Namespace, connect: Connect) -> int:
    from ..engine.remote import python_of
    from ..serving.record import read_record
    from . import deploy
    from .alerting import alertmanager_config
    from .config import prometheus_config
    from .packaged import rule_paths
    from .place import NodePlace
    from .targets import targets_of

    with connect(args, require_all=False) as session:
        place = _places(args, session)  # an unreachable head stops `up` here, before any node changes
        record = read_record(session) if session.head.name not in session.unreachable else None
        targets = targets_of(session.hosts, session.head, record, on_head=not args.here,
                             exporter_port=args.exporter_port, addresses=resolved_addresses(session.hosts))
        rules = {f"rules/{p.name}": p.read_bytes() for p in rule_paths()}
        notify = deploy.alertmanager() if args.notify else None
        files = {"prometheus.yml": prometheus_config(targets, sorted(rules),
                                                     alertmanager=notify.listen if notify else None).encode(), **rules}
        reachable = [h for h in session.hosts if h.name not in session.unreachable]
        outcomes = [deploy.Outcome(name, "exporter", "failed", f"unreachable: {e.message}")
                    for name, e in session.unreachable.items()]
        # Every address of the node: Prometheus reaches it by the one it knows, whichever that is on the node.
        outcomes += session.each(lambda h: deploy.exporter_up(NodePlace(h.name, session.transport(h)), python_of(h),
                                                              "0.0.0.0", args.exporter_port, args.check), reachable)
        if notify is not None:  # Alertmanager first: Prometheus sends to it from its first evaluation
            outcomes.append(deploy.daemon_up(place, notify, {"alertmanager.yml": alertmanager_config(args.notify)
                                                             .encode()}, args.check))
        elif deploy.running(place, "alertmanager"):  # --notify dropped: nothing sends to it any more
            outcomes.append(deploy.Outcome(place.name, "alertmanager", "would change", "would stop it (no --notify)")
                            if args.check else deploy.stop(place, "alertmanager", purge=False))
        outcomes.append(deploy.prometheus_up(place, files, args.listen, args.check))
    return _report(args, outcomes, {"listen": args.listen, "here": args.here, "notify": bool(args.notify),
                                    "targets": [{"job": t.job, "address": t.address, **dict(t.labels)}
                                                for t in targets.all()], "served": targets.served})


def cmd_down(args: argparse.Namespace, connect: Connect) -> int:
    from . import deploy
    from .place import NodePlace

    with connect(args, require_all=False) as session:
        reachable = [h for h in session.hosts if h.name not in session.unreachable]
        place = _places(args, session)
        outcomes = [deploy.stop(place, "prometheus", args.purge), deploy.stop(place, "alertmanager", args.purge)]
        outcomes += session.each(lambda h: deploy.stop(NodePlace(h.name, session.transport(h)), "exporter",
                                                       args.purge), reachable)
        outcomes += [deploy.Outcome(n, "exporter", "failed", f"unreachable: {e.message}")
                     for n, e in session.unreachable.items()]
    return _report(args, outcomes, {"purged": args.purge})


def cmd_status(args: argparse.Namespace, connect: Connect) -> int:
    from . import deploy
    from .place import NodePlace

    with connect(args, require_all=False) as session:
        place = _places(args, session)
        exporters = {h.name: deploy.running(NodePlace(h.name, session.transport(h)), "exporter")
                     for h in session.hosts if h.name not in session.unreachable}
        prometheus = deploy.running(place, "prometheus")
        notifying = deploy.running(place, "alertmanager")
        health = deploy.targets_health(place, args.listen) if prometheus else "Prometheus is not running there"
    doc: dict[str, Any] = {"prometheus": {"place": place.name, "listen": args.listen, "running": prometheus},
                           "alertmanager": {"running": notifying},
                           "exporters": {n: ("running" if up else "stopped") for n, up in exporters.items()}
                           | {n: "unreachable" for n in session.unreachable},
                           "targets": health if isinstance(health, list) else None,
                           "error": health if isinstance(health, str) else None}
    # No target yet is no health yet: Prometheus lists its targets a moment after it starts.
    healthy = prometheus and all(exporters.values()) and not session.unreachable and isinstance(health, list) \
        and bool(health) and all(t["health"] == "up" for t in health)
    if args.json:
        from ..engine.report import print_json

        print_json(doc | {"healthy": healthy})
    else:
        from ..engine.console import out

        out.print(f"prometheus on {place.name} ({args.listen}): {'running' if prometheus else 'not running'}; "
                  f"alertmanager (--notify): {'running' if notifying else 'not running'}", highlight=False)
        for name, state in doc["exporters"].items():
            out.print(f"  exporter on {name}: {state}", highlight=False)
        for t in health if isinstance(health, list) else ():
            who = " ".join(x for x in (t["node"], t["replica"]) if x)
            out.print(f"  target {t['job']} {who}: {t['health']}" + (f" ({t['error']})" if t["error"] else ""),
                      highlight=False)
        if isinstance(health, str):
            out.print(f"  {health}", highlight=False)
    return EXIT_OK if healthy else EXIT_FAILED


def _report(args: argparse.Namespace, outcomes: list[Any], extra: dict[str, Any]) -> int:
    failed = any(o.status == "failed" for o in outcomes)
    if args.json:
        from ..engine.report import print_json

        print_json({"outcomes": [o.to_json() for o in outcomes], **extra, "failed": failed})
    else:
        from ..engine.console import out

        for o in outcomes:
            out.print(f"{o.status:<12} {o.piece:<10} {o.place}: {o.reason}", highlight=False)
        if "listen" in extra and not failed:
            out.print(f"prometheus: http://{extra['listen']} on {outcomes[-1].place} "
                      f"({len(extra['targets'])} targets); `sparkcluster monitor status` lists them", highlight=False)
    return EXIT_FAILED if failed else EXIT_OK


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser], app: App) -> None:
    monitor = commands.add_parser("monitor", help="Prometheus on the head: every node's metrics, the engines', "
                                                  "alert and recording rules")
    sub = monitor.add_subparsers(dest="monitor_command", required=True, metavar="up|down|status")
    up = app.connecting(sub.add_parser("up", help="start each node's exporter and Prometheus (idempotent)"))
    up.add_argument("--check", action="store_true", help="show what would change; change nothing")
    up.add_argument("--notify", type=notify_url, metavar="URL",
                    help="also run the distribution's Alertmanager, posting every alert and its resolution to this "
                         "webhook (the URL is kept in a private file only); without it a running one is stopped")
    up.add_argument("--exporter-port", type=port_number, default=9839,
                    help="the port each node's exporter serves on (default 9839)")
    down = app.connecting(sub.add_parser("down", help="stop Prometheus, Alertmanager and the exporters; their data is "
                                                      "kept"))
    down.add_argument("--purge", action="store_true", help="also remove Prometheus' data and the exporters' files")
    status = app.connecting(sub.add_parser("status", help="what runs, and which targets Prometheus sees up"))
    for p in (up, down, status):
        p.add_argument("--here", action="store_true",
                       help="Prometheus on this machine rather than on the head (give it to down and status too)")
        p.add_argument("--listen", type=listen_address, default=DEFAULT_LISTEN,
                       help=f"Prometheus' HOST:PORT (default {DEFAULT_LISTEN}: loopback; `status` asks it over SSH)")
    app.wire(up, cmd_up)
    app.wire(down, cmd_down)
    app.wire(status, cmd_status)
