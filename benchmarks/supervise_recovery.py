"""How long the supervisor takes to notice each fault and to bring the serve back, and what each time is made of,
on 2 simulated Sparks serving the real CPU vLLM (host runtime, native launcher), with the supervisor's DEFAULT
policy (a round every 15 s, a probe every 30 s waited for 20 s, two misses in a row).

Faults, each from a healthy serve:
- kill -9 of spark-2's vLLM (TP 2): a dead rank;
- kill -STOP of the head's engine core (TP 2): a wedge under /health 200, which only the probe sees;
- a power cut of the head (TP 2): `sim power-off` + `sim boot spark-1`, nothing else done.

For each: the wall time from the fault to the first completion answered again (this script's own clock, a
completion tried every second), the supervisor's detection time (first failed check to the decision), its
recovery time (the decision to answering), and the recovery serve's own phases. Detection is bounded by the
policy (`misses x (probe_every_s + probe_timeout_s)` for a wedge); recovery by a warm serve on this machine.

Run as root:  .venv/bin/python benchmarks/supervise_recovery.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sparkcluster.serving.readiness import http  # noqa: E402
from sparkcluster.sim import SimCluster, UpOptions, tinymodel  # noqa: E402
from tests.support import vllm_model_info  # noqa: E402

VLLM_ENV = ROOT / ".venv-vllm"
MODEL = "local/tiny-llama"
BODY = {"model": MODEL, "prompt": "The cluster of sparks", "max_tokens": 2, "temperature": 0}


def cli(inventory: Path, *args: str, config: str, timeout: float = 900) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "sparkcluster", args[0], "-i", str(inventory), *args[1:]]
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "XDG_CONFIG_HOME": config},
                          timeout=timeout)


def ssh(cluster: SimCluster, host: str, command: str) -> str:
    return subprocess.run([*cluster.ssh_argv(host), command], capture_output=True, text=True, timeout=120).stdout


def answering_after(endpoint: str, since: float, limit_s: float = 900) -> float:
    while time.monotonic() - since < limit_s:
        if http(f"{endpoint}/completions", BODY, timeout=10)[0] == 200:
            return time.monotonic() - since
        time.sleep(1)
    raise SystemExit(f"not answering within {limit_s:.0f} s")


def last_incident(cluster: SimCluster, config: str, count: int, limit_s: float = 900) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        events = json.loads(cli(cluster.inventory_path, "events", "--json", config=config).stdout or "{}")
        done = [e for e in events.get("events", []) if e["outcome"] != "reported"]
        if len(done) >= count:
            return done[-1]
        time.sleep(2)
    raise SystemExit(f"no incident #{count} within {limit_s:.0f} s")


def report(fault: str, wall: float, incident: dict) -> None:
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in (incident.get("phases") or {}).items())
    print(f"{fault}: answering again {wall:.1f} s after the fault; the supervisor: {incident['seen']} detected in "
          f"{incident['detected_s']:.1f} s, {incident['action']} answered after {incident['recovered_s']:.1f} s "
          f"({phases or 'no phases'}); the rest ({wall - incident['detected_s'] - incident['recovered_s']:.1f} s) is "
          "the rounds before the first failed check")


def main() -> int:
    if not (VLLM_ENV / "bin" / "vllm").exists():
        print("skipped: run scripts/setup-vllm.sh for a real vLLM")
        return 0
    with tempfile.TemporaryDirectory() as config:
        cluster = SimCluster.up(UpOptions(count=2, name="bench-supervise", docker=False, vllm_env=str(VLLM_ENV)))
        try:
            assert cli(cluster.inventory_path, "bootstrap", "--runtime", "host", config=config).returncode == 0
            tinymodel.generate_on(cluster, "spark-1", str(VLLM_ENV / "bin" / "python"))
            vllm_model_info.lay_on(cluster, VLLM_ENV)
            endpoint = f"http://{cluster.topology.hosts[0].mgmt_ip}:8000/v1"
            start = time.monotonic()
            served = cli(cluster.inventory_path, "serve", "--launcher", "native", "--tp", "2", "--model", MODEL,
                         "--no-verify", "--json", "--", "--max-model-len", "512", "--enforce-eager", config=config)
            if served.returncode != 0:
                raise SystemExit(served.stderr[-3000:])
            print(f"serve TP 2 (warm caches after the first): {time.monotonic() - start:.1f} s, phases "
                  f"{json.loads(served.stdout)['phases']}")

            ssh(cluster, "spark-2", 'kill -KILL -- -"$(cat ~/.cache/sparkcluster/serve/main.pid)"')
            report("kill -9 of spark-2's vLLM", answering_after(endpoint, time.monotonic()),
                   last_incident(cluster, config, 1))

            core = ssh(cluster, "spark-1", "pgrep -f EngineCore | head -n 1").strip()
            ssh(cluster, "spark-1", f"kill -STOP {core}")
            wedged = time.monotonic()
            time.sleep(2)  # the wedge first: a completion sent at once would queue behind it
            report("kill -STOP of the head's engine core", answering_after(endpoint, wedged),
                   last_incident(cluster, config, 2))

            cluster.power_off("spark-1")
            cut = time.monotonic()
            cluster.boot("spark-1")
            booted = time.monotonic() - cut
            report(f"a power cut of the head (boot {booted:.1f} s)", answering_after(endpoint, cut),
                   last_incident(cluster, config, 3))
            cli(cluster.inventory_path, "down", config=config)
        finally:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
