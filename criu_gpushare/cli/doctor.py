"""`criu-gpushare doctor [--json]`: can this machine checkpoint GPU processes? Each check says how to fix it.

Checks run in order and never raise: a failing check is reported with its fix and the exit code is
CheckFailed's when any check failed. Warnings (e.g. persistence mode unknown) do not fail.
"""
import dataclasses
import json
import os
import re
import shutil
import subprocess

import click

from ..gpu import driver as drv
from ..errors import CheckFailed, Error
from ..shimctl.shimlib import shim_path, shim_version
from ..store import memfs

MIN_DRIVER = (580, 0)
MIN_CRIU = (4, 0)
PASS, FAIL, WARN = "pass", "fail", "warn"


@dataclasses.dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


def _version_tuple(text):
    return tuple(int(x) for x in text.split(".")[:2])


def check_driver():
    try:
        with open("/proc/driver/nvidia/version") as f:
            m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+\.\d+(?:\.\d+)?)", f.read())
    except OSError:
        m = None
    try:
        api = drv.cuda_version()
    except Error as e:
        return Check("driver", FAIL, str(e), "install the NVIDIA driver >= 580 and its libcuda.so.1")
    api_text = f"CUDA {api // 1000}.{api % 1000 // 10}"
    if not m:
        return Check("driver", FAIL, f"libcuda loads ({api_text}) but /proc/driver/nvidia/version "
                     "is missing: the kernel module is not loaded",
                     "load the nvidia kernel module (driver >= 580)")
    version = m.group(1)
    if _version_tuple(version) < MIN_DRIVER:
        return Check("driver", FAIL, f"{version} ({api_text})", "upgrade the NVIDIA driver to >= 580")
    return Check("driver", PASS, f"{version} ({api_text})")


def check_checkpoint_api():
    try:
        missing = [s for s in drv.CHECKPOINT_SYMBOLS if not drv.has_symbol(s)]
    except Error as e:
        return Check("checkpoint-api", FAIL, str(e), "install the NVIDIA driver >= 580")
    if missing:
        return Check("checkpoint-api", FAIL, "missing " + ", ".join(missing),
                     "upgrade the NVIDIA driver to >= 580 (the checkpoint API came with 570, "
                     "restoring onto other GPUs with 580)")
    return Check("checkpoint-api", PASS, f"all {len(drv.CHECKPOINT_SYMBOLS)} cuCheckpointProcess* symbols")


def _persistence_modes():
    """{uuid: 'Enabled'|'Disabled'} from nvidia-smi, or None when it cannot tell."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=uuid,persistence_mode", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(tuple(x.strip() for x in line.split(",", 1)) for line in out.splitlines() if "," in line)


def check_gpus():
    try:
        gpus = drv.gpus()
    except Error as e:
        return [Check("gpus", FAIL, str(e), "criu-gpushare needs a machine with an NVIDIA GPU")]
    if not gpus:
        return [Check("gpus", FAIL, "no GPU visible", "check CUDA_VISIBLE_DEVICES and nvidia-smi")]
    checks = [Check("gpus", PASS, "; ".join(f"{i}: {name} {uuid}" for i, name, uuid in gpus))]
    modes = _persistence_modes()
    if modes is None:
        checks.append(Check("persistence-mode", WARN, "unknown (nvidia-smi not available)",
                            "enable it: nvidia-smi -pm 1 (or nvidia-persistenced)"))
    else:
        off = [uuid for _, _, uuid in gpus if modes.get(uuid, "").lower() != "enabled"]
        if off:
            checks.append(Check("persistence-mode", FAIL, "disabled on " + ", ".join(off),
                                "enable it: nvidia-smi -pm 1 (or run nvidia-persistenced); "
                                "the driver's restore needs it"))
        else:
            checks.append(Check("persistence-mode", PASS, "enabled on every GPU"))
    return checks


def check_criu():
    criu = shutil.which("criu")
    if not criu:
        return [Check("criu", FAIL, "criu not found in PATH", "install CRIU >= 4.0")]
    try:
        out = subprocess.run([criu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return [Check("criu", FAIL, f"{criu} --version: {e}", "reinstall CRIU >= 4.0")]
    m = re.search(r"Version:\s*(\d+\.\d+(?:\.\d+)?)", out)
    if not m or _version_tuple(m.group(1)) < MIN_CRIU:
        return [Check("criu", FAIL, f"{criu}: {out.strip() or 'no version'}",
                      "install CRIU >= 4.0 (older ones fail on recent kernels)")]
    checks = [Check("criu", PASS, f"{m.group(1)} at {criu}")]
    try:
        r = subprocess.run([criu, "check"], capture_output=True, text=True, timeout=120)
        detail = (r.stdout + r.stderr).strip().splitlines()
        ok = r.returncode == 0
        checks.append(Check("criu-check", PASS if ok else FAIL, detail[-1] if detail else f"exit {r.returncode}",
                            "" if ok else "run `criu check` as root and fix what it reports"))
    except (OSError, subprocess.SubprocessError) as e:
        checks.append(Check("criu-check", FAIL, str(e), "run `criu check` as root"))
    return checks


def check_cuda_plugin():
    """CRIU's own CUDA plugin must not act on our tasks (hooks/README.md, "Configuration")."""
    from ..criu.libdir import criu_libdir, installed_cuda_plugin
    path = installed_cuda_plugin()
    if path is None:
        return Check("criu-cuda-plugin", PASS, f"not installed in {criu_libdir()}: CRIU leaves GPU "
                     "tasks to criu-gpushare")
    return Check("criu-cuda-plugin", WARN, f"{path} is installed: `criu-gpushare dump`/`restore` "
                 "give CRIU a plugin directory without it, but `criu --action-script "
                 "criu-gpushare-hook` and runc would load it",
                 f"for the hook, set `libdir` in CRIU's config to a directory without {os.path.basename(path)}")


# CRIU's node-wide configuration files (runc's is read for runc's requests); either may name the hook.
CRIU_CONFIG_FILES = ("/etc/criu/default.conf", "/etc/criu/runc.conf")


def _config_words(path):
    with open(path) as f:
        return [line.split() for line in f if line.strip() and not line.lstrip().startswith("#")]


def check_link_remap(files=CRIU_CONFIG_FILES):
    """A CRIU configuration that runs the hook must also turn on link-remap: every Python program
    using multiprocessing queues or locks holds deleted semaphore files that CRIU dumps only so."""
    missing, configured = [], []
    for path in files:
        try:
            words = _config_words(path)
        except OSError:
            continue
        if not _hook_scripts(words):
            continue
        (configured if any(w[0].lstrip("-") == "link-remap" for w in words) else missing).append(path)
    if missing:
        return Check("criu-link-remap", WARN, f"{', '.join(missing)} runs criu-gpushare-hook without "
                     "link-remap: dumps of programs using Python multiprocessing will fail",
                     f"add a line `link-remap` to {', '.join(missing)} (hooks/runc.conf shows it)")
    if configured:
        return Check("criu-link-remap", PASS, f"link-remap set beside the hook in {', '.join(configured)}")
    return Check("criu-link-remap", PASS, "no CRIU configuration file runs the hook; `criu-gpushare dump` "
                 "turns link-remap on itself, and `criu dump --action-script criu-gpushare-hook` needs "
                 "--link-remap added by hand")


def _hook_scripts(words):
    return [w[1] for w in words if w[0].lstrip("-") == "action-script" and len(w) > 1
            and "criu-gpushare-hook" in w[1]]


def check_hook_installed(files=CRIU_CONFIG_FILES, search_path=None):
    """A configured hook CRIU cannot run fails every dump and restore on the node: the script
    must be executable, and the Python program its launcher runs must be beside it (or on PATH;
    search_path: another PATH to look in)."""
    broken, seen = [], []
    for path in files:
        try:
            scripts = _hook_scripts(_config_words(path))
        except OSError:
            continue
        for script in scripts:
            seen.append(script)
            if not (os.path.isfile(script) and os.access(script, os.X_OK)):
                broken.append(f"{path} names {script}, which is not an executable file")
                continue
            beside = os.path.join(os.path.dirname(os.path.realpath(script)), "criu-gpushare-hook-actions")
            if not os.access(beside, os.X_OK) and shutil.which("criu-gpushare-hook-actions",
                                                               path=search_path) is None:
                broken.append(f"{script} runs criu-gpushare-hook-actions, which is neither beside it "
                              "nor on PATH")
    if broken:
        return Check("criu-hook", FAIL, "; ".join(broken) + ": CRIU fails every dump and restore "
                     "that runs it", "point action-script at the output of `command -v "
                     "criu-gpushare-hook` (reinstall criu-gpushare if there is none)")
    if seen:
        return Check("criu-hook", PASS, f"CRIU runs {', '.join(sorted(set(seen)))}")
    return Check("criu-hook", PASS, "no CRIU configuration file runs the hook")


def check_pycriu():
    try:
        import pycriu  # noqa: F401  (ships with CRIU, not on PyPI)
    except ImportError as e:
        return Check("pycriu", FAIL, str(e), "install CRIU's python3-pycriu package, "
                     "or put its dist-packages on PYTHONPATH")
    return Check("pycriu", PASS, os.path.dirname(pycriu.__file__))


def check_shim():
    try:
        path = shim_path()
        version, protocol = shim_version(path)
    except Error as e:
        return Check("shim", FAIL, str(e), "reinstall criu-gpushare: pip install criu-gpushare")
    return Check("shim", PASS, f"{version} (protocol {protocol}) at {path}")


def check_store():
    try:
        from ..config import load_settings
        store = load_settings().store
    except ImportError:
        return Check("store", FAIL, "store settings module missing", "reinstall criu-gpushare")
    except Error as e:
        return Check("store", FAIL, str(e), "fix the configuration file or environment variable")
    if "://" in store:
        return _check_object_store(store)
    probe = os.path.abspath(store)
    while not os.path.isdir(probe):  # the store is created on first use: check where it would be
        probe = os.path.dirname(probe)
    if not os.access(probe, os.W_OK | os.X_OK):
        return Check("store", FAIL, f"{store}: {probe} is not writable",
                     "set CRIU_GPUSHARE_STORE or the config file's store to a writable directory")
    return Check("store", PASS, store if probe == store else f"{store} (created on first use)")


def check_store_pages(store, mountinfo=memfs.MOUNTINFO, shmem_enabled=memfs.SHMEM_ENABLED):
    """[a Check] for a local store on tmpfs: whether its chunks get huge pages (saves and loads run
    faster: the kernel fills 512 times fewer pages); [] for any other store."""
    if "://" in store:
        return []
    probe = os.path.abspath(store)
    while not os.path.isdir(probe):  # created on first use: where it would be
        probe = os.path.dirname(probe)
    try:
        mount = memfs.mount_of(probe, mountinfo)
    except OSError:
        return []
    if mount is None or mount[1] != "tmpfs":
        return []
    point, _, options = mount
    if memfs.tmpfs_huge_pages(options, shmem_enabled):
        return [Check("store pages", PASS, f"{store} is on a tmpfs of huge pages ({point})")]
    return [Check("store pages", WARN,
                  f"{store} is on a tmpfs of 4 KiB pages ({point}): GPU memory saves and loads run "
                  "slower there (40 GiB on an H200: a dump 3.34 s against 2.68 s on huge pages)",
                  "give the store a tmpfs of its own with huge pages: mount -t tmpfs -o "
                  "huge=always,size=SIZE,mode=0700 tmpfs DIR, and point the store there "
                  '(README, "Settings")')]


def _check_object_store(url):
    from ..store.s3client import is_s3_url
    if not is_s3_url(url):
        return Check("store", FAIL, f"{url}: not a directory or an s3:// URL",
                     "set CRIU_GPUSHARE_STORE or the config file's store to a directory or s3://BUCKET/PREFIX")
    from ..store.s3store import S3Store
    try:
        return Check("store", PASS, S3Store.probe(url))
    except Error as e:
        return Check("store", FAIL, str(e), "check AWS_ENDPOINT_URL, the credentials (AWS_ACCESS_KEY_ID, "
                     "AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and that the bucket exists")


def run_checks():
    checks = [check_driver(), check_checkpoint_api(), *check_gpus(), *check_criu(),
              check_cuda_plugin(), check_hook_installed(), check_link_remap(), check_pycriu(), check_shim(),
              check_store()]
    if checks[-1].status == PASS:
        from ..config import load_settings
        checks += check_store_pages(load_settings().store)
    return checks


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def doctor(as_json):
    """Check that this machine can checkpoint GPU processes, and say how to fix what fails."""
    checks = run_checks()
    failed = [c for c in checks if c.status == FAIL]
    if as_json:
        click.echo(json.dumps({"ok": not failed, "checks": [dataclasses.asdict(c) for c in checks]},
                              indent=2))
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            click.echo(f"{c.status.upper():4}  {c.name:{width}}  {c.detail}")
            if c.fix and c.status != PASS:
                click.echo(f"{'':4}  {'':{width}}  fix: {c.fix}")
    if failed:
        raise CheckFailed(len(failed))
