#!/usr/bin/env bash
# Runs the whole test suite (unit tests, and integration tests on simulated clusters; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
# The system packages first, then every Python environment at once: scripts/setup-vllm.sh (a real vLLM, CPU
# build, for the serve tests) beside scripts/setup.sh, and the checkers as soon as .venv is there.
./scripts/setup.sh --system
./scripts/setup-vllm.sh & vllm_setup=$!
./scripts/setup.sh
# The values between the wings are typed; the checker holds them (configuration: pyproject.toml [tool.mypy]).
.venv/bin/python -m mypy
.venv/bin/ruff check sparkcluster   # unused or undefined names, import order
wait "$vllm_setup" || { echo "test.sh: scripts/setup-vllm.sh failed (its output is above)" >&2; exit 1; }
# Simulated-cluster tests fail instead of skipping when the machine cannot run them.
export SPARKCLUSTER_REQUIRE_SIM="${SPARKCLUSTER_REQUIRE_SIM:-1}"

# pytest exit code 5 (no tests collected) is a failure, never a silent pass.
run_pytest() {
  local status=0
  .venv/bin/python -m pytest --durations=25 "$@" || status=$?  # the slowest 25: where CI time goes
  if [ "$status" -eq 5 ]; then
    echo "test.sh: pytest collected no tests ($*); that is a failure" >&2
    return 1
  fi
  return "$status"
}

if [ "$#" -gt 0 ]; then
  run_pytest "$@"
  exit
fi
# The simulated-cluster tests wait on SSH, Docker, Ray and vLLM more than they compute (one process kept two
# cores 45% busy), so two processes run them, a file each at a time (a file's tests share its cluster), the
# slowest files first (tests/integration/conftest.py orders them; xdist's reorder by test count would undo it).
# The unit tests run after them, also in two processes, but for those marked `serial`: they time a stub server
# to a few percent, so they run last, alone on the cores. (Run beside scripts/setup-vllm.sh instead, they gained
# nothing: the install was done a few seconds into them, and they took 137-163 s there against 131 s here.)
status=0
run_pytest -n 2 --dist loadfile --no-loadscope-reorder tests/integration || status=$?
run_pytest -n 2 -m "not serial" tests/unit || status=$?
run_pytest -m serial tests/unit || status=$?
exit "$status"
