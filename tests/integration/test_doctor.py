"""`sparkcluster doctor` on one simulated 3-node cluster: a clean cluster passes; a node given another driver,
kernel (without CMA), BIOS (with a twin at x2) or image, or a planted /etc/nccl.conf, is named with the fix; a
support bundle of an inventory and node files holding every shape of secret holds none of them.

The hardware values come from the emulators (`sim hardware`); the image is a real Docker image, the same ID on
every node (copied with docker save | load), and one node's is rebuilt with another NCCL."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sparkcluster.sim import SimCluster, UpOptions, image
from tests.support.helpers import require_sim, run_cli, ssh, unique_name

pytestmark = [pytest.mark.sim, pytest.mark.docker]

NCCL_LIB = "/usr/local/lib/libnccl.so.{}"
VLLM_DIST = "/usr/lib/python3/dist-packages/vllm-0.11.1.dist-info"


def rebuild_image(cluster: SimCluster, host: str, nccl: str) -> None:
    """What `docker build` on one node leaves: the same tag, another ID, this NCCL and vLLM 0.11.1 inside."""
    ssh(cluster, host, f"docker rm -f rebuild >/dev/null 2>&1; docker run --name rebuild {image.DEFAULT_TAG} sh -c "
                       f"'rm -f /usr/local/lib/libnccl.so.*; mkdir -p /usr/local/lib {VLLM_DIST}; "
                       f"touch {NCCL_LIB.format(nccl)}' && docker commit rebuild {image.DEFAULT_TAG} >/dev/null && "
                       "docker rm rebuild >/dev/null", user="root")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    require_sim(docker=True)
    c = SimCluster.up(UpOptions(count=3, name=unique_name("doctor")))
    try:
        tar = image.build(with_torch=False)
        image.import_into(c, ["spark-1"], image.DEFAULT_TAG, tar)
        rebuild_image(c, "spark-1", "2.28.3")
        for other in ("spark-2", "spark-3"):  # the same ID everywhere, as `sparkcluster image sync` leaves it
            save = subprocess.Popen([*c.ssh_argv("spark-1", "root"), f"docker save {image.DEFAULT_TAG}"],
                                    stdout=subprocess.PIPE)
            subprocess.run([*c.ssh_argv(other, "root"), "docker load -q"], stdin=save.stdout, check=True,
                           capture_output=True, timeout=300)
            assert save.wait(60) == 0
        yield c
    finally:
        c.down()


def doctor(cluster: SimCluster) -> tuple[int, dict]:
    result = run_cli("doctor", "-i", str(cluster.inventory_path), "--json", timeout=300)
    return result.returncode, json.loads(result.stdout)


def named(report: dict, check: str) -> list[dict]:
    return [f for f in report["findings"] if f["check"] == check and f["severity"] != "ok"]


def short_of_disk(cluster: SimCluster, hosts: list[str]) -> dict[str, bool | None]:
    """Per node: whether its HF cache really has less than bootstrap's 50 GiB floor free (None: too near to say).
    A simulated node's disk (its home holds the cache) is this machine's: on a nearly full machine, a clean
    cluster is rightly warned."""
    verdicts: dict[str, bool | None] = {}
    for host in hosts:
        avail = int(ssh(cluster, host, "df -B1 --output=avail ~ | tail -1").stdout)
        verdicts[host] = None if abs(avail - 50 * 2**30) < 2**30 else avail < 50 * 2**30
    return verdicts


def test_a_clean_cluster_passes(sim):
    code, report = doctor(sim)
    short = short_of_disk(sim, list(report["nodes"]))
    disk_warned = {n for f in report["findings"] if f["check"] == "preflight.disk" and f["severity"] == "warn"
                   for n in f["nodes"]}
    assert all(short[n] is not False for n in disk_warned), (disk_warned, short)
    assert all(n in disk_warned for n, is_short in short.items() if is_short), (disk_warned, short)
    bad = [f["summary"] for f in report["findings"] if f["severity"] != "ok" and f["check"] != "preflight.disk"]
    assert code == 0 and report["ok"] and not bad, bad
    health = {n: v["health"] for n, v in report["nodes"].items()}
    assert {h["image"]["nccl"] for h in health.values()} == {"2.28.3"}
    assert {h["image"]["vllm"] for h in health.values()} == {"0.11.1"}
    assert len({h["image"]["id"] for h in health.values()}) == 1
    checks = {f["check"] for f in report["findings"]}
    assert {"preflight.gpu", "preflight.fabric", "driver", "kernel", "BIOS", "ConnectX firmware", "CmaTotal"} <= checks


def test_nodes_given_another_driver_kernel_or_bios_are_named(sim):
    sim.set_hardware("spark-2", {"driver": "580.95.05", "kernel": "7.0.0-1019-nvidia", "cma_total_kb": 0})
    sim.set_hardware("spark-3", {"bios_version": "sim-5.20", "bios_date": "01/15/2026",
                                 "pcie_width": {"enP2p1s0f1np1": "2"}})
    try:
        code, report = doctor(sim)
    finally:
        for host in ("spark-2", "spark-3"):
            sim.set_hardware(host, dict.fromkeys(("driver", "kernel", "cma_total_kb", "bios_version", "bios_date",
                                                  "pcie_width")))
    assert code == 1 and not report["ok"]
    for check, node in (("driver", "spark-2"), ("kernel", "spark-2"), ("CmaTotal", "spark-2"), ("BIOS", "spark-3"),
                        ("PCIe link of the twins", "spark-3"), ("CMA", "spark-2"), ("PCIe", "spark-3")):
        found = named(report, check)
        assert found and found[0]["nodes"] == [node] and found[0]["fix"], (check, found)
    assert "7.0.0-1019-nvidia" in named(report, "CMA")[0]["summary"]
    assert "before April 2026" in named(report, "PCIe")[0]["summary"]
    assert named(report, "preflight.driver")[0]["nodes"] == ["spark-2"]  # 580.95.05 is below the floor too
    # put back: the cluster is clean again
    assert doctor(sim)[0] == 0


def test_nccl_conf_planted_on_one_node_is_named(sim):
    ssh(sim, "spark-3", "printf 'NCCL_P2P_LEVEL=SYS\\n' > /etc/nccl.conf", user="root")
    try:
        code, report = doctor(sim)
        text = run_cli("doctor", "-i", str(sim.inventory_path)).stdout
    finally:
        ssh(sim, "spark-3", "rm -f /etc/nccl.conf", user="root")
    assert code == 1
    conf = named(report, "nccl.conf")
    assert conf and conf[0]["nodes"] == ["spark-3"] and "NCCL_P2P_LEVEL=SYS" in conf[0]["summary"]
    assert "sudo rm /etc/nccl.conf" in conf[0]["fix"]
    assert named(report, "NCCL config files")[0]["nodes"] == ["spark-3"]
    assert "spark-3: /etc/nccl.conf sets NCCL_P2P_LEVEL=SYS" in text and "fix: remove it" in text


def test_an_image_rebuilt_with_another_nccl_is_named(sim):
    rebuild_image(sim, "spark-2", "2.27.7")
    code, report = doctor(sim)
    assert code == 1
    for check in ("image ID", "NCCL in the image"):
        assert named(report, check)[0]["nodes"] == ["spark-2"], check
    assert "2.27.7" in named(report, "NCCL in the image")[0]["summary"]
    assert "image sync" in named(report, "image ID")[0]["fix"]


# Every shape of secret round 5's S3 found passing through `doctor --bundle`, each value distinct: where it is planted.
PLANTED = {
    "inventory": {"hf": "hf_PlantedInventoryTokenS3xyz0123", "openai": "sk-PlantedOpenAiKeyS3-0123456789",
                  "wandb": "PlantedWandbKeyS3", "second": "PlantedSecondTokenS3", "url": "PlantedUrlPassS3",
                  "listed": "PlantedListedPassS3", "folded": "PlantedFoldedSesameS3", "host": "PlantedHostApiKeyS3"},
    "comm.env": {"openai": "sk-PlantedCommEnvKeyS3-0123456789", "ngc": "PlantedNgcKeyS3"},
    "last-verify.log": {"basic": "UGxhbnRlZEJhc2ljUzM=", "git": "PlantedGitPassS3", "flag": "sk-PlantedFlagKeyS3-0123",
                        "pg": "PlantedPgPassS3", "ghp": "ghp_PlantedGithubTokenS3abcdefghij",
                        "cut": "b3BlbnNzaPlantedCutKeyBodyS3"},
    "ray-logs.txt": {"putty": "AAAAIPlantedPuttyPrivateS3", "json": "sk-PlantedJsonListS3-0123456",
                     "listflag": "sk-PlantedListFlagS3-0123456", "pgp": "lQOYBGPlantedPgpBodyS3",
                     "hf": "hf_PlantedRayLogTokenS3abcdefghij"},
}


def planted_inventory(cluster: SimCluster, path: Path) -> None:
    secrets = PLANTED["inventory"]
    doc = yaml.safe_load(cluster.inventory_path.read_text())
    doc["vars"].setdefault("serve_env", {}).update({"HF_TOKEN": secrets["hf"], "OPENAI_KEY": secrets["openai"],
                                                    "WANDB_KEY": secrets["wandb"], "HF_TOKEN_2": secrets["second"]})
    doc["vars"].update(registry_url=f"https://alice:{secrets['url']}@registry.example.com/",
                       passwords=[secrets["listed"]])
    doc["hosts"]["spark-1"]["vars"] = {"api_key": secrets["host"]}
    text = yaml.safe_dump(doc, sort_keys=False)
    # a password folded over two lines, as written by hand (what the parser gives is not the text as written)
    path.write_text(text.replace("\nvars:\n", f"\nvars:\n  db:\n    password: >\n      open\n      {secrets['folded']}\n"
                                               "    user: bob\n", 1))


def planted_node_files(cluster: SimCluster) -> None:
    log, ray = PLANTED["last-verify.log"], PLANTED["ray-logs.txt"]
    comm = PLANTED["comm.env"]
    ssh(cluster, "spark-2", "mkdir -p ~/.config/sparkcluster && cat > ~/.config/sparkcluster/comm.env <<'X'\n"
                            f"NCCL_SOCKET_IFNAME=enp1s0f1np1\nexport OPENAI_KEY={comm['openai']}\n"
                            f"export NGC_KEY={comm['ngc']}\nX")
    ssh(cluster, "spark-2", "cat > ~/.config/sparkcluster/last-verify.log <<'X'\n"
                            f"curl -H 'Authorization: Basic {log['basic']}' https://registry.example.com/v2/\n"
                            f"git clone https://bob:{log['git']}@github.com/org/repo\n"
                            f"vllm serve org/model --api-key {log['flag']} --port 8000\n"
                            f"PGPASSWORD={log['pg']} psql -h db\n"
                            f"curl -H 'Authorization: token {log['ghp']}' https://api.github.com/user\n"
                            f"-----BEGIN OPENSSH PRIVATE KEY-----\n{log['cut']}\nX")  # cut: no END line
    # As root, over whatever /tmp/ray the machine under the node's overlay holds (a Ray run there as root leaves one
    # the login user cannot replace); the node's own copy only, which the cleanup removes the same way.
    ssh(cluster, "spark-3", "rm -rf /tmp/ray && mkdir -p /tmp/ray/session_latest/logs && "
                            "cat > /tmp/ray/session_latest/logs/raylet.out "
                            "<<'X'\nPuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nPublic-Lines: 1\n"
                            f"AAAAC3NzaC1lZDI1NTE5AAAAIPublicHalf\nPrivate-Lines: 1\n{ray['putty']}\nPrivate-MAC: 01ab\n"
                            f"{{\"api_key\": [\"{ray['json']}\"], \"model\": \"m\"}}\n"
                            f"args: [\"--api-key\", \"{ray['listflag']}\", \"--port\", \"8000\"]\n"
                            f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{ray['pgp']}\n=ab12\n"
                            "-----END PGP PRIVATE KEY BLOCK-----\n"
                            f"HF_TOKEN={ray['hf']} and the inventory's key, unnamed: {PLANTED['inventory']['openai']}\n"
                            "raylet started\nX", user="root")


def test_a_bundle_of_every_shape_of_secret_holds_none_of_them(sim, tmp_path):
    """S3 end to end: an inventory and node files (comm.env lines, a last-verify log, a Ray log) holding every shape
    the round found passing (16 of 19 then); unpacked, the bundle holds none of them, and the manifest counts them
    by kind, file by file."""
    inventory, path = tmp_path / "inventory.yml", tmp_path / "support.tar.gz"
    planted_inventory(sim, inventory)
    try:
        planted_node_files(sim)
        result = run_cli("doctor", "-i", str(inventory), "--bundle", str(path), timeout=300)
    finally:
        ssh(sim, "spark-2", "rm -f ~/.config/sparkcluster/comm.env ~/.config/sparkcluster/last-verify.log")
        ssh(sim, "spark-3", "rm -rf /tmp/ray", user="root")
    assert result.returncode in (0, 1) and path.is_file(), result.stdout + result.stderr
    with tarfile.open(path) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    root = tmp_path / "unpacked" / "support"
    files = {str(p.relative_to(root)): p.read_text() for p in root.rglob("*") if p.is_file()}
    leaks = [(name, value) for values in PLANTED.values() for value in values.values()
             for name, text in files.items() if value in text]
    assert not leaks, leaks
    # what is no secret is still there to diagnose
    assert "NCCL_SOCKET_IFNAME=enp1s0f1np1" in files["nodes/spark-2/comm.env"]
    assert "raylet started" in files["nodes/spark-3/ray-logs.txt"] and "PublicHalf" in files["nodes/spark-3/ray-logs.txt"]
    kept = yaml.safe_load(files["inventory.yml"])
    assert kept["vars"]["db"]["user"] == "bob" and kept["vars"]["registry_url"].endswith("@registry.example.com/")
    scrubbed = json.loads(files["MANIFEST.json"])["scrubbed"]["files"]
    assert scrubbed["nodes/spark-2/comm.env"] == {"the value of OPENAI_KEY": 1, "the value of NGC_KEY": 1}
    assert scrubbed["nodes/spark-2/last-verify.log"] == {
        "a Basic authorization": 1, "a password in a URL": 1, "the value of --api-key": 1, "the value of PGPASSWORD": 1,
        "an authorization token": 1, "private key": 1}
    assert scrubbed["nodes/spark-3/ray-logs.txt"] == {
        "a PuTTY private key": 1, "the value of api_key": 1, "the value of --api-key": 1, "private key": 1,
        "the value of HF_TOKEN": 1, "a secret from the inventory or the sudo prompt": 1,
        "the value of PuTTY-User-Key-File-3": 1}
    inventory_kinds = scrubbed["inventory.yml"]
    assert inventory_kinds["a secret from the inventory or the sudo prompt"] == 6, inventory_kinds  # as written
    assert inventory_kinds["a password in a URL"] == 1 and inventory_kinds["the value of password"] == 1
    total = sum(n for kinds in scrubbed.values() for n in kinds.values())
    assert f"{total} secrets scrubbed" in result.stdout


XID_79 = "NVRM: Xid (PCI:000f:01:00): 79, pid=2113, name=python3, GPU has fallen off the bus."
XID_119 = ("NVRM: Xid (PCI:000f:01:00): 119, pid=2113, name=python3, Timeout after 6s of waiting for RPC response from "
           "GPU0 GSP! Expected function 76 (GSP_RM_CONTROL) (0x20801348 0x4).")


def sim_hardware(cluster: SimCluster, host: str, *flags: str) -> None:
    result = run_cli("sim", "hardware", host, "--name", cluster.state.name, *flags, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_cma_kernel_names_kho_off_and_a_planted_xid_is_named_with_its_meaning(sim):
    """Issue 42's proof: kernel 7.0.0-1019-nvidia with CMA 0 on spark-2 is named there with kho=off (how to set it,
    how to check it, where owners reported it); an NVRM Xid line in spark-2's kernel log is named there with its
    time and meaning; the others' kernel logs are read and clean. The Xid spark-2's previous boot ended with
    (journalctl -k -b -1) is named there "in the previous boot"; spark-3, whose journal lives in memory, is told how
    to keep it."""
    sim_hardware(sim, "spark-2", "--kernel", "7.0.0-1019-nvidia", "--cma-total-kb", "0", "--kernel-log", XID_79,
                 "--kernel-log-previous", XID_119)
    sim_hardware(sim, "spark-3", "--journal", "volatile")
    try:
        code, report = doctor(sim)
        text = run_cli("doctor", "-i", str(sim.inventory_path), timeout=300).stdout
    finally:
        sim_hardware(sim, "spark-2", "--clear")
        sim_hardware(sim, "spark-3", "--clear")
    assert code == 1 and not report["ok"]
    cma = named(report, "CMA")
    assert len(cma) == 1 and cma[0]["nodes"] == ["spark-2"] and cma[0]["severity"] == "fail"
    assert "7.0.0-1019-nvidia" in cma[0]["summary"] and "CmaTotal: 0 kB" in cma[0]["summary"]
    for step in ("kho=off", "GRUB_CMDLINE_LINUX_DEFAULT", "sudo update-grub", "cat /proc/cmdline",
                 "grep Cma /proc/meminfo"):
        assert step in cma[0]["fix"], step
    assert "MiaAI-Lab/DeepSeek-v4-Flash-DSpark-2x-DGX-Spark#259" in cma[0]["source"]
    xid = named(report, "Xid 79")
    assert len(xid) == 1 and xid[0]["nodes"] == ["spark-2"] and xid[0]["severity"] == "fail", xid
    assert "fallen off the bus" in xid[0]["summary"] and "power-cycle" in xid[0]["fix"]
    assert re.search(r"at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d", xid[0]["summary"]), xid[0]["summary"]
    assert report["nodes"]["spark-2"]["health"]["kernel_log"]["source"] == "journalctl"
    clean = [f for f in report["findings"] if f["check"] == "kernel log" and f["severity"] == "ok"]
    assert sorted(n for f in clean for n in f["nodes"]) == ["spark-1", "spark-3"]
    assert "spark-2: NVRM Xid 79" in text and "kho=off" in text and "reported: MiaAI-Lab" in text
    # the previous boot: its Xid named on spark-2 as such, kept apart from this boot's in --json
    before = named(report, "Xid 119 (previous boot)")
    assert len(before) == 1 and before[0]["nodes"] == ["spark-2"] and before[0]["severity"] == "fail", before
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d"
    assert re.match(rf"spark-2: in the previous boot \(its log ends at {stamp}\): NVRM Xid 119 at {stamp} \(GSP RPC "
                    r"timeout", before[0]["summary"]), before[0]["summary"]
    kernel_log = report["nodes"]["spark-2"]["health"]["kernel_log"]
    assert [e["xid"] for e in kernel_log["events"]] == [79] and kernel_log["previous_boot"]["state"] == "read"
    assert [e["xid"] for e in kernel_log["previous_boot"]["events"]] == [119]
    assert "spark-2: in the previous boot (its log ends at" in text
    # spark-1's journal begins with this boot; spark-3's keeps none: an info with the fix, doctor's verdict unchanged
    assert report["nodes"]["spark-1"]["health"]["kernel_log"]["previous_boot"]["state"] == "none"
    memory = [f for f in report["findings"] if f["check"] == "kernel log (previous boot)" and f["severity"] == "info"]
    assert [f["nodes"] for f in memory] == [["spark-3"]] and "no persistent journal was found" in memory[0]["summary"]
    assert "sudo mkdir -p /var/log/journal" in memory[0]["fix"] and "journal lives in memory" in text
    # --clear put the defaults back: the kernel log is empty again, CMA is there
    _, after = doctor(sim)
    assert not named(after, "Xid 79") and not named(after, "CMA") and not named(after, "Xid 119 (previous boot)"), [
        f["summary"] for f in after["findings"] if f["severity"] != "ok"]
    assert not [f for f in after["findings"] if f["group"] == "kernel log" and f["severity"] != "ok"]


def test_a_hot_throttled_gpu_is_named_on_its_node_and_top_gives_every_nodes_telemetry(sim):
    """Issue 42's proof: a GPU at 92 C throttled by hw_thermal_slowdown on spark-2 is named there by doctor with the
    fixes owners found (clock cap, airflow, a 10 GB shm_size); the others pass with their figures; `top --once
    --json` gives each node's temperature, power and SM clock (the memory clock a GB10 does not report: null)."""
    sim_hardware(sim, "spark-2", "--gpu-temp", "92", "--power-w", "95", "--sm-clock", "1534",
                 "--throttle", "hw_thermal_slowdown")
    try:
        code, report = doctor(sim)
        top = run_cli("top", "-i", str(sim.inventory_path), "--once", "--json", timeout=120)
    finally:
        sim_hardware(sim, "spark-2", "--clear")
    assert code == 1 and not report["ok"]
    thermal = named(report, "thermal")
    assert len(thermal) == 1 and thermal[0]["nodes"] == ["spark-2"] and thermal[0]["severity"] == "fail", thermal
    assert thermal[0]["summary"].startswith("spark-2: GPU at 92 C (>= 90 C) and clocks cut by hw_thermal_slowdown")
    assert "`sudo nvidia-smi -lgc 0,2000`" in thermal[0]["fix"] and "10 GB" in thermal[0]["fix"]
    assert "air" in thermal[0]["fix"] and "#146" in thermal[0]["source"]
    passing = [f for f in report["findings"] if f["group"] == "gpu" and f["severity"] == "ok"]
    assert sorted(n for f in passing for n in f["nodes"]) == ["spark-1", "spark-3"]
    assert report["nodes"]["spark-2"]["gpu"]["throttled_by"] == ["hw_thermal_slowdown"]
    assert top.returncode == 0, top.stderr[-2000:]
    nodes = json.loads(top.stdout)["nodes"]
    figures = {name: (n["gpu"]["temperature_c"], n["gpu"]["power_w"], n["gpu"]["sm_clock_mhz"], n["gpu"]["mem_clock_mhz"])
               for name, n in nodes.items()}
    assert figures == {"spark-1": (41, 4.52, 208, None), "spark-2": (92, 95, 1534, None),
                       "spark-3": (41, 4.52, 208, None)}, figures
    assert nodes["spark-2"]["gpu"]["throttled_by"] == ["hw_thermal_slowdown"]
    assert nodes["spark-1"]["gpu"]["clock_events"] == ["gpu_idle"]
    # --clear put the idle GPU back
    query = "nvidia-smi --query-gpu=temperature.gpu,clocks_event_reasons.active --format=csv,noheader"
    assert ssh(sim, "spark-2", query).stdout.strip() == "41, 0x0000000000000001"


def test_a_baseline_names_the_driver_changed_since_on_its_node(sim, tmp_path):
    """Issue 42's proof: `doctor --save-baseline` on the cluster as it is, then another driver on spark-2: `doctor
    --baseline` exits 1 naming spark-2 with the old and the new driver; put back, nothing changed since."""
    path = tmp_path / "baseline.json"
    inventory = str(sim.inventory_path)
    saved = run_cli("doctor", "-i", inventory, "--save-baseline", str(path), timeout=300)
    assert f"baseline: saved 3 nodes to {path}" in " ".join(saved.stdout.split()), saved.stdout + saved.stderr
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and sorted(doc["nodes"]) == ["spark-1", "spark-2", "spark-3"]
    old = doc["nodes"]["spark-2"]["driver"]
    assert old and old != "580.95.05"
    sim_hardware(sim, "spark-2", "--driver", "580.95.05")
    try:
        compared = run_cli("doctor", "-i", inventory, "--baseline", str(path), "--json", timeout=300)
        text = run_cli("doctor", "-i", inventory, "--baseline", str(path), timeout=300).stdout
    finally:
        sim_hardware(sim, "spark-2", "--clear")
    assert compared.returncode == 1, compared.stderr
    changes = json.loads(compared.stdout)["baseline"]["changes"]
    assert ("spark-2", "driver", old, "580.95.05") in [(c["node"], c["what"], c["old"], c["new"]) for c in changes]
    assert {c["node"] for c in changes} == {"spark-2"}  # and the CUDA version that follows the driver, there too
    assert f"spark-2 driver: {old} -> 580.95.05" in text and "on 1 node, 0 failing" in text
    again = run_cli("doctor", "-i", inventory, "--baseline", str(path), "--json", timeout=300)
    assert json.loads(again.stdout)["baseline"]["changes"] == []
