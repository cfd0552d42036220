#!/usr/bin/env bash
# One-time set-up of a fresh Debian/Ubuntu machine for sparkcluster and its simulated cluster (idempotent).
# Installs the system packages the simulator needs and a virtual environment in .venv with sparkcluster.
# `--system` installs the system packages only (scripts/test.sh runs it first, then this script and
# scripts/setup-vllm.sh side by side: both venvs on Debian's python3 need python3-venv).
set -euo pipefail
cd "$(dirname "$0")/.."

# netplan.io and iputils-arping: what bootstrap's fabric.addresses uses on a node (the simulated hosts share them).
APT_PACKAGES=(openssh-server openssh-client sudo docker.io iproute2 iputils-ping iputils-arping netplan.io util-linux
              procps rsync python3 python3-venv curl
              socat docker-registry  # benchmarks/data_plane.py's baselines (raw TCP, a registry)
              zsh fish   # tests/unit/test_cli.py: the completion scripts parsed by their shells
              bash-completion  # tests/unit/test_readme_completion.py: the README's lines loaded as Ubuntu does
              python3-paramiko python3-yaml python3-jinja2 python3-rich  # the supervisor on a simulated head (its python3)
              prometheus prometheus-node-exporter  # promtool for the monitor wing's rules; benchmarks/monitor_exporter.py
              prometheus-alertmanager  # amtool and Alertmanager: monitor up --notify's tests
              gcc libc6-dev)  # verify --tune builds NCCL's tuner plugin with each node's cc (the simulated ones too)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
[ "${1:-}" = "--system" ] && exit 0

# The three environments are independent: each is made by its own job, at the same time, since the installer waits
# on downloads and on the disk more than on the cores.
. scripts/pyinstall.sh
main_venv() {
  if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
  fi
  pyinstall .venv --upgrade "pip>=24" "setuptools>=68" wheel
  pyinstall .venv -e '.[test]'
  # PyTorch's CPU build, for `sparkcluster verify` with gloo on the simulated cluster (the GPU nodes of a real
  # cluster run the probe with their own torch). 2.13.0 is the build this machine kind keeps on disk.
  .venv/bin/python -c 'import torch' 2>/dev/null || \
    pyinstall .venv torch==2.13.0
}
# A Ray environment made with Debian's python3, which `sparkcluster sim image --ray-env .venv-ray` copies into
# the simulated cluster's test image: the image's interpreter is Debian's, so the venv must be built on it.
RAY_VERSION=2.60.0
# With PyTorch (CPU) too: the probe runs inside the containers, as it does in a vLLM image.
ray_venv() {
  if ! .venv-ray/bin/python -c "import ray, aiohttp, torch; assert ray.__version__ == '$RAY_VERSION'" 2>/dev/null; then
    echo "setup: installing ray[default]==$RAY_VERSION and torch in .venv-ray (for the test image)"
    rm -rf .venv-ray
    /usr/bin/python3 -m venv .venv-ray
    pyinstall .venv-ray "ray[default]==$RAY_VERSION" torch==2.13.0
  fi
}
# llama-benchy itself, only for tests/unit/bench/test_bench_vs_llama_benchy.py: the reference `bench --method
# llama-benchy` is held to on the same server (every metric within 5%, the same JSON keys).
BENCHY_VERSION=0.4.0
benchy_venv() {
  if ! .venv-benchy/bin/llama-benchy --version 2>/dev/null | grep -q "$BENCHY_VERSION"; then
    echo "setup: installing llama-benchy==$BENCHY_VERSION in .venv-benchy (the reference bench is checked against)"
    rm -rf .venv-benchy
    python3 -m venv .venv-benchy
    pyinstall .venv-benchy "llama-benchy==$BENCHY_VERSION"
  fi
}

main_venv & main=$!
ray_venv & ray=$!
benchy_venv & benchy=$!
failed=()
wait "$main" || failed+=(.venv)
wait "$ray" || failed+=(.venv-ray)
wait "$benchy" || failed+=(.venv-benchy)
if [ "${#failed[@]}" -gt 0 ]; then
  echo "setup: making ${failed[*]} failed (its installer's output is above)" >&2
  exit 1
fi
echo "setup: ready ($(.venv/bin/sparkcluster --version))"
