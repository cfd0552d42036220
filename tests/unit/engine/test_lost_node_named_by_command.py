"""Round 5's wrong messages M4 and M5 (second bullet): a node that drops off mid-command is named with the
command's name (`the facts probe`, `blobwire fetch <blob>`), never the whole script its line carries."""

from __future__ import annotations

import pytest

from sparkcluster.engine import facts
from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host
from sparkcluster.engine.transport import Transport, Unreachable
from sparkcluster.staging.wire import fetch_command


class DroppedConnection:
    """A connection whose node went away: opening a channel fails as paramiko's does on a dead transport."""

    transport = property(lambda self: self)
    is_connected = True

    def open_session(self) -> None:
        raise EOFError("Connection closed by remote host")


def dropped_off(command: Command, monkeypatch: pytest.MonkeyPatch) -> Unreachable:
    t = Transport(Host("spark-3", "192.168.103.13", "worker"))
    monkeypatch.setattr(t, "_connect", lambda: DroppedConnection())
    with pytest.raises(Unreachable) as caught:
        t.run(command)
    return caught.value


def test_a_node_lost_mid_facts_is_named_with_the_facts_probe_not_its_script(monkeypatch):
    error = dropped_off(facts.PROBE, monkeypatch)
    assert error.message == ("192.168.103.13 dropped off while running the facts probe: "
                             "Connection closed by remote host")


def test_a_node_lost_mid_fetch_is_named_with_blobwire_fetch_and_its_blob(monkeypatch):
    blob = "a" * 64
    command = fetch_command("python3", "10.103.2.11:36815", "10.103.2.12", "/m/blobs", blob, 10, "t" * 64)
    error = dropped_off(command, monkeypatch)
    assert error.message == (f"192.168.103.13 dropped off while running `blobwire fetch {blob}` from "
                             "10.103.2.11:36815: Connection closed by remote host")
    assert "\n" not in error.message and "Blobs over plain TCP" not in error.message


def test_an_unnamed_script_is_quoted_by_its_first_line_only():
    script = "set -e\n" + "echo x\n" * 300
    assert Command(script).label() == "`set -e ...`"
    long_line = "echo " + "y" * 500
    assert Command(long_line).label() == f"`{long_line[:100]} ...`"
    assert Command.argv(["true"]).label() == "`true`"
