"""Where the monitor wing's package data lies (an installed wheel carries it: pyproject's package-data): the
alert and recording rules, and the Grafana dashboard."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

RULE_FILES = ("sparkcluster-alerts.yml", "sparkcluster-recording.yml")
DASHBOARD_FILE = "sparkcluster.json"


def _folder(name: str) -> Path:
    return Path(str(files("sparkcluster.monitor") / name))


def rule_paths() -> list[Path]:
    return [_folder("rules") / name for name in RULE_FILES]


def dashboard_path() -> Path:
    return _folder("dashboards") / DASHBOARD_FILE
