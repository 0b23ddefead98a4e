/* peer.h: the client side of shim-to-shim requests, and the list of peers. Layer 0 (uses wire). */
#ifndef GS_PEER_H
#define GS_PEER_H

#include <stddef.h>
#include <sys/types.h>

/* Asks the shim of pid: one JSON request (and optionally an fd), one reply (and optionally an fd).
 * Returns 0 with the reply in reply (NUL-terminated), or -1. */
int gs_peer_request(pid_t pid, const char *req, int fd_in, char *reply, size_t replylen, int *fd_out,
                    int timeout_ms);
/* Pids named by a control socket in this network namespace (/proc/net/unix), at most max. */
int gs_peer_pids(pid_t *pids, int max);

#endif
