"""Process helpers the tests and the bench share: the subreaper role and reaping for CRIU trees, the
named semaphores a killed tree leaves behind, and helper processes that announce themselves with a
JSON hello line."""
import contextlib
import ctypes
import json
import os
import subprocess

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper():
    """Orphans of the trees this process starts (CRIU kills a parent with its children; a restored
    tree's root is reparented once the tool exits) become its children, so that reap_children can
    free their pids for the next restore."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def reap_children():
    """Reaps every child that has exited, ours or reparented to us (a zombie, multiprocessing's
    resource tracker among them, still holds its pid and the tree's session id). Returns False
    when no child at all is left."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        return False
    return True


def named_semaphores(pids):
    """The POSIX named semaphores (/dev/shm/sem.*) the processes have mapped, by path. Found by
    inode, not by the paths in the maps: sem_open maps a temporary file and then links it under the
    semaphore's name, so its creator, and every process of a tree CRIU restored, maps a name that
    is gone."""
    inodes = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            continue  # gone already: what it mapped is mapped by the others, or by nobody
        for line in lines:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/sem."):
                inodes.add(int(fields[4]))
    if not inodes:
        return []
    return sorted(e.path for e in os.scandir("/dev/shm") if e.name.startswith("sem.") and e.inode() in inodes)


@contextlib.contextmanager
def semaphores_unlinked(pids):
    """Around a SIGKILL of a whole tree: its named semaphores, taken before, unlinked after. A tree
    started with multiprocessing's spawn keeps its queues' and events' semaphores linked while it
    runs and leaves their unlinking to its resource tracker, which such a kill ends too."""
    paths = named_semaphores(pids)
    yield
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class ReadyProcesses:
    """Helper processes that print one JSON line with "ready": true, then serve until their stdin
    closes; stop() closes it and waits (SIGKILL after 10 s)."""

    def __init__(self):
        self.started = []

    def start(self, argv):
        """(process, hello) of argv started with pipes for stdin and stdout."""
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.started.append(p)
        hello = json.loads(p.stdout.readline())
        assert hello["ready"], hello
        return p, hello

    def stop(self):
        for p in self.started:
            p.stdin.close()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
