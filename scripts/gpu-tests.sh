#!/bin/bash
# gpu-tests.sh: build, install and run the GPU tests (tests/gpu) on the GPU test machine.
#
#   OUT=DIR scripts/gpu-tests.sh          (from the repository root; OUT defaults to ./gpu-out)
#
# What it does, in order; a failed step is recorded and the script goes on:
#   1. keeps NVLink multicast off in every process (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
#      NVSHMEM_DISABLE_NVLS=1); kills the processes an earlier run stopped before its cleanup left
#      behind (said in OUT/steps.txt), and stops (exit 3) beside a run still going;
#   2. `pip install --no-build-isolation --no-deps -e .` (no network there; editable so that the
#      package imported from the repository root is the built one, shim included)
#                                                                         -> OUT/pip-install.log
#   3. unpacks the debs carried in .criu-debs/*.deb (Debian sid builds of CRIU 4.2.1 and pycriu, and
#      Debian 12's runc for tests/gpu/test_runc_gpu.py: `apt-get download runc` into .criu-debs/)
#      under $CRIU_PREFIX (default /opt/criu, never /) and puts them on PATH, LD_LIBRARY_PATH, PYTHONPATH;
#      then compiles the bytecode of the package and of every module it imports, where missing or
#      stale, as an install does                                          -> OUT/pip-install.log
#   4. prints versions: kernel, nvidia-smi, driver, python packages, criu --version, criu check
#      -> OUT/versions.txt
#   5. `criu-gpushare doctor` and `criu-gpushare doctor --json`          -> OUT/doctor.txt, OUT/doctor.json
#   6. `python3 -m pytest tests/gpu` under `timeout 480`   -> OUT/gpu-tests.log, OUT/junit.xml,
#      OUT/probe-figures.txt (the PROBE lines the tests recorded); then tests/shim, tests/engine
#      and tests/hook against the real driver -> OUT/real-driver-tests.log, -results.txt;
#      with GPU_BENCH=1, bench/copy_bench.py and bench/shim_bench.py -> OUT/bench.txt, then
#      bench/checkpoint_bench.py at BENCH_SCALE (default 0.25; 1 = 40 GiB, ~15 min) under
#      `timeout $BENCH_TIMEOUT_S` (default 900; BENCH_CRIU=1 adds its --criu rows)
#      -> OUT/bench-checkpoint.txt, .json (its workloads carry the probe tag: step 7 kills leftovers),
#      bench/startup_bench.py when BENCHES names `startup` -> OUT/bench-startup.txt,
#      bench/write_paths_bench.py --huge-tmpfs when BENCHES names `writes` -> OUT/bench-writes.txt,
#      bench/write_paths_bench.py --disk in BENCH_DISK_DIR (default .bench-disk, as checkpoint_bench's
#      disk store; BENCH_DISK_WRITES_SIZE, default 8G) when it names `disk-writes`
#      -> OUT/bench-disk-writes.txt,
#      bench/save_stages_bench.py (BENCH_STAGES_GIB, default 40) when it names `stages`
#      -> OUT/bench-stages.txt, bench/criu_memory_bench.py (BENCH_CRIU_MEMORY_GIB, default 1, and
#      BENCH_CRIU_MEMORY_ARGS, e.g. "--cold --beside-store 8 --dir .bench-disk/criu-memory") when
#      it names `criu-memory` -> OUT/bench-criu-memory.txt, bench/host_memory_bench.py
#      (BENCH_HOST_MEMORY_ARGS) when it names `host-memory` -> OUT/bench-host-memory.txt, bench/overlap_bench.py
#      (BENCH_OVERLAP_GIB, default 16) when it names `overlap` -> OUT/bench-overlap.txt,
#      bench/mapping_bench.py (BENCH_MAPPING_ARGS) when it names `mapping` -> OUT/bench-mapping.txt, and
#      bench/allocator_bench.py (BENCH_ALLOC_GIB, default 8) -> OUT/bench-allocator.txt, .json;
#      tests/gpu/test_stress.py runs CRIU_GPUSHARE_STRESS_CYCLES cycles (default 60, ~4.2 s each on
#      the H200, a progress line every 10 cycles);
#      a pytest run that outlives PYTEST_TIMEOUT_S gets SIGTERM: the stacks of its threads go to
#      the log (tests/conftest.py), then this script names the test it was in;
#   7. kills every process a probe started that is still alive (they carry GPUSHARE_PROBE_TAG=<this
#      run> in their environment; a process stuck CHECKPOINTED only dies of SIGKILL), then lists
#      what is left on the GPU;
#   8. writes OUT/summary.txt (every probe row PASS/FAIL/SKIP/NOT RUN with its figures) and prints it;
#      a run that picks its tests (GPU_TESTS set, or no "gpu" part) is not failed by rows it did not run.
# GPU_REPEAT=N runs the GPU tests (step 6) up to N times, stopping at the first failing run.
# GPU_PARTS (default "gpu real example") picks the parts of step 6 to run, so a run fits a time
# limit: gpu (tests/gpu), real (REAL_SUITES, default tests/shim tests/engine tests/hook, against
# the real driver), example (examples/torch_dump_restore.sh -> OUT/example.txt), bench (as
# GPU_BENCH=1; BENCHES picks among "copy shim checkpoint allocator startup writes disk-writes
# stages criu-memory host-memory overlap mapping").
# Seen on the H200 (driver 580): install, CRIU and doctor ~40 s; tests/gpu/test_cuda_graphs.py
# ~140 s; tests/hook/test_gpu_dump.py ~60 s; tests/engine > 140 s; the probes in tests/gpu ~6 min;
# checkpoint_bench at BENCH_SCALE=0.25 (single, empty, --criu, no disk) ~40 s. On an H100 (driver
# 580): tests/gpu/test_criu_trees.py, test_suspend_torch.py and test_serving_tree.py ~245 s; against
# the real driver tests/gpu_layer ~21 s and tests/hook ~190 s. A machine that limits one command to
# 10 minutes needs several runs: split by GPU_PARTS, GPU_TESTS, REAL_SUITES.
# Only a few files of OUT may come back: 0-summary.txt holds the summary and the probe figures,
# 0-bench-checkpoint.txt and .json, 0-bench-startup.txt, 0-bench-host-memory.txt,
# 0-bench-criu-memory.txt and 0-bench-disk-writes.txt the benches' output (also that of a bench the run's timeout stopped, as far as it got).
# GPU_REQUIRE=NAME stops at once (exit 3, said in 0-summary.txt) on a GPU whose name lacks NAME.
# Steps 7 and 8 also run when the script is interrupted. GPU_TESTS_INSTALL=0 skips step 2 (a dry
# run on a development machine, where the package is installed editable). Exit status: 0 when every step worked and
# every test passed or skipped, 1 otherwise.
set -u
cd "$(dirname "$0")/.." || exit 1
REPO=$(pwd)
OUT=${OUT:-./gpu-out}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || { echo "gpu-tests: cannot create OUT=$OUT" >&2; exit 1; }
CRIU_PREFIX=${CRIU_PREFIX:-/opt/criu}
PYTEST_TIMEOUT_S=${PYTEST_TIMEOUT_S:-480}

# GPU_REQUIRE=NAME: figures meant for one card (the performance targets are the H200's), asked of
# a machine that may lend another: stop before installing anything unless the GPU's name has NAME.
if [ -n "${GPU_REQUIRE:-}" ]; then
    gpu_name=$(timeout 60 nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    case $gpu_name in
    *"$GPU_REQUIRE"*) ;;
    *) echo "gpu-tests: GPU_REQUIRE=$GPU_REQUIRE, and this machine's GPU is ${gpu_name:-none (no nvidia-smi answer)}: nothing run" |
           tee "$OUT/0-summary.txt"
       exit 3 ;;
    esac
fi

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Probe processes get GPUSHARE_PROBE_TAG=$GPUSHARE_PROBE_RUN (tests/probes/probe_harness.py);
# this script and pytest do not carry the tag, so step 7 finds exactly the probes.
export GPUSHARE_PROBE_RUN="gpu-tests-$$-$(date +%s)"
export PROBE_RECORD="$OUT/probe-figures.txt"
export PROBE_DISK_DIR=${PROBE_DISK_DIR:-$REPO}  # the O_DIRECT probe writes (and removes) 2 GiB here
: >"$PROBE_RECORD"
: >"$OUT/steps.txt"
FAILED=0
FINISHED=0

each_with_env() {  # each_with_env NAME: "PID VALUE" for each other process whose environment sets NAME
    local environ pid value
    for environ in /proc/[0-9]*/environ; do
        pid=${environ#/proc/}; pid=${pid%/environ}
        [ "$pid" = "$$" ] && continue
        value=$(tr '\0' '\n' 2>/dev/null <"$environ" | sed -n "s/^$1=//p" | head -n 1)
        [ -n "$value" ] && echo "$pid $value"
    done
}

report_survivors() {  # report_survivors PID...: after SIGKILL, the ones still there (a D state)
    local pid
    sleep 2
    for pid in "$@"; do
        [ -d "/proc/$pid" ] && echo "still present after SIGKILL: $pid ($(awk '/^State:/{print $2, $3}' "/proc/$pid/status" 2>/dev/null))"
    done
    return 0
}

ancestors() {  # this shell's pid and those of its parents, up to init
    local pid=$$
    while [ -n "$pid" ] && [ "$pid" -gt 1 ]; do
        echo "$pid"
        pid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    done
}

# A run stopped before its own cleanup (a timeout around this script, the machine's limit on a
# command) can leave its tests' processes on the GPU, and a driver checkpoint call of theirs
# beside one of this run's never returns. Every process a run starts inherits its
# GPUSHARE_PROBE_RUN (gpu-tests-<its pid>-<time>): kill those of runs that are over; refuse to
# start beside a run still going. A run this one was started from (its pid among our ancestors)
# is neither.
sweep_earlier_runs() {
    local mine pid run owner killed=""
    mine=" $(ancestors | tr '\n' ' ')"
    while read -r pid run; do
        case $run in gpu-tests-*) ;; *) continue ;; esac
        [ "$run" = "$GPUSHARE_PROBE_RUN" ] && continue  # this run's own (the commands of this walk)
        owner=${run#gpu-tests-}; owner=${owner%%-*}
        case $mine in *" $owner "*) continue ;; esac
        if tr '\0' ' ' 2>/dev/null <"/proc/$owner/cmdline" | grep -q 'gpu-tests\.sh'; then
            echo "gpu-tests: another run ($run, pid $owner) is still going: two runs at once would make" \
                 "driver checkpoint calls from two processes, which never return; nothing run" | tee "$OUT/0-summary.txt"
            exit 3
        fi
        kill -KILL "$pid" 2>/dev/null && killed="$killed $pid"
    done < <(each_with_env GPUSHARE_PROBE_RUN)
    if [ -n "$killed" ]; then
        echo "processes left by earlier runs: killed$killed" | tee -a "$OUT/steps.txt"
        # shellcheck disable=SC2086  # one word per pid
        report_survivors $killed | tee -a "$OUT/steps.txt"
    fi
    return 0
}
sweep_earlier_runs

step() {  # step NAME RC: record a step's outcome
    local status=ok
    [ "$2" -eq 0 ] || { status="FAILED (exit $2)"; FAILED=1; }
    echo "$1: $status" | tee -a "$OUT/steps.txt"
}

banner() { echo; echo "===== $* ====="; }

run_pytest() {  # run_pytest LOG NAME ARGS...: one pytest run under the timeout, appended to LOG
    local log=$1 name=$2 rc
    shift 2
    timeout -k 30 "$PYTEST_TIMEOUT_S" python3 -m pytest "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        # -v prints each test's id as it starts: the last one in the log is the one stopped
        echo "gpu-tests: $name stopped by the ${PYTEST_TIMEOUT_S} s timeout (PYTEST_TIMEOUT_S) in" \
             "$(grep -oE '^[^ ]+::[^ ]+' "$log" | tail -n 1 || true); where each of its threads was" \
             "is in the stack dump above" | tee -a "$log"
    fi
    step "$name" "$rc"
    LAST_RC=$rc
}

kill_leftover_probes() {
    local pid tag left=""
    while read -r pid tag; do
        if [ "$tag" = "$GPUSHARE_PROBE_RUN" ]; then
            left="$left $pid"
            kill -KILL "$pid" 2>/dev/null
        fi
    done < <(each_with_env GPUSHARE_PROBE_TAG)
    if [ -n "$left" ]; then
        echo "killed leftover probe processes:$left"
        # shellcheck disable=SC2086  # one word per pid
        report_survivors $left
    else
        echo "no leftover probe processes"
    fi
    if command -v nvidia-smi >/dev/null; then
        echo "GPU compute processes now:"
        timeout 60 nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>&1 || true
    fi
}

finish() {
    [ "$FINISHED" -eq 1 ] && return
    FINISHED=1
    banner "cleanup"
    kill_leftover_probes 2>&1 | tee "$OUT/cleanup.txt"
    banner "summary"
    {
        echo "criu-gpushare GPU tests, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(hostname), commit $(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo '?')$(
            n=$(git -C "$REPO" status --porcelain --untracked-files=no 2>/dev/null | wc -l); [ "$n" -gt 0 ] && echo " + $n changed file(s)")"
        echo "-- steps"
        cat "$OUT/steps.txt"
        echo "-- versions"
        grep -E '^(kernel|driver|gpu|criu-version|criu-check|python|python-env|cuda-bindings|torch):' "$OUT/versions.txt" 2>/dev/null
        echo "-- probes"
        # a run that picked its tests (GPU_TESTS, or no "gpu" part) leaves the other rows NOT RUN
        subset=""
        [ -n "${GPU_TESTS:-}" ] && subset=--subset
        if [[ " ${GPU_PARTS:-gpu} " == *" gpu "* ]]; then
            python3 "$REPO/tests/gpu/summarize.py" --junit "$OUT/junit.xml" --figures "$PROBE_RECORD" $subset \
                || FAILED=1
        else  # no JUnit file to read: not a failure of the parts that ran
            echo "tests/gpu not run (GPU_PARTS=$GPU_PARTS)"
        fi
        echo "-- real driver: shim, suspend/resume, CRIU integration"
        cat "$OUT/real-driver-results.txt" 2>/dev/null || echo "not run"
        grep -E '^=+ .*(passed|failed|error).* =+$' "$OUT/real-driver-tests.log" 2>/dev/null
        echo "-- cleanup"
        cat "$OUT/cleanup.txt"
        echo "-- files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
        echo "-- probe figures"
        cat "$PROBE_RECORD" 2>/dev/null
    } >"$OUT/summary.txt" 2>&1
    # A machine that brings back only a few files of OUT, in name order, brings this one first,
    # and the benches' tables beside it (written as they ran: what a stopped run had done too).
    cp "$OUT/summary.txt" "$OUT/0-summary.txt"
    for f in bench-checkpoint.txt bench-checkpoint.json bench-startup.txt bench-host-memory.txt bench-criu-memory.txt \
             bench-disk-writes.txt; do
        [ -f "$OUT/$f" ] && cp "$OUT/$f" "$OUT/0-$f"
    done
    cat "$OUT/summary.txt"
}
trap finish EXIT
trap 'echo "gpu-tests: interrupted" >&2; FAILED=1; exit 1' INT TERM

banner "install (pip)"
if [ "${GPU_TESTS_INSTALL:-1}" = 0 ]; then
    echo "GPU_TESTS_INSTALL=0: not installing (dry run on a development machine)" | tee "$OUT/pip-install.log"
else
    python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/pip-install.log" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ] && grep -q externally-managed-environment "$OUT/pip-install.log"; then
        # PEP 668 system Python (Ubuntu 24.04): the machine's packages went in the same way
        echo "-- retrying with --break-system-packages" >>"$OUT/pip-install.log"
        python3 -m pip install --no-build-isolation --no-deps --break-system-packages -e . \
            >>"$OUT/pip-install.log" 2>&1
        rc=$?
    fi
    step "pip install" $rc
    tail -n 3 "$OUT/pip-install.log"
fi

banner "CRIU"
debs=("$REPO"/.criu-debs/*.deb)
if [ -e "${debs[0]}" ]; then
    rc=0
    mkdir -p "$CRIU_PREFIX"
    for deb in "${debs[@]}"; do dpkg -x "$deb" "$CRIU_PREFIX" || rc=$?; done
    step "unpack ${#debs[@]} CRIU debs under $CRIU_PREFIX" $rc
    export PATH="$CRIU_PREFIX/usr/sbin:$CRIU_PREFIX/usr/bin:$PATH"
    export LD_LIBRARY_PATH="$CRIU_PREFIX/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PYTHONPATH="$CRIU_PREFIX/usr/lib/python3/dist-packages${PYTHONPATH:+:$PYTHONPATH}"
else
    echo "no .criu-debs/*.deb: CRIU tests will skip unless a CRIU >= 4 is already on PATH"
fi

# pycriu needs protobuf; the GPU machine has no network: a wheel carried in .whl/ if it lacks one,
# fetched beforehand on a machine with network (the GPU machine's python is 3.12):
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d .whl protobuf
if ! python3 -c 'import google.protobuf' 2>/dev/null && ls "$REPO"/.whl/protobuf-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --find-links "$REPO/.whl" protobuf 2>&1 | tail -n 2 ||
        python3 -m pip install -q --no-index --find-links "$REPO/.whl" --break-system-packages protobuf 2>&1 | tail -n 2
    python3 -c 'import google.protobuf'
    step "protobuf for pycriu (from .whl/)" $?
fi

# s3:// stores (bench --s3, the s3 tests): SeaweedFS's weed binary (xz) and boto3's wheels, carried
# in .s3-carry/ by scripts/pack-s3-carry.sh (the machine has neither and no network).
if [ -e "$REPO/.s3-carry/weed.xz" ]; then
    mkdir -p "$CRIU_PREFIX/usr/bin"
    xz -dc "$REPO/.s3-carry/weed.xz" >"$CRIU_PREFIX/usr/bin/weed" && chmod +x "$CRIU_PREFIX/usr/bin/weed"
    rc=$?
    if ! python3 -c 'import boto3' 2>/dev/null; then
        python3 -m pip install -q --no-index --find-links "$REPO/.s3-carry" boto3 2>&1 | tail -n 2 ||
            python3 -m pip install -q --no-index --find-links "$REPO/.s3-carry" --break-system-packages boto3 2>&1 | tail -n 2
        python3 -c 'import boto3' || rc=1
    fi
    step "weed and boto3 (from .s3-carry/)" $rc
fi

# Bytecode, compiled once as an install does, so that the figures are a user's: this machine sets
# PYTHONDONTWRITEBYTECODE, so no command caches what it compiles, and each would compile again at
# start what has no bytecode: the package (an editable install compiles nothing, and a later call
# on a warm machine copies the tree anew, leaving it stale), psutil as this environment holds it
# (36-59 ms of a command's start), pycriu unpacked from a deb. Every module the package's commands,
# hook and holders can import, compiled where its bytecode is missing or older than its source.
python3 - >>"$OUT/pip-install.log" 2>&1 <<'EOF'
import compileall, importlib, importlib.util, pkgutil, sys
import criu_gpushare
# the command line itself is compiled, not imported (__main__ runs it); the shim is a library
specs = (importlib.util.find_spec(m.name)
         for m in pkgutil.walk_packages(criu_gpushare.__path__, "criu_gpushare."))
package = [spec for spec in specs if spec.origin.endswith(".py")]
names = [spec.name for spec in package if not spec.name.endswith(".__main__")]
for name in names + ["pycriu", "cuda.bindings.driver", "cuda.bindings.runtime", "xxhash"]:
    try:
        importlib.import_module(name)
    except Exception as e:  # an optional part whose package is absent here (e.g. boto3)
        print(f"not imported: {name}: {e}")
origins = sorted({spec.origin for spec in package} |
                 {o for o in (getattr(getattr(m, "__spec__", None), "origin", None)
                              for m in list(sys.modules.values())) if o and o.endswith(".py")})
# compile_file rewrites bytecode that is missing or older than its source, and leaves the rest
failed = [o for o in origins if not compileall.compile_file(o, quiet=1)]
print(f"bytecode up to date for {len(origins) - len(failed)} of {len(origins)} modules "
      "(the package and what it imports)")
EOF
step "compile the bytecode of the package and what it imports" $?
tail -n 1 "$OUT/pip-install.log"

banner "versions"
{
    # key: value lines first (the summary quotes them), then the full outputs, indented
    echo "kernel: $(uname -r)"
    if [ -r /proc/driver/nvidia/version ]; then
        echo "driver: $(head -n 1 /proc/driver/nvidia/version)"
    else
        echo "driver: none (/proc/driver/nvidia/version absent)"
    fi
    if command -v nvidia-smi >/dev/null; then
        echo "gpu: $(timeout 60 nvidia-smi --query-gpu=name,driver_version,memory.total,persistence_mode,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader 2>&1 | tr '\n' ';')"
    else
        echo "gpu: no nvidia-smi"
    fi
    echo "python: $(python3 --version 2>&1)"
    echo "python-env: $(env | grep -E '^PYTHON' | tr '\n' ' ')"
    for pkg in cuda-bindings torch xxhash psutil pytest boto3 criu-gpushare; do
        echo "$pkg: $(python3 -m pip show "$pkg" 2>/dev/null | awk '/^Version:/{print $2}')"
    done
    if command -v criu >/dev/null; then
        echo "criu-version: $(command -v criu): $(criu --version 2>&1 | head -n 2 | tr '\n' ' ')"
        timeout 120 criu check >"$OUT/criu-check.txt" 2>&1
        echo "criu-check: exit $? ($(tail -n 1 "$OUT/criu-check.txt"))"
        sed 's/^/    /' "$OUT/criu-check.txt"
    else
        echo "criu-version: none"
    fi
    if command -v nvidia-smi >/dev/null; then
        echo "nvidia-smi:"
        timeout 60 nvidia-smi 2>&1 | sed 's/^/    /'
    fi
} >"$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"

banner "criu-gpushare doctor"
# The installed package, never the source tree: run from / (python puts the cwd on sys.path);
# the console script when pip put it on PATH, else its module.
if command -v criu-gpushare >/dev/null; then
    doctor() { (cd / && timeout 120 criu-gpushare doctor "$@"); }
else
    doctor() { (cd / && timeout 120 python3 -m criu_gpushare.cli doctor "$@"); }
fi
if (cd / && python3 -c 'import criu_gpushare.cli') 2>/dev/null; then
    # a failing check is information, not a failed run: the exit codes go into steps.txt
    doctor >"$OUT/doctor.txt" 2>&1
    echo "criu-gpushare doctor: exit $? (see doctor.txt)" | tee -a "$OUT/steps.txt"
    doctor --json >"$OUT/doctor.json" 2>"$OUT/doctor-json.stderr"
    echo "criu-gpushare doctor --json: exit $? (see doctor.json, doctor-json.stderr)" | tee -a "$OUT/steps.txt"
    cat "$OUT/doctor.txt"
else
    echo "criu_gpushare is not importable outside the source tree (did the install fail?)" | tee "$OUT/doctor.txt"
    step "criu-gpushare doctor" 127
fi

PARTS=" ${GPU_PARTS:-gpu real example} "
if [[ $PARTS == *" gpu "* ]]; then
banner "GPU tests"
: >"$OUT/gpu-tests.log"
# GPU_REPEAT=N runs them up to N times, until one run fails (a rare failure, looked for in one call);
# junit.xml is the last run's: the failing one when one failed.
for ((repeat = 1; repeat <= ${GPU_REPEAT:-1}; repeat++)); do
    [ "${GPU_REPEAT:-1}" -gt 1 ] && echo "===== GPU tests, run $repeat of $GPU_REPEAT" | tee -a "$OUT/gpu-tests.log"
    run_pytest "$OUT/gpu-tests.log" "pytest ${GPU_TESTS:-tests/gpu}" ${GPU_TESTS:-tests/gpu} -v -rs \
        -p no:cacheprovider --junitxml="$OUT/junit.xml"
    [ "$LAST_RC" -eq 0 ] || break
done
fi

# The same suites that run on the fake driver in CI, here against the real driver (tests that only
# the fake can run, e.g. two devices or multicast, skip with their reason), plus CRIU integration.
if [[ $PARTS == *" real "* ]]; then
banner "shim, suspend/resume and CRIU tests on the real driver"
: >"$OUT/real-driver-tests.log"
for suite in ${REAL_SUITES:-tests/shim tests/engine tests/hook}; do  # one pytest each: own conftest
    CRIU_GPUSHARE_TEST_DRIVER=real run_pytest "$OUT/real-driver-tests.log" "pytest $suite (real driver)" \
        "$suite" -v -rs -p no:cacheprovider
done
grep -E "^tests/.*(PASSED|FAILED|SKIPPED|ERROR)" "$OUT/real-driver-tests.log" | sed 's/ *\[ *[0-9]*%\]$//' \
    >"$OUT/real-driver-results.txt"
fi

if [[ $PARTS == *" example "* ]]; then
banner "example: PyTorch processes sharing GPU memory, dumped, killed, restored"
command -v criu-gpushare >/dev/null || export CRIU_GPUSHARE="python3 -m criu_gpushare.cli"
example_dir=$(mktemp -d)  # its image and store stay out of OUT (too many files to bring back)
timeout -k 20 "${EXAMPLE_TIMEOUT_S:-300}" examples/torch_dump_restore.sh "$example_dir" 2>&1 | tee "$OUT/example.txt"
step "examples/torch_dump_restore.sh" "${PIPESTATUS[0]}"
mkdir -p "$OUT/example"
cp "$example_dir"/*.log "$example_dir"/images/*.log "$example_dir"/images/criu-gpushare.json "$OUT/example/" 2>/dev/null
rm -rf "$example_dir"
fi

if [[ $PARTS == *" bench "* ]] || [ "${GPU_BENCH:-0}" = 1 ]; then  # benchmarks are not tests: only on request
    banner "benchmarks"
    BENCHES=" ${BENCHES:-copy shim checkpoint allocator} "
    if [[ $BENCHES == *" copy "* ]]; then timeout 200 python3 bench/copy_bench.py --gib 8 2>&1 | tee "$OUT/bench.txt"; fi
    if [[ $BENCHES == *" shim "* ]]; then timeout 200 python3 bench/shim_bench.py --repeat 7 2>&1 | tee -a "$OUT/bench.txt"; fi
    if [[ $BENCHES == *" startup "* ]]; then
        timeout 200 python3 bench/startup_bench.py --gpu 2>&1 | tee "$OUT/bench-startup.txt"
        step "bench/startup_bench.py --gpu" "${PIPESTATUS[0]}"
    fi
    if [[ $BENCHES == *" writes "* ]]; then
        timeout 300 python3 bench/write_paths_bench.py --huge-tmpfs --size "${BENCH_WRITES_SIZE:-16G}" 2>&1 | tee "$OUT/bench-writes.txt"
        step "bench/write_paths_bench.py" "${PIPESTATUS[0]}"
    fi
    if [[ $BENCHES == *" disk-writes "* ]]; then
        mkdir -p "${BENCH_DISK_DIR:-$REPO/.bench-disk}"
        timeout 300 python3 bench/write_paths_bench.py --disk --dir "${BENCH_DISK_DIR:-$REPO/.bench-disk}" \
            --threads 2,4,8,16 --size "${BENCH_DISK_WRITES_SIZE:-8G}" --repeat 1 2>&1 | tee "$OUT/bench-disk-writes.txt"
        step "bench/write_paths_bench.py --disk" "${PIPESTATUS[0]}"
    fi
    if [[ $BENCHES == *" mapping "* ]]; then
        # BENCH_MAPPING_ARGS: options, split into words on purpose
        timeout 200 python3 bench/mapping_bench.py ${BENCH_MAPPING_ARGS:-} 2>&1 | tee "$OUT/bench-mapping.txt"
        step "bench/mapping_bench.py" "${PIPESTATUS[0]}"
    fi
    if [[ $BENCHES == *" stages "* ]]; then
        timeout 300 python3 bench/save_stages_bench.py --gib "${BENCH_STAGES_GIB:-40}" 2>&1 | tee "$OUT/bench-stages.txt"
        step "bench/save_stages_bench.py (${BENCH_STAGES_GIB:-40} GiB)" "${PIPESTATUS[0]}"
    fi
    if [[ $BENCHES == *" criu-memory "* ]]; then
        timeout 300 python3 bench/criu_memory_bench.py --gib "${BENCH_CRIU_MEMORY_GIB:-1}" ${BENCH_CRIU_MEMORY_ARGS:-} 2>&1 |
            tee "$OUT/bench-criu-memory.txt"
        step "bench/criu_memory_bench.py (${BENCH_CRIU_MEMORY_GIB:-1} GiB)" "${PIPESTATUS[0]}"
    fi
    if [[ $BENCHES == *" host-memory "* ]]; then
        # BENCH_HOST_MEMORY_ARGS: options, split into words on purpose
        timeout -k 30 150 python3 bench/host_memory_bench.py ${BENCH_HOST_MEMORY_ARGS:-} 2>&1 | tee "$OUT/bench-host-memory.txt"
        step "bench/host_memory_bench.py" "${PIPESTATUS[0]}"
        kill_leftover_probes >>"$OUT/bench-host-memory.txt" 2>&1
    fi
    if [[ $BENCHES == *" overlap "* ]]; then
        timeout 200 python3 bench/overlap_bench.py --gib "${BENCH_OVERLAP_GIB:-16}" 2>&1 | tee "$OUT/bench-overlap.txt"
        step "bench/overlap_bench.py (${BENCH_OVERLAP_GIB:-16} GiB)" "${PIPESTATUS[0]}"
    fi
    # No driver checkpoint call of these overlaps another: each bench runs alone, in sequence.
    if [[ $BENCHES == *" checkpoint "* ]]; then
    timeout -k 30 "${BENCH_TIMEOUT_S:-900}" python3 bench/checkpoint_bench.py --scale "${BENCH_SCALE:-0.25}" \
        --json-out "$OUT/bench-checkpoint.json" ${BENCH_CRIU:+--criu} ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench-checkpoint.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] && echo "gpu-tests: checkpoint_bench stopped by the ${BENCH_TIMEOUT_S:-900} s timeout"
    step "bench/checkpoint_bench.py (scale ${BENCH_SCALE:-0.25})" "$rc"
    kill_leftover_probes >>"$OUT/bench-checkpoint.txt" 2>&1
    fi
    if [[ $BENCHES == *" allocator "* ]]; then
    timeout -k 30 "${BENCH_ALLOC_TIMEOUT_S:-600}" python3 bench/allocator_bench.py --gib "${BENCH_ALLOC_GIB:-8}" \
        --json-out "$OUT/bench-allocator.json" 2>&1 | tee "$OUT/bench-allocator.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" -eq 124 ] && echo "gpu-tests: allocator_bench stopped by the ${BENCH_ALLOC_TIMEOUT_S:-600} s timeout"
    step "bench/allocator_bench.py (${BENCH_ALLOC_GIB:-8} GiB)" "$rc"
    fi
fi

finish
exit "$FAILED"
