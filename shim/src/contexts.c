/* contexts.c: contexts the program creates itself, so the drain reaches them; every context's
 * stack reservation while the tool has the process's memory out.
 *
 * The drain synchronizes every active primary context (the driver can enumerate those); contexts
 * from cuCtxCreate cannot be enumerated, so the shim records them here. The list lock is held
 * while the drain synchronizes them, so a cuCtxDestroy waits instead of racing it.
 *
 * A context reserves local memory for the stacks of every thread the GPU can run: its stack
 * limit (CU_LIMIT_STACK_SIZE) times those threads, 264 MiB on an H100 at the default 1 KiB,
 * whatever it holds between kernels (nothing anyone reads again). The driver's checkpoint copies
 * that reservation into the process like the rest of the context, so CRIU dumps it and the
 * driver's restore copies it back. From the release to the resume no kernel runs, so the shim sets
 * each context's stack limit to 0 after the release, which gives the reservation back, and sets
 * the program's own value again before the gates open.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "contexts.h"
#include "resolve.h"
#include "threads.h"
#include "track.h"

static pthread_mutex_t ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static CUcontext *ctxs;
static size_t n_ctxs, cap_ctxs;

static void remember(CUcontext c)
{
    pthread_mutex_lock(&ctx_mu);
    if (n_ctxs == cap_ctxs)
        gs_grow((void **)&ctxs, &cap_ctxs, sizeof(*ctxs));
    ctxs[n_ctxs++] = c;
    pthread_mutex_unlock(&ctx_mu);
}

CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    GS_REAL_OR_FAIL(cuCtxCreate_v2);
    CUresult r = real(pctx, flags, dev);
    if (r == CUDA_SUCCESS && !gs_depth)
        remember(*pctx);
    return r;
}

CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int n,
                                unsigned int flags, CUdevice dev)
{
    GS_REAL_OR_FAIL(cuCtxCreate_v3);
    CUresult r = real(pctx, params, n, flags, dev);
    if (r == CUDA_SUCCESS && !gs_depth)
        remember(*pctx);
    return r;
}

CUresult CUDAAPI cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
                                CUdevice dev)
{
    GS_REAL_OR_FAIL(cuCtxCreate_v4);
    CUresult r = real(pctx, params, flags, dev);
    if (r == CUDA_SUCCESS && !gs_depth)
        remember(*pctx);
    return r;
}

CUresult CUDAAPI cuCtxDestroy_v2(CUcontext ctx)
{
    GS_REAL_OR_FAIL(cuCtxDestroy_v2);
    pthread_mutex_lock(&ctx_mu);
    CUresult r = real(ctx);
    if (r == CUDA_SUCCESS)
        for (size_t i = 0; i < n_ctxs; i++)
            if (ctxs[i] == ctx) {
                ctxs[i] = ctxs[--n_ctxs];
                break;
            }
    pthread_mutex_unlock(&ctx_mu);
    return r;
}

CUresult gs_sync_created_contexts(char *what, size_t whatlen)
{
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&ctx_mu);
    for (size_t i = 0; i < n_ctxs && r == CUDA_SUCCESS; i++) {
        CUcontext old;
        r = CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, ctxs[i]);
        if (r != CUDA_SUCCESS) {
            snprintf(what, whatlen, "cuCtxPushCurrent(created context %zu)", i);
            break;
        }
        r = CU(CUresult(*)(void), cuCtxSynchronize);
        if (r != CUDA_SUCCESS)
            snprintf(what, whatlen, "cuCtxSynchronize(created context %zu)", i);
        CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
    }
    pthread_mutex_unlock(&ctx_mu);
    return r;
}

/* ---- stack reservations while the memory is out ------------------------------------------- */

struct lowered {
    CUcontext ctx;
    size_t stack; /* the program's limit, set again at resume */
};
static struct lowered *lowered; /* guarded by ctx_mu */
static size_t n_lowered, cap_lowered;

typedef CUresult (*get_limit_fn)(size_t *, CUlimit);
typedef CUresult (*set_limit_fn)(CUlimit, size_t);

/* The current context's stack limit set to 0, its old value recorded; 1 if it was lowered now. A
 * context lowered before keeps its first record (a retried release must not record the 0). */
static int lower_current(CUcontext c)
{
    for (size_t i = 0; i < n_lowered; i++)
        if (lowered[i].ctx == c)
            return 0;
    size_t stack = 0;
    if (CU(get_limit_fn, cuCtxGetLimit, &stack, CU_LIMIT_STACK_SIZE) != CUDA_SUCCESS || !stack)
        return 0;
    CUresult r = CU(set_limit_fn, cuCtxSetLimit, CU_LIMIT_STACK_SIZE, 0);
    if (r != CUDA_SUCCESS) {
        gs_log("release: the stack reservation stays (cuCtxSetLimit: %s)", gs_cu_name(r));
        return 0;
    }
    if (n_lowered == cap_lowered)
        gs_grow((void **)&lowered, &cap_lowered, sizeof(*lowered));
    lowered[n_lowered++] = (struct lowered){c, stack};
    return 1;
}

int gs_contexts_lower_stacks(void)
{
    int n = 0, n_dev = 0;
    CUcontext old;
    pthread_mutex_lock(&ctx_mu);
    CU(CUresult(*)(int *), cuDeviceGetCount, &n_dev);
    for (int d = 0; d < n_dev; d++) {
        unsigned flags;
        int active = 0;
        CUcontext c;
        if (CU(CUresult(*)(CUdevice, unsigned *, int *), cuDevicePrimaryCtxGetState, d, &flags,
               &active) != CUDA_SUCCESS || !active ||
            CU(CUresult(*)(CUcontext *, CUdevice), cuDevicePrimaryCtxRetain, &c, d) != CUDA_SUCCESS)
            continue;
        if (CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, c) == CUDA_SUCCESS) {
            n += lower_current(c);
            CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
        }
        CU(CUresult(*)(CUdevice), cuDevicePrimaryCtxRelease_v2, d);
    }
    for (size_t i = 0; i < n_ctxs; i++)
        if (CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, ctxs[i]) == CUDA_SUCCESS) {
            n += lower_current(ctxs[i]);
            CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
        }
    pthread_mutex_unlock(&ctx_mu);
    return n;
}

void gs_contexts_restore_stacks(void)
{
    CUcontext old;
    pthread_mutex_lock(&ctx_mu);
    for (size_t i = 0; i < n_lowered; i++) {
        CUresult r = CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, lowered[i].ctx);
        if (r == CUDA_SUCCESS) {
            r = CU(set_limit_fn, cuCtxSetLimit, CU_LIMIT_STACK_SIZE, lowered[i].stack);
            CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
        }
        if (r != CUDA_SUCCESS) /* the driver still grows local memory for what a kernel
                                * declares; a deeper stack than that (recursion) may not launch */
            gs_log("resume: the program's stack limit of %zu bytes was not set again: %s",
                   lowered[i].stack, gs_cu_name(r));
    }
    n_lowered = 0;
    pthread_mutex_unlock(&ctx_mu);
}

void gs_contexts_reset_after_fork(void)
{
    pthread_mutex_init(&ctx_mu, NULL);
    n_ctxs = 0; /* contexts do not survive fork */
    n_lowered = 0;
}
