"""Issue 39, round 5's S3, H3, D1 and T4: one rule for secret names (serve, `recipes show` and the support bundle
agree), the bundle's scrubber on every shape the report found passing, linear in its input, each item capped; the
archive's temporary file created exclusively, never through a planted link; a bundle folder that cannot be written
refused before anything connects."""

from __future__ import annotations

import json
import os
import re
import tarfile
from collections import Counter
from pathlib import Path

import pytest
import yaml

from sparkcluster.doctor import cli as doctor_cli
from sparkcluster.doctor.bundle import Bundle, write
from sparkcluster.engine.command import MASK, masked_env
from sparkcluster.engine.errors import UsageError
from sparkcluster.engine.inventory import Host, Inventory
from sparkcluster.engine.scrub import SCRUBBED, Scrubber, capped, secrets_in
from sparkcluster.engine.scrub import blocks as scrub_blocks
from sparkcluster.serving.nodes import node_env

# Names serve hid and the bundle kept, or that neither treated as a secret (S3's first bullet).
SECRET_NAMES = ("OPENAI_KEY", "WANDB_KEY", "HF_TOKEN_2", "PGPASSWORD", "SECRET_KEY_BASE", "MYSQL_PWD", "DB_PWD",
                "NGC_KEY", "HF_TOKEN", "apiKey", "X-Auth-Token", "ansible_become_pass")
# Names that only contain a secret's word: their values stay readable (tuning a stranger needs to see).
PLAIN_NAMES = ("TOKENIZERS_PARALLELISM", "max_num_batched_tokens", "PWD", "VLLM_LOGGING_LEVEL", "KEYRING_BACKEND",
               "author", "key")  # a bare `key`: a pair's key, the inventory's SSH key path


def scrubbed(text: str, known: list[str] | None = None) -> tuple[str, Counter[str]]:
    return Scrubber(known or []).scrub(text)


# ---- one secret rule ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SECRET_NAMES)
def test_a_secret_name_is_hidden_by_serve_recipes_show_and_the_bundle_alike(name):
    value = "planted-value-" + name.lower()
    assert masked_env({name: value}) == {name: MASK}  # `recipes show`, serve's --check and --json
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):  # serve: a secret goes on stdin, never the command line
        env = node_env(Inventory(path=Path("i.yml"), name="t", hosts=(), vars={"serve_env": {name: value}}),
                       Host("spark-1", "10.0.0.1", role="head"))
        assert env.secrets.get(name) == value
    assert secrets_in({"serve_env": {name: value}}) == [value]  # the bundle: a known secret of the inventory
    for line in (f"export {name}={value}\n", f"{name}: {value}\n", f'{{"{name}": "{value}"}}'):
        clean, counts = scrubbed(line)
        assert value not in clean and counts == {f"the value of {name}": 1}, (line, clean)


@pytest.mark.parametrize("name", PLAIN_NAMES)
def test_a_name_that_only_contains_a_secret_word_keeps_its_value(name):
    assert masked_env({name: "8192"}) == {name: "8192"}
    assert secrets_in({name: "8192"}) == []
    assert scrubbed(f"{name}=8192\n{name}: 8192\n")[0] == f"{name}=8192\n{name}: 8192\n"


# ---- every shape of S3 ------------------------------------------------------------------------------------
INVENTORY = """\
name: planted
vars:
  registry_url: https://alice:UrlPassw0rd1@registry.example.com/
  passwords: [ListedPassw0rd]
  more_secrets:
    - SecondListed1
  db:
    password: >
      FoldedOpen
      FoldedSesame
    user: bob
  literal:
    token: |
      LiteralLineOne
      LiteralLineTwo
  continued: {password: "ContinuedOpen
      ContinuedSesame"}
  escaped: {password: "Esc \\"Quoted\\" Tail"}
  quoted: {password: 'It''sQuoteTail'}
  binary:
    secret: !!binary |
      QmluYXJ5U2VjcmV0VmFsdWU=
  serve_env:
    HF_TOKEN: hf_PlantedInventoryToken0123456789
    OPENAI_KEY: sk-PlantedOpenAiKey0123456789
    WANDB_KEY: PlantedWandbKey01
    HF_TOKEN_2: PlantedSecondToken
    TOKENIZERS_PARALLELISM: "false"
  max_num_batched_tokens: 8192
hosts:
  spark-1: {address: 10.0.0.1, role: head, vars: {api_key: PlantedHostApiKey}}
"""
INVENTORY_SECRETS = ("UrlPassw0rd1", "ListedPassw0rd", "SecondListed1", "FoldedOpen", "FoldedSesame",
                     "LiteralLineOne", "LiteralLineTwo", "ContinuedOpen", "ContinuedSesame", "Quoted", "Tail",
                     "QuoteTail", "QmluYXJ5U2VjcmV0VmFsdWU=", "hf_PlantedInventoryToken", "PlantedOpenAiKey",
                     "PlantedWandbKey01", "PlantedSecondToken", "PlantedHostApiKey")


def inventory_known() -> list[str]:
    doc = yaml.safe_load(INVENTORY)
    return secrets_in(doc["vars"]) + [s for host in doc["hosts"].values() for s in secrets_in(host.get("vars", {}))]


def test_every_value_under_a_secret_name_is_known_whatever_its_shape():
    known = inventory_known()
    for value in ("ListedPassw0rd", "SecondListed1", "FoldedOpen FoldedSesame", "PlantedWandbKey01",
                  "QmluYXJ5U2VjcmV0VmFsdWU=", "LiteralLineOne", "PlantedHostApiKey"):
        assert value in known, value
    assert "8192" not in known and "false" not in known and "bob" not in known


def test_the_inventory_holds_no_secret_of_any_shape_once_scrubbed():
    clean, counts = scrubbed(INVENTORY, inventory_known())
    leaks = [s for s in INVENTORY_SECRETS if s in clean]
    assert not leaks, (leaks, clean)
    assert "max_num_batched_tokens: 8192" in clean and 'TOKENIZERS_PARALLELISM: "false"' in clean
    assert "user: bob" in clean and "registry.example.com" in clean  # what is no secret stays to diagnose
    assert yaml.safe_load(clean)["vars"]["db"] == {"password": SCRUBBED, "user": "bob"}  # still the same YAML
    assert counts["a password in a URL"] == 1


@pytest.mark.parametrize(("text", "secret", "kind"), [
    ("curl -H 'Authorization: Basic YWxpY2U6c2VjcmV0' https://x\n", "YWxpY2U6c2VjcmV0", "a Basic authorization"),
    ('curl -H "Authorization: token ghp_PlantedGithubToken01234567" x\n', "PlantedGithubToken",
     "an authorization token"),
    ("git clone https://bob:GitPassw0rd@github.com/org/repo\n", "GitPassw0rd", "a password in a URL"),
    ("vllm serve m --api-key sk-PlantedFlagKey0123 --port 8000\n", "PlantedFlagKey", "the value of --api-key"),
    ("run --hf-token=PlantedHfFlag --x\n", "PlantedHfFlag", "the value of --hf-token"),
    ("ray start --redis-password 'Planted Spaced'\n", "Spaced", "the value of --redis-password"),
    ('{"flags": ["--api-key", "sk-PlantedListItem01234", "--port", "8000"]}', "PlantedListItem",
     "the value of --api-key"),
    ("['--ngc-key', 'PlantedReprItem']", "PlantedReprItem", "the value of --ngc-key"),
    ("PGPASSWORD=PlantedPg psql -h db\n", "PlantedPg", "the value of PGPASSWORD"),
    ("export NGC_KEY='Planted Quoted'\\''Rest'\n", "Rest", "the value of NGC_KEY"),
    ('password = "a \\"PlantedInner\\" PlantedTail"\n', "PlantedTail", "the value of password"),
    ("db:\n  password: 'it''sPlantedTail'\n", "PlantedTail", "the value of password"),
    ('{"api_key": ["sk-PlantedInAList012345"], "model": "m"}', "PlantedInAList", "the value of api_key"),
    ("x:\n  api_key:\n    - PlantedNestedItem\n  model: m\n", "PlantedNestedItem", "the value of api_key"),
    ("x:\n  password: \"PlantedOpen\n    PlantedContinued\"\n  model: m\n", "PlantedContinued",
     "the value of password"),
    ("x:\n  secret: !!binary |\n    UGxhbnRlZEJpbmFyeQ==\n  model: m\n", "UGxhbnRlZEJpbmFyeQ", "the value of secret"),
])
def test_each_shape_of_secret_in_text_is_scrubbed_and_counted(text, secret, kind):
    clean, counts = scrubbed(text)
    assert secret not in clean, clean
    assert counts[kind] == 1, counts


def test_what_follows_a_scrubbed_value_stays():
    clean, _ = scrubbed('{"flags": ["--api-key", "sk-PlantedListItem01234", "--port", "8000"]}')
    assert json.loads(clean) == {"flags": ["--api-key", SCRUBBED, "--port", "8000"]}  # still JSON, the rest kept
    clean, _ = scrubbed("x:\n  api_key:\n    - PlantedNestedItem\n  model: m\n")
    assert yaml.safe_load(clean) == {"x": {"api_key": SCRUBBED, "model": "m"}}
    clean, _ = scrubbed("curl -H 'Authorization: Basic YWxpY2U6c2VjcmV0' https://x\n")
    assert clean == f"curl -H 'Authorization: Basic {SCRUBBED}' https://x\n"


PUTTY = """\
PuTTY-User-Key-File-3: ssh-ed25519
Encryption: none
Comment: planted
Public-Lines: 2
AAAAC3NzaC1lZDI1NTE5AAAAIPublicHalfOne
AAAAPublicHalfTwo
Private-Lines: 2
AAAAIPlantedPuttyPrivateOne
AAAAIPlantedPuttyPrivateTwo
Private-MAC: 0123abcd
"""


@pytest.mark.parametrize(("text", "secrets", "kind"), [
    (PUTTY, ("PlantedPuttyPrivate",), "a PuTTY private key"),
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBGPlantedPgpBody\n=abcd\n-----END PGP PRIVATE KEY BLOCK-----\nok\n",
     ("PlantedPgpBody", "=abcd"), "private key"),
    ("log\n-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaPlantedCutBody\nb3BlbnNzaPlantedCutTail\n",
     ("PlantedCutBody", "PlantedCutTail"), "private key"),  # END cut off by a `head`
    ("b3BlbnNzaPlantedHeadless\n-----END RSA PRIVATE KEY-----\nlater lines\n", ("PlantedHeadless",),
     "private key"),  # BEGIN cut off by a `tail`
])
def test_private_keys_of_every_format_are_scrubbed_even_cut(text, secrets, kind):
    clean, counts = scrubbed(text)
    assert not [s for s in secrets if s in clean], clean
    assert counts[kind] == 1, counts
    if kind == "a PuTTY private key":
        assert "AAAAPublicHalfTwo" in clean and "Private-MAC: 0123abcd" in clean
    if "later lines" in text:
        assert clean.endswith("\nlater lines\n")


# ---- H3: linear in its input ----------------------------------------------------------------------------------
class ScanLog:
    """Wraps a compiled pattern: how many characters each search may have read (from where it started to where
    it matched, or to the end of the text where it found nothing)."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern, self.read = pattern, 0

    def search(self, text: str, pos: int = 0) -> re.Match[str] | None:
        found = self.pattern.search(text, pos)
        self.read += (found.end() if found else len(text)) - pos
        return found


def test_unterminated_key_headers_are_read_once_however_many(monkeypatch):
    """H3: N copies of a BEGIN line without an END took time N squared (a lazy `.*?` to the end for each BEGIN).
    Every search now starts where the last stopped: the text is read a bounded number of times."""
    text = ("-----BEGIN RSA PRIVATE KEY-----\n" + "A" * 200 + "\n") * 4000
    mark, end = ScanLog(scrub_blocks.KEY_MARK), ScanLog(scrub_blocks.KEY_END)
    monkeypatch.setattr(scrub_blocks, "KEY_MARK", mark)
    monkeypatch.setattr(scrub_blocks, "KEY_END", end)
    clean, counts = scrubbed(text)
    assert clean == SCRUBBED and counts == {"private key": 1}
    assert mark.read + end.read <= 2 * len(text)


def test_an_item_is_capped_in_bytes_at_a_line_end():
    text = "line of text\n" * 1000
    kept, cut = capped(text, limit=100)
    assert cut == len(text) - 91 and kept.startswith("line of text\n" * 7) and "13000" not in kept
    assert kept.splitlines()[-1].startswith("[... 12909 bytes cut")
    assert capped("short\n", limit=100) == ("short\n", 0)


def test_a_capped_item_is_named_in_the_manifest(tmp_path, monkeypatch):
    monkeypatch.setattr("sparkcluster.doctor.bundle.capped", lambda text: capped(text, limit=64))
    path = tmp_path / "b.tar.gz"
    write(Bundle(files={"nodes/spark-1/nvidia-smi-q.txt": "x" * 30 + "\n" + "y" * 200 + "\n"}), path, Scrubber([]))
    with tarfile.open(path) as tar:
        manifest = json.loads(tar.extractfile("b/MANIFEST.json").read())  # type: ignore[union-attr]
    assert manifest["capped"]["files"] == {"nodes/spark-1/nvidia-smi-q.txt": 201}


# ---- D1: the temporary file ----------------------------------------------------------------------------------
def test_a_link_planted_at_the_old_temporary_name_is_left_alone(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("IMPORTANT DATA")
    victim.chmod(0o644)
    (tmp_path / ".b.tar.gz.partial").symlink_to(victim)
    write(Bundle(files={"doctor.json": "{}\n"}), tmp_path / "b.tar.gz", Scrubber([]))
    assert victim.read_text() == "IMPORTANT DATA" and victim.stat().st_mode & 0o777 == 0o644
    assert tarfile.is_tarfile(tmp_path / "b.tar.gz") and not (tmp_path / "b.tar.gz").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".b.tar.gz.partial", "b.tar.gz", "victim.txt"]


def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("sparkcluster.doctor.bundle.tarfile.TarFile.addfile", broken)
    with pytest.raises(OSError):
        write(Bundle(files={"doctor.json": "{}\n"}), tmp_path / "b.tar.gz", Scrubber([]))
    assert list(tmp_path.iterdir()) == []


# ---- T4: a folder that cannot be written ----------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only folder; /proc is tried below")
def test_a_read_only_bundle_folder_is_refused_before_connecting(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o555)
    with pytest.raises(UsageError, match="cannot create a file in") as refused:
        doctor_cli.bundle_path(str(folder / "x.tar.gz"))
    assert refused.value.exit_code == 2 and "folder you can write" in refused.value.fix


def test_a_bundle_under_proc_is_refused_before_connecting():
    with pytest.raises(UsageError, match=r"--bundle /proc/x.tar.gz: cannot create a file in /proc") as refused:
        doctor_cli.bundle_path("/proc/x.tar.gz")
    assert refused.value.exit_code == 2


def test_a_writable_folder_is_left_as_it_was(tmp_path):
    assert doctor_cli.bundle_path(str(tmp_path / "x.tar.gz")) == tmp_path / "x.tar.gz"
    assert list(tmp_path.iterdir()) == []


def test_a_bundle_that_fails_at_the_end_still_prints_the_doctors_table(tmp_path, monkeypatch):
    """T4: the write failed after the whole run with a traceback, and the table (rendered after it) was lost."""
    import argparse
    import contextlib

    from sparkcluster.doctor.run import DoctorReport
    from sparkcluster.serving.runtime import ClusterRuntime

    shown: list[str] = []
    monkeypatch.setattr(doctor_cli, "cluster_runtime", lambda inventory, given: ClusterRuntime("host", "test"))
    monkeypatch.setattr(doctor_cli, "image_to_check", lambda session, given, runtime: "")
    monkeypatch.setattr(doctor_cli, "run_doctor", lambda session, image, **_: DoctorReport("", {}, {}, ()))
    monkeypatch.setattr(doctor_cli.bundle, "collect", lambda session, report: Bundle(files={"doctor.json": "{}\n"}))
    monkeypatch.setattr(doctor_cli.bundle, "known_secrets", lambda session: [])
    monkeypatch.setattr(doctor_cli, "render", lambda console, report: shown.append("table"))

    def disk_full(*args: object) -> None:
        shown.append("write")
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(doctor_cli.bundle, "write", disk_full)
    args = argparse.Namespace(bundle=str(tmp_path / "b.tar.gz"), image=None, json=False)
    with pytest.raises(UsageError, match=r"the bundle could not be written \(No space left on device\)") as failed:
        doctor_cli.cmd_doctor(args, lambda args, require_all: contextlib.nullcontext(argparse.Namespace(inventory=None)))
    assert shown == ["write", "table"] and failed.value.exit_code == 2 and "folder you can write" in failed.value.fix
