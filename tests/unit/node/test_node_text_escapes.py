"""Round 5's M6: text a node wrote (nvidia-smi's output, interface names) reaches the terminal as text, never as
escape sequences that clear the screen or set the window's title; an odd interface name is shown by its name.
(The driver check reading `ESC]0;...BEL ESC[2J590.48.01` as 590.48.01: tests/fixtures/steps/round5-node-text.json.)"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from sparkcluster.doctor.render import render as render_doctor
from sparkcluster.doctor.run import DoctorReport
from sparkcluster.engine.facts import parse_probe
from sparkcluster.engine.nodetext import printable
from sparkcluster.engine.report import facts_table
from sparkcluster.node.cli import render as render_topology
from sparkcluster.node.discovery import Checked
from sparkcluster.node.fabric import End, Fabric, Link
from sparkcluster.node.health import parse_health
from sparkcluster.node.parity import Finding, Node, Severity

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
WRAPPED = "\x1b]0;PWNED-TITLE\x07\x1b[2J"  # what a wrapped nvidia-smi printed before its answer


def printed(draw) -> str:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    draw(Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_escapes_of_every_kind_go_and_what_they_surround_stays():
    assert printable(f"{WRAPPED}590.48.01") == "590.48.01"
    assert printable("a\x1bP1$r\x1b\\b\x9b2Jc\x1b(Bd\x1b7e") == "abcde"  # DCS, 8-bit CSI, charset, save cursor
    assert printable("x\x1b]0;a title left open") == "x"
    assert printable("one\nforged line\r\x00\x7f") == "one forged line "


def test_facts_show_the_driver_without_the_escapes_around_it():
    text = (FIXTURES / "probe-spark.txt").read_text().replace("NVIDIA GB10, 580.159.03", f"NVIDIA GB10, {WRAPPED}590.48.01")
    facts = parse_probe(text)
    assert facts.gpu is not None and facts.gpu.driver_version == "590.48.01"
    odd = replace(facts.interfaces[-1], name="e\x1b]0;T\x07[red]x")
    facts = replace(facts, interfaces=(*facts.interfaces[:-1], odd), hf_cache="/h\x1b[2J/hf")
    shown = printed(lambda c: facts_table(c, "spark-3", "192.168.103.13", facts))
    assert "driver 590.48.01" in shown and "\x1b" not in shown and "PWNED" not in shown
    assert "e[red]x" in shown and "/h/hf" in shown  # the name as text: no title set, no markup read


def test_doctor_prints_node_text_as_text_not_escapes_or_markup():
    node = Node(parse_probe((FIXTURES / "probe-spark.txt").read_text()),
                parse_health((FIXTURES / "doctor" / "health-spark.txt").read_text(), "vllm-node"))
    finding = Finding("parity", "driver", Severity.FAIL, f"spark-3 runs {WRAPPED}590.48.01 [red]x[/red]",
                      "fix \x1b[2J[bold]", ("spark-3",), {"spark-1": "590.44.01", "spark-3": f"{WRAPPED}590.48.01"})
    report = DoctorReport("vllm-node", {"spark-1": node, "spark-3": node}, {"spark-2": f"gone {WRAPPED}"}, (finding,))
    shown = printed(lambda c: render_doctor(c, report))
    assert "\x1b" not in shown and "PWNED" not in shown
    assert "spark-3 runs 590.48.01 [red]x[/red]" in shown and "fix: fix [bold]" in shown
    assert "FAIL spark-2: gone" in shown and "590.48.01" in shown.split("compared across nodes")[1]


def test_topology_names_an_odd_interface_by_its_name_never_port_none():
    odd = "e;$(id)`x`"
    link = Link(End("spark-1", 1, "enp1s0f1np1"), End("spark-3", None, odd))
    escaped = Link(End("spark-1", 0, "enp1s0f0np0"), End("spark-3", None, "f\x1b[2Jg"))
    shown = printed(lambda c: render_topology(c, Checked(Fabric(("spark-1", "spark-3"), (link, escaped)), "auto", ())))
    assert "None" not in shown and "\x1b" not in shown
    assert f"spark-1 port 1 ==== spark-3   (enp1s0f1np1<->{odd})" in shown
    assert f"spark-3 {odd}" in shown and "spark-3 fg" in shown
