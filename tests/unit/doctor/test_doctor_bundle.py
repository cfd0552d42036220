"""The support bundle's scrubbing (every planted secret gone, each counted by kind in the manifest) and
nccl-report reading a bundle as it reads log files, headlining its root cause."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from sparkcluster.doctor.bundle import Bundle, write
from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.scrub import SCRUBBED, Scrubber, secrets_in
from sparkcluster.nccl.report import report

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TOKEN = "hf_" + "q" * 34
PASSWORD = "correct horse battery"


def test_secrets_found_by_name_at_any_depth():
    inventory = {"serve_env": {"HF_TOKEN": TOKEN, "VLLM_LOGGING_LEVEL": "INFO"}, "ansible_become_pass": "pw1234",
                 "max_num_batched_tokens": "8192", "hosts": {"a": {"api_key": "k-123456"}}}
    assert sorted(secrets_in(inventory)) == sorted([TOKEN, "pw1234", "k-123456"])


def test_every_kind_of_secret_is_scrubbed_and_counted():
    text = (f"HF_TOKEN={TOKEN}\nexport OPENAI_API_KEY='sk-abcdefgh'\n\"DB_PASSWORD\": \"hunter22\"\n"
            f"max_num_batched_tokens=8192\nAuthorization: Bearer abcdefghijklmnop\nsudo said {PASSWORD}\n"
            "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
            "a stray hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ in a log\n")
    clean, counts = Scrubber([TOKEN, PASSWORD]).scrub(text)
    for secret in (TOKEN, "sk-abcdefgh", "hunter22", "abcdefghijklmnop", PASSWORD, "b3BlbnNzaC1rZXktdjEAAAA",
                   "hf_ABCDEFGHIJKLMNOPQRSTUVWXYZ"):
        assert secret not in clean, secret
    assert "max_num_batched_tokens=8192" in clean  # a name that merely contains "token" keeps its value
    spaced, _ = Scrubber([]).scrub("DB_PASSWORD='open sesame now' and x_token: \"two words\"\n")
    assert "sesame" not in spaced and "words" not in spaced and spaced.count(SCRUBBED) == 2
    assert counts["private key"] == 1 and counts["the value of OPENAI_API_KEY"] == 1
    assert counts["a secret from the inventory or the sudo prompt"] == 2 and counts["a bearer token"] == 1
    assert clean.count(SCRUBBED) == 7


def bundle_with(tmp_path: Path, files: dict[str, str]) -> Path:
    path = tmp_path / "support.tar.gz"
    write(Bundle(files=files, items={"spark-2": {"last-verify.log": "present"}}), path, Scrubber([TOKEN]))
    return path


def test_the_archive_holds_no_secret_and_the_manifest_says_what_was_scrubbed(tmp_path):
    path = bundle_with(tmp_path, {"inventory.yml": f"vars:\n  serve_env:\n    HF_TOKEN: {TOKEN}\n",
                                  "nodes/spark-2/logs.txt": "all quiet\n"})
    assert path.stat().st_mode & 0o777 == 0o600
    with tarfile.open(path) as tar:
        names = tar.getnames()
        data = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]
        manifest = json.loads(tar.extractfile("support/MANIFEST.json").read())  # type: ignore[union-attr]
    assert "support/nodes/spark-2/logs.txt" in names and TOKEN.encode() not in data
    assert manifest["scrubbed"]["files"]["inventory.yml"] == {"a secret from the inventory or the sudo prompt": 1}
    assert manifest["items"]["spark-2"]["last-verify.log"] == "present"


def test_nccl_report_reads_a_bundle_and_headlines_the_socket_fallback(tmp_path):
    log = (FIXTURES / "nccl" / "socket-management-truncated.log").read_text()
    path = bundle_with(tmp_path, {"nodes/spark-2/last-verify.log": log, "nodes/spark-2/comm.env": "X=1\n"})
    code, text = report([str(path)], json_output=False, min_busbw=None)
    assert code == 1
    headline = text.splitlines()[0]
    assert headline.startswith("FAIL") and "socket fallback on the management interface enP7s7" in headline
    assert "truncated" not in headline
    assert f"{path}::support/nodes/spark-2/last-verify.log" in text
    # the same log as a plain file reads the same
    plain = tmp_path / "plain.log"
    plain.write_text(log)
    assert report([str(plain)], json_output=False, min_busbw=None)[1].splitlines()[0] == headline


def test_a_bundle_without_logs_is_refused(tmp_path):
    path = bundle_with(tmp_path, {"nodes/spark-2/comm.env": "X=1\n"})
    with pytest.raises(UsageError, match="without logs"):
        report([str(path)], json_output=False, min_busbw=None)


def test_each_item_keeps_its_text_when_the_one_before_has_no_final_newline():
    import subprocess

    from sparkcluster.doctor.bundle import _script, sections

    script = _script({"a.json": "printf '{\"status\": \"PASS\"}'", "b.log": "printf 'one\\ntwo\\n'", "c": "true"})
    found = sections(subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout)
    assert found == {"a.json": '{"status": "PASS"}\n', "b.log": "one\ntwo\n", "c": ""}
