/* contexts.c: contexts the program creates itself, so the drain reaches them.
 *
 * The drain synchronizes every active primary context (the driver can enumerate those); contexts
 * from cuCtxCreate cannot be enumerated, so the shim records them here. The list lock is held
 * while the drain synchronizes them, so a cuCtxDestroy waits instead of racing it.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "contexts.h"
#include "resolve.h"
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

void gs_contexts_reset_after_fork(void)
{
    pthread_mutex_init(&ctx_mu, NULL);
    n_ctxs = 0; /* contexts do not survive fork */
}
