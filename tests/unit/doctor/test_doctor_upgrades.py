"""Issue 48, `doctor --upgrades`: each node's pending packages (apt's simulation, fwupd's list) in the formats the tools
print (tests/fixtures/doctor/upgrades/), every candidate the known-bad table holds named with the table's line that
holds it back, the hold and the fix; a node whose apt or fwupd cannot answer says so; --json's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkcluster.doctor.upgrades import FWUPD_MARK, UPGRADES_SCRIPT, Upgrades, parse_node, read_upgrades
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.session import Session
from sparkcluster.node import platform_known
from sparkcluster.node.finding import Severity
from sparkcluster.node.platform_known import Component
from sparkcluster.node.upgrades import Candidate, parse_apt_simulation, parse_fwupd_updates, upstream
from tests.support.strict_transport import StrictTransport, verify_all

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "doctor" / "upgrades"
BAD_APT = (FIXTURES / "apt-dist-upgrade-bad-kernel-and-driver.txt").read_text()
GOOD_APT = (FIXTURES / "apt-dist-upgrade-good-kernel.txt").read_text()
FWUPD = (FIXTURES / "fwupd-get-updates-connectx.json").read_text()


def table_line(text: str) -> str:
    """The line of platform_known.py where `text` (the start of a table entry) is written, found in its source."""
    source = Path(platform_known.__file__).read_text().splitlines()
    return f"node/platform_known.py:{next(i for i, line in enumerate(source, 1) if text in line)}"


def node_output(apt: str, apt_rc: int = 0, fwupd: str | None = FWUPD, fwupd_rc: int = 0) -> str:
    """What UPGRADES_SCRIPT prints on a node."""
    fw = f"{fwupd}\n@@fwupd rc={fwupd_rc}\n" if fwupd is not None else "@@fwupd missing\n"
    return f"{apt}@@apt rc={apt_rc}\n{FWUPD_MARK}\n{fw}"


def test_apts_simulation_names_the_kernel_itself_not_only_its_meta_package():
    candidates, metas = parse_apt_simulation(BAD_APT)
    assert candidates == (
        Candidate(Component.KERNEL, "7.0.0-1019-nvidia", "linux-image-7.0.0-1019-nvidia", "7.0.0-1019.19"),
        Candidate(Component.DRIVER, "580.173.02", "nvidia-kernel-common-580", "580.173.02-0ubuntu0.24.04.1",
                  "580.95.05-0ubuntu0.24.04.2"),
    )
    assert metas == ("linux-nvidia-hwe-24.04", "linux-image-nvidia-hwe-24.04", "linux-headers-nvidia-hwe-24.04")
    assert upstream("1:580.173.02-0ubuntu0.24.04.1") == "580.173.02"


def test_a_captured_simulation_with_no_kernel_or_driver_gives_no_candidate():
    text = (FIXTURES / "apt-dist-upgrade-debian12-captured.txt").read_text()
    assert sum(line.startswith("Inst ") for line in text.splitlines()) > 50  # it was read, and held packages
    assert parse_apt_simulation(text) == ((), ())
    # the same lines with a kernel and a driver among them are read, whatever origins and marks apt adds
    more = text + ("Inst linux-image-7.0.0-31-generic (7.0.0-31.31 Ubuntu:24.04/noble-updates, "
                   "Ubuntu:24.04/noble-security [arm64]) []\n"
                   "Inst nvidia-driver-595-open [590.48.01-0ubuntu1] (595.84-0ubuntu1 Ubuntu:24.04/noble [arm64]) []\n")
    candidates, _ = parse_apt_simulation(more)
    assert [(c.component, c.value) for c in candidates] == [(Component.KERNEL, "7.0.0-31-generic"),
                                                            (Component.DRIVER, "595.84")]


def test_fwupd_offers_connectx_firmware_and_a_bios():
    firmware, bios = parse_fwupd_updates(FWUPD)
    assert (firmware.component, firmware.value, firmware.replaces) == (Component.FIRMWARE, "28.45.4028", "28.45.1200")
    assert (bios.component, bios.value, str(bios.released)) == (Component.BIOS, "5.38", "2025-11-03")
    # fwupd's words where nothing is to update (its exit 2), or no JSON at all: no candidate
    assert parse_fwupd_updates("No updates available for remaining devices") == ()
    assert parse_fwupd_updates('{"Devices": []}') == ()


def test_every_held_candidate_is_named_with_the_tables_line_the_hold_and_the_fix():
    node = parse_node(node_output(BAD_APT))
    held = {(h.candidate.component, h.candidate.value): h for h in node.held}
    assert set(held) == {(Component.KERNEL, "7.0.0-1019-nvidia"), (Component.DRIVER, "580.173.02"),
                         (Component.FIRMWARE, "28.45.4028")}  # openssl is no candidate; the BIOS is one, never held
    assert (Component.BIOS, "5.38") in {(c.component, c.value) for c in node.candidates}
    assert held[Component.KERNEL, "7.0.0-1019-nvidia"].where == table_line('KnownBad(Component.KERNEL, ("7.0.0-1019')
    assert held[Component.DRIVER, "580.173.02"].where == table_line('KnownBad(Component.DRIVER, ("580.173.02"')
    assert held[Component.FIRMWARE, "28.45.4028"].where == table_line('KnownBad(Component.FIRMWARE, ("28.45.4028"')
    findings = {f.check: f for f in Upgrades({"spark-1": node}).findings()}
    kernel = findings["kernel 7.0.0-1019-nvidia"]
    assert kernel.severity is Severity.FAIL and kernel.nodes == ("spark-1",)
    line = table_line('KnownBad(Component.KERNEL, ("7.0.0-1019')
    assert kernel.summary.startswith(
        "spark-1: would install kernel 7.0.0-1019-nvidia (linux-image-7.0.0-1019-nvidia 7.0.0-1019.19, new), held back "
        f"by {line} (kernel 7.0.0-1019-nvidia): boots with CmaTotal")
    assert kernel.fix.startswith("do not upgrade it: `sudo apt-mark hold linux-image-7.0.0-1019-nvidia "
                                 "linux-nvidia-hwe-24.04 linux-image-nvidia-hwe-24.04 linux-headers-nvidia-hwe-24.04` "
                                 "before `apt upgrade`; if it lands anyway: add `kho=off`")
    assert "eugr/spark-vllm-docker#389" in kernel.source
    driver = findings["driver 580.173.02"]
    assert driver.severity is Severity.WARN
    assert "`sudo apt-mark hold nvidia-kernel-common-580` before" in driver.fix
    assert "NVIDIA/open-gpu-kernel-modules#1358" in driver.source
    firmware = findings["ConnectX firmware 28.45.4028"]
    assert firmware.fix.startswith("do not apply it: leave `fwupdmgr update` for ConnectX-7 until a release past "
                                   "28.45.4028; if it lands anyway:")


def test_a_clean_node_lists_what_it_would_take_and_passes():
    node = parse_node(node_output(GOOD_APT, fwupd="No updates available", fwupd_rc=2))
    assert node.held == () and node.unread == ()
    (finding,) = Upgrades({"spark-2": node}).findings()
    assert finding.severity is Severity.OK
    assert finding.summary == ("spark-2: kernel 6.17.0-1034-nvidia (linux-image-6.17.0-1034-nvidia 6.17.0-1034.34, new); "
                               "none on the known-bad table")


@pytest.mark.parametrize("output, said", [
    (node_output("E: Could not open lock file /var/lib/dpkg/lock-frontend\n", apt_rc=100),
     "`apt-get -s dist-upgrade` failed (E: Could not open lock file /var/lib/dpkg/lock-frontend)"),
    (f"@@apt missing\n{FWUPD_MARK}\n@@fwupd missing\n", "apt-get is not installed"),
    (node_output(GOOD_APT, fwupd=None), "fwupdmgr is not installed: firmware and BIOS updates not read"),
])
def test_what_could_not_be_read_is_a_warning_not_silence(output, said):
    findings = Upgrades({"spark-1": parse_node(output)}).findings()
    warned = [f for f in findings if f.severity is Severity.WARN]
    assert warned and any(said in f.summary for f in warned), findings


def test_read_on_every_node_at_once_in_one_exec_each_and_its_json():
    hosts = (Host(name="spark-1", address="10.0.0.1", role="head"), Host(name="spark-2", address="10.0.0.2", role="worker"))
    transports = {"spark-1": StrictTransport("spark-1").expect(UPGRADES_SCRIPT, stdout=node_output(BAD_APT)),
                  "spark-2": StrictTransport("spark-2").expect(UPGRADES_SCRIPT, stdout=node_output(GOOD_APT, fwupd=None))}
    session = Session(Inventory(path=Path("inv.yml"), name="t", hosts=hosts, vars={}), transports, {})  # type: ignore[arg-type]
    doc = json.loads(json.dumps(read_upgrades(session, ["spark-1", "spark-2"]).to_json()))
    verify_all(transports)
    kernel = doc["nodes"]["spark-1"]["candidates"][0]
    assert kernel == {"component": "kernel", "value": "7.0.0-1019-nvidia", "package": "linux-image-7.0.0-1019-nvidia",
                      "version": "7.0.0-1019.19", "replaces": None, "held_back_by": [{
                          "line": table_line('KnownBad(Component.KERNEL, ("7.0.0-1019'), "severity": "fail",
                          "versions": ["7.0.0-1019-nvidia"], "symptom": platform_known.KNOWN_BAD[0].symptom,
                          "fix": platform_known.GRUB_KHO_OFF, "source": "; ".join(platform_known.CMA_SOURCES)}]}
    assert [c["held_back_by"] for c in doc["nodes"]["spark-2"]["candidates"]] == [[]]
    assert doc["nodes"]["spark-2"]["unread"] == ["fwupdmgr is not installed: firmware and BIOS updates not read"]
    assert doc["unreachable"] == {}
