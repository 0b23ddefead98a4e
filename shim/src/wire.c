/* wire.c: the control socket's transport: abstract names, records with fds, timeouts, trust. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#include "wire.h"

socklen_t gs_sock_addr(pid_t pid, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, GS_SOCK_PREFIX "%d", (int)pid);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

void gs_set_timeouts(int fd, int rcv_ms, int snd_ms)
{
    struct timeval rt = {rcv_ms / 1000, (rcv_ms % 1000) * 1000};
    struct timeval st = {snd_ms / 1000, (snd_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &st, sizeof(st));
}

int gs_send_text(int sock, const char *text, size_t len, const int *fds, int nfds, int flags)
{
    if (nfds < 0 || nfds > GS_MAX_SEND_FDS)
        return -1;
    size_t off = 0;
    do {
        size_t n = len - off < GS_MAX_RECORD ? len - off : GS_MAX_RECORD;
        struct iovec iov = {(void *)(text + off), n};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        union {
            char buf[CMSG_SPACE(sizeof(int) * GS_MAX_SEND_FDS)];
            struct cmsghdr align;
        } c;
        if (off == 0 && nfds > 0) {
            memset(&c, 0, sizeof(c));
            mh.msg_control = c.buf;
            mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
            memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)nfds);
        }
        if (sendmsg(sock, &mh, MSG_NOSIGNAL | flags) < 0)
            return -1;
        off += n;
    } while (off < len);
    return 0;
}

ssize_t gs_recv_record(int sock, char *buf, size_t len, int *fds, int *nfds, int *trunc,
                       int *ctrunc, int flags)
{
    struct iovec iov = {buf, len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * GS_MAX_FDS)];
        struct cmsghdr align;
    } c;
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                        .msg_controllen = sizeof(c.buf)};
    ssize_t n;
    do
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
    while (n < 0 && errno == EINTR);
    *nfds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); n >= 0 && cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + (size_t)i * sizeof(int), sizeof(int));
            if (*nfds < GS_MAX_FDS)
                fds[(*nfds)++] = fd;
            else
                close(fd);
        }
    }
    *trunc = n >= 0 && (mh.msg_flags & MSG_TRUNC);
    *ctrunc = n >= 0 && (mh.msg_flags & MSG_CTRUNC);
    return n;
}

int gs_peer_cred(int sock, struct ucred *cr)
{
    socklen_t len = sizeof(*cr);
    return getsockopt(sock, SOL_SOCKET, SO_PEERCRED, cr, &len) == 0 && len == sizeof(*cr) ? 0 : -1;
}

int gs_uid_trusted(uid_t uid) { return uid == 0 || uid == geteuid(); }
