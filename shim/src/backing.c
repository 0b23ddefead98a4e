/* backing.c: exportable cuMem memory the shim allocates in the program's place (backing.h). */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backing.h"
#include "resolve.h"

size_t gs_backing_min(void)
{
    static long long min = -1;
    if (min < 0) {
        const char *e = getenv("CRIU_GPUSHARE_MALLOC_MIN");
        char *end;
        long long v = e && *e ? strtoll(e, &end, 0) : -1;
        min = e && *e && *end == 0 && v >= 0 ? v : 2LL << 20;
    }
    return (size_t)min;
}

void gs_backing_record(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h, int dev,
                       int origin, CUmemoryPool pool, const CUmemAccessDesc *access, int n_access)
{
    struct gs_alloc *a = GS_PUSH(gs.allocs);
    *a = (struct gs_alloc){.id = gs_new_id(), .h = h, .size = size, .dev = dev, .origin = origin,
                           .pool = pool, .handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                           .va = va};
    if (origin == GS_ORIGIN_ASYNC)
        __atomic_add_fetch(&gs.n_async, 1, __ATOMIC_RELAXED);
    struct gs_map *m = GS_PUSH(gs.maps);
    *m = (struct gs_map){.va = va, .size = size, .h = h, .kind = GS_OBJ_ALLOC, .obj_id = a->id};
    gs_merge_access(m, access, (size_t)n_access);
}

void gs_backing_prop(CUmemAllocationProp *prop, int dev)
{
    memset(prop, 0, sizeof(*prop));
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = dev;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* A device's granularity never changes: asked once (every allocation would ask otherwise). */
static size_t granularity(int dev)
{
    static size_t known[GS_MAX_DEV];
    if (dev < 0 || dev >= GS_MAX_DEV)
        return 0;
    size_t gran = __atomic_load_n(&known[dev], __ATOMIC_RELAXED);
    if (gran)
        return gran;
    CUmemAllocationProp prop;
    gs_backing_prop(&prop, dev);
    if (CU(CUresult(*)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags),
           cuMemGetAllocationGranularity, &gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) !=
        CUDA_SUCCESS)
        return 0;
    __atomic_store_n(&known[dev], gran, __ATOMIC_RELAXED);
    return gran;
}

size_t gs_backing_rounded(size_t bytesize, int dev)
{
    size_t gran = granularity(dev);
    return gran ? (bytesize + gran - 1) / gran * gran : 0;
}

CUresult gs_backing_alloc(CUdeviceptr *dptr, size_t bytesize, int dev, int origin,
                          CUmemoryPool pool, const CUmemAccessDesc *access, int n_access)
{
    CUmemAllocationProp prop;
    gs_backing_prop(&prop, dev);
    size_t size = gs_backing_rounded(bytesize, dev);
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    CUmemGenericAllocationHandle h;
    CUresult r = REAL(cuMemCreate)(&h, size, &prop, 0);
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr va = 0;
    r = CU(CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long),
           cuMemAddressReserve, &va, size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        goto release;
    r = REAL(cuMemMap)(va, size, 0, h, 0);
    if (r != CUDA_SUCCESS)
        goto free_va;
    r = REAL(cuMemSetAccess)(va, size, access, (size_t)n_access);
    if (r != CUDA_SUCCESS)
        goto unmap;
    *dptr = va;
    gs_lock();
    gs_backing_record(va, size, h, dev, origin, pool, access, n_access);
    gs_unlock();
    return CUDA_SUCCESS;
unmap:
    REAL(cuMemUnmap)(va, size);
free_va:
    CU(CUresult(*)(CUdeviceptr, size_t), cuMemAddressFree, va, size);
release:
    REAL(cuMemRelease)(h);
    return r;
}

int gs_backing_forget(CUdeviceptr va, CUmemGenericAllocationHandle *h, size_t *size,
                      CUmemoryPool *pool)
{
    struct gs_alloc *a = gs_find_backed_va(va);
    if (!a)
        return -1;
    *h = a->h;
    *size = a->size;
    if (pool)
        *pool = a->origin == GS_ORIGIN_ASYNC ? a->pool : NULL;
    gs_forget_maps(va, a->size);
    gs_forget_exports(GS_OBJ_ALLOC, a->id); /* neither moves gs.allocs: a stays valid */
    gs_close_kept(a);
    if (a->origin == GS_ORIGIN_ASYNC)
        __atomic_sub_fetch(&gs.n_async, 1, __ATOMIC_RELAXED);
    GS_DEL(gs.allocs, (size_t)(a - gs.allocs.v));
    return 0;
}

CUresult gs_backing_destroy(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h)
{
    REAL(cuMemUnmap)(va, size);
    CU(CUresult(*)(CUdeviceptr, size_t), cuMemAddressFree, va, size);
    return REAL(cuMemRelease)(h);
}
