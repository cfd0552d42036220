#!/usr/bin/env bash
# The main job on the embedded default: a simulated two-Spark cluster, end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
SC=.venv/bin/sparkcluster
NAME="${SPARKCLUSTER_DEMO_NAME:-demo}"
$SC sim down "$NAME" >/dev/null 2>&1 || true   # a re-run starts from fresh hosts
$SC sim up 2 --name "$NAME"
INVENTORY=$($SC sim list --json | .venv/bin/python -c "import json,sys; print(next(c['inventory'] for c in json.load(sys.stdin) if c['name'] == '$NAME'))")
echo
echo "== what the head sees"
$SC sim ssh spark-1 --name "$NAME" -- 'hostname; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; ibdev2netdev; ip -br -4 addr'
echo
echo "inventory: $INVENTORY"
echo "the cluster stays up; remove it with: $SC sim down $NAME"
