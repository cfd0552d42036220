"""The tests' one fake transport (tests/support/fake_transport.py) and the real one satisfy the same Protocol,
member by member with the same signatures, so a fake can stand where the engine takes a Transport."""

from __future__ import annotations

import inspect

import pytest

from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host
from sparkcluster.engine.transport import Transport, Unreachable
from tests.support.fake_transport import FakeTransport, Transporting
from tests.support.strict_transport import StrictTransport

MEMBERS = [name for name in dir(Transporting) if not name.startswith("_")]


def test_the_protocol_names_what_the_engine_calls():
    assert MEMBERS == ["close", "host_key", "read_file", "reconnect", "run", "write_file_atomic"]


@pytest.mark.parametrize("name", MEMBERS)
def test_the_real_transport_and_the_fakes_have_each_member_with_the_protocols_signature(name):
    wanted = inspect.signature(getattr(Transporting, name))
    assert inspect.signature(getattr(Transport, name)) == wanted
    assert inspect.signature(getattr(FakeTransport, name)) == wanted


def test_the_fake_and_the_real_transport_are_each_a_transporting():
    real = Transport(Host("spark-1", "10.0.0.1", role="head"))  # not connected: it connects on first use
    assert isinstance(real, Transporting) and isinstance(FakeTransport(), Transporting)
    assert isinstance(StrictTransport(), Transporting)


def test_the_fake_answers_from_its_script_else_its_answer_and_keeps_files():
    fake = FakeTransport("spark-2", [("^docker", 3, "", "no daemon")], answer=(1, "out", "err"))
    assert fake.host.name == "spark-2"
    assert (fake.run(Command("docker info")).exit_code, fake.run(Command("true")).stdout) == (3, "out")
    assert fake.ran == ["docker info", "true"]
    fake.write_file_atomic("/etc/x", b"1", 0o644)
    assert fake.read_file("/etc/x") == b"1" and fake.read_file("/etc/y") is None
    with pytest.raises(Unreachable, match="cannot connect to spark-3"):
        FakeTransport("spark-3", unreachable=True).run(Command("true"))
