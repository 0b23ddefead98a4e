"""Finding the processes of a workload and what each of them holds (GPU device files, the shim)."""
import functools
import os

from ..errors import ProcessError
from .shimlib import SHIM_FILENAME

GPU_DEVICE_PREFIX = "/dev/nvidia"


def process_tree(pid):
    """[pid, descendants...] of a running process, each parent before its children; ProcessError
    when it does not exist.

    Reads the kernel's lists of each task's children (/proc/PID/task/TID/children, which CRIU
    itself needs): it costs the tree's size, where psutil reads the stat of every process on the
    host, and it saves psutil's import in every suspend, dump and restore. psutil does it where the
    kernel keeps no such list."""
    if not _kernel_lists_children():
        return _process_tree_psutil(pid)
    tree, seen = [pid], {pid}
    for parent in tree:  # the list grows while it is walked: breadth first
        try:
            children = _children(parent)
        except FileNotFoundError:
            if parent == pid:
                raise ProcessError(pid, "no such process") from None
            continue  # exited meanwhile; its children went to a reaper outside the tree
        except PermissionError as e:
            raise ProcessError(parent, f"cannot read /proc/{parent}/task: permission denied") from e
        for child in children:
            if child not in seen:  # a pid reused during the walk must not loop it
                seen.add(child)
                tree.append(child)
    return tree


@functools.cache
def _kernel_lists_children():
    return os.path.exists("/proc/thread-self/children")


def _children(pid):
    """The pids pid's threads started (a child's parent is the thread that forked it)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                out.extend(int(c) for c in f.read().split())
        except FileNotFoundError:
            continue  # the thread exited meanwhile
    return out


def _process_tree_psutil(pid):
    import psutil  # only here: importing it costs a command start more than walking a tree
    try:
        root = psutil.Process(pid)
        return [pid] + [p.pid for p in root.children(recursive=True)]
    except psutil.NoSuchProcess as e:
        raise ProcessError(pid, "no such process") from e
    except psutil.AccessDenied as e:
        raise ProcessError(pid, "permission denied (run as root or as the process's user)") from e


def _maps_paths(pid):
    try:
        with open(f"/proc/{pid}/maps") as f:
            return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}
    except FileNotFoundError as e:
        raise ProcessError(pid, "no such process") from e
    except PermissionError as e:
        raise ProcessError(pid, "cannot read /proc/%d/maps: permission denied" % pid) from e


def gpu_device_fds(pid):
    """{fd: target} of the /dev/nvidia* files a process holds open."""
    fds = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError as e:
        raise ProcessError(pid, "no such process") from e
    except PermissionError as e:
        raise ProcessError(pid, f"cannot list /proc/{pid}/fd: permission denied") from e
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith(GPU_DEVICE_PREFIX):
            fds[int(name)] = target
    return fds


def gpu_device_mappings(pid):
    """["<start address> <path>"] of the /dev/nvidia* files process pid maps."""
    out = []
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].strip().startswith(GPU_DEVICE_PREFIX):
                    out.append(f"0x{fields[0].split('-')[0]} {fields[5].strip()}")
    except FileNotFoundError as e:
        raise ProcessError(pid, "no such process") from e
    return out


def cuda_and_shim(pid):
    """(has the CUDA driver loaded, runs with criu-gpushare's shim), from one read of its maps."""
    names = {os.path.basename(p) for p in _maps_paths(pid)}
    return any(n.startswith("libcuda.so") for n in names), SHIM_FILENAME in names


def uses_cuda(pid):
    """Whether the process has the CUDA driver loaded (libcuda mapped)."""
    return cuda_and_shim(pid)[0]


def cuda_pids(root_pid):
    """The processes of root_pid's tree with libcuda loaded (no CUDA call: safe before a fork).
    Fails closed: a process whose maps cannot be read is an error, never "uses no CUDA"."""
    out = []
    for pid in process_tree(root_pid):
        if not os.path.exists(f"/proc/{pid}"):
            continue  # exited meanwhile: CRIU will notice on its own
        if uses_cuda(pid):
            out.append(pid)
    return out


def v1_freezer_cgroup(pid):
    """pid's cgroup in a cgroup v1 freezer hierarchy when it is not the root (a container's on a
    cgroup v1 host), else None."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if "freezer" in controllers.split(",") and path != "/":
                    return path
    except FileNotFoundError:
        raise ProcessError(pid, "no such process") from None
    return None
