"""Whether a running Ray cluster may be reused: the fingerprint of every node's start command and comm env file,
and the record that keeps it on the head (older records without one read as not reusable)."""

from __future__ import annotations

from sparkcluster.engine.command import Command
from sparkcluster.serving.record import ServeRecord
from sparkcluster.serving.reuse import ray_fingerprint
from tests.support.serving import COMMANDS, session


def test_the_fingerprint_changes_with_a_command_or_a_comm_env_and_only_then():
    base = ray_fingerprint(session(b"VLLM_HOST_IP=2\n"), COMMANDS)
    assert base == ray_fingerprint(session(b"VLLM_HOST_IP=2\n"), COMMANDS)
    assert base != ray_fingerprint(session(b"VLLM_HOST_IP=3\n"), COMMANDS)
    other = {**COMMANDS, "spark-2": Command("docker run --no-cache ... ray start")}
    assert base != ray_fingerprint(session(b"VLLM_HOST_IP=2\n"), other)
    token = {**COMMANDS, "spark-2": Command("docker run ... ray start", stdin="HF_TOKEN=hf_new\n\n")}
    assert base != ray_fingerprint(session(b"VLLM_HOST_IP=2\n"), token)  # a secret changed, off the line


def test_the_record_keeps_the_fingerprint_and_an_old_record_has_none():
    record = ServeRecord("docker", "ray", "vllm-node", ("spark-1", "spark-2"), ray_fingerprint="abc")
    assert ServeRecord.from_json(record.to_json()) == record
    old = record.to_json()
    del old["ray_fingerprint"]
    assert ServeRecord.from_json(old).ray_fingerprint is None
