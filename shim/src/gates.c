/* gates.c: holding the program's GPU work on command.
 *
 * Two gates sit in the wrappers, outside the driver (so cuCheckpointProcessLock can still take the
 * process while a call is held):
 *   launch gate: kernel and graph launches;
 *   memory gate: copies, memsets, stream memory operations, host functions.
 * Quiesce closes the launch gate, waits for launches being submitted, synchronizes the GPU; then
 * the same for the memory gate. Launches go first because kernels in flight may wait for copies
 * another thread issues (NCCL's proxy thread): those copies must still get through until the
 * kernels are done. On a timeout both gates reopen and the caller hears "busy".
 *
 * The fast path is two atomic adds and a load; a held caller sleeps on a condition variable.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "contexts.h"
#include "gates.h"
#include "resolve.h"
#include "threads.h"

struct gate {
    int closed;    /* atomic */
    long inflight; /* atomic: callers inside the real call */
};

static struct gate gates[2];
static pthread_mutex_t gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gate_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t quiesce_mu = PTHREAD_MUTEX_INITIALIZER; /* one quiesce/resume at a time */

static inline void gate_enter(struct gate *g)
{
    for (;;) {
        __atomic_add_fetch(&g->inflight, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&g->closed, __ATOMIC_SEQ_CST))
            return;
        __atomic_sub_fetch(&g->inflight, 1, __ATOMIC_SEQ_CST);
        pthread_mutex_lock(&gate_mu);
        while (__atomic_load_n(&g->closed, __ATOMIC_SEQ_CST))
            pthread_cond_wait(&gate_cv, &gate_mu);
        pthread_mutex_unlock(&gate_mu);
    }
}

static inline void gate_exit(struct gate *g) { __atomic_sub_fetch(&g->inflight, 1, __ATOMIC_SEQ_CST); }

/* A gated wrapper: the driver's function, entered through the gate unless re-entered. */
#define GATED(gate, name, params, args)                                                            \
    CUresult CUDAAPI name params                                                                   \
    {                                                                                              \
        __typeof__(&name) real = REAL(name);                                                       \
        if (!real)                                                                                 \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        if (gs_depth)                                                                              \
            return real args;                                                                      \
        gate_enter(&gates[gate]);                                                                  \
        CUresult r = real args;                                                                    \
        gate_exit(&gates[gate]);                                                                   \
        return r;                                                                                  \
    }
#define G(gate, name, twin, params, args) GATED(gate, name, params, args) GATED(gate, twin, params, args)
GS_GATED_HOOKS(G)
#undef G
#undef GATED

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static void deadline_ts(struct timespec *ts, long ms)
{
    clock_gettime(CLOCK_REALTIME, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Closes a gate and waits until no caller is inside it. */
static int close_and_wait(struct gate *g, long deadline)
{
    __atomic_store_n(&g->closed, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&g->inflight, __ATOMIC_SEQ_CST) > 0) {
        if (now_ms() >= deadline)
            return -1;
        struct timespec ts = {0, 200000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

static void gates_open(void)
{
    pthread_mutex_lock(&gate_mu);
    __atomic_store_n(&gates[GS_GATE_LAUNCH].closed, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&gates[GS_GATE_MEMORY].closed, 0, __ATOMIC_SEQ_CST);
    pthread_cond_broadcast(&gate_cv);
    pthread_mutex_unlock(&gate_mu);
}

/* ---- drain: synchronize every active primary context and every context the program created, in
 * a thread of its own ------------------------------------------------------------------------------ */

/* The synchronize can outlast the caller's timeout; it keeps running in its thread, and the next
 * attempt waits for it before starting another. */
static pthread_mutex_t sync_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t sync_cv = PTHREAD_COND_INITIALIZER;
static int sync_running;
static unsigned sync_gen;
static CUresult sync_result;
static char sync_what[128];

static CUresult sync_contexts(char *what, size_t whatlen)
{
    int n = 0;
    CUresult r = CU(CUresult(*)(int *), cuDeviceGetCount, &n);
    if (r != CUDA_SUCCESS) {
        snprintf(what, whatlen, "cuDeviceGetCount");
        return r;
    }
    for (int dev = 0; dev < n; dev++) {
        unsigned flags = 0;
        int active = 0;
        r = CU(CUresult(*)(CUdevice, unsigned *, int *), cuDevicePrimaryCtxGetState, dev, &flags,
               &active);
        if (r != CUDA_SUCCESS || !active)
            continue;
        CUcontext ctx = NULL, old = NULL;
        r = CU(CUresult(*)(CUcontext *, CUdevice), cuDevicePrimaryCtxRetain, &ctx, dev);
        if (r != CUDA_SUCCESS) {
            snprintf(what, whatlen, "cuDevicePrimaryCtxRetain(device %d)", dev);
            return r;
        }
        r = CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, ctx);
        if (r == CUDA_SUCCESS) {
            r = CU(CUresult(*)(void), cuCtxSynchronize);
            if (r != CUDA_SUCCESS)
                snprintf(what, whatlen, "cuCtxSynchronize(device %d)", dev);
            CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
        } else {
            snprintf(what, whatlen, "cuCtxPushCurrent(device %d)", dev);
        }
        CU(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease_v2, dev);
        if (r != CUDA_SUCCESS)
            return r;
    }
    return gs_sync_created_contexts(what, whatlen);
}

static void *sync_main(void *arg)
{
    (void)arg;
    char what[128] = "";
    CUresult r = sync_contexts(what, sizeof(what));
    pthread_mutex_lock(&sync_mu);
    sync_result = r;
    snprintf(sync_what, sizeof(sync_what), "%s", what);
    sync_running = 0;
    sync_gen++;
    pthread_cond_broadcast(&sync_cv);
    pthread_mutex_unlock(&sync_mu);
    return NULL;
}

/* Synchronizes every active primary context and every created one, waiting at most ms. */
static int sync_all(int ms, char *err, size_t errlen)
{
    struct timespec ts;
    deadline_ts(&ts, ms);
    pthread_mutex_lock(&sync_mu);
    while (sync_running)
        if (pthread_cond_timedwait(&sync_cv, &sync_mu, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&sync_mu);
            snprintf(err, errlen, "the GPU did not drain within %d ms (an earlier synchronize is "
                     "still running)", ms);
            return -1;
        }
    unsigned gen = sync_gen;
    sync_running = 1;
    if (gs_start_thread(sync_main, NULL)) {
        sync_running = 0;
        pthread_mutex_unlock(&sync_mu);
        snprintf(err, errlen, "cannot start the synchronize thread");
        return -1;
    }
    while (sync_gen == gen)
        if (pthread_cond_timedwait(&sync_cv, &sync_mu, &ts) == ETIMEDOUT) {
            pthread_mutex_unlock(&sync_mu);
            snprintf(err, errlen, "the GPU did not drain within %d ms", ms);
            return -1;
        }
    CUresult r = sync_result;
    if (r != CUDA_SUCCESS)
        snprintf(err, errlen, "%s: %s", sync_what, gs_cu_name(r));
    pthread_mutex_unlock(&sync_mu);
    return r == CUDA_SUCCESS ? 0 : -1;
}

int gs_quiesce(int timeout_ms, char *err, size_t errlen)
{
    pthread_mutex_lock(&quiesce_mu);
    static const char *const what[] = {"kernel launches", "memory operations"};
    for (int g = GS_GATE_LAUNCH; g <= GS_GATE_MEMORY; g++) {
        long deadline = now_ms() + timeout_ms;
        if (close_and_wait(&gates[g], deadline)) {
            snprintf(err, errlen, "%s still being submitted after %d ms", what[g], timeout_ms);
            goto busy;
        }
        long left = deadline - now_ms();
        if (sync_all(left > 0 ? (int)left : 1, err, errlen))
            goto busy;
    }
    pthread_mutex_unlock(&quiesce_mu);
    return 0;
busy:
    gates_open();
    pthread_mutex_unlock(&quiesce_mu);
    return -1;
}

void gs_resume(void)
{
    /* After a quiesce in progress, not in the middle of it (it would close the gates again). */
    pthread_mutex_lock(&quiesce_mu);
    gates_open();
    pthread_mutex_unlock(&quiesce_mu);
}

int gs_quiesced(int wait)
{
    if (wait)
        pthread_mutex_lock(&quiesce_mu);
    int closed = __atomic_load_n(&gates[GS_GATE_LAUNCH].closed, __ATOMIC_SEQ_CST) &&
                 __atomic_load_n(&gates[GS_GATE_MEMORY].closed, __ATOMIC_SEQ_CST);
    if (wait)
        pthread_mutex_unlock(&quiesce_mu);
    return closed;
}

void gs_gate_state(int gate, int *closed, long *inflight)
{
    *closed = __atomic_load_n(&gates[gate].closed, __ATOMIC_SEQ_CST);
    *inflight = __atomic_load_n(&gates[gate].inflight, __ATOMIC_SEQ_CST);
}

void gs_gates_reset_after_fork(void)
{
    /* The child runs the program on; a quiesce of the parent does not hold it. */
    pthread_mutex_init(&gate_mu, NULL);
    pthread_cond_init(&gate_cv, NULL);
    pthread_mutex_init(&quiesce_mu, NULL);
    pthread_mutex_init(&sync_mu, NULL);
    pthread_cond_init(&sync_cv, NULL);
    sync_running = 0;
    memset(gates, 0, sizeof(gates));
}
