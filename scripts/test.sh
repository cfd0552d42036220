#!/usr/bin/env bash
# Runs the whole test suite (unit tests, and integration tests on simulated clusters; needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup-vllm.sh   # a real vLLM (CPU build) for the serve tests
# The values between the wings are typed; the checker holds them (configuration: pyproject.toml [tool.mypy]).
.venv/bin/python -m mypy
.venv/bin/ruff check sparkcluster   # unused or undefined names, import order
# Simulated-cluster tests fail instead of skipping when the machine cannot run them.
export SPARKCLUSTER_REQUIRE_SIM="${SPARKCLUSTER_REQUIRE_SIM:-1}"
set +e
.venv/bin/python -m pytest --durations=25 "$@"  # the slowest 25: where CI time goes
status=$?
set -e
if [ "$status" -eq 5 ]; then
  echo "test.sh: pytest collected no tests; that is a failure" >&2
  exit 1
fi
exit "$status"
