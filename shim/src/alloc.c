/* alloc.c: device memory the process creates and maps.
 *
 *   cuMemCreate        recorded with an id; POSIX-fd export capability is added so the memory can
 *                      be exported later (retried without it if the driver refuses)
 *   cuMemMap/Unmap     mappings of allocations, imports and multicast objects
 *   cuMemSetAccess     merged per location into each mapping (the driver changes only the
 *                      locations named in a call, so a restore must replay the merged list)
 *   cuMemRetainAllocationHandle  a retained handle resolves to the object mapped at the address
 *   cuMemRelease       marks the object released; it is forgotten once nothing maps it
 *   cuMemAlloc >= CRIU_GPUSHARE_MALLOC_MIN (default 2 MiB) is backed by exportable cuMem memory
 *                      (backing.c); cuMemFree synchronizes first (cuMemFree waits for work using
 *                      the memory, cuMemUnmap does not) and frees stream-ordered memory too
 *   cuCtxEnable/DisablePeerAccess  recorded, and applied to the shim's cuMem memory, which peer
 *                      access to a context does not cover
 * Multicast objects are mcast.c's, stream-ordered allocation and pools pools.c's.
 */
#include <string.h>
#include <unistd.h>

#include "backing.h"
#include "resolve.h"
#include "track.h"

static CUresult current_device(int *dev)
{
    CUdevice d = 0;
    CUresult r = CU(CUresult(*)(CUdevice *), cuCtxGetDevice, &d);
    *dev = (int)d;
    return r;
}

/* Devices that may access memory owned by dev: dev itself and the peers the app enabled. */
static int access_list(int dev, CUmemAccessDesc *desc, int max)
{
    int n = 0;
    desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[n].location.id = dev;
    desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (dev < 0 || dev >= GS_MAX_DEV)
        return n;
    for (int a = 0; a < GS_MAX_DEV && n < max; a++)
        if (a != dev && gs.peer[dev][a]) {
            desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
            desc[n].location.id = a;
            desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        }
    return n;
}

static void record_map(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle h)
{
    struct gs_map *m = GS_PUSH(gs.maps);
    *m = (struct gs_map){.va = va, .size = size, .offset = offset, .h = h};
    m->kind = gs_classify_handle(h, &m->obj_id);
    if (m->kind == GS_OBJ_IMPORT) { /* the exporter's size is not known yet: the mapping tells */
        struct gs_import *im = gs_find_import_h(h);
        if (im && im->size < offset + size)
            im->size = offset + size;
    }
}

CUresult CUDAAPI cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                             const CUmemAllocationProp *prop, unsigned long long flags)
{
    GS_ENTER_UNLESS(!prop || !handle, cuMemCreate, handle, size, prop, flags);
    gs_want_server();
    CUmemAllocationProp p = *prop;
    p.requestedHandleTypes |= CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUresult r = real(handle, size, &p, flags);
    if (r != CUDA_SUCCESS && p.requestedHandleTypes != prop->requestedHandleTypes) {
        p = *prop;
        r = real(handle, size, &p, flags);
    }
    if (r == CUDA_SUCCESS) {
        gs_lock();
        gs_xlat_forget(*handle, 1); /* a value the driver reuses means the new object now */
        *GS_PUSH(gs.allocs) = (struct gs_alloc){
            .id = gs_new_id(), .h = *handle, .size = size, .origin = GS_ORIGIN_CUMEM,
            .dev = p.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? p.location.id : -1,
            .handle_types = p.requestedHandleTypes};
        gs_unlock();
    }
    return gs_leave(r);
}

CUresult CUDAAPI cuMemRelease(CUmemGenericAllocationHandle handle)
{
    GS_ENTER(cuMemRelease, handle);
    CUmemGenericAllocationHandle app = handle;
    handle = gs_xlat(handle); /* memory re-created by a resume has a new handle */
    CUresult r = real(handle);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    gs_lock();
    gs_xlat_forget(app, 0);
    int found = 0;
    for (size_t i = 0; i < gs.aliases.n; i++)
        if (gs.aliases.v[i].h == handle) {
            GS_DEL(gs.aliases, i); /* a retained handle: its object lives on */
            found = 1;
            break;
        }
    if (!found) {
        struct gs_alloc *a = gs_find_alloc_h(handle);
        struct gs_import *im = a ? NULL : gs_find_import_h(handle);
        struct gs_mcast *mc = a || im ? NULL : gs_find_mcast_h(handle);
        if (a)
            a->app_released = 1;
        else if (im)
            im->app_released = 1;
        else if (mc)
            mc->app_released = 1;
        /* Exports of a handle that was never identified die with it: the value may be reused. */
        GS_DROP_IF(gs.exports, e->kind == GS_OBJ_UNKNOWN && e->h == handle, close(e->fd));
        gs_collect();
    }
    gs_unlock();
    return gs_leave(r);
}

CUresult CUDAAPI cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                          CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    GS_ENTER(cuMemMap, ptr, size, offset, handle, flags);
    handle = gs_xlat(handle);
    CUresult r = real(ptr, size, offset, handle, flags);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    gs_lock();
    record_map(ptr, size, offset, handle);
    gs_unlock();
    return gs_leave(r);
}

CUresult CUDAAPI cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    GS_ENTER(cuMemUnmap, ptr, size);
    CUresult r = real(ptr, size);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    gs_lock();
    gs_forget_maps(ptr, size);
    gs_collect();
    gs_unlock();
    return gs_leave(r);
}

CUresult CUDAAPI cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                size_t count)
{
    GS_ENTER(cuMemSetAccess, ptr, size, desc, count);
    CUresult r = real(ptr, size, desc, count);
    if (r != CUDA_SUCCESS || !desc)
        return gs_leave(r);
    gs_lock();
    for (size_t i = 0; i < gs.maps.n; i++) {
        struct gs_map *m = &gs.maps.v[i];
        if (m->va < ptr + size && ptr < m->va + m->size)
            gs_merge_access(m, desc, count);
    }
    gs_unlock();
    return gs_leave(r);
}

CUresult CUDAAPI cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    GS_ENTER(cuMemRetainAllocationHandle, handle, addr);
    CUresult r = real(handle, addr);
    if (r != CUDA_SUCCESS || !handle)
        return gs_leave(r);
    gs_lock();
    gs_xlat_forget(*handle, 1);
    struct gs_map *m = gs_find_map_at((CUdeviceptr)(uintptr_t)addr);
    if (m && m->kind != GS_OBJ_UNKNOWN) {
        struct gs_alias *al = GS_PUSH(gs.aliases);
        al->h = *handle;
        al->kind = m->kind;
        al->obj_id = m->obj_id;
    }
    gs_unlock();
    return gs_leave(r);
}

/* ---- cuMemAlloc backed by exportable cuMem memory (backing.c) ------------------------------- */

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    int dev;
    GS_ENTER_UNLESS(!dptr || bytesize < gs_backing_min() || gs_backing_min() == 0 ||
                        current_device(&dev) != CUDA_SUCCESS,
                    cuMemAlloc_v2, dptr, bytesize);
    gs_want_server();
    CUmemAccessDesc desc[GS_MAX_ACCESS];
    gs_lock();
    int n = access_list(dev, desc, GS_MAX_ACCESS);
    gs_unlock();
    CUresult r = gs_backing_alloc(dptr, bytesize, dev, GS_ORIGIN_MALLOC, NULL, desc, n);
    if (r != CUDA_SUCCESS)
        r = real(dptr, bytesize); /* plain memory still works; the driver path will handle it */
    return gs_leave(r);
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    GS_REAL_OR_FAIL(cuMemFree_v2);
    if (gs_depth)
        return real(dptr);
    CUmemGenericAllocationHandle h;
    size_t size;
    gs_lock();
    if (gs_backing_forget(dptr, &h, &size, NULL)) {
        /* driver memory: lazy IPC handles of it die with it */
        for (size_t i = 0; i < gs.lazy_ipc.n; i++)
            if (gs.lazy_ipc.v[i].base == dptr) {
                GS_DEL(gs.lazy_ipc, i);
                break;
            }
        gs_unlock();
        return real(dptr);
    }
    gs_unlock();
    gs_depth++;
    /* cuMemFree waits for work using the memory (stream-ordered memory too); cuMemUnmap does not. */
    CUresult r = CU(CUresult(*)(void), cuCtxSynchronize);
    if (r == CUDA_SUCCESS || r == CUDA_ERROR_INVALID_CONTEXT)
        r = gs_backing_destroy(dptr, size, h);
    return gs_leave(r);
}

/* ---- peer access ---------------------------------------------------------------------------- */

/* Peer access to a context covers its cuMemAlloc memory; the shim's cuMem memory behind it needs
 * per-allocation access, granted (or revoked) here. */
static void apply_peer_access(int owner, int accessor, int enable)
{
    CUmemAccessDesc d;
    d.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    d.location.id = accessor;
    d.flags = enable ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    gs_lock();
    gs.peer[owner][accessor] = (unsigned char)enable;
    for (size_t i = 0; i < gs.allocs.n; i++) {
        struct gs_alloc *a = &gs.allocs.v[i];
        if (a->origin != GS_ORIGIN_MALLOC || a->dev != owner)
            continue;
        if (REAL(cuMemSetAccess)(a->va, a->size, &d, 1) == CUDA_SUCCESS) {
            struct gs_map *m = gs_find_map_at(a->va);
            if (m)
                gs_merge_access(m, &d, 1);
        }
    }
    gs_unlock();
}

static CUresult peer_access(CUcontext peer, unsigned flags, int enable)
{
    if (gs_depth)
        return enable ? REAL(cuCtxEnablePeerAccess)(peer, flags) : REAL(cuCtxDisablePeerAccess)(peer);
    gs_depth++;
    CUresult r = enable ? REAL(cuCtxEnablePeerAccess)(peer, flags)
                        : REAL(cuCtxDisablePeerAccess)(peer);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    int owner, accessor;
    if (gs_context_device(peer, &owner) == CUDA_SUCCESS && current_device(&accessor) == CUDA_SUCCESS &&
        owner >= 0 && owner < GS_MAX_DEV && accessor >= 0 && accessor < GS_MAX_DEV)
        apply_peer_access(owner, accessor, enable);
    return gs_leave(r);
}

CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags)
{
    if (!REAL(cuCtxEnablePeerAccess))
        return CUDA_ERROR_NOT_FOUND;
    return peer_access(peerContext, Flags, 1);
}

CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext)
{
    if (!REAL(cuCtxDisablePeerAccess))
        return CUDA_ERROR_NOT_FOUND;
    return peer_access(peerContext, 0, 0);
}
