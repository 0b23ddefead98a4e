/* peer.h: the client side of shim-to-shim requests, and the list of peers. Layer 0 (uses wire). */
#ifndef GS_PEER_H
#define GS_PEER_H

#include <stddef.h>
#include <sys/types.h>

/* Asks the shim of pid: one JSON request (and optionally an fd), one reply (and optionally an fd).
 * Only a server that is pid and runs as root or this process's euid is sent anything or believed;
 * any other name costs no wait. Returns 0 with the reply in reply (NUL-terminated), or -1. */
int gs_peer_request(pid_t pid, const char *req, int fd_in, char *reply, size_t replylen, int *fd_out,
                    int timeout_ms);
/* Pids named by a control socket in this network namespace (/proc/net/unix), each once, in a
 * malloc'd array (free it), *count of them. */
pid_t *gs_peer_pids(size_t *count);

#endif
