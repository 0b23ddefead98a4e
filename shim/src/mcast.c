/* mcast.c: NVLink multicast objects (NCCL NVLS, PyTorch symmetric memory): objects created or
 * imported, devices added, memory bound and unbound. Never exercised on a GPU machine by this
 * project's tests (fake driver only). Suspend refuses processes that have any (lifecycle.c).
 */
#include <string.h>

#include "resolve.h"
#include "track.h"

CUresult CUDAAPI cuMulticastCreate(CUmemGenericAllocationHandle *mcHandle,
                                   const CUmulticastObjectProp *prop)
{
    GS_ENTER(cuMulticastCreate, mcHandle, prop);
    CUresult r = real(mcHandle, prop);
    if (r != CUDA_SUCCESS || !prop || !mcHandle)
        return gs_leave(r);
    gs_want_server();
    gs_lock();
    struct gs_mcast *mc = GS_PUSH(gs.mcasts);
    memset(mc, 0, sizeof(*mc));
    mc->id = gs_new_id();
    mc->h = *mcHandle;
    mc->prop = *prop;
    gs_unlock();
    return gs_leave(r);
}

CUresult CUDAAPI cuMulticastAddDevice(CUmemGenericAllocationHandle mcHandle, CUdevice dev)
{
    GS_ENTER(cuMulticastAddDevice, mcHandle, dev);
    CUresult r = real(mcHandle, dev);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    gs_lock();
    struct gs_mcast *mc = gs_find_mcast_h(mcHandle);
    if (mc && mc->n_devs < GS_MAX_DEV)
        mc->devs[mc->n_devs++] = (int)dev;
    gs_unlock();
    return gs_leave(r);
}

static void record_bind(CUmemGenericAllocationHandle mc_h, int dev, size_t mc_off, size_t size,
                        CUmemGenericAllocationHandle mem_h, CUdeviceptr mem_ptr, size_t mem_off,
                        unsigned long long flags)
{
    gs_lock();
    struct gs_mcast *mc = gs_find_mcast_h(mc_h);
    if (mc) {
        struct gs_mcbind *b = GS_PUSH(gs.mcbinds);
        *b = (struct gs_mcbind){.mc_id = mc->id, .dev = dev, .mc_offset = mc_off, .size = size,
                                .mem_h = mem_h, .mem_ptr = mem_ptr, .mem_offset = mem_off,
                                .flags = flags};
        if (mem_ptr) {
            struct gs_map *m = gs_find_map_at(mem_ptr);
            if (m && m->kind == GS_OBJ_ALLOC)
                b->mem_alloc_id = m->obj_id;
        } else {
            uint64_t id;
            if (gs_classify_handle(mem_h, &id) == GS_OBJ_ALLOC)
                b->mem_alloc_id = id;
        }
    }
    gs_unlock();
}

static int mem_device(CUmemGenericAllocationHandle h, CUdeviceptr p)
{
    int dev = -1;
    gs_lock();
    uint64_t id;
    if (h && gs_classify_handle(h, &id) == GS_OBJ_ALLOC) {
        struct gs_alloc *a = gs_find_alloc_id(id);
        if (a)
            dev = a->dev;
    } else if (p) {
        struct gs_map *m = gs_find_map_at(p);
        if (m && m->kind == GS_OBJ_ALLOC) {
            struct gs_alloc *a = gs_find_alloc_id(m->obj_id);
            if (a)
                dev = a->dev;
        }
    }
    gs_unlock();
    return dev;
}

/* Binding blocks until every device of the group has joined, in every process: it runs without
 * the state lock, which the control thread needs to serve the peers meanwhile. */
CUresult CUDAAPI cuMulticastBindMem(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                    CUmemGenericAllocationHandle memHandle, size_t memOffset,
                                    size_t size, unsigned long long flags)
{
    GS_ENTER(cuMulticastBindMem, mcHandle, mcOffset, memHandle, memOffset, size, flags);
    CUresult r = real(mcHandle, mcOffset, memHandle, memOffset, size, flags);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    record_bind(mcHandle, mem_device(memHandle, 0), mcOffset, size, memHandle, 0, memOffset, flags);
    return gs_leave(r);
}

CUresult CUDAAPI cuMulticastBindAddr(CUmemGenericAllocationHandle mcHandle, size_t mcOffset,
                                     CUdeviceptr memptr, size_t size, unsigned long long flags)
{
    GS_ENTER(cuMulticastBindAddr, mcHandle, mcOffset, memptr, size, flags);
    CUresult r = real(mcHandle, mcOffset, memptr, size, flags);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    record_bind(mcHandle, mem_device(0, memptr), mcOffset, size, 0, memptr, 0, flags);
    return gs_leave(r);
}

CUresult CUDAAPI cuMulticastUnbind(CUmemGenericAllocationHandle mcHandle, CUdevice dev,
                                   size_t mcOffset, size_t size)
{
    GS_ENTER(cuMulticastUnbind, mcHandle, dev, mcOffset, size);
    CUresult r = real(mcHandle, dev, mcOffset, size);
    if (r != CUDA_SUCCESS)
        return gs_leave(r);
    gs_lock();
    struct gs_mcast *mc = gs_find_mcast_h(mcHandle);
    if (mc)
        GS_DROP_IF(gs.mcbinds, e->mc_id == mc->id && e->dev == (int)dev &&
                                   e->mc_offset >= mcOffset && e->mc_offset - mcOffset < size, );
    gs_collect();
    gs_unlock();
    return gs_leave(r);
}
