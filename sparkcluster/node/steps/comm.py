"""comm.env: the node's comm variables, all bound to its own QSFP interface, in one env file.

This is what serve hands to the containers (`docker run --env-file`) and to host-mode Ray/vLLM
(`set -a; . FILE`). Values come from this node's facts only: a worker that copies the head's interface names
binds to a port it may not have cabled (docs/failure-modes.md F19, F22).
"""

from __future__ import annotations

import base64
import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...engine.command import Command
from ...engine.steps.base import HostContext, Plan, Step, StepFailed, register
from ...engine.steps.files import file_state, plan_file, write_file
from ..addressing import routed_control_plane
from ..commtuning import keep_tuning
from ..fabric import Kind
from ..network import COMM_ENV_PATH, NODE_NETDEV, QsfpError, comm_env, qsfp_port, ring_env
from .preflight import facts_of, qsfp_of, ring_of

if TYPE_CHECKING:
    import jinja2


@functools.cache
def _templates() -> jinja2.Environment:
    # jinja2 when the file is first rendered (after connecting), not when a playbook naming comm.env loads.
    from importlib import resources

    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("sparkcluster") / "templates")),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
    )


def render_comm_env(host: str, env: dict[str, str]) -> str:
    return _templates().get_template("comm.env.j2").render(env=env, host=host, generated_by="sparkcluster bootstrap")


@dataclass(frozen=True)
class CommEnvArgs:
    path: str = COMM_ENV_PATH


@register
class CommEnv(Step):
    name = "comm.env"
    Args = CommEnvArgs

    def _content(self, ctx: HostContext) -> str:
        try:
            env = comm_env(qsfp_of(ctx))
        except QsfpError as e:
            raise StepFailed(e.message, e.fix) from None
        fabric = ring_of(ctx)
        if fabric is not None and fabric.kind is Kind.RING:
            facts = facts_of(ctx)
            if routed_control_plane(ctx.inventory, ctx.host):  # its node address, routed over the cables
                node = facts.interface(NODE_NETDEV)
                if node is None or not node.ipv4:
                    raise StepFailed(f"{ctx.host.name} has no node address on {NODE_NETDEV}: on a ring the control "
                                     "plane binds to it (fabric.control_plane: routed)",
                                     "run bootstrap again (fabric.addresses gives it), or set vars: {fabric: "
                                     "{control_plane: lan}} to bind the control plane to the management LAN")
                control: tuple[str, str] | None = (NODE_NETDEV, str(node.ipv4[0].ip))
            else:
                control = next(((i.name, str(a.ip)) for i in facts.interfaces for a in i.ipv4
                                if str(a.ip) == ctx.host.address), None)
            if control is None:
                raise StepFailed(f"{ctx.host.name}: its inventory address {ctx.host.address} is on none of its "
                                 "interfaces: on a ring the control plane needs an address every node reaches",
                                 "give the node's management LAN address (enP7s7) as its address: in the inventory, "
                                 "or set vars: {fabric: {control_plane: routed}}")
            hcas = [d.hca for d in facts.rdma if d.up and qsfp_port(d.netdev) is not None]
            prefix = next((l.subnet.prefixlen for l in fabric.links if l.subnet), 24)
            env = ring_env(env, len(fabric.nodes), hcas, control[1], control[0], prefix)
        return keep_tuning(self._current(ctx), render_comm_env(ctx.host.name, env))

    def _current(self, ctx: HostContext) -> str:
        """The file as it is (empty where missing or unreadable: plan_file says which), for verify --tune's block."""
        state = ctx.read(file_state(self.args.path)).stdout.split()
        return base64.b64decode(state[1]).decode(errors="replace") if len(state) == 2 else ""

    def reads(self, ctx: HostContext) -> tuple[Command, ...]:
        return (file_state(self.args.path),)

    def check(self, ctx: HostContext) -> Plan:
        return plan_file(ctx, self.args.path, self._content(ctx), "0644")

    def apply(self, ctx: HostContext, plan: Plan) -> None:
        write_file(ctx, self.args.path, self._content(ctx), "0644")
