"""discovery's probe line, run by a real shell against a stand-in `ping` that answers as a simulated switch does.

The case that broke a loaded CI run: two nodes on a switch, re-bootstrapped. The unicast echoes to the other node
answer at once; what tells the switch from a direct cable is a third voice (the switch's own address) that only
the multicast hears. An early end keyed on the unicast answers alone stopped the multicast before a loaded ping had
read that voice, so one twin read as a cable and the other as a switch ("cabled directly and through a switch")."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from sparkcluster.node.discovery import parse_probe, probe_command

OWN, PEER, SWITCH = "fe80::1", "fe80::2", "fe80::99"

# Multicast (ff02::1): reads the answers to its first echo late (READ_S: a loaded node), those to its second echo
# SECOND_S later (a second on a real node), then lasts 60 s unless stopped (one process to stop, as the real ping
# is: its sleeps go with it).
# Unicast: the candidates in ANSWERING answer at once, the others stay silent until their deadline (cut short here).
FAKE_PING = f"""#!/bin/sh
for a in "$@"; do last=$a; done
# The sleep's stdout is not the pipe: a TERM that lands between its fork and `s=$!` leaves it running, and it
# must not hold the probe's pipe open as the real ping (one process) never does.
nap() {{ sleep "$1" >/dev/null & s=$!; wait $s; }}
trap 'kill $s 2>/dev/null; exit 1' TERM
case $last in
  ff02::1*)
    nap "$READ_S"
    for who in {OWN} {SWITCH} {PEER}; do echo "64 bytes from $who%enp1s0f1np1: icmp_seq=1 ttl=64 time=0.1 ms"; done
    nap "$SECOND_S"
    echo "64 bytes from {OWN}%enp1s0f1np1: icmp_seq=2 ttl=64 time=0.1 ms"
    nap "$LAST_S"; exit 1 ;;
  *) case " $ANSWERING " in *" $last "*) echo "64 bytes from $last: icmp_seq=1 ttl=64 time=0.1 ms" ;;
     *) nap 1; exit 1 ;; esac ;;
esac
"""


def run_probe(tmp_path: Path, candidates: dict[str, tuple[str, ...]], answering: str, *, read_s: float = 0.5,
              last_s: float = 60, link_local: tuple[str, ...] | None = None) -> dict[str, tuple[str, ...]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "ping").write_text(FAKE_PING)
    (bin_dir / "ping").chmod(0o755)
    command = probe_command(tuple(candidates), candidates, link_local)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ANSWERING": answering,
           "READ_S": str(read_s), "LAST_S": str(last_s), "SECOND_S": "0.3"}
    done = subprocess.run(["sh", "-c", command.line()], capture_output=True, text=True, env=env, timeout=20)
    assert done.returncode == 0, done.stderr
    return parse_probe(done.stdout)


def test_a_switched_twin_keeps_the_voice_only_the_multicast_hears(tmp_path: Path) -> None:
    # The unicast answers at once, the multicast's answers are read half a second later: the stranger (the
    # switch) is still in the twin's line. The multicast would last 60 s: the probe ends within subprocess's 20 s
    # because it is stopped after its second echo's answer.
    seen = run_probe(tmp_path, {"enp1s0f1np1": ("10.0.0.12",)}, "10.0.0.12", read_s=0.5)
    assert seen == {"enp1s0f1np1": ("10.0.0.12", OWN, PEER, SWITCH)}


def test_a_silent_candidate_keeps_the_multicast_listening_to_its_end(tmp_path: Path) -> None:
    seen = run_probe(tmp_path, {"enp1s0f1np1": ("10.0.0.12", "10.0.0.13")}, "10.0.0.12", read_s=0.1, last_s=1)
    assert seen == {"enp1s0f1np1": ("10.0.0.12", OWN, PEER, SWITCH)}


def test_a_twin_without_candidates_listens_on_multicast(tmp_path: Path) -> None:
    seen = run_probe(tmp_path, {"enp1s0f1np1": ()}, "", read_s=0.1, last_s=0.2)
    assert seen == {"enp1s0f1np1": (OWN, PEER, SWITCH)}


def test_a_twin_without_link_local_sends_no_multicast(tmp_path: Path) -> None:
    # No source address on the twin's link: nobody could answer a multicast echo, so none is sent (the stand-in
    # would answer one, and last 60 s); the other twin, with its link-local address, still listens.
    twins = {"enp1s0f1np1": ("10.0.0.12",), "enP2p1s0f1np1": ("10.0.1.12",)}
    command = probe_command(tuple(twins), twins, ["enP2p1s0f1np1"])
    assert "ff02::1%enp1s0f1np1" not in command.script and "ff02::1%enP2p1s0f1np1" in command.script
    # Nothing is written on the node (bootstrap --check must leave it as it was): no redirection but stderr's.
    assert "mktemp" not in command.script and command.script.replace("2>/dev/null", "").count(">") == 0
    seen = run_probe(tmp_path, twins, "10.0.0.12 10.0.1.12", read_s=0.1, link_local=("enP2p1s0f1np1",))
    assert seen == {"enp1s0f1np1": ("10.0.0.12",), "enP2p1s0f1np1": ("10.0.1.12", OWN, PEER, SWITCH)}
