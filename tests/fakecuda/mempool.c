/* Stream-ordered allocation and memory pools: cuMemAllocAsync, cuMemAllocFromPoolAsync,
 * cuMemFreeAsync, the default and current pool of each device, cuMemPoolCreate and its attributes,
 * and pool exports as POSIX fds.
 *
 * The model is the simplest one that keeps the API's promises: an allocation is a cuMemAlloc-kind
 * allocation (FK_MAP_ALLOC, so the fake's checkpoint saves it like any driver memory) that records
 * its pool; a free waits for the stream and frees at once, so a pool never holds unused memory and
 * trimming has nothing to do. Pointer exports (cuMemPoolExportPointer) are not modelled. A pool
 * export is a memfd holding the exporter's pid and pool; importing it gives a pool that allocates
 * nothing, enough for tests of what a checkpoint of such an importer must refuse. An allocation on
 * a capturing stream (capture.c) is made at once, as if the graph had run.
 */
#include "fake.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FK_POOL_MAGIC 0x6c6f6f504b46ull
#define FK_POOL_EXPORT_MAGIC 0x78506c6f6f504b46ull

struct fk_pool {
    unsigned long long magic;
    int dev;
    unsigned long long handle_types;
    unsigned long long threshold; /* CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, kept for the getter */
    int imported;                 /* from another process's export: allocates nothing here */
    int destroyed;
};

struct fk_pool_export {
    unsigned long long magic;
    int pid;
    unsigned long long pool;
};

static struct fk_pool default_pools[FK_MAX_DEVICES];
static struct fk_pool *current_pools[FK_MAX_DEVICES];

static int bad_dev(CUdevice d) { return d < 0 || d >= fk.ndev; }

static struct fk_pool *default_pool(int dev)
{
    struct fk_pool *p = &default_pools[dev];
    if (!p->magic) {
        p->magic = FK_POOL_MAGIC;
        p->dev = dev;
    }
    return p;
}

static struct fk_pool *pool_get(CUmemoryPool h)
{
    struct fk_pool *p = (struct fk_pool *)h;
    return p && p->magic == FK_POOL_MAGIC && !p->destroyed ? p : NULL;
}

FK_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev)
{
    FK_API("cuDeviceGetDefaultMemPool");
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (bad_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    *pool = (CUmemoryPool)default_pool(dev);
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    FK_API("cuDeviceGetMemPool");
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    if (bad_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    *pool = (CUmemoryPool)(current_pools[dev] ? current_pools[dev] : default_pool(dev));
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    FK_API("cuDeviceSetMemPool");
    if (bad_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    struct fk_pool *p = pool_get(pool);
    CUresult r = p && p->dev == dev && !p->imported ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) current_pools[dev] = p;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props)
{
    FK_API("cuMemPoolCreate");
    if (!pool || !props || props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        props->location.type != CU_MEM_LOCATION_TYPE_DEVICE || bad_dev(props->location.id))
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_pool *p = calloc(1, sizeof *p);
    p->magic = FK_POOL_MAGIC;
    p->dev = props->location.id;
    p->handle_types = props->handleTypes;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

/* Kept allocated, like streams: a late free may still name it. */
FK_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    FK_API("cuMemPoolDestroy");
    fk_lock();
    struct fk_pool *p = pool_get(pool);
    CUresult r = p && p != &default_pools[p->dev] ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        p->destroyed = 1;
        if (current_pools[p->dev] == p) current_pools[p->dev] = NULL;
    }
    fk_unlock();
    return r;
}

static size_t pool_bytes(struct fk_pool *p)
{
    size_t n = 0;
    for (struct fk_map *m = fk.maps; m; m = m->next)
        if (m->pool == p) n += m->size;
    return n;
}

FK_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    FK_API("cuMemPoolSetAttribute");
    fk_lock();
    struct fk_pool *p = pool_get(pool);
    CUresult r = p && value ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && attr == CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
        p->threshold = *(cuuint64_t *)value;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    FK_API("cuMemPoolGetAttribute");
    fk_lock();
    struct fk_pool *p = pool_get(pool);
    CUresult r = p && value ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        switch (attr) {
        case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = p->threshold; break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool_bytes(p); break;
        default: *(int *)value = 0; break;
        }
    }
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    FK_API("cuMemPoolTrimTo");
    (void)minBytesToKeep;
    fk_lock();
    CUresult r = pool_get(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    FK_API("cuMemPoolSetAccess");
    (void)map;
    (void)count;
    fk_lock();
    CUresult r = pool_get(pool) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    fk_unlock();
    return r;
}

/* ---- stream-ordered allocation ------------------------------------------------------------- */

static CUresult alloc_from(struct fk_pool *p, CUdeviceptr *dptr, size_t bytesize, CUstream hs, int pt)
{
    struct fk_ctx *c;
    CUresult r = fk_stream_context(hs, pt, &c);
    if (r) return r;
    if (!p || p->imported || p->dev != c->dev) return CUDA_ERROR_INVALID_VALUE;
    return fk_alloc_device(c, bytesize, p, dptr);
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUstream hs, int pt)
{
    struct fk_ctx *c;
    CUresult r = fk_stream_context(hs, pt, &c);
    if (r) return r;
    fk_lock();
    struct fk_pool *p = current_pools[c->dev] ? current_pools[c->dev] : default_pool(c->dev);
    fk_unlock();
    return alloc_from(p, dptr, bytesize, hs, pt);
}

static CUresult alloc_pool_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hs, int pt)
{
    fk_lock();
    struct fk_pool *p = pool_get(pool);
    fk_unlock();
    return alloc_from(p, dptr, bytesize, hs, pt);
}

/* Stream order, simplified: the free waits for the stream's work, then frees. */
static CUresult free_async(CUdeviceptr dptr, CUstream hs, int pt)
{
    CUresult r = fk_stream_wait_all(hs, pt);
    return r ? r : fk_free_device(dptr, 0);
}

#define ALLOC_BODY(pt) alloc_async(dptr, bytesize, hs, pt)
#define ALLOC_POOL_BODY(pt) alloc_pool_async(dptr, bytesize, pool, hs, pt)
#define FREE_BODY(pt) free_async(dptr, hs, pt)
FK_PAIR(cuMemAllocAsync, cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream hs), ALLOC_BODY)
FK_PAIR(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz,
        (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hs), ALLOC_POOL_BODY)
FK_PAIR(cuMemFreeAsync, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hs), FREE_BODY)

/* ---- pool exports ------------------------------------------------------------------------- */

FK_EXPORT CUresult cuMemPoolExportToShareableHandle(void *handle, CUmemoryPool pool,
                                                    CUmemAllocationHandleType type, unsigned long long flags)
{
    FK_API("cuMemPoolExportToShareableHandle");
    (void)flags;
    fk_lock();
    struct fk_pool *p = pool_get(pool);
    int ok = p && !p->imported && type == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
             (p->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) && handle;
    fk_unlock();
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("fakecuda-pool", MFD_CLOEXEC);
    struct fk_pool_export e = {FK_POOL_EXPORT_MAGIC, (int)getpid(), (unsigned long long)(uintptr_t)p};
    if (fd < 0 || write(fd, &e, sizeof e) != (ssize_t)sizeof e) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *(int *)handle = fd;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemPoolImportFromShareableHandle(CUmemoryPool *pool, void *handle,
                                                      CUmemAllocationHandleType type, unsigned long long flags)
{
    FK_API("cuMemPoolImportFromShareableHandle");
    (void)flags;
    if (!pool || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    struct fk_pool_export e;
    int fd = (int)(intptr_t)handle;
    if (pread(fd, &e, sizeof e, 0) != (ssize_t)sizeof e || e.magic != FK_POOL_EXPORT_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    struct fk_pool *p = calloc(1, sizeof *p);
    p->magic = FK_POOL_MAGIC;
    p->imported = 1;
    p->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}
