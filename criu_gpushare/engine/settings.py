"""A job's settings, whichever door loads them: the commands (cli/) and the CRIU action script
(hook/main.py) all call load_settings here. Each setting comes from the first of these that gives it:
  1. a flag of the command: --store, --timeout (suspend), --gpu-map (resume, restore). The hook has
     none: CRIU runs it without arguments, and CRIU's environment gives what the command line
     would (CRTOOLS_INIT_PID the PID, CRTOOLS_IMAGE_DIR the DIR)
  2. the environment: CRIU_GPUSHARE_STORE, CRIU_GPUSHARE_CACHE, CRIU_GPUSHARE_CACHE_LIMIT,
     CRIU_GPUSHARE_GC_GRACE, CRIU_GPUSHARE_VERIFY (config.py), CRIU_GPUSHARE_GPU_MAP
     ("OLD=NEW,...")
  3. the config file (config.py)
  4. for a restore's store, the one its dump recorded in the image (engine/jobs.py); else the default

Apart from the jobs on purpose: a resume that its holder does loads these and imports nothing of
the engine (engine/resuming.py).
"""
import dataclasses
import os

from ..config import ENV_GPU_MAP, load_settings as load_store_settings
from ..errors import ProcessError
from ..gpu.devices import parse_gpu_map


def load_settings(flags=None, environ=None):
    """Every setting of a job (config.Settings), resolved in the order above. `flags` maps setting
    names (store, cache, cache_limit, gc_grace_s, verify, timeout_s, gpu_map) to command-line
    values, already parsed; None is unset."""
    flags = {k: v for k, v in (flags or {}).items() if v is not None}
    environ = os.environ if environ is None else environ
    own = ("timeout_s", "gpu_map")
    settings = load_store_settings({k: v for k, v in flags.items() if k not in own}, environ)
    origin, more = dict(settings.origin), {}
    for name in own:
        if name in flags:
            more[name], origin[name] = flags[name], "flag"
        elif name == "gpu_map" and environ.get(ENV_GPU_MAP):
            more[name], origin[name] = _gpu_map_env(environ[ENV_GPU_MAP]), f"env {ENV_GPU_MAP}"
        else:
            origin[name] = "default"
    return dataclasses.replace(settings, origin=origin, **more)


def _gpu_map_env(value):
    try:
        return parse_gpu_map(list(filter(None, value.split(","))))
    except ValueError as e:
        raise ProcessError(ENV_GPU_MAP, str(e)) from None
