/* peer.c: requests to the shims of other processes (exporter lookup, CUDA IPC), and the list of
 * processes that have a control socket in this network namespace.
 *
 * Abstract names carry no permissions: anyone in the network namespace can bind
 * "@criu-gpushare.<pid>", with its own pid or a stranger's. So before anything is sent (a request,
 * an fd) and before any answer is believed, the server must be the process the name promises
 * (SO_PEERCRED pid) and run as root or as this process's effective uid. And a name must cost the
 * program nothing when it is not a shim's: the connect does not wait (a full listen backlog skips
 * the name at once), and the credentials are known the moment it succeeds. A stopped process's
 * shim is not asked at all: it could not answer before the request's timeout.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"
#include "wire.h"

/* Whether pid is stopped by a signal (SIGSTOP; criu-gpushare's hand-over to CRIU): its shim would
 * accept the connection and answer nothing until it runs again, so asking it costs the request's
 * whole timeout. Not a tracing stop ('t'): the tool's freezer stops a process's other threads
 * that way while its shim's thread answers. */
static int stopped(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    const char *paren = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    return paren && paren[1] == ' ' && paren[2] == 'T';
}

/* A connected socket to the shim of pid, blocking from now on; -1 when the name is not bound, its
 * backlog is full, its process is stopped, or its server is not pid, or runs as a user this shim
 * does not trust. */
static int connect_trusted(pid_t pid)
{
    if (stopped(pid))
        return -1;
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (sock < 0)
        return -1;
    struct sockaddr_un a;
    socklen_t alen = gs_sock_addr(pid, &a);
    struct ucred cr;
    int r;
    do /* a unix connect does not go "in progress": it succeeds, or fails (EAGAIN: backlog full) */
        r = connect(sock, (struct sockaddr *)&a, alen);
    while (r && errno == EINTR);
    if (r || gs_peer_cred(sock, &cr) || cr.pid != pid || !gs_uid_trusted(cr.uid) ||
        fcntl(sock, F_SETFL, fcntl(sock, F_GETFL) & ~O_NONBLOCK)) {
        close(sock);
        return -1;
    }
    return sock;
}

int gs_peer_request(pid_t pid, const char *req, int fd_in, char *reply, size_t replylen, int *fd_out,
                    int timeout_ms)
{
    reply[0] = 0;
    if (fd_out)
        *fd_out = -1;
    int sock = connect_trusted(pid);
    if (sock < 0)
        return -1;
    gs_set_timeouts(sock, timeout_ms, timeout_ms);
    if (gs_send_text(sock, req, strlen(req), &fd_in, fd_in >= 0, 0)) {
        close(sock);
        return -1;
    }
    size_t got = 0;
    int rc = -1;
    for (;;) {
        int fds[GS_MAX_FDS], nfds, trunc, ctrunc;
        ssize_t n = gs_recv_record(sock, reply + got, replylen - 1 - got, fds, &nfds, &trunc, &ctrunc, 0);
        for (int i = 0; i < nfds; i++) {
            if (fd_out && *fd_out < 0 && i == 0)
                *fd_out = fds[i];
            else
                close(fds[i]);
        }
        if (n <= 0 || trunc) {
            rc = n == 0 && got ? 0 : -1;
            break;
        }
        got += (size_t)n;
        if (got >= replylen - 1)
            break;
    }
    reply[got] = 0;
    close(sock);
    if (rc && fd_out && *fd_out >= 0) {
        close(*fd_out);
        *fd_out = -1;
    }
    return rc;
}

static int cmp_pid(const void *a, const void *b)
{
    pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
    return (x > y) - (x < y);
}

pid_t *gs_peer_pids(size_t *count)
{
    *count = 0;
    FILE *f = fopen("/proc/net/unix", "re");
    if (!f)
        return NULL;
    pid_t *pids = NULL;
    size_t n = 0, cap = 0;
    char line[512];
    const char *needle = "@" GS_SOCK_PREFIX;
    while (fgets(line, sizeof(line), f)) {
        char *p = strstr(line, needle);
        if (!p)
            continue;
        char *end;
        long pid = strtol(p + strlen(needle), &end, 10);
        if (pid <= 0 || pid > 0x7fffffff || (*end != '\n' && *end != 0))
            continue;
        if (n == cap) { /* no cap on the count: names a stranger binds must not hide a shim's */
            size_t ncap = cap ? cap * 2 : 64;
            pid_t *np = realloc(pids, ncap * sizeof(*np));
            if (!np)
                break;
            pids = np;
            cap = ncap;
        }
        pids[n++] = (pid_t)pid;
    }
    fclose(f);
    if (n)
        qsort(pids, n, sizeof(*pids), cmp_pid);
    size_t k = 0; /* each pid once (a listener and its connections all show the name) */
    for (size_t i = 0; i < n; i++)
        if (!k || pids[k - 1] != pids[i])
            pids[k++] = pids[i];
    *count = k;
    return pids;
}
