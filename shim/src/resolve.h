/* resolve.h: the real driver and the shim's wrappers of it. Layer 1 (above json, threads, wire,
 * peer; below everything that calls the driver).
 *
 * REAL(name) is the driver's own function of a hook, CU(type, name, ...) an unwrapped call by
 * exact name; the shim's own driver calls always go through them, never through a wrapper.
 */
#ifndef GS_RESOLVE_H
#define GS_RESOLVE_H

#include <cuda.h>

#include "criu_gpushare_shim.h"

/* Every function the shim interposes. Each has a wrapper exported under the driver's name and a
 * slot holding the driver's own function. X(name) */
#include "hooks.def"

enum gs_hook_id {
#define X(name) GS_HOOK_##name,
    GS_HOOKS(X)
#undef X
    GS_HOOK_COUNT
};

/* The driver's own function for hook id (resolved on first use; NULL if libcuda lacks it). */
void *gs_real_hook(int id);
/* The driver's own function by name, never one of the shim's wrappers. Loads libcuda if needed. */
void *gs_real(const char *name);

/* Older entry points cuda.h (CUDA 13) declares only for the driver's own build. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);
/* Per-thread-stream twins of the stream-ordered allocator, which cuda.h declares only under
 * CUDA_API_PER_THREAD_DEFAULT_STREAM (and then under the plain names). */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/* The wrappers are exported under the driver's names (direct linking reaches them too). */
#define GS_DECLARE_EXPORT(name) GS_EXPORT __typeof__(name) name;
GS_TRACKED_HOOKS(GS_DECLARE_EXPORT)
#define GS_DECLARE_GATED(gate, name, twin, params, args) \
    GS_EXPORT CUresult CUDAAPI name params;              \
    GS_EXPORT CUresult CUDAAPI twin params;
GS_GATED_HOOKS(GS_DECLARE_GATED)

/* Finds the shim's wrapper for a driver function that a lookup returned (by pointer: the lookup
 * may use an unversioned name and return the _v2 or _ptsz function); exact_name also accepts a
 * hook of exactly that name. Returns real unchanged when the shim does not wrap it. */
void *gs_wrapper_for(const char *name, void *real, int exact_name);

#define REAL(name) ((__typeof__(&name))gs_real_hook(GS_HOOK_##name))

/* Unwrapped driver call by its exact (versioned) name, cached at the call site. Evaluates to
 * CUDA_ERROR_NOT_FOUND when the driver lacks the function. */
#define CU(type, name, ...)                                                                     \
    ({                                                                                          \
        static __typeof__(type) gs_p_;                                                          \
        __typeof__(type) gs_f_ = __atomic_load_n(&gs_p_, __ATOMIC_RELAXED);                     \
        if (!gs_f_) {                                                                           \
            gs_f_ = (__typeof__(type))gs_real(#name);                                           \
            __atomic_store_n(&gs_p_, gs_f_, __ATOMIC_RELAXED);                                  \
        }                                                                                       \
        gs_f_ ? gs_f_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND;                                      \
    })

/* Re-entrancy guard: a wrapper entered again on the same thread (the driver calling an exported
 * name, a callback) passes straight through without tracking. */
extern __thread int gs_depth __attribute__((tls_model("initial-exec")));

/* A wrapper's opening. GS_REAL_OR_FAIL: `real` is the driver's function; without it the call
 * fails. GS_ENTER_UNLESS also passes a nested call, or one for which skip holds, straight through
 * untracked, and otherwise enters the guard; the wrapper leaves it by returning gs_leave(r). */
#define GS_REAL_OR_FAIL(name)                                                                   \
    __typeof__(&name) real = REAL(name);                                                        \
    if (!real)                                                                                  \
        return CUDA_ERROR_NOT_FOUND
#define GS_ENTER_UNLESS(skip, name, ...)                                                        \
    GS_REAL_OR_FAIL(name);                                                                      \
    if (gs_depth || (skip))                                                                     \
        return real(__VA_ARGS__);                                                               \
    gs_depth++
#define GS_ENTER(name, ...) GS_ENTER_UNLESS(0, name, __VA_ARGS__)

static inline CUresult gs_leave(CUresult r)
{
    gs_depth--;
    return r;
}

/* The CUresult's name (cuGetErrorName), or "CUDA error". */
const char *gs_cu_name(CUresult r);

/* This process uses the driver: make sure its control server runs (started lazily, once per pid,
 * at the first cuInit or tracked call). Wrappers call this; the server registers itself with
 * gs_set_server_starter at load, so the wrappers do not depend on it. */
void gs_want_server(void);
void gs_set_server_starter(void (*start)(void));

#endif
