#!/usr/bin/env bash
# The test command: sets up everything on a fresh Debian 12/13 machine (root) or a developer's
# machine, then runs the test suite. Extra arguments go to pytest (e.g. -k store, -x).
#   scripts/test.sh
# Installs into ./.venv: the package (editable, which builds the shim) and the test tools.
# GPU tests (tests/gpu) skip here with a reason; they run on a GPU machine via scripts/gpu-tests.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

. /etc/os-release
debian_like=false
case " ${ID:-} ${ID_LIKE:-} " in *" debian "*|*" ubuntu "*) debian_like=true ;; esac

need_apt=()
command -v gcc >/dev/null || need_apt+=(gcc libc6-dev)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# xxh128sum (xxhash) for the store-compatibility test: chunk names verified by an independent tool.
# Where it is installed here, the test fails rather than skips without it.
if $debian_like; then
  command -v xxh128sum >/dev/null || need_apt+=(xxhash)
  export CRIU_GPUSHARE_TEST_NEED_XXH128SUM=1
fi
# runc for the container checkpoint test (tests/criu/test_runc.py), which needs root.
if $debian_like && [ "$(id -u)" = 0 ]; then command -v runc >/dev/null || need_apt+=(runc); fi
if [ ${#need_apt[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
fi

# CRIU >= 4 and pycriu for the CRIU tests (tests/criu, tests/hook): built from source, since
# distributions' packages are too old (Debian 12) or lack pieces; cached in .criu/, so only the first
# run pays. Elsewhere, or if the build fails, those tests skip and say why.
if $debian_like && [ "$(id -u)" = 0 ]; then
  if criu_prefix=$(scripts/build-criu.sh | tail -n 1); then
    export PATH=$criu_prefix/bin:$PATH
    export PYTHONPATH=$criu_prefix/python${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "test.sh: building CRIU failed (above); the CRIU tests will skip" >&2
  fi
else
  echo "test.sh: CRIU is built only on Debian/Ubuntu as root; the CRIU tests use what is on PATH" >&2
fi

[ -x .venv/bin/python ] || python3 -m venv --system-site-packages .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'
# The CRIU tests run the hook the package installs (criu-gpushare-hook) by name.
export PATH=$PWD/.venv/bin:$PATH
exec .venv/bin/python -m pytest -q -rs "$@"
