/* peer.c: requests to the shims of other processes (exporter lookup, CUDA IPC), and the list of
 * processes that have a control socket in this network namespace. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "peer.h"
#include "wire.h"

int gs_peer_request(pid_t pid, const char *req, int fd_in, char *reply, size_t replylen, int *fd_out,
                    int timeout_ms)
{
    reply[0] = 0;
    if (fd_out)
        *fd_out = -1;
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -1;
    gs_set_timeouts(sock, timeout_ms, timeout_ms);
    struct sockaddr_un a;
    socklen_t alen = gs_sock_addr(pid, &a);
    struct ucred cr;
    socklen_t crlen = sizeof(cr);
    /* Abstract names carry no permissions: talk only to the process the name promises. */
    if (connect(sock, (struct sockaddr *)&a, alen) ||
        getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) || cr.pid != pid ||
        gs_send_text(sock, req, strlen(req), fd_in, 0)) {
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

int gs_peer_pids(pid_t *pids, int max)
{
    FILE *f = fopen("/proc/net/unix", "re");
    if (!f)
        return 0;
    char line[512];
    int n = 0;
    const char *needle = "@" GS_SOCK_PREFIX;
    while (fgets(line, sizeof(line), f) && n < max) {
        char *p = strstr(line, needle);
        if (!p)
            continue;
        char *end;
        long pid = strtol(p + strlen(needle), &end, 10);
        if (pid <= 0 || (*end != '\n' && *end != 0))
            continue;
        int dup = 0;
        for (int i = 0; i < n; i++)
            dup |= pids[i] == (pid_t)pid;
        if (!dup)
            pids[n++] = (pid_t)pid;
    }
    fclose(f);
    return n;
}
