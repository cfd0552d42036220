"""The values serving hands to the other wings: the versioned serve record on the head (what status, logs,
down and bench read), and serve's one event stream (its stage phase shows each node's progress, as `stage` does)."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from sparkcluster.bench.target import from_record
from sparkcluster.engine.errors import SparkclusterError
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.modelref import ModelRef
from sparkcluster.engine.session import Session
from sparkcluster.nccl.verdict import VerdictStatus
from sparkcluster.serving import phases
from sparkcluster.serving.record import ProbeSummary, ServeRecord, Serving, read_record
from sparkcluster.serving.render import progress_printer
from sparkcluster.staging.chain import BlobDone, NodeResult, StageResult

SERVED = ServeRecord("docker", "ray", "vllm-node", ("spark-1", "spark-2"), Serving(
    "org/model", "model", 8000, "http://10.0.0.1:8000/v1", 2, "default", ("--max-model-len", "512"),
    ProbeSummary("nccl", VerdictStatus.PASS, "NET/IB on roceP2p1s0f1"), pp=2))


def test_the_record_round_trips_through_json_with_its_version():
    doc = json.loads(json.dumps(SERVED.to_json()))
    assert doc["version"] == 4 and doc["serving"]["verify"]["status"] == "PASS"
    assert doc["serving"]["tp"] == 2 and doc["serving"]["pp"] == 2
    assert ServeRecord.from_json(doc) == SERVED


def version_1(doc: dict) -> dict:
    """A record as a version 1 serve wrote it: no pp (it served tensor parallel only)."""
    serving = {k: v for k, v in doc["serving"].items() if k != "pp"}
    return {**doc, "version": 1, "serving": serving}


@pytest.mark.parametrize("unversioned", [False, True])
def test_a_version_1_record_still_reads_as_pipeline_parallel_1(unversioned):
    doc = version_1(SERVED.to_json())
    if unversioned:  # written before records carried a version: read as version 1
        del doc["version"]
    read = ServeRecord.from_json(json.loads(json.dumps(doc)))
    assert read.serving is not None and read.serving.pp == 1 and read.serving.tp == 2
    assert read == ServeRecord(SERVED.runtime, SERVED.launcher, SERVED.image, SERVED.nodes,
                               replace(SERVED.serving, pp=1))


@pytest.mark.parametrize("change, needle", [
    ({"version": 5}, "version 5"),
    ({"runtime": "podman"}, "runtime 'podman'"),
])
def test_a_record_this_version_cannot_read_is_named_with_the_fix(change, needle):
    class Head:
        def read_file(self, path: str) -> bytes:
            return json.dumps({**SERVED.to_json(), **change}).encode()
    session = Session(Inventory(Path("inv.yml"), "t", (Host("spark-1", "10.0.0.1", role="head"),), {}),
                      {"spark-1": Head()})  # type: ignore[dict-item]
    with pytest.raises(SparkclusterError) as caught:
        read_record(session)
    assert needle in caught.value.message and "sparkcluster down" in caught.value.fix


def test_bench_reads_the_probe_verdict_that_serve_records():
    target = from_record(SERVED, "sha256:abc")
    assert target.base_url == "http://10.0.0.1:8000/v1" and target.model == "model"
    assert target.config["nccl_verdict"] == {"backend": "nccl", "status": "PASS", "cause": "NET/IB on roceP2p1s0f1"}
    assert target.config["recipe_flags"] == ["--max-model-len", "512"] and target.config["image_id"] == "sha256:abc"
    assert target.config["tp"] == 2 and target.config["pp"] == 2  # a TP x PP serve is not described as TP only


def test_bench_without_a_serve_record_says_what_to_do():
    with pytest.raises(SparkclusterError, match="nothing is served"):
        from_record(ServeRecord("docker", "ray", "vllm-node", ("spark-1",)), None)


def test_serves_stage_phase_shows_each_nodes_progress(monkeypatch):
    """The events `stage` emits reach serve's renderer: a line per blob per node, as `sparkcluster stage` prints."""
    def fake_stage(session, model, *, progress):
        for node in ("spark-2", "spark-3"):
            progress(BlobDone(node, "sha", "model.safetensors", 2_000_000, 0.5, 1, 1))
        return StageResult(str(model), "c" * 40, "spark-1", {n: NodeResult("absent", state="complete")
                                                             for n in ("spark-2", "spark-3")})
    monkeypatch.setattr(phases, "stage", fake_stage)
    shown = io.StringIO()
    phases.stage_model(Session(Inventory(Path("i.yml"), "t", (), {}), {}), ModelRef.parse("org/model"),
                       progress_printer(Console(file=shown, width=200)))
    assert shown.getvalue().splitlines() == [
        "spark-2 <- 1/1 model.safetensors 2 MB in 0.5 s (4 MB/s)",
        "spark-3 <- 1/1 model.safetensors 2 MB in 0.5 s (4 MB/s)"]
