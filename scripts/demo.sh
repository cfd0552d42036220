#!/usr/bin/env bash
# The main job on the embedded default: a simulated two-Spark cluster, end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup-vllm.sh   # a real vLLM (CPU build) for the last part: serving across the simulated nodes
SC=.venv/bin/sparkcluster
NAME="${SPARKCLUSTER_DEMO_NAME:-demo}"
$SC sim down "$NAME" >/dev/null 2>&1 || true   # a re-run starts from fresh hosts
# Fresh Sparks as they come out of the box: the QSFP twins cabled but unaddressed, no passwordless ssh between
# them yet. --vllm-env: the inventory names the CPU vLLM environment for `serve --runtime host`.
$SC sim up 2 --name "$NAME" --no-ssh-mesh --no-fabric-addresses --vllm-env .venv-vllm
INVENTORY=$($SC sim list --json | .venv/bin/python -c "import json,sys; print(next(c['inventory'] for c in json.load(sys.stdin) if c['name'] == '$NAME'))")

echo; echo "== facts: what each node is"
$SC facts "$INVENTORY"
echo; echo "== the first mile: spark-2's QSFP twins before bootstrap (no IPv4, MTU 1500)"
$SC sim ssh spark-2 --name "$NAME" -- 'ip -br addr show enp1s0f1np1; ip -br addr show enP2p1s0f1np1; ip -o link show enp1s0f1np1 | grep -o "mtu [0-9]*"'
echo; echo "== topology: who is cabled to whom, found on the wire before anything is addressed"
$SC topology "$INVENTORY"
echo; echo "== bootstrap --check --diff: the whole plan (the netplan file, the addresses, every later play checked"
echo "   against the planned addresses), before anything changes"
# --runtime docker: the demo serves eugr's way (containers) first, so bootstrap provisions Docker and records that
# runtime in the inventory (sim up --vllm-env wrote `runtime: host`); the real-vLLM serve below names --runtime host.
$SC bootstrap "$INVENTORY" --runtime docker --check --diff
echo; echo "== bootstrap: fabric addresses, preflight, provisioning (then again: nothing left to change)"
$SC bootstrap "$INVENTORY" --runtime docker
$SC bootstrap "$INVENTORY" | tail -n 4
$SC sim ssh spark-2 --name "$NAME" -- 'ip -br addr show enp1s0f1np1; ip -br addr show enP2p1s0f1np1; ip -o link show enp1s0f1np1 | grep -o "mtu [0-9]*"; sudo cat /etc/netplan/40-sparkcluster-fabric.yaml'
echo; echo "== the head's comm env, every variable bound to its own QSFP interface"
$SC sim ssh spark-1 --name "$NAME" -- 'cat ~/.config/sparkcluster/comm.env'
echo; echo "== stage: a generated 1 GiB model on the head, fanned out over the fabric, then checked"
.venv/bin/python -c "from sparkcluster.sim import SimCluster; from sparkcluster.sim.fakemodel import generate; generate(SimCluster.load('$NAME'), 'spark-1', 'acme/demo-1b', 1 << 30, shards=4)"
$SC stage acme/demo-1b -i "$INVENTORY"
$SC stage acme/demo-1b -i "$INVENTORY" --status
echo; echo "== verify: which network really carries the collectives (gloo on this CPU-only machine)"
$SC verify "$INVENTORY"

echo; echo "== serve, eugr's setup: a vllm_node container per node running Ray, vllm serve --tp 2 in the head's"
echo "   (the test image carries a real Ray, PyTorch for the probe and a stand-in for the GPU-only vLLM; it"
echo "   starts on the head only, and serve copies it to the worker over the fabric)"
$SC sim image --name "$NAME" --hosts spark-1 --ray-env .venv-ray
$SC serve -i "$INVENTORY" --model acme/demo-1b
$SC status -i "$INVENTORY"
$SC sim ssh spark-2 --name "$NAME" -- "docker inspect vllm_node --format '{{.Config.Cmd}}'; docker exec vllm_node env | grep -E '^(VLLM_HOST_IP|NCCL_IB_HCA|NCCL_SOCKET_IFNAME)='"
$SC down -i "$INVENTORY"

echo; echo "== serve with a real vLLM (CPU build): a tiny Llama made on the head, staged by serve, TP 2 across both"
echo "   nodes with vLLM's own multi-node launcher; the probe runs first, in the environment vLLM gets"
.venv/bin/python -c "from sparkcluster.sim import SimCluster, tinymodel; tinymodel.generate_on(SimCluster.load('$NAME'), 'spark-1', '$PWD/.venv-vllm/bin/python')"
$SC serve -i "$INVENTORY" --runtime host --launcher native --model local/tiny-llama -- --max-model-len 512 --enforce-eager
HEAD_ADDRESS=$($SC sim list --json | .venv/bin/python -c "import json,sys; print(next(c for c in json.load(sys.stdin) if c['name'] == '$NAME')['hosts'][0]['mgmt_ip'])")
curl -sS "http://$HEAD_ADDRESS:8000/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "local/tiny-llama", "prompt": "The cluster of sparks", "max_tokens": 12, "temperature": 0}'
echo
echo; echo "== bench: throughput and latency at each concurrency, as the community's recipes publish them"
$SC bench -i "$INVENTORY" --concurrency 1,2,4 --runs 1 --prompt-tokens 64 --output-tokens 16 --plot "${TMPDIR:-/tmp}/sparkcluster-demo-bench.png"
echo; echo "== the supervisor serve started on the head: spark-2's vLLM killed, noticed and served again, no command given"
$SC sim ssh spark-2 --name "$NAME" -- 'kill -KILL -- -"$(cat ~/.cache/sparkcluster/serve/main.pid)"'
for _ in $(seq 60); do
  $SC events -i "$INVENTORY" --json | grep -q '"outcome": "recovered"' && break
  sleep 5
done
$SC events -i "$INVENTORY"
$SC status -i "$INVENTORY"
$SC down -i "$INVENTORY"
echo
echo "inventory: $INVENTORY"
echo "the cluster stays up; remove it with: $SC sim down $NAME"
