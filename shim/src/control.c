/* control.c: the control socket of this process (protocol: shim/protocol.md), and requests to the
 * shims of other processes.
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
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim_internal.h"

#define GS_SOCK_PREFIX "criu-gpushare."
#define GS_THREAD_NAME "criu-gpushare"
#define GS_MAX_REQUEST 65536
#define GS_MAX_RECORD 65536
#define GS_MAX_FDS 4
#define GS_MAX_WORKERS 16
#define GS_REQ_TIMEOUT_MS 2000
#define GS_REPLY_TIMEOUT_MS 5000
#define GS_LOCK_TIMEOUT_MS 2000
#define GS_DENY_WAIT_MS 100

static pthread_mutex_t ctl_mu = PTHREAD_MUTEX_INITIALIZER;
static pid_t server_pid; /* pid the running server was started for */
static int listen_fd = -1;
static int n_workers; /* atomic */

void gs_log(const char *fmt, ...)
{
    char line[512];
    int n = snprintf(line, sizeof(line), "[criu-gpushare %d] ", (int)getpid());
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
    va_end(ap);
    if (n > (int)sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    ssize_t unused = write(2, line, (size_t)n);
    (void)unused;
}

/* ---- threads ---------------------------------------------------------------------------------- */

static void block_signals(sigset_t *old)
{
    sigset_t all;
    sigfillset(&all);
    static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
    for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
        sigdelset(&all, fatal[i]);
    pthread_sigmask(SIG_BLOCK, &all, old);
}

void gs_thread_init(void)
{
    block_signals(NULL);
    prctl(PR_SET_NAME, GS_THREAD_NAME, 0, 0, 0);
}

struct start {
    void *(*fn)(void *);
    void *arg;
    sem_t *named;
};

static void *trampoline(void *p)
{
    struct start s = *(struct start *)p;
    free(p);
    gs_thread_init();
    sem_post(s.named);
    return s.fn(s.arg);
}

int gs_start_thread(void *(*fn)(void *), void *arg)
{
    struct start *s = malloc(sizeof(*s));
    if (!s)
        return -1;
    s->fn = fn;
    s->arg = arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    /* Created with signals blocked, so no signal meant for the app lands on it before it runs. */
    sigset_t old;
    block_signals(&old);
    pthread_t t;
    sem_t named;
    sem_init(&named, 0, 0);
    s->named = &named;
    int r = pthread_create(&t, &attr, trampoline, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (r == 0) /* the thread carries its name before the caller goes on (a freezer may look) */
        while (sem_wait(&named) && errno == EINTR)
            ;
    sem_destroy(&named);
    pthread_attr_destroy(&attr);
    if (r) {
        free(s);
        return -1;
    }
    return 0;
}

/* ---- messages ----------------------------------------------------------------------------------- */

static socklen_t sock_addr(pid_t pid, struct sockaddr_un *a)
{
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    int n = snprintf(a->sun_path + 1, sizeof(a->sun_path) - 1, GS_SOCK_PREFIX "%d", (int)pid);
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static void set_timeouts(int fd, int rcv_ms, int snd_ms)
{
    struct timeval rt = {rcv_ms / 1000, (rcv_ms % 1000) * 1000};
    struct timeval st = {snd_ms / 1000, (snd_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &rt, sizeof(rt));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &st, sizeof(st));
}

/* Sends text as records of at most GS_MAX_RECORD bytes, fd (if >= 0) on the first. */
static int send_text(int sock, const char *text, size_t len, int fd)
{
    size_t off = 0;
    do {
        size_t n = len - off < GS_MAX_RECORD ? len - off : GS_MAX_RECORD;
        struct iovec iov = {(void *)(text + off), n};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        union {
            char buf[CMSG_SPACE(sizeof(int))];
            struct cmsghdr align;
        } c;
        if (off == 0 && fd >= 0) {
            memset(&c, 0, sizeof(c));
            mh.msg_control = c.buf;
            mh.msg_controllen = sizeof(c.buf);
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(sizeof(int));
            memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        }
        if (sendmsg(sock, &mh, MSG_NOSIGNAL) < 0)
            return -1;
        off += n;
    } while (off < len);
    return 0;
}

/* Receives one record; fds that came with it go to fds (excess ones are closed). Returns the
 * length, 0 at end of stream, -1 on error; *trunc is set if the record was larger than buf. */
static ssize_t recv_record(int sock, char *buf, size_t len, int *fds, int *nfds, int *trunc,
                           int *ctrunc)
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
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
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

/* ---- server ------------------------------------------------------------------------------------- */

static void reply_error(int sock, const char *code, const char *reason)
{
    struct gs_buf b = {0};
    gs_buf_printf(&b, "{\"v\":%d,\"ok\":false,\"error\":", CRIU_GPUSHARE_PROTOCOL);
    gs_buf_str(&b, code);
    gs_buf_printf(&b, ",\"reason\":");
    gs_buf_str(&b, reason);
    gs_buf_printf(&b, "}");
    if (!b.oom)
        send_text(sock, b.p, b.n, -1);
    gs_buf_free(&b);
}

static void reply_ok(int sock, struct gs_buf *body, int fd)
{
    struct gs_buf b = {0};
    gs_buf_printf(&b, "{\"v\":%d,\"ok\":true", CRIU_GPUSHARE_PROTOCOL);
    if (body && body->n)
        gs_buf_printf(&b, ",%s", body->p);
    gs_buf_printf(&b, "}");
    if (b.oom)
        reply_error(sock, "failed", "out of memory building the reply");
    else
        send_text(sock, b.p, b.n, fd);
    gs_buf_free(&b);
}

static void cmd_status(int sock)
{
    struct gs_buf b = {0};
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        reply_error(sock, "busy", "state lock held for 2 s (an application thread is stopped "
                                  "inside the shim?)");
        return;
    }
    gs_buf_printf(&b, "\"pid\":%d,\"version\":\"%s\",\"protocol\":%d,", (int)getpid(),
                  CRIU_GPUSHARE_SHIM_VERSION, CRIU_GPUSHARE_PROTOCOL);
    gs_status_json(&b);
    gs_buf_printf(&b, ",\"state\":\"%s\"", gs_lifecycle_state_locked());
    gs_unlock();
    gs_buf_printf(&b, ",");
    gs_gates_status(&b);
    reply_ok(sock, &b, -1);
    gs_buf_free(&b);
}

static void cmd_quiesce(int sock, const struct gs_json *req)
{
    const struct gs_json_field *t = gs_json_get(req, "timeout_ms", 'i');
    long long timeout = t ? t->num : 2000;
    if (timeout < 1 || timeout > 600000) {
        reply_error(sock, "bad-request", "timeout_ms must be between 1 and 600000");
        return;
    }
    gs_resolve_pending_imports();
    char untracked[512];
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        reply_error(sock, "busy", "state lock held for 2 s");
        return;
    }
    int n = gs_untracked(untracked, sizeof(untracked));
    gs_unlock();
    if (n) {
        reply_error(sock, "refused", untracked);
        return;
    }
    char err[256];
    if (gs_quiesce((int)timeout, err, sizeof(err))) {
        reply_error(sock, "busy", err);
        return;
    }
    struct gs_buf b = {0};
    gs_buf_printf(&b, "\"quiesced\":true");
    reply_ok(sock, &b, -1);
    gs_buf_free(&b);
}

static void cmd_whose(int sock, const int *fds, int nfds)
{
    if (nfds != 1) {
        reply_error(sock, "bad-request", "whose takes exactly one fd");
        return;
    }
    struct gs_origin o;
    char err[128];
    int r = gs_whose_fd(fds[0], &o, err, sizeof(err));
    if (r) {
        reply_error(sock, r == -2 ? "busy" : "not-ours", err);
        return;
    }
    struct gs_buf b = {0};
    gs_buf_printf(&b, "\"id\":%llu,\"multicast\":%s,\"size\":%zu", (unsigned long long)o.id,
                  o.is_mc ? "true" : "false", o.size);
    reply_ok(sock, &b, -1);
    gs_buf_free(&b);
}

static void cmd_export(int sock, const struct gs_json *req)
{
    const struct gs_json_field *f = gs_json_get(req, "id", 'i');
    if (!f || f->num <= 0) {
        reply_error(sock, "bad-request", "export needs \"id\": a positive integer");
        return;
    }
    int fd = -1;
    char err[256];
    int r = gs_export_id((uint64_t)f->num, &fd, err, sizeof(err));
    if (r) {
        reply_error(sock, r == -2 ? "busy" : strncmp(err, "gone", 4) == 0 ? "gone" : "failed", err);
        return;
    }
    reply_ok(sock, NULL, fd);
    close(fd);
}

/* Host memory released by `release` is registered again first; the gates stay closed while
 * anything is still released. */
static void cmd_resume(int sock)
{
    char err[256];
    int r = gs_lifecycle_before_resume(err, sizeof(err));
    if (r) {
        reply_error(sock, r == -2 ? "busy" : r == -3 ? "refused" : "failed", err);
        return;
    }
    gs_resume();
    struct gs_buf b = {0};
    gs_buf_printf(&b, "\"resumed\":true");
    reply_ok(sock, &b, -1);
    gs_buf_free(&b);
}

/* The suspend/resume commands of lifecycle.c. */
static void cmd_lifecycle(int sock, const char *cmd, const struct gs_json *req, const int *fds,
                          int nfds)
{
    struct gs_buf b = {0};
    char err[320];
    int fd = -1;
    const char *code = gs_lifecycle_command(cmd, req, fds, nfds, &b, &fd, err, sizeof(err));
    if (code)
        reply_error(sock, code, err);
    else if (b.oom)
        reply_error(sock, "failed", "out of memory building the reply");
    else
        reply_ok(sock, &b, fd);
    if (fd >= 0)
        close(fd);
    gs_buf_free(&b);
}

static void serve(int sock)
{
    char *buf = malloc(GS_MAX_REQUEST);
    int fds[GS_MAX_FDS], nfds = 0, trunc = 0, ctrunc = 0;
    if (!buf) {
        reply_error(sock, "failed", "out of memory");
        return;
    }
    ssize_t n = recv_record(sock, buf, GS_MAX_REQUEST, fds, &nfds, &trunc, &ctrunc);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            reply_error(sock, "bad-request", "no request within 2000 ms");
        goto out;
    }
    if (n == 0)
        goto out;
    struct gs_json req;
    char err[160];
    if (trunc) {
        reply_error(sock, "bad-request", "request larger than 65536 bytes");
        goto out;
    }
    if (ctrunc) {
        reply_error(sock, "bad-request", "too many fds attached");
        goto out;
    }
    if (gs_json_parse(buf, (size_t)n, &req, err, sizeof(err))) {
        reply_error(sock, "bad-request", err);
        goto out;
    }
    const struct gs_json_field *v = gs_json_get(&req, "v", 'i');
    const struct gs_json_field *cmd = gs_json_get(&req, "cmd", 's');
    if (!v || v->num != CRIU_GPUSHARE_PROTOCOL) {
        snprintf(err, sizeof(err), "protocol version %lld is not supported (this shim speaks %d)",
                 v ? v->num : 0LL, CRIU_GPUSHARE_PROTOCOL);
        reply_error(sock, "version", err);
        goto out;
    }
    if (!cmd) {
        reply_error(sock, "bad-request", "missing \"cmd\"");
        goto out;
    }
    if (nfds && strcmp(cmd->str, "whose") != 0 && !gs_lifecycle_takes_fd(cmd->str)) {
        reply_error(sock, "bad-request", "unexpected fd with this command");
        goto out;
    }
    if (!strcmp(cmd->str, "status"))
        cmd_status(sock);
    else if (!strcmp(cmd->str, "quiesce"))
        cmd_quiesce(sock, &req);
    else if (!strcmp(cmd->str, "resume"))
        cmd_resume(sock);
    else if (!strcmp(cmd->str, "whose"))
        cmd_whose(sock, fds, nfds);
    else if (!strcmp(cmd->str, "export"))
        cmd_export(sock, &req);
    else if (gs_lifecycle_command_known(cmd->str))
        cmd_lifecycle(sock, cmd->str, &req, fds, nfds);
    else {
        snprintf(err, sizeof(err), "unknown command \"%.64s\"", cmd->str);
        reply_error(sock, "unknown-command", err);
    }
out:
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
    socklen_t len = sizeof(cr);
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &len)) {
        snprintf(why, whylen, "cannot read the peer's credentials");
        return 0;
    }
    if (cr.uid == 0 || cr.uid == geteuid())
        return 1;
    snprintf(why, whylen, "uid %u may not control this process (only root or uid %u)",
             (unsigned)cr.uid, (unsigned)geteuid());
    return 0;
}

/* Answers without serving: reads (and drops) the request first, because closing a unix socket
 * with unread data resets the connection and the client would never see why. A client that sends
 * nothing holds the accept thread for at most GS_DENY_WAIT_MS. */
static void refuse(int sock, const char *code, const char *why)
{
    char buf[256];
    int fds[GS_MAX_FDS], nfds = 0, trunc, ctrunc;
    set_timeouts(sock, GS_DENY_WAIT_MS, GS_DENY_WAIT_MS);
    if (recv_record(sock, buf, sizeof(buf), fds, &nfds, &trunc, &ctrunc) >= 0)
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
    reply_error(sock, code, why);
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
        set_timeouts(sock, GS_REQ_TIMEOUT_MS, GS_REPLY_TIMEOUT_MS);
        char why[160];
        if (!peer_allowed(sock, why, sizeof(why))) {
            refuse(sock, "denied", why);
            continue;
        }
        if (__atomic_add_fetch(&n_workers, 1, __ATOMIC_SEQ_CST) > GS_MAX_WORKERS ||
            gs_start_thread(worker_main, (void *)(intptr_t)sock)) {
            __atomic_sub_fetch(&n_workers, 1, __ATOMIC_SEQ_CST);
            refuse(sock, "busy", "too many requests at once");
        }
    }
}

void gs_control_ensure(void)
{
    pid_t self = getpid();
    if (__atomic_load_n(&server_pid, __ATOMIC_ACQUIRE) == self)
        return;
    pthread_mutex_lock(&ctl_mu);
    if (server_pid != self) {
        struct sockaddr_un a;
        socklen_t alen = sock_addr(self, &a);
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
}

__attribute__((constructor)) static void control_init(void)
{
    pthread_atfork(NULL, NULL, after_fork_child);
}

/* ---- client (peer requests) ------------------------------------------------------------------- */

int gs_peer_request(pid_t pid, const char *req, int fd_in, char *reply, size_t replylen, int *fd_out,
                    int timeout_ms)
{
    reply[0] = 0;
    if (fd_out)
        *fd_out = -1;
    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (sock < 0)
        return -1;
    set_timeouts(sock, timeout_ms, timeout_ms);
    struct sockaddr_un a;
    socklen_t alen = sock_addr(pid, &a);
    struct ucred cr;
    socklen_t crlen = sizeof(cr);
    /* Abstract names carry no permissions: talk only to the process the name promises. */
    if (connect(sock, (struct sockaddr *)&a, alen) ||
        getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) || cr.pid != pid ||
        send_text(sock, req, strlen(req), fd_in)) {
        close(sock);
        return -1;
    }
    size_t got = 0;
    int rc = -1;
    for (;;) {
        int fds[GS_MAX_FDS], nfds, trunc, ctrunc;
        ssize_t n = recv_record(sock, reply + got, replylen - 1 - got, fds, &nfds, &trunc, &ctrunc);
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
