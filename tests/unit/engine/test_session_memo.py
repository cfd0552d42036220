"""The session's run memo: what a run works out once (the fabric) is shared by every narrowing of the session and
worked out once when every node's step asks at the same moment; a new session (a new run) starts empty."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session


def session() -> Session:
    hosts = (Host("spark-1", "10.0.0.1", role="head"), Host("spark-2", "10.0.0.2", role="worker"))
    return Session(Inventory(Path("inv.yml"), "t", hosts, {}), {})


def test_one_value_per_run_shared_by_narrowed_sessions_and_concurrent_askers() -> None:
    s = session()
    made: list[int] = []

    def make() -> str:
        time.sleep(0.05)  # every asker arrives while the first is still working it out
        made.append(1)
        return "fabric"

    got: list[str] = []
    askers = [threading.Thread(target=lambda: got.append(s.only(["spark-2"]).memo.get("k", make))) for _ in range(4)]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    assert got == ["fabric"] * 4 and made == [1]
    assert s.memo.get("k", lambda: "again") == "fabric"
    assert session().memo.get("k", lambda: "new run") == "new run"  # no global keyed by an object's id


def test_forget_makes_the_next_reader_work_it_out_again() -> None:
    s = session()
    s.memo.get("k", lambda: 1)
    s.only(["spark-1"]).memo.forget("k")
    assert s.memo.get("k", lambda: 2) == 2
