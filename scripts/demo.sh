#!/usr/bin/env bash
# The main job on the embedded default: a simulated two-Spark cluster, end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
SC=.venv/bin/sparkcluster
NAME="${SPARKCLUSTER_DEMO_NAME:-demo}"
$SC sim down "$NAME" >/dev/null 2>&1 || true   # a re-run starts from fresh hosts
# Fresh Sparks as they come out of the box: no passwordless ssh between them yet.
$SC sim up 2 --name "$NAME" --no-ssh-mesh
INVENTORY=$($SC sim list --json | .venv/bin/python -c "import json,sys; print(next(c['inventory'] for c in json.load(sys.stdin) if c['name'] == '$NAME'))")

echo; echo "== facts: what each node is"
$SC facts "$INVENTORY"
echo; echo "== bootstrap: preflight + provisioning (then again: nothing left to change)"
$SC bootstrap "$INVENTORY"
$SC bootstrap "$INVENTORY" | tail -n 4
echo; echo "== the head's comm env, every variable bound to its own QSFP interface"
$SC sim ssh spark-1 --name "$NAME" -- 'cat ~/.config/sparkcluster/comm.env'
echo; echo "== stage: a generated 1 GiB model on the head, fanned out over the fabric, then checked"
.venv/bin/python -c "from sparkcluster.sim import SimCluster; from sparkcluster.sim.fakemodel import generate; generate(SimCluster.load('$NAME'), 'spark-1', 'acme/demo-1b', 1 << 30, shards=4)"
$SC stage acme/demo-1b -i "$INVENTORY"
$SC stage acme/demo-1b -i "$INVENTORY" --status
echo; echo "== verify: which network really carries the collectives (gloo on this CPU-only machine)"
$SC verify "$INVENTORY"
echo
echo "Not yet in this demo (open issue): serve (Ray + vLLM with tensor parallelism)."
echo "inventory: $INVENTORY"
echo "the cluster stays up; remove it with: $SC sim down $NAME"
