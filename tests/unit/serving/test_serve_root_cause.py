"""A vLLM that fails at start is told by its root cause (issue 43): the first exception and its message, read from
the logs of the launch (the head's vLLM beside Ray, each node's Ray or vLLM rank), with where to read them whole;
not the last lines of the log, which end the last traceback ("Engine core initialization failed. See root cause
above."). Real captures of the CPU vLLM failing (tests/fixtures/vllm/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkcluster.engine.command import Command
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.engine.transport import Result
from sparkcluster.serving.lifecycle import diagnosis
from sparkcluster.serving.readiness import NotReady, wait_ready
from sparkcluster.serving.rootcause import LogRead, first_error, root_cause
from sparkcluster.serving.runtime import RuntimeChoice

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
RAY_UNSUPPORTED = "ValueError: current platform cpu does not support ray."
TOO_LONG = ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig Value error, "
            "User-specified max_model_len (99999999) is greater than the derived max_model_len "
            "(max_position_embeddings=2048.0 or model_max_length=None in model's config.json).")


def lines(name: str) -> list[str]:
    return (FIXTURES / name).read_text().splitlines()


class Node:
    """A node whose logs are the given texts, by the file its runtime tails."""

    def __init__(self, logs: dict[str, str]) -> None:
        self.logs = logs

    def run(self, command: Command) -> Result:
        text = next((text for log, text in self.logs.items() if f"{log}.log" in command.script), "")
        return Result(command, 0, text, "", 0.0)

    def close(self) -> None:
        pass


def cluster(head: dict[str, str], worker: dict[str, str]) -> Session:
    hosts = (Host("spark-1", "10.0.0.1", "head", vars={"python_env": "/opt/venv"}),
             Host("spark-2", "10.0.0.2", "worker", vars={"python_env": "/opt/venv"}))
    return Session(Inventory(Path("inv.yml"), "t", hosts, {}),
                   {"spark-1": Node(head), "spark-2": Node(worker)})  # type: ignore[dict-item]


def refused(session: Session, launcher: str) -> NotReady:
    with pytest.raises(NotReady) as e:
        wait_ready("http://127.0.0.1:9", "m", 30, lambda: "vLLM on spark-1 exited",
                   lambda: diagnosis(session, RuntimeChoice("host"), launcher))  # type: ignore[arg-type]
    return e.value


def test_the_issues_ray_serve_on_the_cpu_vllm_is_told_by_its_engine_cores_valueerror():
    """The report: serve printed the log's last lines, the end of the API server's traceback, and not the engine
    core's ValueError above them (failed before)."""
    log = (FIXTURES / "cpu-0.32-ray-unsupported.log").read_text()
    error = refused(cluster({"vllm": log, "main": "Ray runtime started.\n"}, {"main": "Ray runtime started.\n"}),
                    "ray")
    assert f"vLLM's error: {RAY_UNSUPPORTED} (spark-1's vLLM log, EngineCore)" in error.message, str(error)
    assert "Engine core initialization failed" not in str(error)
    assert error.fix == "the whole log: `sparkcluster logs --runtime host --node spark-1 -n 1000`"


@pytest.mark.parametrize("name, text, process", [
    ("cpu-0.32-ray-unsupported.log", RAY_UNSUPPORTED, "EngineCore"),
    ("cpu-0.32-max-model-len-too-long.log", TOO_LONG, ""),  # the traceback has no process prefix
    ("cpu-0.32-unrecognized-flag.log", "vllm: error: unrecognized arguments: --no-such-flag 3", ""),
])
def test_each_real_failure_is_its_first_exception_with_its_message(name, text, process):
    error = first_error(lines(name))
    assert error is not None and error.process == process and not error.logged_only
    assert error.text.startswith(text), error.text
    assert "For further information visit" not in error.text  # pydantic's link to its docs is no reason


def test_the_earliest_error_across_the_nodes_logs_is_the_root_cause():
    """Native multi-node: the worker's rank failed first; the head failed after it, for that reason."""
    worker = ["(EngineCore pid=7) INFO 11-27 16:25:10 [core.py:90] starting",
              "(Worker_TP1 pid=9) ERROR 11-27 16:25:12 [multiproc.py:1] WorkerProc failed to start.",
              "(Worker_TP1 pid=9) ERROR 11-27 16:25:12 [multiproc.py:1] Traceback (most recent call last):",
              '(Worker_TP1 pid=9) ERROR 11-27 16:25:12 [multiproc.py:1]   File "x.py", line 1, in f',
              "(Worker_TP1 pid=9) ERROR 11-27 16:25:12 [multiproc.py:1] torch.OutOfMemoryError: 40 GiB requested"]
    cause = root_cause([LogRead("spark-1", "vLLM log", tuple(lines("cpu-0.32-ray-unsupported.log"))),
                        LogRead("spark-2", "vLLM log", tuple(worker))])
    assert cause is not None
    assert cause.describe() == "torch.OutOfMemoryError: 40 GiB requested (spark-2's vLLM log, Worker_TP1)"


def test_an_exception_outranks_an_earlier_error_line_and_a_clean_log_has_none():
    logged = ["INFO 11-27 16:25:01 [a.py:1] up", "ERROR 11-27 16:25:02 [b.py:2] Worker proc died unexpectedly"]
    assert first_error(["INFO 11-27 16:25:01 [a.py:1] up"]) is None
    error = first_error(logged)
    assert error is not None and error.logged_only and error.text == "Worker proc died unexpectedly"
    cause = root_cause([LogRead("spark-1", "vLLM log", tuple(logged)),
                        LogRead("spark-2", "vLLM log", tuple(lines("cpu-0.32-ray-unsupported.log")))])
    assert cause is not None and cause.error.text == RAY_UNSUPPORTED


def test_logs_that_name_no_error_still_show_their_last_lines_and_where_to_read_them():
    error = refused(cluster({"main": "\n".join(f"INFO line {i}" for i in range(40))}, {"main": ""}), "native")
    assert "vLLM's error" not in error.message
    assert "last lines of the vLLM log on spark-1:\n    INFO line 25" in error.fix and "INFO line 24" not in error.fix
    assert error.fix.endswith("the whole log: `sparkcluster logs --runtime host --node spark-1 -n 1000`")
