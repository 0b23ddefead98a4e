/* host.c: page-locked host memory.
 *
 * The driver does not restore page-locked host memory everywhere (Grace, driver 580), so the shim
 * must be able to unregister each buffer before a checkpoint and register it again afterwards at
 * the same device pointer. Memory from cuMemHostAlloc/cuMemAllocHost belongs to the driver and
 * cannot be re-registered, so the shim allocates it itself (anonymous mmap) and registers it with
 * REGISTER_PORTABLE | REGISTER_DEVICEMAP whatever the flags: with unified addressing the driver's
 * page-locked allocations are usable from every context and device, so the registration must be
 * too. WRITECOMBINED is dropped (it only affects speed).
 * If registering fails, the driver's own allocation is used and the buffer is not tracked.
 */
#include <string.h>
#include <sys/mman.h>

#include "resolve.h"
#include "track.h"

#define GS_HOST_REGISTER_FLAGS (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP)

static void record_host(void *p, size_t size, unsigned flags, int owned)
{
    CUdeviceptr dptr = 0;
    if (flags & CU_MEMHOSTREGISTER_DEVICEMAP)
        CU(CUresult(*)(CUdeviceptr *, void *, unsigned), cuMemHostGetDevicePointer_v2, &dptr, p, 0);
    gs_lock();
    *GS_PUSH(gs.hosts) =
        (struct gs_host){.p = p, .size = size, .flags = flags, .owned = owned, .dptr = dptr};
    gs_unlock();
}

/* Returns 1 and the record's fields if p is a tracked buffer (removed from the record). */
static int take_host(void *p, size_t *size, int *owned)
{
    int found = 0;
    gs_lock();
    for (size_t i = 0; i < gs.hosts.n; i++)
        if (gs.hosts.v[i].p == p) {
            *size = gs.hosts.v[i].size;
            *owned = gs.hosts.v[i].owned;
            GS_DEL(gs.hosts, i);
            found = 1;
            break;
        }
    gs_unlock();
    return found;
}

static CUresult shim_host_alloc(void **pp, size_t size, unsigned reg_flags)
{
    if (!size)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = REAL(cuMemHostRegister_v2)(p, size, reg_flags);
    if (r != CUDA_SUCCESS) {
        munmap(p, size);
        return r;
    }
    record_host(p, size, reg_flags, 1);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    __typeof__(&cuMemHostAlloc) real = REAL(cuMemHostAlloc);
    if (!real || !REAL(cuMemHostRegister_v2))
        return real ? real(pp, bytesize, Flags) : CUDA_ERROR_NOT_FOUND;
    if (gs_depth || !pp)
        return real(pp, bytesize, Flags);
    gs_depth++;
    gs_want_server();
    CUresult r = shim_host_alloc(pp, bytesize, GS_HOST_REGISTER_FLAGS);
    if (r != CUDA_SUCCESS)
        r = real(pp, bytesize, Flags);
    return gs_leave(r);
}

CUresult CUDAAPI cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    __typeof__(&cuMemAllocHost_v2) real = REAL(cuMemAllocHost_v2);
    if (!real || !REAL(cuMemHostRegister_v2))
        return real ? real(pp, bytesize) : CUDA_ERROR_NOT_FOUND;
    if (gs_depth || !pp)
        return real(pp, bytesize);
    gs_depth++;
    gs_want_server();
    CUresult r = shim_host_alloc(pp, bytesize, GS_HOST_REGISTER_FLAGS);
    if (r != CUDA_SUCCESS)
        r = real(pp, bytesize);
    return gs_leave(r);
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    GS_REAL_OR_FAIL(cuMemFreeHost);
    size_t size;
    int owned;
    if (gs_depth || !take_host(p, &size, &owned))
        return real(p);
    if (!owned) /* registered by the app, then freed as if allocated: let the driver judge */
        return real(p);
    gs_depth++;
    CUresult r = REAL(cuMemHostUnregister)(p);
    munmap(p, size);
    gs_depth--;
    return r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED ? CUDA_SUCCESS : r;
}

CUresult CUDAAPI cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    GS_ENTER(cuMemHostRegister_v2, p, bytesize, Flags);
    CUresult r = real(p, bytesize, Flags);
    if (r == CUDA_SUCCESS) {
        gs_want_server();
        record_host(p, bytesize, Flags, 0);
    }
    return gs_leave(r);
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    GS_ENTER(cuMemHostUnregister, p);
    CUresult r = real(p);
    if (r == CUDA_SUCCESS) {
        size_t size;
        int owned;
        gs_lock();
        int is_owned = 0;
        for (size_t i = 0; i < gs.hosts.n; i++)
            if (gs.hosts.v[i].p == p)
                is_owned = gs.hosts.v[i].owned;
        gs_unlock();
        /* A buffer the shim allocated stays recorded (as unregistered) until cuMemFreeHost. */
        if (!is_owned)
            take_host(p, &size, &owned);
    }
    return gs_leave(r);
}
