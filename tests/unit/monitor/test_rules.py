"""The alert and recording rules (sparkcluster/monitor/rules/), checked and unit-tested by the real `promtool`
(Debian's `prometheus` package; scripts/setup.sh --system installs it). Each alert fires on its own synthetic
fault within two minutes of the fault's onset and not before its `for:`, its summary naming the host and the fix
(the whole summary compared); every alert stays silent on a healthy cluster; each recording rule yields its figure.

The cases are data here; the test writes promtool's own test file from them, so promtool does the evaluating."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkcluster.monitor.packaged import rule_paths

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: apt-get install prometheus")
SCRAPE_S = 15
NODE = {"job": "sparkcluster-node", "node": "spark-2", "instance": "10.0.0.12:9839"}
ENGINE = {"job": "vllm", "node": "spark-2", "replica": "replica 1", "model": "Qwen/Qwen3-0.6B",
          "instance": "10.0.0.12:8000"}
TWIN = {**NODE, "netdev": "enp1s0f1np1", "port": "1", "hca": "rocep1s0f1"}


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


@dataclass
class Case:
    alert: str
    input: list[dict[str, str]]
    onset_s: int  # the fault's first sample (for the wedge: the last token)
    fires_at_s: int  # when the alert must be firing
    labels: dict[str, str]
    value: str = ""  # {{ $value }} as Prometheus prints it
    silent_at_s: int | None = None  # before its `for:` has passed: not yet firing
    extra: list[dict[str, str]] = field(default_factory=list)


def rising(before: int, after: int, step: int = 10) -> str:
    return f"0+{step}x{before} {before * step}x{after}"


CASES = [
    Case("SparkNodeDown", [series("up", NODE, "1x7 0x20")], 120, 195, NODE, silent_at_s=165),
    Case("VllmEngineDown", [series("up", ENGINE, "1x7 0x20")], 120, 195, ENGINE, silent_at_s=165),
    Case("VllmEngineWedged", [series("vllm:num_requests_running", ENGINE, "3x40"),
                              series("vllm:generation_tokens_total", ENGINE, rising(8, 30))],
         120, 240, {k: ENGINE[k] for k in ("node", "replica", "model")}, silent_at_s=225),
    Case("SparkGpuHot", [series("sparkcluster_gpu_temperature_celsius", NODE, "60x7 95x20")], 120, 195, NODE,
         value="95", silent_at_s=165),
    Case("SparkGpuThrottled", [series("sparkcluster_gpu_clock_event", {**NODE, "reason": "hw_thermal_slowdown",
                                                                        "throttle": "1"}, "0x7 1x20")],
         120, 195, {**NODE, "reason": "hw_thermal_slowdown", "throttle": "1"}, silent_at_s=165),
    Case("SparkGpuPowerBrake", [series("sparkcluster_gpu_clock_event", {**NODE, "reason": "hw_power_brake_slowdown",
                                                                         "throttle": "1"}, "0x7 1x20")],
         120, 165, {**NODE, "reason": "hw_power_brake_slowdown", "throttle": "1"}, silent_at_s=135),
    Case("SparkGpuXid", [series("sparkcluster_kernel_events_total", {**NODE, "kind": "xid"}, "0x7 1x20")],
         120, 135, {**NODE, "kind": "xid"}),
    Case("SparkNvNoMemory", [series("sparkcluster_kernel_events_total", {**NODE, "kind": "nv-no-memory"},
                                    "0x7 2x20")], 120, 135, {**NODE, "kind": "nv-no-memory"}),
    Case("SparkQsfpDown", [series("sparkcluster_qsfp_used", TWIN, "1x30"),
                           series("sparkcluster_qsfp_up", TWIN, "1x7 0x20")], 120, 195, TWIN, silent_at_s=165),
    Case("SparkQsfpSlow", [series("sparkcluster_qsfp_up", TWIN, "1x30"),
                           series("sparkcluster_qsfp_expected_speed_mbps", TWIN, "200000x30"),
                           series("sparkcluster_qsfp_speed_mbps", TWIN, "200000x7 100000x20")],
         120, 195, TWIN, value="100000", silent_at_s=165),
    Case("SparkRoceErrorsRising", [series("sparkcluster_roce_errors_total", {**TWIN, "counter": "port_rcv_errors"},
                                          "0x7 0+5x20")],
         120, 165, {"node": "spark-2", "netdev": "enp1s0f1np1"}),
    Case("SparkCmaZero", [series("sparkcluster_cma_total_bytes", NODE, "67108864x7 0x20")], 120, 195, NODE,
         silent_at_s=165),
    Case("SparkHfCacheDiskFull", [series("sparkcluster_hf_cache_size_bytes", NODE, "1000000000000x30"),
                                  series("sparkcluster_hf_cache_free_bytes", NODE, "300000000000x7 20000000000x20")],
         120, 195, NODE, value="0.02", silent_at_s=165),
    Case("SparkSupervisorGaveUp", [series("sparkcluster_supervisor_state", {**NODE, "job": "sparkcluster-supervisor",
                                                                            "state": "gave-up"}, "0x7 1x20")],
         120, 135, {**NODE, "job": "sparkcluster-supervisor", "state": "gave-up"}),
]

HEALTHY = [
    series("up", NODE, "1x40"), series("up", ENGINE, "1x40"),
    series("vllm:num_requests_running", ENGINE, "3x40"),
    series("vllm:generation_tokens_total", ENGINE, "0+25x40"),
    # an idle engine: nothing running, no tokens: not wedged
    series("vllm:num_requests_running", {**ENGINE, "replica": "replica 2"}, "0x40"),
    series("vllm:generation_tokens_total", {**ENGINE, "replica": "replica 2"}, "500x40"),
    series("sparkcluster_gpu_temperature_celsius", NODE, "71x40"),
    *(series("sparkcluster_gpu_clock_event", {**NODE, "reason": r, "throttle": t}, "0x40")
      for r, t in (("hw_slowdown", "1"), ("hw_thermal_slowdown", "1"), ("hw_power_brake_slowdown", "1"),
                   ("gpu_idle", "0"))),
    series("sparkcluster_kernel_events_total", {**NODE, "kind": "xid"}, "2x40"),  # old Xids: not new
    series("sparkcluster_kernel_events_total", {**NODE, "kind": "nv-no-memory"}, "0x40"),
    series("sparkcluster_qsfp_used", TWIN, "1x40"), series("sparkcluster_qsfp_up", TWIN, "1x40"),
    series("sparkcluster_qsfp_speed_mbps", TWIN, "200000x40"),
    series("sparkcluster_qsfp_expected_speed_mbps", TWIN, "200000x40"),
    # a dark twin no cable ever lit: not down
    series("sparkcluster_qsfp_used", {**TWIN, "netdev": "enp1s0f0np0", "port": "0"}, "0x40"),
    series("sparkcluster_qsfp_up", {**TWIN, "netdev": "enp1s0f0np0", "port": "0"}, "0x40"),
    series("sparkcluster_roce_errors_total", {**TWIN, "counter": "port_rcv_errors"}, "7x40"),
    series("sparkcluster_cma_total_bytes", NODE, "67108864x40"),
    series("sparkcluster_hf_cache_size_bytes", NODE, "1000000000000x40"),
    series("sparkcluster_hf_cache_free_bytes", NODE, "300000000000x40"),
    series("sparkcluster_supervisor_state", {**NODE, "state": "watching"}, "1x40"),
    series("sparkcluster_supervisor_state", {**NODE, "state": "gave-up"}, "0x40"),
]


def alert_rules() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(rule_paths()[0].read_text())
    return {rule["alert"]: rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule}


def duration_s(text: str) -> int:
    m = re.fullmatch(r"(\d+)([smh])", text or "0s")
    assert m, text
    return int(m[1]) * {"s": 1, "m": 60, "h": 3600}[m[2]]


def expand(template: str, labels: dict[str, str], value: str) -> str:
    """The summary as Prometheus renders it, for the few template forms the rules use."""
    out = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], template)
    percent = f"{float(value or 0) * 100:.4g}%"
    return out.replace("{{ $value | humanizePercentage }}", percent).replace("{{ $value }}", value)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def run_tests(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    doc = {"rule_files": [str(p) for p in rule_paths()], "evaluation_interval": f"{SCRAPE_S}s", "tests": tests}
    path = tmp_path / "rules_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=200))
    return promtool("test", "rules", str(path))


def test_promtool_checks_the_rule_files() -> None:
    done = promtool("check", "rules", *map(str, rule_paths()))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 14 rules found" in done.stdout and "SUCCESS: 9 rules found" in done.stdout


def test_every_alert_has_a_case_and_fires_within_two_minutes() -> None:
    rules = alert_rules()
    assert sorted(c.alert for c in CASES) == sorted(rules), "an alert without its fault case, or a case without a rule"
    for case in CASES:
        for_s = duration_s(rules[case.alert].get("for", "0s"))
        assert case.fires_at_s - case.onset_s <= 120, case.alert
        assert case.fires_at_s - case.onset_s >= for_s, case.alert
        summary = rules[case.alert]["annotations"]["summary"]
        assert "{{ $labels.node }}" in summary and "`" in summary, f"{case.alert}: name the host and the command"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.alert)
def test_each_alert_fires_on_its_fault(tmp_path: Path, case: Case) -> None:
    rule = alert_rules()[case.alert]
    labels = {**case.labels, **rule.get("labels", {})}
    expected = {"exp_labels": labels,
                "exp_annotations": {"summary": expand(rule["annotations"]["summary"], labels, case.value)}}
    checks = [{"eval_time": f"{case.fires_at_s}s", "alertname": case.alert, "exp_alerts": [expected]},
              {"eval_time": f"{case.onset_s - SCRAPE_S}s", "alertname": case.alert, "exp_alerts": []}]
    if case.silent_at_s is not None:
        checks.append({"eval_time": f"{case.silent_at_s}s", "alertname": case.alert, "exp_alerts": []})
    done = run_tests(tmp_path, [{"interval": f"{SCRAPE_S}s", "input_series": case.input,
                                 "alert_rule_test": checks}])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "spark-2" in expected["exp_annotations"]["summary"]


def test_every_alert_is_silent_on_a_healthy_cluster(tmp_path: Path) -> None:
    checks = [{"eval_time": f"{t}m", "alertname": name, "exp_alerts": []} for name in alert_rules() for t in (3, 9)]
    done = run_tests(tmp_path, [{"interval": f"{SCRAPE_S}s", "input_series": HEALTHY, "alert_rule_test": checks}])
    assert done.returncode == 0, done.stdout + done.stderr


def test_recording_rules_give_tokens_per_second_cache_hits_and_acceptance(tmp_path: Path) -> None:
    where = {k: ENGINE[k] for k in ("node", "replica", "model")}
    inner = ",".join(f'{k}="{v}"' for k, v in where.items())
    inputs = [series("vllm:generation_tokens_total", ENGINE, "0+300x40"),  # 20 tokens/s
              series("vllm:prompt_tokens_total", ENGINE, "0+1500x40"),  # 100 tokens/s
              series("vllm:prefix_cache_queries_total", ENGINE, "0+100x40"),
              series("vllm:prefix_cache_hits_total", ENGINE, "0+25x40"),
              series("vllm:spec_decode_num_drafts_total", ENGINE, "0+10x40"),
              series("vllm:spec_decode_num_draft_tokens_total", ENGINE, "0+30x40"),
              series("vllm:spec_decode_num_accepted_tokens_total", ENGINE, "0+15x40"),
              series("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**ENGINE, "position": "0"}, "0+5x40"),
              series("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**ENGINE, "position": "1"}, "0+2.5x40")]
    expected = [("vllm:generation_tokens_per_second:rate1m", where, 20), ("vllm:prompt_tokens_per_second:rate1m",
                where, 100), ("vllm:total_tokens_per_second:rate1m", where, 120),
                ("model:vllm_generation_tokens_per_second:rate1m", {"model": ENGINE["model"]}, 20),
                ("vllm:prefix_cache_hit_rate:rate5m", where, 0.25), ("vllm:spec_decode_acceptance_rate:rate5m",
                where, 0.5), ("vllm:spec_decode_mean_acceptance_length:rate5m", where, 2.5),
                ("vllm:spec_decode_acceptance_rate_per_position:rate5m", {**where, "position": "0"}, 0.5),
                ("vllm:spec_decode_acceptance_rate_per_position:rate5m", {**where, "position": "1"}, 0.25)]
    checks = []
    for name, labels, number in expected:
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        checks.append({"expr": f"{name}{{{inner}}}", "eval_time": "8m",
                       "exp_samples": [{"labels": f"{name}{{{inner}}}", "value": number}]})
    done = run_tests(tmp_path, [{"interval": f"{SCRAPE_S}s", "input_series": inputs, "promql_expr_test": checks}])
    assert done.returncode == 0, done.stdout + done.stderr
