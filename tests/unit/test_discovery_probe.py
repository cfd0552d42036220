"""discovery's probe line, run by a real shell against a stand-in `ping`: an addressed twin whose every candidate
answers ends its multicast listen then (every re-run of bootstrap), a twin with a silent candidate keeps listening."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sparkcluster.node.discovery import parse_probe, probe_command

# Multicast (ff02::1): waits, then names a neighbour by its link-local address, unless killed first (one process
# to kill, as the real ping is: its sleep goes with it). Unicast: the
# candidates listed in ANSWERING answer at once, the others stay silent until their deadline (cut short here).
FAKE_PING = """#!/bin/sh
for a in "$@"; do last=$a; done
case $last in
  ff02::1*) sleep "$MULTICAST_S" & trap 'kill $!; exit 1' TERM; wait $!; echo "64 bytes from fe80::2%enp1s0f1np1: icmp_seq=1 ttl=64 time=0.1 ms" ;;
  *) case " $ANSWERING " in *" $last "*) echo "64 bytes from $last: icmp_seq=1 ttl=64 time=0.1 ms" ;;
     *) sleep 1; exit 1 ;; esac ;;
esac
"""


def run_probe(tmp_path: Path, candidates: dict[str, tuple[str, ...]], answering: str,
              multicast_s: str) -> dict[str, tuple[str, ...]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ping").write_text(FAKE_PING)
    (bin_dir / "ping").chmod(0o755)
    command = probe_command(tuple(candidates), candidates)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ANSWERING": answering,
           "MULTICAST_S": multicast_s}
    done = subprocess.run(["sh", "-c", command.line()], capture_output=True, text=True, env=env, timeout=20)
    assert done.returncode == 0, done.stderr
    return parse_probe(done.stdout)


def test_an_addressed_twin_whose_candidates_all_answer_stops_listening(tmp_path: Path) -> None:
    # The multicast would take 60 s: the probe ends within subprocess's 20 s only because it is stopped.
    seen = run_probe(tmp_path, {"enp1s0f1np1": ("10.0.0.12", "10.0.0.13")}, "10.0.0.12 10.0.0.13", "60")
    assert seen == {"enp1s0f1np1": ("10.0.0.12", "10.0.0.13")}


def test_a_silent_candidate_keeps_the_multicast_listening(tmp_path: Path) -> None:
    seen = run_probe(tmp_path, {"enp1s0f1np1": ("10.0.0.12", "10.0.0.13")}, "10.0.0.12", "1.5")
    assert seen == {"enp1s0f1np1": ("10.0.0.12", "fe80::2")}


def test_a_twin_without_candidates_listens_on_multicast(tmp_path: Path) -> None:
    seen = run_probe(tmp_path, {"enp1s0f1np1": ()}, "", "0.2")
    assert seen == {"enp1s0f1np1": ("fe80::2",)}
