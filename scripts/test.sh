#!/usr/bin/env bash
# The test command: sets up everything on a fresh Debian 12/13 machine (root) or a developer's
# machine, then runs the test suite. Extra arguments go to pytest (e.g. -k store, -x).
#   scripts/test.sh
# Installs into ./.venv: the package (editable, which builds the shim) and the test tools.
# GPU tests (tests/gpu) skip here with a reason; they run on a GPU machine via scripts/gpu-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# CRIU >= 4 for the integration tests: Debian 13 packages it (4.1); Debian 12's 3.17 fails on recent
# kernels, so there those tests skip and say why.
. /etc/os-release
if [ "${ID:-}" = debian ] && [ "${VERSION_ID%%.*}" -ge 13 ] 2>/dev/null && ! command -v criu >/dev/null; then
  need_apt+=(criu)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi
[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
exec .venv/bin/python -m pytest -q -rs "$@"
