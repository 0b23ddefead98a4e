/* The checkpoint API across processes (cuCheckpointProcess*), with the real driver's behaviour as
 * measured (tests/probes/README.md):
 *
 * Every process that called cuInit runs a restore thread that listens on an abstract unix socket
 * named after the state directory and its pid; the calling process sends it one request per call
 * and the thread carries the operation out inside the target. While LOCKED or CHECKPOINTED the
 * target's own API calls wait at the gate (core.c). Checkpoint saves device memory into host memory
 * of the target, unmaps the device VAs (left PROT_NONE) and driver-owned pinned host memory, and
 * frees the device memory accounting. Restore refuses processes that still hold imports (legacy IPC:
 * INVALID_VALUE, cuMem fd import: NOT_SUPPORTED) and leaves them CHECKPOINTED for good.
 *
 * The real driver hangs when two processes make checkpoint calls at the same time; the fake detects
 * that with a node-wide flock and fails the second call loudly instead (see fk_serial_enter). */
#include "fake.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

enum fk_ck_op { CK_LOCK = 1, CK_CHECKPOINT, CK_RESTORE, CK_UNLOCK, CK_STATE, CK_TID };

struct fk_ck_req {
    int op;
    unsigned timeout_ms;
    unsigned npairs;
    CUcheckpointGpuPair pairs[FK_MAX_DEVICES];
};

struct fk_ck_rep {
    int result;
    int state;
    int tid;
};

/* FNV-1a of the state directory: fakes of different test runs never talk to each other. */
static unsigned long long fk_state_hash(void)
{
    unsigned long long h = 1469598103934665603ull;
    for (const char *c = fk.state_dir; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return h;
}

/* The restore thread's abstract name: the state directory's hash, then the pid namespace and the
 * pid the process sees, so that processes of two containers (each its own pid 1) never collide. */
static void fk_listen_name(struct sockaddr_un *addr, socklen_t *len)
{
    struct stat ns;
    unsigned long long ino = stat("/proc/self/ns/pid", &ns) == 0 ? (unsigned long long)ns.st_ino : 0;
    memset(addr, 0, sizeof *addr);
    addr->sun_family = AF_UNIX;
    int n = snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "fakecuda-ckpt.%016llx.%llu.%d",
                     fk_state_hash(), ino, (int)getpid());
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* A task as it sees itself, in its own pid namespace (the last NSpid field), or -1. tgid/tid:
 * a thread of tgid (tid == tgid: the process). */
static pid_t fk_ns_tid(pid_t tgid, pid_t tid)
{
    char path[96], line[256];
    snprintf(path, sizeof path, "/proc/%d/task/%d/status", (int)tgid, (int)tid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    pid_t nspid = -1;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "NSpid:", 6) == 0) {
            char *save = NULL;
            for (char *tok = strtok_r(line + 6, " \t\n", &save); tok; tok = strtok_r(NULL, " \t\n", &save))
                nspid = atoi(tok);
            break;
        }
    fclose(f);
    return nspid;
}

/* The name of tgid's restore thread socket, as the real driver reaches a process by its pid as the
 * caller sees it, in whatever pid namespace the target runs and after CRIU restored it into a new
 * one (its socket keeps the name it was bound to; CRIU keeps the pid the process sees): among
 * tgid's fds, the unix socket named with this state directory's prefix and tgid's own pid (a
 * forked child that inherited its parent's socket has another). /proc/TGID/net/unix lists the
 * sockets of tgid's network namespace. */
static int fk_target_name(pid_t tgid, struct sockaddr_un *addr, socklen_t *len)
{
    char path[96], line[512], prefix[64];
    unsigned long inodes[256];
    int ninodes = 0;
    pid_t nspid = fk_ns_tid(tgid, tgid);
    if (nspid < 0) return -1;
    snprintf(path, sizeof path, "/proc/%d/fd", (int)tgid);
    DIR *d = opendir(path);
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d)) && ninodes < 256;) {
        char target[64];
        ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (sscanf(target, "socket:[%lu]", &inodes[ninodes]) == 1) ninodes++;
    }
    closedir(d);
    snprintf(prefix, sizeof prefix, "@fakecuda-ckpt.%016llx.", fk_state_hash());
    snprintf(path, sizeof path, "/proc/%d/net/unix", (int)tgid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int found = -1;
    while (found < 0 && fgets(line, sizeof line, f)) {
        unsigned long inode;
        char name[200];
        if (sscanf(line, "%*s %*s %*s %*s %*s %*s %lu %199s", &inode, name) != 2) continue;
        unsigned long long ino;
        int pid, end = 0;
        if (strncmp(name, prefix, strlen(prefix)) != 0) continue;
        if (sscanf(name + strlen(prefix), "%llu.%d%n", &ino, &pid, &end) != 2 || pid != nspid ||
            name[strlen(prefix) + (size_t)end] != 0)
            continue;
        for (int i = 0; i < ninodes; i++)
            if (inodes[i] == inode) {
                memset(addr, 0, sizeof *addr);
                addr->sun_family = AF_UNIX;
                size_t n = strlen(name + 1);
                memcpy(addr->sun_path + 1, name + 1, n); /* '@' stands for the leading NUL */
                *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
                found = 0;
                break;
            }
    }
    fclose(f);
    return found;
}

/* ---- the operations, run by the restore thread inside the target ---------------------------- */

static int fk_timed_wait(pthread_cond_t *cv, pthread_mutex_t *mu, double deadline_ms)
{
    if (deadline_ms <= 0) return pthread_cond_wait(cv, mu);
    double left = deadline_ms - fk_now_ms();
    if (left <= 0) return ETIMEDOUT;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long long ns = ts.tv_nsec + (long long)(left * 1e6);
    ts.tv_sec += ns / 1000000000;
    ts.tv_nsec = ns % 1000000000;
    return pthread_cond_timedwait(cv, mu, &ts);
}

static CUresult fk_do_lock(unsigned timeout_ms)
{
    double deadline = timeout_ms ? fk_now_ms() + timeout_ms : 0;
    pthread_mutex_lock(&fk.gate_mu);
    if (fk.cstate != FK_RUNNING || fk.locking) {
        pthread_mutex_unlock(&fk.gate_mu);
        return CUDA_ERROR_ILLEGAL_STATE;
    }
    fk.locking = 1; /* new calls wait from now on */
    while (fk.inflight > 0)
        if (fk_timed_wait(&fk.gate_cv, &fk.gate_mu, deadline) == ETIMEDOUT && fk.inflight > 0) break;
    int busy = fk.inflight > 0;
    pthread_mutex_unlock(&fk.gate_mu);
    /* Work already submitted must finish before the process counts as locked. */
    if (!busy && fk_streams_drain_until(deadline) != 0) busy = 1;
    pthread_mutex_lock(&fk.gate_mu);
    fk.locking = 0;
    if (!busy) fk.cstate = FK_LOCKED;
    pthread_cond_broadcast(&fk.gate_cv);
    pthread_mutex_unlock(&fk.gate_mu);
    return busy ? CUDA_ERROR_TIMEOUT : CUDA_SUCCESS;
}

static int fk_owned(const struct fk_phys *p) { return p->kind == FK_PHYS_ALLOC || p->kind == FK_PHYS_CREATE; }

/* Does an fd of this process other than the fake's own refer to p's memfd? An exported fd the
 * application still holds keeps the memory pinned through a checkpoint. */
static int fk_pinned_by_app_fd(const struct fk_phys *p)
{
    struct stat own;
    if (fstat(p->memfd, &own) != 0) return 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) return 0;
    int pinned = 0;
    struct dirent *e;
    while (!pinned && (e = readdir(d))) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (*end || fd == p->memfd || fd == p->ipc_fd || fd == dirfd(d)) continue;
        struct stat st;
        if (fstat((int)fd, &st) == 0 && st.st_ino == own.st_ino && st.st_dev == own.st_dev) pinned = 1;
    }
    closedir(d);
    return pinned;
}

static CUresult fk_do_checkpoint(void)
{
    if (fk.cstate != FK_LOCKED) return CUDA_ERROR_ILLEGAL_STATE;
    fk_lock();
    /* Save first, then release: a failure to save leaves everything in place. */
    for (struct fk_phys *p = fk.phys; p; p = p->next) {
        if (!fk_owned(p) || p->memfd < 0) continue;
        p->saved = malloc(p->size ? p->size : 1);
        size_t done = 0;
        while (p->saved && done < p->size) {
            ssize_t n = pread(p->memfd, (char *)p->saved + done, p->size - done, (off_t)done);
            if (n <= 0) break;
            done += (size_t)n;
        }
        if (!p->saved || done < p->size) {
            fk_log("checkpoint of pid %d: cannot save allocation %#llx", (int)getpid(), p->handle);
            for (struct fk_phys *q = fk.phys; q; q = q->next)
                if (q->memfd >= 0) {
                    free(q->saved);
                    q->saved = NULL;
                }
            fk_unlock();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    for (struct fk_host *h = fk.hosts; h; h = h->next) {
        if (h->kind != FK_HOST_ALLOC || h->unmapped) continue;
        h->saved = malloc(h->size);
        memcpy(h->saved, (void *)h->va, h->size);
    }
    /* Each active primary context's local memory, whatever it holds (stack limit x threads). */
    for (int d = 0; d < fk.ndev; d++) {
        struct fk_ctx *c = &fk.dev[d].primary;
        size_t n = c->stack * FK_LMEM_THREADS;
        if (c->refcount > 0 && n && (c->lmem_saved = malloc(n)))
            memset(c->lmem_saved, 0x5a, n);
    }
    for (struct fk_map *m = fk.maps; m; m = m->next)
        if (m->mapped) {
            fk_map_none(m->va, m->size);
            m->mapped = 0;
        }
    for (struct fk_phys *p = fk.phys; p; p = p->next) {
        if (!fk_owned(p) || p->memfd < 0) continue;
        /* An exported fd the application kept holds the memory: it stays counted as used. */
        int pinned = fk_pinned_by_app_fd(p);
        close(p->memfd);
        p->memfd = -1;
        if (p->ipc_fd >= 0) close(p->ipc_fd);
        p->ipc_fd = -1;
        if (p->charged && !pinned) fk_charge(p, 0);
    }
    for (struct fk_host *h = fk.hosts; h; h = h->next) {
        if (h->kind != FK_HOST_ALLOC || h->unmapped) continue;
        fk_map_none(h->va, h->size);
        close(h->memfd);
        h->memfd = -1;
        h->unmapped = 1;
    }
    fk.cstate = FK_CHECKPOINTED;
    fk_unlock();
    return CUDA_SUCCESS;
}

static CUresult fk_restore_refusal(void)
{
    for (struct fk_phys *p = fk.phys; p; p = p->next)
        if (p->kind == FK_PHYS_IPC) return CUDA_ERROR_INVALID_VALUE;
    for (struct fk_phys *p = fk.phys; p; p = p->next)
        if (p->kind == FK_PHYS_IMPORT || p->kind == FK_PHYS_MULTICAST)
            return CUDA_ERROR_NOT_SUPPORTED;
    return CUDA_SUCCESS;
}

static CUresult fk_do_restore(const struct fk_ck_req *req)
{
    if (fk.cstate != FK_CHECKPOINTED) return CUDA_ERROR_ILLEGAL_STATE;
    if (fk.stuck) return fk.stuck_error;
    fk_lock();
    CUresult r = fk_restore_refusal();
    if (r != CUDA_SUCCESS) {
        fk.stuck = 1;
        fk.stuck_error = r;
        fk_unlock();
        return r;
    }
    /* Device map: identity unless gpuPairs are given, which must name every checkpointed GPU. */
    int newdev[FK_MAX_DEVICES];
    for (int d = 0; d < FK_MAX_DEVICES; d++) newdev[d] = d;
    if (req->npairs > 0) {
        int used[FK_MAX_DEVICES] = {0};
        for (struct fk_phys *p = fk.phys; p; p = p->next)
            if (p->saved && p->dev >= 0) used[p->dev] = 1;
        for (int d = 0; d < fk.ndev; d++)
            if (fk.dev[d].primary.refcount > 0) used[d] = 1;
        for (int d = 0; d < fk.ndev; d++) newdev[d] = -1;
        for (unsigned i = 0; i < req->npairs; i++) {
            int from = fk_dev_by_uuid(&req->pairs[i].oldUuid), to = fk_dev_by_uuid(&req->pairs[i].newUuid);
            if (from < 0 || to < 0) {
                fk_unlock();
                return CUDA_ERROR_INVALID_VALUE;
            }
            newdev[from] = to;
        }
        for (int d = 0; d < fk.ndev; d++)
            if (used[d] && newdev[d] < 0) {
                fk_unlock();
                return CUDA_ERROR_INVALID_VALUE;
            }
        for (int d = 0; d < fk.ndev; d++)
            if (newdev[d] < 0) newdev[d] = d;
    }
    /* Enough memory on every target device? A first OOM leaves the process CHECKPOINTED; later
     * attempts then fail with OPERATING_SYSTEM for good (NVIDIA/cuda-checkpoint#44). */
    size_t need[FK_MAX_DEVICES] = {0};
    for (struct fk_phys *p = fk.phys; p; p = p->next)
        if (p->saved && p->dev >= 0) need[newdev[p->dev]] += p->size;
    for (int d = 0; d < fk.ndev; d++)
        if (need[d] && fk_node_used(d) + need[d] > fk.dev[d].total) {
            fk.stuck = 1;
            fk.stuck_error = CUDA_ERROR_OPERATING_SYSTEM;
            fk_unlock();
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    for (struct fk_phys *p = fk.phys; p; p = p->next) {
        if (!p->saved) continue;
        if (p->dev >= 0) p->dev = newdev[p->dev];
        char tag[32];
        snprintf(tag, sizeof tag, "fakecuda-dev%d", p->dev);
        int fd = fk_memfd_new(p->size, tag);
        size_t done = 0;
        while (fd >= 0 && done < p->size) {
            ssize_t n = pwrite(fd, (char *)p->saved + done, p->size - done, (off_t)done);
            if (n <= 0) break;
            done += (size_t)n;
        }
        if (fd < 0 || done < p->size) {
            fk_log("restore of pid %d: cannot re-create allocation %#llx", (int)getpid(), p->handle);
            fk.cstate = FK_FAILED;
            fk_unlock();
            return CUDA_ERROR_UNKNOWN;
        }
        p->memfd = fd;
        free(p->saved);
        p->saved = NULL;
        fk_charge(p, 1);
    }
    for (struct fk_map *m = fk.maps; m; m = m->next)
        if (!m->mapped && m->phys->memfd >= 0 && fk_map_fd(m->va, m->size, m->phys->memfd, m->offset) == 0)
            m->mapped = 1;
    for (struct fk_host *h = fk.hosts; h; h = h->next) {
        if (h->kind != FK_HOST_ALLOC || !h->unmapped) continue;
        h->memfd = fk_memfd_new(h->size, "fakecuda-host");
        if (h->memfd >= 0 && fk_map_fd(h->va, h->size, h->memfd, 0) == 0) {
            memcpy((void *)h->va, h->saved, h->size);
            free(h->saved);
            h->saved = NULL;
            h->unmapped = 0;
        }
    }
    if (req->npairs > 0) {
        int olddev[FK_MAX_DEVICES];
        for (int d = 0; d < fk.ndev; d++) olddev[d] = fk.dev[d].primary.dev;
        for (int d = 0; d < fk.ndev; d++) fk.dev[d].primary.dev = newdev[olddev[d]];
    }
    for (int d = 0; d < fk.ndev; d++) {
        free(fk.dev[d].primary.lmem_saved);
        fk.dev[d].primary.lmem_saved = NULL;
    }
    fk.cstate = FK_LOCKED;
    fk_unlock();
    return CUDA_SUCCESS;
}

static CUresult fk_do_unlock(void)
{
    pthread_mutex_lock(&fk.gate_mu);
    CUresult r = CUDA_SUCCESS;
    if (fk.cstate != FK_LOCKED) r = CUDA_ERROR_ILLEGAL_STATE;
    else fk.cstate = FK_RUNNING;
    pthread_cond_broadcast(&fk.gate_cv);
    pthread_mutex_unlock(&fk.gate_mu);
    return r;
}

static void fk_serve(int conn)
{
    struct fk_ck_req req;
    struct fk_ck_rep rep = {0, 0, 0};
    size_t got = 0;
    while (got < sizeof req) {
        ssize_t n = read(conn, (char *)&req + got, sizeof req - got);
        if (n <= 0) return;
        got += (size_t)n;
    }
    /* FAKECUDA_FAIL of the target makes the operation fail inside it, its state unchanged. */
    static const char *names[] = {NULL, "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                                  "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"};
    CUresult injected = req.op >= CK_LOCK && req.op <= CK_UNLOCK ? fk_fail_point(names[req.op]) : CUDA_SUCCESS;
    switch (injected != CUDA_SUCCESS ? -1 : req.op) {
    case -1: rep.result = injected; break;
    case CK_LOCK: rep.result = fk_do_lock(req.timeout_ms); break;
    case CK_CHECKPOINT: rep.result = fk_do_checkpoint(); break;
    case CK_RESTORE: rep.result = fk_do_restore(&req); break;
    case CK_UNLOCK: rep.result = fk_do_unlock(); break;
    case CK_STATE:
    case CK_TID: break;
    default: rep.result = CUDA_ERROR_INVALID_VALUE; break;
    }
    rep.state = (int)fk.cstate;
    rep.tid = (int)fk.restore_tid;
    ssize_t w = write(conn, &rep, sizeof rep);
    (void)w;
}

static int fk_listen_fd = -1;

static void *fk_restore_thread(void *arg)
{
    (void)arg;
    fk.restore_tid = (pid_t)syscall(SYS_gettid);
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* signals go to the application's threads */
    for (;;) {
        int conn = accept4(fk_listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            fk_log("restore thread of pid %d: accept: %s", (int)getpid(), strerror(errno));
            return NULL;
        }
        fk_serve(conn);
        close(conn);
    }
    return NULL;
}

void fk_checkpoint_start_restore_thread(void)
{
    struct sockaddr_un addr;
    socklen_t len;
    fk_listen_name(&addr, &len);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&addr, len) != 0 || listen(fd, 64) != 0) {
        fk_log("pid %d: cannot serve checkpoint requests: %s", (int)getpid(), strerror(errno));
        if (fd >= 0) close(fd);
        return;
    }
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 512);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    fk_listen_fd = fd;
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &attr, fk_restore_thread, NULL) != 0) fk_log("cannot start the restore thread");
    else pthread_setname_np(t, "fakecuda-rst");
    pthread_attr_destroy(&attr);
    while (!__atomic_load_n(&fk.restore_tid, __ATOMIC_ACQUIRE)) usleep(100);
}

/* ---- the calling side ---------------------------------------------------------------------- */

/* Node-wide detection of checkpoint calls from two processes at once. Threads of this process
 * share one hold of the flock; another process holding it means overlapping calls. */
static pthread_mutex_t fk_serial_mu = PTHREAD_MUTEX_INITIALIZER;
static int fk_serial_fd = -1, fk_serial_users;

static CUresult fk_serial_enter(void)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fk_serial_mu);
    if (fk_serial_users == 0) {
        char path[600];
        snprintf(path, sizeof path, "%s/checkpoint-calls.lock", fk.state_dir);
        if (fk_serial_fd < 0) fk_serial_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        if (fk_serial_fd >= 0 && flock(fk_serial_fd, LOCK_EX | LOCK_NB) != 0) {
            fprintf(stderr, "fakecuda: concurrent checkpoint calls from two processes (the real driver hangs)\n");
            r = CUDA_ERROR_NOT_PERMITTED;
        }
    }
    if (r == CUDA_SUCCESS) fk_serial_users++;
    pthread_mutex_unlock(&fk_serial_mu);
    return r;
}

static void fk_serial_leave(void)
{
    pthread_mutex_lock(&fk_serial_mu);
    if (--fk_serial_users == 0 && fk_serial_fd >= 0) flock(fk_serial_fd, LOCK_UN);
    pthread_mutex_unlock(&fk_serial_mu);
}

/* A thread id names its process too (as with the driver, which goes through /proc). */
static pid_t fk_tgid(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    pid_t tgid = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Tgid: %d", &tgid) == 1) break;
    fclose(f);
    return tgid;
}

static CUresult fk_call(int pid, struct fk_ck_req *req, struct fk_ck_rep *rep)
{
    if (pid <= 0) return CUDA_ERROR_INVALID_VALUE;
    pid_t tgid = fk_tgid(pid);
    if (tgid < 0) return CUDA_ERROR_INVALID_VALUE; /* no such process */
    int serial = req->op == CK_LOCK || req->op == CK_CHECKPOINT || req->op == CK_RESTORE || req->op == CK_UNLOCK;
    if (serial) {
        CUresult r = fk_serial_enter();
        if (r) return r;
    }
    struct sockaddr_un addr;
    socklen_t len;
    int fd = -1;
    CUresult r = CUDA_SUCCESS;
    if (fk_target_name(tgid, &addr, &len) != 0) r = CUDA_ERROR_NOT_INITIALIZED; /* no CUDA there */
    else if ((fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) r = CUDA_ERROR_OPERATING_SYSTEM;
    else if (connect(fd, (struct sockaddr *)&addr, len) != 0) r = CUDA_ERROR_NOT_INITIALIZED; /* no CUDA there */
    else if (write(fd, req, sizeof *req) != (ssize_t)sizeof *req) r = CUDA_ERROR_OPERATING_SYSTEM;
    else {
        /* Blocks for as long as the target's restore thread does not answer (e.g. it is stopped),
         * like the real driver. */
        size_t got = 0;
        while (got < sizeof *rep) {
            ssize_t n = read(fd, (char *)rep + got, sizeof *rep - got);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            got += (size_t)n;
        }
        if (got < sizeof *rep) r = CUDA_ERROR_OPERATING_SYSTEM;
        else r = (CUresult)rep->result;
    }
    if (fd >= 0) close(fd);
    if (serial) fk_serial_leave();
    return r;
}

#define FK_CK_API(name) FK_API_NOGATE(name)

FK_EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs *args)
{
    FK_CK_API("cuCheckpointProcessLock");
    struct fk_ck_req req = {.op = CK_LOCK, .timeout_ms = args ? args->timeoutMs : 0};
    struct fk_ck_rep rep;
    return fk_call(pid, &req, &rep);
}

FK_EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs *args)
{
    FK_CK_API("cuCheckpointProcessCheckpoint");
    (void)args;
    struct fk_ck_req req = {.op = CK_CHECKPOINT};
    struct fk_ck_rep rep;
    return fk_call(pid, &req, &rep);
}

FK_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs *args)
{
    FK_CK_API("cuCheckpointProcessRestore");
    struct fk_ck_req req = {.op = CK_RESTORE};
    if (args && args->gpuPairsCount > 0) {
        if (!args->gpuPairs || args->gpuPairsCount > FK_MAX_DEVICES) return CUDA_ERROR_INVALID_VALUE;
        req.npairs = args->gpuPairsCount;
        memcpy(req.pairs, args->gpuPairs, req.npairs * sizeof req.pairs[0]);
    }
    struct fk_ck_rep rep;
    return fk_call(pid, &req, &rep);
}

FK_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs *args)
{
    FK_CK_API("cuCheckpointProcessUnlock");
    (void)args;
    struct fk_ck_req req = {.op = CK_UNLOCK};
    struct fk_ck_rep rep;
    return fk_call(pid, &req, &rep);
}

FK_EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState *state)
{
    FK_CK_API("cuCheckpointProcessGetState");
    if (!state) return CUDA_ERROR_INVALID_VALUE;
    struct fk_ck_req req = {.op = CK_STATE};
    struct fk_ck_rep rep;
    CUresult r = fk_call(pid, &req, &rep);
    if (r == CUDA_SUCCESS) *state = (CUprocessState)rep.state;
    return r;
}

FK_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int *tid)
{
    FK_CK_API("cuCheckpointProcessGetRestoreThreadId");
    if (!tid) return CUDA_ERROR_INVALID_VALUE;
    struct fk_ck_req req = {.op = CK_TID};
    struct fk_ck_rep rep;
    CUresult r = fk_call(pid, &req, &rep);
    if (r != CUDA_SUCCESS) return r;
    /* The restore thread knows its tid in its own pid namespace; the caller gets it as it sees it
     * (as the kernel translates ids across namespaces), the thread of pid that has that NSpid. */
    pid_t tgid = fk_tgid(pid);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)tgid);
    DIR *d = opendir(path);
    if (!d) return CUDA_ERROR_INVALID_VALUE;
    *tid = -1;
    for (struct dirent *e; (e = readdir(d)) && *tid < 0;) {
        pid_t t = (pid_t)atoi(e->d_name);
        if (t > 0 && fk_ns_tid(tgid, t) == rep.tid) *tid = t;
    }
    closedir(d);
    return *tid < 0 ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}
