/* server.c: the control socket of this process (protocol: shim/protocol.md): the socket, the
 * accept loop, workers, authentication, fork. What a request does is commands.c's.
 *
 * Server: abstract AF_UNIX SOCK_SEQPACKET "\0criu-gpushare.<pid>" (pid as this process sees
 * itself), started with the driver (cuInit) or the first tracked call, started again for the new
 * pid in a forked child at its first such call. One thread accepts; each accepted connection gets
 * a worker thread (at most GS_MAX_WORKERS at once) serving one request. All these threads block
 * every signal except the fatal ones and are named "criu-gpushare" so a freezer can spare them.
 *
 * Authentication: SO_PEERCRED uid 0 or this process's euid (as seen in this user namespace).
 * The peer's pid is not checked: a tool in an ancestor pid namespace shows as pid 0. Anyone else
 * in the network namespace can connect and gets "denied".
 *
 * Nothing a client sends can crash or block the workload: requests are bounded in size and
 * time (GS_REQ_TIMEOUT_MS to arrive), every field is validated, fds that come with a request that
 * takes none are closed, and the state lock is only taken with a timeout.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "contexts.h"
#include "devices.h"
#include "gates.h"
#include "pools.h"
#include "resolve.h"
#include "threads.h"
#include "track.h"
#include "wire.h"

#define GS_MAX_REQUEST GS_MAX_RECORD
#define GS_MAX_WORKERS 16
#define GS_REQ_TIMEOUT_MS 2000
#define GS_REPLY_TIMEOUT_MS 5000
#define GS_REFUSE_DRAIN 16 /* records read from a refused client, at most */

static pthread_mutex_t ctl_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t server_pid; /* pid the running server was started for */
static int listen_fd = -1;
static int n_workers; /* atomic */

/* flags: for sendmsg (MSG_DONTWAIT where nothing may wait) */
static void send_reply(int sock, struct gs_reply *r, int flags)
{
    struct gs_buf text = {0};
    gs_reply_text(r, &text);
    if (!text.oom)
        gs_send_text(sock, text.p, text.n, r->fds, r->error ? 0 : r->nfds, flags);
    gs_buf_free(&text);
}

static void send_error(int sock, const char *code, const char *reason, int flags)
{
    struct gs_reply r;
    gs_reply_init(&r);
    gs_reply_fail(&r, code, "%s", reason);
    send_reply(sock, &r, flags);
}

static void serve(int sock)
{
    char *buf = malloc(GS_MAX_REQUEST);
    int fds[GS_MAX_FDS], nfds = 0, trunc = 0, ctrunc = 0;
    if (!buf) {
        send_error(sock, "failed", "out of memory", 0);
        return;
    }
    ssize_t n = gs_recv_record(sock, buf, GS_MAX_REQUEST, fds, &nfds, &trunc, &ctrunc, 0);
    struct gs_reply r;
    gs_reply_init(&r);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            send_error(sock, "bad-request", "no request within 2000 ms", 0);
    } else if (n == 0) {
        /* the client went away */
    } else if (trunc) {
        send_error(sock, "bad-request", "request larger than 65536 bytes", 0);
    } else if (ctrunc) {
        send_error(sock, "bad-request", "too many fds attached", 0);
    } else {
        gs_command_run(buf, (size_t)n, fds, nfds, &r);
        send_reply(sock, &r, 0);
    }
    gs_reply_free(&r);
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
    free(buf);
}

static void *worker_main(void *arg)
{
    int sock = (int)(intptr_t)arg;
    serve(sock);
    close(sock);
    __atomic_sub_fetch(&n_workers, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static int peer_allowed(int sock, char *why, size_t whylen)
{
    struct ucred cr;
    if (gs_peer_cred(sock, &cr)) {
        snprintf(why, whylen, "cannot read the peer's credentials");
        return 0;
    }
    if (gs_uid_trusted(cr.uid))
        return 1;
    snprintf(why, whylen, "uid %u may not control this process (only root or uid %u)",
             (unsigned)cr.uid, (unsigned)geteuid());
    return 0;
}

/* Answers without serving, in the accept thread, without waiting for anything: a stranger must not
 * be able to slow the server down. Closing a unix socket with unread data resets the connection
 * (the client would never see why), so: no more data may come (SHUT_RD: the client's further sends
 * fail), what is already queued is read and dropped (fds closed), the reply goes out if the
 * client's queue has room, and the socket is closed. */
static void refuse(int sock, const char *code, const char *why)
{
    char buf[256];
    int fds[GS_MAX_FDS], nfds = 0, trunc, ctrunc;
    shutdown(sock, SHUT_RD);
    for (int k = 0; k < GS_REFUSE_DRAIN; k++) {
        ssize_t n = gs_recv_record(sock, buf, sizeof(buf), fds, &nfds, &trunc, &ctrunc,
                                   MSG_DONTWAIT);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        if (n <= 0)
            break;
    }
    send_error(sock, code, why, MSG_DONTWAIT);
    close(sock);
}

static void *accept_main(void *arg)
{
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int sock = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (sock < 0) {
            if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE ||
                errno == ENOBUFS || errno == ENOMEM) {
                if (errno != EINTR && errno != ECONNABORTED)
                    usleep(10000);
                continue;
            }
            return NULL; /* the socket was closed (fork child, exit) */
        }
        char why[160];
        if (!peer_allowed(sock, why, sizeof(why))) {
            refuse(sock, "denied", why);
            continue;
        }
        gs_set_timeouts(sock, GS_REQ_TIMEOUT_MS, GS_REPLY_TIMEOUT_MS);
        if (__atomic_add_fetch(&n_workers, 1, __ATOMIC_SEQ_CST) > GS_MAX_WORKERS ||
            gs_start_thread(worker_main, (void *)(intptr_t)sock)) {
            __atomic_sub_fetch(&n_workers, 1, __ATOMIC_SEQ_CST);
            refuse(sock, "busy", "too many requests at once");
        }
    }
}

/* Starts the control server of this pid if it is not running (lazily: first driver use). */
static void server_ensure(void)
{
    if (!gs_devices_known()) /* the driver is initialized by now, and the process not locked */
        gs_devices_refresh();
    pid_t self = getpid();
    if (__atomic_load_n(&server_pid, __ATOMIC_ACQUIRE) == self)
        return;
    pthread_mutex_lock(&ctl_mu);
    if (server_pid != self) {
        struct sockaddr_un a;
        socklen_t alen = gs_sock_addr(self, &a);
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0 || bind(fd, (struct sockaddr *)&a, alen) || listen(fd, 64) ||
            gs_start_thread(accept_main, (void *)(intptr_t)fd)) {
            gs_log("no control socket @%s%d: %s; this process cannot be checkpointed with its "
                   "shared GPU memory", GS_SOCK_PREFIX, (int)self, strerror(errno));
            if (fd >= 0)
                close(fd);
            fd = -1;
        }
        listen_fd = fd;
        __atomic_store_n(&server_pid, self, __ATOMIC_RELEASE); /* one attempt per pid */
    }
    pthread_mutex_unlock(&ctl_mu);
}

static void after_fork_child(void)
{
    /* Only the forking thread exists in the child: the server threads did not come along, and the
     * inherited listening socket carries the parent's name. The next tracked call starts a server
     * under the child's own pid. */
    pthread_mutex_init(&ctl_mu, NULL);
    if (listen_fd >= 0)
        close(listen_fd);
    listen_fd = -1;
    n_workers = 0;
    gs_state_reset_after_fork();
    gs_gates_reset_after_fork();
    gs_contexts_reset_after_fork();
    gs_pools_reset_after_fork();
}

__attribute__((constructor)) static void server_init(void)
{
    gs_set_server_starter(server_ensure);
    pthread_atfork(NULL, NULL, after_fork_child);
}
