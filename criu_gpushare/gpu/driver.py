"""The CUDA driver, through cuda-python: loading it with clear errors, and checking results.

cuda-bindings opens libcuda.so.1 at the first call. On a machine without the NVIDIA driver that
raises from deep inside cuda-pathfinder; here it becomes NoGpuError with what to do.
"""
import threading
import time

from ..errors import DriverError, NoGpuError

CHECKPOINT_SYMBOLS = (
    "cuCheckpointProcessLock",
    "cuCheckpointProcessCheckpoint",
    "cuCheckpointProcessRestore",
    "cuCheckpointProcessUnlock",
    "cuCheckpointProcessGetState",
    "cuCheckpointProcessGetRestoreThreadId",
)


_start_seconds = None  # how long this process's driver start took, once it happened
_started = None  # the bindings, once cuInit succeeded
_starting = threading.Lock()  # one start at a time: a caller during start_in_background's waits
_background = False  # whether start_in_background began it


def driver():
    """cuda.bindings.driver after a successful cuInit(0)."""
    global _started
    if _started is None:
        with _starting:
            if _started is None:
                _started = _start()
    return _started


def start_in_background():
    """Start the driver (its bindings, cuInit) in a thread now, for a process that has other work
    before its first driver call (the hook's dump holder: the engine's imports); the first
    driver() waits for it. Its failure is left to that call, which tries again and raises."""
    global _background
    if _started is not None or _background:
        return

    def start():
        try:
            driver()
        except Exception:  # noqa: BLE001 - driver() raises it again where it is needed
            pass
    _background = True
    threading.Thread(target=start, name="driver-start", daemon=True).start()


def background_start_seconds():
    """How long the driver's start in the background took, or None where there was none: it ran
    beside other work, so it is not a phase of its own (engine/steps.py reports it apart)."""
    return _start_seconds if _background else None


def _start():
    global _start_seconds
    t0 = time.monotonic()
    try:
        from cuda.bindings import driver as cu
    except ImportError as e:
        raise NoGpuError(f"cuda-bindings is not installed ({e}): pip install cuda-bindings") from e
    try:
        (err,) = cu.cuInit(0)
    except Exception as e:  # cuda-pathfinder's DynamicLibNotFoundError, RuntimeError
        raise NoGpuError("the NVIDIA driver library libcuda.so.1 cannot be loaded "
                         f"({type(e).__name__}); install the NVIDIA driver (>= 580)") from e
    if err != cu.CUresult.CUDA_SUCCESS:
        raise NoGpuError(f"cuInit failed: {error_name(cu, err)}")
    _start_seconds = time.monotonic() - t0
    return cu


def start_seconds():
    """How long this process's driver start took (the bindings imported, cuInit), or None before
    it happened: a step that started the driver can show the part it was (engine/steps.py)."""
    return _start_seconds


def error_name(cu, err):
    res, name = cu.cuGetErrorName(err)
    return name.decode() if res == cu.CUresult.CUDA_SUCCESS and name else f"CUresult {int(err)}"


def check(result, what):
    """Unpack a cuda-python result tuple (err, *values); raise DriverError naming `what` on error."""
    cu = driver()
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        name = error_name(cu, err)
        error = DriverError(f"{what}: {name}")
        error.result = name  # e.g. "CUDA_ERROR_NOT_INITIALIZED", for callers to test
        raise error
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def cuda_version():
    """The CUDA API version the driver implements (13000 for driver 580)."""
    cu = driver()
    return check(cu.cuDriverGetVersion(), "cuDriverGetVersion")


def has_symbol(name):
    """Whether the driver exports `name` (asked through cuGetProcAddress, like cuda-python does)."""
    cu = driver()
    err, _, status = cu.cuGetProcAddress(name.encode(), cuda_version(), 0)
    return (err == cu.CUresult.CUDA_SUCCESS
            and status == cu.CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SUCCESS)


def gpus():
    """[(index, name, uuid string 'GPU-...')] of the visible GPUs."""
    cu = driver()
    out = []
    for i in range(check(cu.cuDeviceGetCount(), "cuDeviceGetCount")):
        dev = check(cu.cuDeviceGet(i), "cuDeviceGet")
        name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName").split(b"\0")[0].decode()
        out.append((i, name, format_uuid(check(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes)))
    return out


def gpu_inventory():
    """[{"uuid", "name", "memory" (total bytes)}] of the visible GPUs, in this process's order."""
    cu = driver()
    out = []
    for i, name, uuid in gpus():
        dev = check(cu.cuDeviceGet(i), "cuDeviceGet")
        out.append({"uuid": uuid, "name": name, "memory": int(check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem"))})
    return out


def format_uuid(raw):
    """16 bytes as nvidia-smi prints them: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx."""
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"
