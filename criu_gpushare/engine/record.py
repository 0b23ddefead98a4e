"""The record a dump leaves in a CRIU image directory: `criu-gpushare.json`.

It is what a restore, in a new process and maybe on another machine, needs besides CRIU's own
images and the chunk store: where the GPU memory is (store path, ref, manifest id), the group's
plan and the steps its dump took (so the restore runs exactly their undo), the GPUs by UUID with
their model and memory, and the processes by pid (host pid and pid in their own namespace).

  {"format": 1, "tool": "0.1.0", "protocol": 2, "created": 1764750000.0,
   "gpu_state": true,                  # false: the tree had libcuda loaded but no GPU state
   "store": "/var/lib/criu-gpushare/store", "ref": "dump-1234-...", "manifest": "<id>",
   "gpus": [{"uuid": "GPU-...", "name": "NVIDIA H200", "memory": 150754820096}],
   "processes": [{"pid": 1234, "nspid": 1234}, ...],
   "group": {...},                     # engine/steps.py Group.state()
   "options": {"store": ..., "ref": ..., "verify": true, "timeout_s": 60.0, ...}}
                                       # the dump's options whole (engine/steps.py Options);
                                       # records without it (older dumps) are read the same

Written atomically and durably; read back with every field checked (ImageError names what is
wrong), never through a symbolic link, and only from a regular file of root's or the reader's.
"""
import errno
import json
import os
import stat
import time

from .. import __version__
from ..errors import ImageError

RECORD_NAME = "criu-gpushare.json"


def path_in(images_dir):
    """Where the record of images_dir is."""
    return os.path.join(images_dir, RECORD_NAME)


class RecordMissing(ImageError):
    """CRIU image {}: {}"""
FORMAT = 1
_REQUIRED = {"format": int, "gpu_state": bool, "store": str, "ref": str, "gpus": list,
             "processes": list, "group": dict}


def make(group, store, ref, manifest_id, gpus, nspids, protocol, options=None):
    rec = {"format": FORMAT, "tool": __version__, "protocol": protocol, "created": time.time(),
           # the store as the settings give it: an absolute path, or an s3:// URL (config.py)
           "gpu_state": group.has_gpu_state, "store": store, "ref": ref,
           "manifest": manifest_id, "gpus": gpus,
           "processes": [{"pid": p, "nspid": nspids.get(p, p)} for p in group.pids],
           "group": group.state()}
    if options is not None:  # what the dump ran with; a restore reads only its store and ref
        rec["options"] = options.stored()
    return rec


def write(images_dir, record):
    path = path_in(images_dir)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)
    fd = os.open(images_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read(images_dir):
    """The record of images_dir; ImageError when it is missing (an image made without
    criu-gpushare), unreadable, or of a format this version does not know."""
    path = path_in(images_dir)
    try:
        # Not through a link, nor from a file that only its owner may vouch for: the record names
        # the store and the ref a restore loads into GPU memory.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd) as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ImageError(images_dir, f"{path} is not a regular file: remove it and dump again")
            if st.st_uid not in (0, os.geteuid()):
                raise ImageError(images_dir, f"{path} is owned by uid {st.st_uid}, neither root nor "
                                 f"uid {os.geteuid()}: if you trust it, chown it, else dump again")
            record = json.load(f)
    except FileNotFoundError:
        raise RecordMissing(images_dir, f"has no {RECORD_NAME}: it was not dumped through "
                         "criu-gpushare (criu-gpushare dump, or criu dump --action-script "
                         "criu-gpushare-hook)") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ImageError(images_dir, f"{path} is a symbolic link: the tool reads no record through "
                             "one; copy the file in its place") from None
        raise ImageError(images_dir, f"{RECORD_NAME} cannot be read: {e}") from None
    except ValueError as e:
        raise ImageError(images_dir, f"{RECORD_NAME} cannot be read: {e}") from None
    if not isinstance(record, dict):
        raise ImageError(images_dir, f"{RECORD_NAME} is not a JSON object")
    for key, kind in _REQUIRED.items():
        if not isinstance(record.get(key), kind):
            raise ImageError(images_dir, f"{RECORD_NAME}: field {key!r} is missing or not a {kind.__name__}")
    if record["format"] != FORMAT:
        raise ImageError(images_dir, f"{RECORD_NAME} is of format {record['format']}; this "
                         f"criu-gpushare ({__version__}) reads format {FORMAT}")
    return record
