"""The distribution's Prometheus, configured: prometheus.yml for the targets (targets.py), the rule files beside
it (package data, rules/), scraped every 15 s. Pure: the text is a value, `promtool check config` checks it in the
tests, and `monitor up` writes it only where it differs from what is there.

vLLM's series carry the labels its own Grafana dashboards filter on (job, instance, model_name from vLLM) plus
node, replica and model from here. Ray's stat logger (RayPrometheusStatLogger, vLLM's Ray path) exports the same
figures as `ray_vllm_*` / `ray_vllm:*`: they are renamed back to `vllm:*` at scrape, so one set of rules and
dashboards reads both launchers.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import yaml

from .targets import Target, Targets

SCRAPE_INTERVAL_S = 15
SCRAPE_TIMEOUT_S = 10
RAY_RENAME = {"source_labels": ["__name__"], "regex": "ray_vllm[:_](.+)", "target_label": "__name__",
              "replacement": "vllm:${1}", "action": "replace"}


def _job(name: str, targets: Sequence[Target], rename_ray: bool = False) -> dict[str, Any]:
    by_path: dict[str, list[Target]] = defaultdict(list)
    for target in targets:
        by_path[target.path].append(target)
    (path, same), = by_path.items()  # one path per job
    job: dict[str, Any] = {"job_name": name, "metrics_path": path,
                           "static_configs": [{"targets": [t.address], "labels": dict(t.labels)} for t in same]}
    if rename_ray:
        job["metric_relabel_configs"] = [RAY_RENAME]
    return job


def prometheus_config(targets: Targets, rule_files: Sequence[str], interval_s: int = SCRAPE_INTERVAL_S,
                      alertmanager: str | None = None) -> str:
    """`interval_s`: the scrape's (the rules keep their own 15 s); the tests scrape faster to wait less.
    `alertmanager`: its HOST:PORT, where --notify runs one."""
    jobs = [_job("sparkcluster-node", targets.nodes)] if targets.nodes else []
    if targets.supervisor:
        jobs.append(_job("sparkcluster-supervisor", [targets.supervisor]))
    if targets.engines:
        jobs.append(_job("vllm", targets.engines, rename_ray=True))
    if targets.router:
        jobs.append(_job("vllm-router", [targets.router]))
    doc: dict[str, Any] = {"global": {"scrape_interval": f"{interval_s}s", "scrape_timeout": f"{min(SCRAPE_TIMEOUT_S, interval_s)}s",
                      "evaluation_interval": f"{SCRAPE_INTERVAL_S}s",
                      "external_labels": {"cluster": "sparkcluster"}},
           "rule_files": list(rule_files), "scrape_configs": jobs}
    if alertmanager:
        doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    header = ("# Written by `sparkcluster monitor up`; rewritten by it (edit the inventory or serve again, then run it "
              "again).\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=120)
