"""Issue 39 (round 5: H2, T1, M1): `nccl-report` on a bundle someone else made. The archive is read in one pass, a
huge member is streamed in bounded memory, a cut-short or damaged bundle and a member that is not in it are clean
errors naming the fix, and hostile member names reach the terminal escaped, each member read as its own."""

from __future__ import annotations

import io
import os
import tarfile
import zlib
from pathlib import Path
from typing import Any

import pytest

from sparkcluster import cli
from sparkcluster.engine.errors import EXIT_USAGE
from sparkcluster.nccl.report import report

from tests.support.memory import report_child  # a child with its address space capped, printing its peak

IB = "{node}:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE [RO]; OOB enp1s0f0np0:192.168.100.{n}<0>\n"
SOCKET = "{node}:2:2 [0] NCCL INFO NET/Socket : Using [0]enP7s7:192.168.1.{n}<0>\n"


def bundle(path: Path, members: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def one_line_members(count: int) -> list[tuple[str, bytes]]:
    return [(f"b/nodes/n{i}/logs.txt", IB.format(node=f"n{i}", n=i % 250).encode()) for i in range(count)]


def run_cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(cli.err_console, "width", 10_000)
    code = cli.main(["nccl-report", *args])
    out, err = capsys.readouterr()
    return code, out, err


# ---- H2: one pass over the archive, bounded memory per member ---------------------------------------------
@pytest.fixture
def decompressions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a decompression starts (zlib.decompressobj: gzip and tarfile alike start one per pass over a
    gzip stream, and one more at each re-opening or rewind)."""
    started: list[int] = []
    real = zlib.decompressobj

    def counted(*args: Any, **kwargs: Any) -> Any:
        started.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(zlib, "decompressobj", counted)
    return started


def passes(path: Path, started: list[int], *inputs: str) -> int:
    started.clear()
    report(list(inputs) or [str(path)], json_output=False, min_busbw=None)
    return len(started)


def test_a_bundle_of_many_members_is_read_in_one_pass(tmp_path: Path, decompressions: list[int]) -> None:
    # Failed before: each member re-opened the archive and found its name by reading the whole stream (N passes).
    one = passes(bundle(tmp_path / "one.tar.gz", one_line_members(1)), decompressions)
    path = bundle(tmp_path / "many.tar.gz", one_line_members(300))
    assert passes(path, decompressions) == one, f"{len(decompressions)} decompressions, {one} for one member"
    code, text = report([str(path)], json_output=False, min_busbw=None)
    assert code == 1 and text.startswith("FAIL  300 runs, judged apart: 300 FAIL")
    for i in (0, 150, 299):
        assert f"{path}::b/nodes/n{i}/logs.txt n{i}:1: network IB; HCAs mlx5_0" in text


def test_a_member_named_on_the_command_line_is_read_in_one_pass(tmp_path: Path, decompressions: list[int]) -> None:
    one = passes(bundle(tmp_path / "one.tar.gz", one_line_members(1)), decompressions)
    path = bundle(tmp_path / "many.tar.gz", one_line_members(50))
    assert passes(path, decompressions, f"{path}::b/nodes/n7/logs.txt") == one
    code, text = report([f"{path}::b/nodes/n7/logs.txt"], json_output=False, min_busbw=None)
    assert code == 1
    assert text.startswith("FAIL  truncated") and f"{path}::b/nodes/n7/logs.txt n7:1: network IB" in text


class Zeros(io.RawIOBase):
    """`size` zero bytes, made as they are read: the test writes a 300 MB member without holding it."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        count = min(len(buffer), self.left)
        buffer[:count] = bytes(count)
        self.left -= count
        return count


def test_a_huge_member_of_zeros_is_streamed_in_bounded_memory(tmp_path: Path) -> None:
    # Failed before: the member's first 256 MB were read whole and decoded to one str (MemoryError under the cap).
    path = tmp_path / "zeros.tar.gz"
    size = 300 << 20
    log = IB.format(node="spark-1", n=11).encode()
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        info = tarfile.TarInfo("b/nodes/spark-1/logs.txt")
        info.size = size
        tar.addfile(info, io.BufferedReader(Zeros(size), 1 << 20))
        info = tarfile.TarInfo("b/nodes/spark-2/logs.txt")
        info.size = len(log)
        tar.addfile(info, io.BytesIO(log))
    small = bundle(tmp_path / "small.tar.gz", [("b/nodes/spark-2/logs.txt", log)])
    code, out, err, peak = report_child(str(path))
    _, small_out, _, small_peak = report_child(str(small))
    assert code == 1 and "Traceback" not in err, err
    assert f"{path}::b/nodes/spark-2/logs.txt spark-1:1: network IB" in out  # the member after the zeros is read
    assert peak - small_peak < 100, f"{peak} MB for a 300 MB member, {small_peak} MB without it"


# ---- T1: a cut-short or damaged bundle, a member that is not in it -----------------------------------------
def test_a_truncated_bundle_is_a_clean_error_naming_a_new_download(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: EOFError traceback (a download that stopped midway, the common case).
    whole = bundle(tmp_path / "whole.tar.gz", [(f"b/nodes/n{i}/logs.txt", os.urandom(20000)) for i in range(20)])
    data = whole.read_bytes()
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(capsys, monkeypatch, str(cut))
    assert code == EXIT_USAGE and "Traceback" not in err
    assert f"error: {cut}: the bundle is cut short or damaged" in err and "download it again" in err, err


@pytest.mark.parametrize("where", ["middle", "checksum"])
def test_a_damaged_bundle_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    # Failed before: zlib.error traceback (a flipped byte in the compressed data); a bad checksum went unnoticed.
    whole = bundle(tmp_path / "whole.tar.gz", [(f"b/nodes/n{i}/logs.txt", (IB.format(node=f"n{i}", n=i) * 400).encode())
                                               for i in range(20)])
    data = bytearray(whole.read_bytes())
    at = len(data) // 2 if where == "middle" else len(data) - 6  # the gzip trailer's CRC32
    data[at: at + 4] = bytes(b ^ 0xFF for b in data[at: at + 4])
    damaged = tmp_path / "damaged.tar.gz"
    damaged.write_bytes(bytes(data))
    code, _, err = run_cli(capsys, monkeypatch, str(damaged))
    assert code == EXIT_USAGE and "Traceback" not in err
    assert f"error: {damaged}: the bundle is cut short or damaged" in err and "download it again" in err, err


def test_a_member_not_in_the_bundle_names_the_nearest(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: KeyError traceback ("filename 'nonexistent' not found").
    path = bundle(tmp_path / "real.tar.gz", one_line_members(3))
    code, _, err = run_cli(capsys, monkeypatch, f"{path}::b/nodes/n1/log.txt")
    assert code == EXIT_USAGE and "Traceback" not in err
    assert f"error: {path}: no member b/nodes/n1/log.txt" in err, err
    assert "fix: name one of its logs (nearest first): b/nodes/n1/logs.txt, " in err, err
    code, _, err = run_cli(capsys, monkeypatch, f"{path}::nonexistent")
    assert code == EXIT_USAGE and f"error: {path}: no member nonexistent" in err, err
    assert "fix: name one of its logs: b/nodes/n0/logs.txt, b/nodes/n1/logs.txt, b/nodes/n2/logs.txt" in err, err


def test_a_folder_of_the_bundle_names_the_logs_inside_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Failed before: KeyError traceback.
    path = bundle(tmp_path / "real.tar.gz", [*one_line_members(2), ("b/nodes/n0/ray-logs.txt", b"quiet\n")])
    for folder in ("b/nodes/n0", "b/nodes/n0/"):
        code, _, err = run_cli(capsys, monkeypatch, f"{path}::{folder}")
        assert code == EXIT_USAGE and "Traceback" not in err
        assert f"error: {path}: {folder} is a folder of the bundle, not a log" in err, err
        assert "fix: name a log inside it: b/nodes/n0/logs.txt, b/nodes/n0/ray-logs.txt" in err, err


# ---- M1: hostile member names ------------------------------------------------------------------------------
def test_member_names_reach_the_terminal_escaped(tmp_path: Path) -> None:
    # Failed before: the names were printed raw (the screen cleared, the title set, a report line split in two).
    log = IB.format(node="spark-1", n=11).encode()
    names = ["b/nodes/\x1b[2J\x1b[31mRED \x1b]0;title\x07/logs.txt", "b/nodes/two\nlines/logs.txt",
             "../../../etc/evil/logs.txt", "/etc/abs/last-verify.log", "b/nodes/\u202eevil\u200b/logs.txt"]
    path = bundle(tmp_path / "hostile.tar.gz", [(name, log) for name in names])
    code, text = report([str(path)], json_output=False, min_busbw=None)
    assert code == 1 and not any(c in text for c in "\x1b\x07\u202e\u200b"), repr(text)
    for shown in (r"b/nodes/\x1b[2J\x1b[31mRED \x1b]0;title\x07/logs.txt", r"b/nodes/two\nlines/logs.txt",
                  "../../../etc/evil/logs.txt", "/etc/abs/last-verify.log", r"b/nodes/\u202eevil\u200b/logs.txt"):
        assert f"{path}::{shown} spark-1:1: network IB" in text, text
    assert all(line.startswith(("FAIL", "run ", "  ", "")) for line in text.splitlines())
    assert not any(line.startswith("lines/") for line in text.splitlines())


def test_two_members_of_one_name_are_each_read(tmp_path: Path) -> None:
    # Failed before: both report lines read the last member ("no NCCL INFO lines" twice, or its verdict twice).
    name = "b/nodes/spark-1/logs.txt"
    path = bundle(tmp_path / "twice.tar.gz", [(name, IB.format(node="spark-1", n=11).encode()),
                                              (name, SOCKET.format(node="spark-9", n=9).encode())])
    _, text = report([str(path)], json_output=False, min_busbw=None)
    assert f"{path}::{name} spark-1:1: network IB" in text, text
    assert f"{path}::{name} (member 2 of that name) spark-9:2: sockets on enP7s7" in text, text
    _, named = report([f"{path}::{name}"], json_output=False, min_busbw=None)
    assert "spark-1:1: network IB" in named and "spark-9:2: sockets on enP7s7" in named
