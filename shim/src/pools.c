/* pools.c: stream-ordered allocation and memory pools.
 *
 *   cuMemAllocAsync, cuMemAllocFromPoolAsync  >= CRIU_GPUSHARE_MALLOC_MIN from a pool without
 *                      export handle types (each device's default pool, pools created without
 *                      them) are backed like a large cuMemAlloc (backing.c), so a checkpoint moves
 *                      them through the copy engine instead of the driver's slow path. The driver
 *                      serves the rest: smaller sizes, exportable, size-limited and imported pools,
 *                      and allocations during stream capture (they become graph nodes)
 *   cuMemFreeAsync     a backed block goes to its pool's cache behind an event recorded on the
 *                      stream; an allocation of the same size on the same device from that pool
 *                      takes it back, on the same stream (the same cuStreamGetId: stream order
 *                      makes that safe) at once, on another once the event completed. Freed during
 *                      stream capture, it stays allocated: the graph may use it at any later
 *                      launch. A block whose pool is gone, or that a devices map moved, is freed
 *                      once its event completes instead
 *   capture            the shim's own calls (event queries, cuMemCreate) run in relaxed capture
 *                      mode, so another thread's global-mode capture is never invalidated by them
 *   the cache          keeps at most the pool's release threshold of completed blocks; cuMemPoolTrimTo
 *                      and cuMemPoolDestroy release them, and so does quiesce (gs_pools_trim), so a
 *                      checkpoint never carries a free block
 *   cuMemPoolSetAccess applied to the pool's backed blocks too, and to every later one
 *   cuMemPoolImportFromShareableHandle  counted: a process that imported another's pool cannot
 *                      be restored by the driver, so its checkpoint is refused (track.c)
 *
 * Lock order: pools_mu, then the state lock. Driver calls that free memory run after both are
 * dropped.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backing.h"
#include "devices.h"
#include "pools.h"
#include "resolve.h"
#include "track.h"

/* A pool the shim has seen: created or imported here, a device's default pool, or another met
 * at an allocation (remembered so that it is looked up once). */
struct pool {
    CUmemoryPool h;
    int dev; /* its allocations are the shim's memory, on this device; -1: the driver's */
    int n_access;
    CUmemAccessDesc access[GS_MAX_ACCESS]; /* merged over cuMemPoolSetAccess, for new blocks */
};

/* A freed backed block waiting in its pool's cache. */
struct block {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle h;
    CUmemoryPool pool;
    int dev;
    unsigned long long stream_id; /* cuStreamGetId of the stream it was freed on (0: unknown) */
    CUevent done; /* completes when the work before the free did; NULL: already done */
};

static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static GS_ARRAY(struct pool) pools;
static GS_ARRAY(struct block) cache;

static struct pool *find_pool(CUmemoryPool h)
{
    for (size_t i = 0; i < pools.n; i++)
        if (pools.v[i].h == h)
            return &pools.v[i];
    return NULL;
}

/* dev < 0: a pool whose memory stays the driver's. */
static struct pool *add_pool(CUmemoryPool h, int dev)
{
    struct pool *p = GS_PUSH(pools);
    memset(p, 0, sizeof(*p));
    p->h = h;
    p->dev = dev;
    if (dev >= 0) {
        p->n_access = 1;
        p->access[0].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p->access[0].location.id = dev;
        p->access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    return p;
}

/* The pool's record, made when first met: a device's default pool is the shim's, any other pool
 * not created here the driver's. pools_mu held. */
static struct pool *pool_of(CUmemoryPool h)
{
    struct pool *p = find_pool(h);
    if (p)
        return p;
    int n = 0;
    CU(CUresult(*)(int *), cuDeviceGetCount, &n);
    for (int dev = 0; dev < n && dev < GS_MAX_DEV; dev++) {
        CUmemoryPool d = NULL;
        if (CU(CUresult(*)(CUmemoryPool *, CUdevice), cuDeviceGetDefaultMemPool, &d, dev) ==
                CUDA_SUCCESS && d == h)
            return add_pool(h, dev);
    }
    return add_pool(h, -1);
}

/* The device of stream s: its context's, or the current one for the NULL and special streams. */
static int stream_device(CUstream s, int *dev)
{
    uintptr_t v = (uintptr_t)s;
    if (v == 0 || v == (uintptr_t)CU_STREAM_LEGACY || v == (uintptr_t)CU_STREAM_PER_THREAD) {
        CUdevice d = 0;
        if (CU(CUresult(*)(CUdevice *), cuCtxGetDevice, &d) != CUDA_SUCCESS)
            return -1;
        *dev = (int)d;
        return 0;
    }
    CUcontext ctx = NULL;
    if (CU(CUresult(*)(CUstream, CUcontext *), cuStreamGetCtx, s, &ctx) != CUDA_SUCCESS)
        return -1;
    return gs_context_device(ctx, dev) == CUDA_SUCCESS ? 0 : -1;
}

/* What names stream s for good: the NULL stream and the per-thread one stand for a different
 * stream in each context or thread, and a destroyed stream's handle may come back; 0 if unknown. */
static unsigned long long stream_id(CUstream s, int per_thread)
{
    unsigned long long id = 0;
    CUresult r = per_thread ? CU(CUresult(*)(CUstream, unsigned long long *), cuStreamGetId_ptsz, s, &id)
                            : CU(CUresult(*)(CUstream, unsigned long long *), cuStreamGetId, s, &id);
    return r == CUDA_SUCCESS ? id : 0;
}

/* Stream capture turns an allocation into a graph node: only the driver can do that. Unknown
 * (the driver lacks the call, or refuses) counts as capturing. */
static int capturing(CUstream s, int per_thread)
{
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult r = per_thread ? CU(CUresult(*)(CUstream, CUstreamCaptureStatus *), cuStreamIsCapturing_ptsz, s, &st)
                            : CU(CUresult(*)(CUstream, CUstreamCaptureStatus *), cuStreamIsCapturing, s, &st);
    return r != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static int event_done(CUevent e)
{
    return !e || CU(CUresult(*)(CUevent), cuEventQuery, e) == CUDA_SUCCESS;
}

/* Takes the cached blocks to release out of the cache: the completed ones of pool (NULL: any)
 * beyond keep bytes, or, with every, all of them, done or not (the caller has drained the work
 * or waits for their events). pools_mu held. */
static size_t take_for_release(CUmemoryPool pool, size_t keep, int every, struct block *out,
                               size_t max)
{
    size_t cached = 0, n = 0;
    for (size_t i = 0; i < cache.n; i++)
        if (!pool || cache.v[i].pool == pool)
            cached += cache.v[i].size;
    for (size_t i = 0; i < cache.n && n < max;) {
        struct block *b = &cache.v[i];
        if ((!pool || b->pool == pool) && (every || (cached > keep && event_done(b->done)))) {
            cached -= b->size;
            out[n++] = *b;
            GS_DEL(cache, i);
        } else {
            i++;
        }
    }
    return n;
}

#define RELEASE_BATCH 64

/* Releases cached blocks as take_for_release picks them, each once the work before its free is
 * done (instant for the completed ones). */
static void release_cached(CUmemoryPool pool, size_t keep, int every)
{
    struct block out[RELEASE_BATCH];
    size_t n;
    do {
        pthread_mutex_lock(&pools_mu);
        n = take_for_release(pool, keep, every, out, RELEASE_BATCH);
        pthread_mutex_unlock(&pools_mu);
        for (size_t i = 0; i < n; i++) {
            if (out[i].done) {
                CU(CUresult(*)(CUevent), cuEventSynchronize, out[i].done);
                CU(CUresult(*)(CUevent), cuEventDestroy_v2, out[i].done);
            }
            gs_backing_destroy(out[i].va, out[i].size, out[i].h);
        }
    } while (n == RELEASE_BATCH);
}


/* Releases the completed blocks of pool beyond its release threshold. */
static void trim_to_threshold(CUmemoryPool pool)
{
    cuuint64_t threshold = 0;
    CU(CUresult(*)(CUmemoryPool, CUmemPool_attribute, void *), cuMemPoolGetAttribute, pool,
       CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold);
    release_cached(pool, (size_t)threshold, 0);
}

/* A cached block of pool and size usable on stream s now, taken out of the cache. pools_mu held. */
static int take_cached(CUmemoryPool pool, size_t size, int dev, CUstream s, int per_thread,
                       struct block *out)
{
    unsigned long long sid = 0; /* asked only once a block of this size is there */
    for (size_t i = 0; i < cache.n; i++) {
        struct block *b = &cache.v[i];
        if (b->pool != pool || b->size != size || b->dev != dev)
            continue;
        if (!sid)
            sid = stream_id(s, per_thread);
        if ((sid && b->stream_id == sid) || event_done(b->done)) {
            *out = *b;
            GS_DEL(cache, i);
            return 1;
        }
    }
    return 0;
}

/* CRIU_GPUSHARE_POOLS=0 leaves stream-ordered memory to the driver's pools. */
static int pools_backed(void)
{
    static int on = -1;
    if (on < 0) {
        const char *e = getenv("CRIU_GPUSHARE_POOLS");
        on = !(e && strcmp(e, "0") == 0);
    }
    return on;
}

/* A backed allocation from pool (NULL: the current pool of the stream's device); 1 when the
 * driver must serve it instead. */
static int backed_alloc(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s,
                        int per_thread, CUresult *result)
{
    if (pool) { /* a pool known to be the driver's costs nothing more */
        pthread_mutex_lock(&pools_mu);
        struct pool *known = find_pool(pool);
        int drivers = known && known->dev < 0;
        pthread_mutex_unlock(&pools_mu);
        if (drivers)
            return 1;
    }
    int dev;
    if (capturing(s, per_thread) || stream_device(s, &dev))
        return 1;
    if (!pool && CU(CUresult(*)(CUmemoryPool *, CUdevice), cuDeviceGetMemPool, &pool, dev) != CUDA_SUCCESS)
        return 1;
    size_t size = gs_backing_rounded(bytesize, dev);
    if (!size)
        return 1;
    pthread_mutex_lock(&pools_mu);
    struct pool *p = pool_of(pool);
    if (p->dev != dev) {
        pthread_mutex_unlock(&pools_mu);
        return 1;
    }
    CUmemAccessDesc access[GS_MAX_ACCESS];
    int n_access = p->n_access;
    memcpy(access, p->access, sizeof(access));
    struct block b;
    if (take_cached(pool, size, dev, s, per_thread, &b)) {
        gs_lock();
        gs_backing_record(b.va, b.size, b.h, dev, GS_ORIGIN_ASYNC, pool, access, n_access);
        gs_unlock();
        pthread_mutex_unlock(&pools_mu);
        if (b.done)
            CU(CUresult(*)(CUevent), cuEventDestroy_v2, b.done);
        *dptr = b.va;
        *result = CUDA_SUCCESS;
        return 0;
    }
    pthread_mutex_unlock(&pools_mu);
    trim_to_threshold(pool); /* room for the new block first */
    CUresult r = gs_backing_alloc(dptr, size, dev, GS_ORIGIN_ASYNC, pool, access, n_access);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        /* Blocks cached for other sizes are what a driver pool would have reused: free them. */
        release_cached(NULL, 0, 0);
        r = gs_backing_alloc(dptr, size, dev, GS_ORIGIN_ASYNC, pool, access, n_access);
    }
    if (r != CUDA_SUCCESS)
        return 1; /* the driver's pool may still have room */
    *result = CUDA_SUCCESS;
    return 0;
}

/* While another thread captures a graph in global mode, event queries and allocations are
 * "unsafe" calls that would invalidate its capture; the shim's own, which never touch a capturing
 * stream, run in relaxed mode, as CUDA asks of libraries. Returns the mode to restore. */
static CUstreamCaptureMode relax_capture(void)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (CU(CUresult(*)(CUstreamCaptureMode *), cuThreadExchangeStreamCaptureMode, &mode) != CUDA_SUCCESS)
        mode = CU_STREAM_CAPTURE_MODE_RELAXED; /* nothing was exchanged: nothing to restore */
    return mode;
}

static void restore_capture(CUstreamCaptureMode mode)
{
    if (mode != CU_STREAM_CAPTURE_MODE_RELAXED)
        CU(CUresult(*)(CUstreamCaptureMode *), cuThreadExchangeStreamCaptureMode, &mode);
}

/* 1 when the driver must serve the allocation, else 0 with its result. */
static int alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s,
                       int per_thread, CUresult *result)
{
    if (!dptr || !pools_backed() || gs_backing_min() == 0 || bytesize < gs_backing_min())
        return 1; /* before any driver call: most allocations of a program are small */
    gs_depth++;
    gs_want_server();
    CUstreamCaptureMode mode = relax_capture();
    int driver = backed_alloc(dptr, bytesize, pool, s, per_thread, result);
    restore_capture(mode);
    gs_depth--;
    return driver;
}

#define ALLOC_WRAPPER(name, per_thread)                                                         \
    CUresult CUDAAPI name(CUdeviceptr *dptr, size_t bytesize, CUstream s)                       \
    {                                                                                           \
        __typeof__(&name) real = REAL(name);                                                    \
        CUresult r;                                                                             \
        if (!real)                                                                              \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        if (gs_depth || alloc_async(dptr, bytesize, NULL, s, per_thread, &r))                   \
            return real(dptr, bytesize, s);                                                     \
        return r;                                                                               \
    }
#define POOL_ALLOC_WRAPPER(name, per_thread)                                                    \
    CUresult CUDAAPI name(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream s)    \
    {                                                                                           \
        __typeof__(&name) real = REAL(name);                                                    \
        CUresult r;                                                                             \
        if (!real)                                                                              \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        if (gs_depth || !pool || alloc_async(dptr, bytesize, pool, s, per_thread, &r))          \
            return real(dptr, bytesize, pool, s);                                               \
        return r;                                                                               \
    }
ALLOC_WRAPPER(cuMemAllocAsync, 0)
ALLOC_WRAPPER(cuMemAllocAsync_ptsz, 1)
POOL_ALLOC_WRAPPER(cuMemAllocFromPoolAsync, 0)
POOL_ALLOC_WRAPPER(cuMemAllocFromPoolAsync_ptsz, 1)

/* An event completing after the work queued on s so far, or NULL (the caller then waits). */
static CUevent record_on(CUstream s, int per_thread)
{
    CUevent e = NULL;
    if (CU(CUresult(*)(CUevent *, unsigned), cuEventCreate, &e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
        return NULL;
    CUresult r = per_thread ? CU(CUresult(*)(CUevent, CUstream), cuEventRecord_ptsz, e, s)
                            : CU(CUresult(*)(CUevent, CUstream), cuEventRecord, e, s);
    if (r != CUDA_SUCCESS) {
        CU(CUresult(*)(CUevent), cuEventDestroy_v2, e);
        return NULL;
    }
    return e;
}

/* 1 when dptr is not the shim's stream-ordered memory (the driver frees it). */
static int backed_free(CUdeviceptr dptr, CUstream s, int per_thread, CUresult *result)
{
    gs_lock();
    struct gs_alloc *a = gs_find_backed_va(dptr);
    int ours = a && a->origin == GS_ORIGIN_ASYNC;
    gs_unlock();
    if (!ours)
        return 1;
    if (capturing(s, per_thread)) {
        /* A free node in a captured graph cannot free the shim's memory, and the graph's work
         * before it may run at any later launch: the block stays allocated (and is saved like
         * any other) until the process ends. */
        *result = CUDA_SUCCESS;
        return 0;
    }
    CUevent done = record_on(s, per_thread);
    if (!done) { /* no event: wait for the stream instead, the block is then free at once */
        CUresult r = per_thread ? CU(CUresult(*)(CUstream), cuStreamSynchronize_ptsz, s)
                                : CU(CUresult(*)(CUstream), cuStreamSynchronize, s);
        if (r != CUDA_SUCCESS) {
            *result = r;
            return 0;
        }
    }
    struct block b = {.va = dptr, .stream_id = stream_id(s, per_thread), .done = done};
    pthread_mutex_lock(&pools_mu);
    gs_lock();
    a = gs_find_backed_va(dptr);
    int found = a && a->origin == GS_ORIGIN_ASYNC;
    if (found) {
        b.dev = a->dev;
        gs_backing_forget(dptr, &b.h, &b.size, &b.pool);
    }
    gs_unlock();
    struct pool *p = found ? find_pool(b.pool) : NULL;
    int cached = p && p->dev == b.dev; /* else its pool is gone, or a devices map moved it */
    if (cached)
        *GS_PUSH(cache) = b;
    pthread_mutex_unlock(&pools_mu);
    if (!found) { /* freed by another thread meanwhile: the driver gives the error */
        if (done)
            CU(CUresult(*)(CUevent), cuEventDestroy_v2, done);
        return 1;
    }
    if (cached) {
        trim_to_threshold(b.pool);
    } else {
        if (done) {
            CU(CUresult(*)(CUevent), cuEventSynchronize, done);
            CU(CUresult(*)(CUevent), cuEventDestroy_v2, done);
        }
        gs_backing_destroy(b.va, b.size, b.h);
    }
    *result = CUDA_SUCCESS;
    return 0;
}

#define FREE_WRAPPER(name, per_thread)                                                          \
    CUresult CUDAAPI name(CUdeviceptr dptr, CUstream s)                                         \
    {                                                                                           \
        __typeof__(&name) real = REAL(name);                                                    \
        if (!real)                                                                              \
            return CUDA_ERROR_NOT_FOUND;                                                        \
        if (gs_depth || !__atomic_load_n(&gs.n_async, __ATOMIC_RELAXED))                        \
            return real(dptr, s); /* no stream-ordered memory of the shim's exists */           \
        gs_depth++;                                                                             \
        CUresult r = CUDA_SUCCESS;                                                              \
        CUstreamCaptureMode mode = relax_capture();                                             \
        int driver = backed_free(dptr, s, per_thread, &r);                                      \
        restore_capture(mode);                                                                  \
        gs_depth--;                                                                             \
        return driver ? real(dptr, s) : r;                                                      \
    }
FREE_WRAPPER(cuMemFreeAsync, 0)
FREE_WRAPPER(cuMemFreeAsync_ptsz, 1)

/* ---- pools ------------------------------------------------------------------------------------ */

CUresult CUDAAPI cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    GS_REAL_OR_FAIL(cuMemPoolCreate);
    CUresult r = real(pool, props);
    if (r != CUDA_SUCCESS || gs_depth || !pool || !props)
        return r;
    /* A size limit or a usage the shim's memory would not honour leaves the pool to the driver. */
    int backed = props->handleTypes == CU_MEM_HANDLE_TYPE_NONE && props->maxSize == 0 &&
                 props->usage == 0 && props->allocType == CU_MEM_ALLOCATION_TYPE_PINNED &&
                 props->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
                 props->location.id >= 0 && props->location.id < GS_MAX_DEV;
    pthread_mutex_lock(&pools_mu);
    add_pool(*pool, backed ? props->location.id : -1);
    pthread_mutex_unlock(&pools_mu);
    return r;
}

CUresult CUDAAPI cuMemPoolDestroy(CUmemoryPool pool)
{
    GS_ENTER(cuMemPoolDestroy, pool);
    release_cached(pool, 0, 1); /* the driver frees its own memory of the pool, not the shim's */
    CUresult r = real(pool);
    if (r == CUDA_SUCCESS) {
        pthread_mutex_lock(&pools_mu);
        for (size_t i = 0; i < pools.n; i++)
            if (pools.v[i].h == pool) {
                GS_DEL(pools, i);
                break;
            }
        pthread_mutex_unlock(&pools_mu);
    }
    return gs_leave(r);
}

CUresult CUDAAPI cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    GS_ENTER(cuMemPoolTrimTo, pool, minBytesToKeep);
    release_cached(pool, minBytesToKeep, 0); /* as the driver, only memory no work still uses */
    CUresult r = real(pool, minBytesToKeep);
    return gs_leave(r);
}

CUresult CUDAAPI cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    GS_REAL_OR_FAIL(cuMemPoolSetAccess);
    CUresult r = real(pool, map, count);
    if (r != CUDA_SUCCESS || gs_depth || !map)
        return r;
    gs_depth++;
    pthread_mutex_lock(&pools_mu);
    struct pool *p = pool_of(pool);
    if (p->dev >= 0) {
        gs_merge_access_list(p->access, &p->n_access, map, count); /* for blocks made later */
        for (size_t i = 0; i < cache.n; i++)
            if (cache.v[i].pool == pool)
                REAL(cuMemSetAccess)(cache.v[i].va, cache.v[i].size, map, count);
        gs_lock();
        for (size_t i = 0; i < gs.allocs.n; i++) {
            struct gs_alloc *a = &gs.allocs.v[i];
            if (a->origin != GS_ORIGIN_ASYNC || a->pool != pool || a->dropped)
                continue;
            if (REAL(cuMemSetAccess)(a->va, a->size, map, count) == CUDA_SUCCESS) {
                struct gs_map *m = gs_find_map_at(a->va);
                if (m)
                    gs_merge_access(m, map, count);
            }
        }
        gs_unlock();
    }
    pthread_mutex_unlock(&pools_mu);
    return gs_leave(r);
}

CUresult CUDAAPI cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle,
                                                    CUmemAllocationHandleType type,
                                                    unsigned long long flags)
{
    GS_REAL_OR_FAIL(cuMemPoolImportFromShareableHandle);
    CUresult r = real(pool, handle, type, flags);
    if (r == CUDA_SUCCESS && !gs_depth && pool) {
        pthread_mutex_lock(&pools_mu);
        add_pool(*pool, -1); /* its memory is the exporter's: never the shim's */
        pthread_mutex_unlock(&pools_mu);
        gs_lock();
        gs.n_pool_imports++;
        gs_unlock();
    }
    return r;
}

/* ---- suspend ---------------------------------------------------------------------------------- */

void gs_pools_trim(void)
{
    int pushed = gs_push_ctx(0); /* a control thread has no context of its own */
    release_cached(NULL, 0, 1);
    gs_pop_ctx(pushed);
}

void gs_pools_reset_after_fork(void)
{
    /* The child has no CUDA objects: neither the cached blocks nor the pools came along. */
    pthread_mutex_init(&pools_mu, NULL);
    free(cache.v);
    free(pools.v);
    memset(&cache, 0, sizeof(cache));
    memset(&pools, 0, sizeof(pools));
}
