/* wire.h: the control socket's transport (protocol.md, "Transport"), shared by the server and the
 * client side of peer requests: socket names, records with fds, timeouts, who is trusted.
 * Layer 0. */
#ifndef GS_WIRE_H
#define GS_WIRE_H

#include <stddef.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#define GS_SOCK_PREFIX "criu-gpushare."
#define GS_MAX_RECORD 65536 /* bytes per record, a request is one */
#define GS_MAX_FDS 4        /* fds taken from one record; more are closed */

/* The abstract address "\0criu-gpushare.<pid>"; returns its length (the name, no trailing NULs). */
socklen_t gs_sock_addr(pid_t pid, struct sockaddr_un *a);
void gs_set_timeouts(int fd, int rcv_ms, int snd_ms);
/* Sends text as records of at most GS_MAX_RECORD bytes, the nfds fds (at most GS_MAX_SEND_FDS) on
 * the first; flags go to sendmsg (MSG_NOSIGNAL always). 0, or -1. */
#define GS_MAX_SEND_FDS 32
int gs_send_text(int sock, const char *text, size_t len, const int *fds, int nfds, int flags);
/* Receives one record; fds that came with it go to fds (beyond GS_MAX_FDS they are closed).
 * Returns the length, 0 at end of stream, -1 on error; *trunc: the record was larger than buf,
 * *ctrunc: more fds came than fit. flags go to recvmsg. */
ssize_t gs_recv_record(int sock, char *buf, size_t len, int *fds, int *nfds, int *trunc,
                       int *ctrunc, int flags);
/* The peer's SO_PEERCRED: 0, or -1. */
int gs_peer_cred(int sock, struct ucred *cr);
/* Who a shim talks to, either way: root or its own effective uid (in its user namespace). */
int gs_uid_trusted(uid_t uid);

#endif
