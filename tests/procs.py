"""Process helpers the tests and the bench share: the subreaper role and reaping for CRIU trees, and
helper processes that announce themselves with a JSON hello line."""
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
