# Sourced by scripts/setup.sh and scripts/setup-vllm.sh: `pyinstall VENV PIP-INSTALL-ARGS...` installs into the
# virtual environment VENV with uv where uv can be had, else with pip. uv resolves and unpacks in parallel: measured
# here, vLLM (CPU) and Ray into a fresh venv took 41.0 s with uv against 123.5 s with pip (61 s of CPU against 96),
# the same packages, torch 2.13.0+cpu in both. Bytecode is compiled at install, as pip does: the simulated nodes'
# login user cannot write __pycache__ into these venvs, and without it every vLLM process there compiled its
# imports afresh (a CI run's real-vLLM tests took 1.5-2.5x as long). uv reads no pip configuration, so the
# find-links folders pip is given (PIP_FIND_LINKS, pip's config: where a machine keeps PyTorch's CPU build) are
# passed on to it.
UV_VENV=.venv-uv
UV_VERSION=0.13.9

uv_ready() {  # made once, by whichever set-up job comes first (the others wait on the lock)
  flock "$UV_VENV.lock" sh -c "[ -x $UV_VENV/bin/uv ] || { python3 -m venv $UV_VENV && \
    $UV_VENV/bin/python -m pip install -q --disable-pip-version-check uv==$UV_VERSION; }" >&2 && [ -x "$UV_VENV/bin/uv" ]
}

pyinstall() {
  local venv=$1
  shift
  if uv_ready; then
    local links=() dir
    for dir in ${PIP_FIND_LINKS:-} $(python3 -m pip config get global.find-links 2>/dev/null); do
      [ -d "$dir" ] && links+=(--find-links "$dir")
    done
    "$UV_VENV/bin/uv" pip install -q --compile-bytecode --python "$venv/bin/python" "${links[@]}" "$@" && return
    echo "pyinstall: uv failed on $* ; pip instead" >&2
  fi
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "$@" \
    2> >(grep -v "^WARNING: Location 'file://" >&2)
}
