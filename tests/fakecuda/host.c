/* Page-locked host memory. cuMemHostAlloc memory is the driver's: a memfd mapping, so a checkpoint
 * can unmap it (a CPU touch then faults) and a restore can put it back at the same address.
 * cuMemHostRegister only records the range: the memory stays the application's. With unified
 * addressing the device pointer of pinned memory is its host address. */
#include "fake.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static int fk_host_overlaps(uintptr_t va, size_t size)
{
    for (struct fk_host *h = fk.hosts; h; h = h->next)
        if (h->va < va + size && va < h->va + h->size) return 1;
    return 0;
}

static CUresult fk_host_alloc(void **pp, size_t size, unsigned flags)
{
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if (!pp || size == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (size + page - 1) & ~(page - 1);
    int fd = fk_memfd_new(len, "fakecuda-host");
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fk_host *h = calloc(1, sizeof *h);
    h->kind = FK_HOST_ALLOC;
    h->va = (uintptr_t)p;
    h->size = len;
    h->flags = flags;
    h->memfd = fd;
    fk_lock();
    h->next = fk.hosts;
    fk.hosts = h;
    fk_unlock();
    *pp = p;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    FK_API("cuMemHostAlloc");
    return fk_host_alloc(pp, size, flags);
}

FK_EXPORT CUresult cuMemAllocHost_v2(void **pp, size_t size)
{
    FK_API("cuMemAllocHost_v2");
    return fk_host_alloc(pp, size, 0);
}

FK_EXPORT CUresult cuMemFreeHost(void *p)
{
    FK_API("cuMemFreeHost");
    fk_lock();
    for (struct fk_host **pp = &fk.hosts; *pp; pp = &(*pp)->next) {
        struct fk_host *h = *pp;
        if (h->va == (uintptr_t)p && h->kind == FK_HOST_ALLOC) {
            *pp = h->next;
            munmap((void *)h->va, h->size);
            if (h->memfd >= 0) close(h->memfd);
            free(h->saved);
            free(h);
            fk_unlock();
            return CUDA_SUCCESS;
        }
    }
    fk_unlock();
    return CUDA_ERROR_INVALID_VALUE;
}

FK_EXPORT CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned int flags)
{
    FK_API("cuMemHostRegister_v2");
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if (!p || size == 0) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    if (fk_host_overlaps((uintptr_t)p, size) || fk_in_arena((uintptr_t)p)) {
        fk_unlock();
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    }
    struct fk_host *h = calloc(1, sizeof *h);
    h->kind = FK_HOST_REGISTERED;
    h->va = (uintptr_t)p;
    h->size = size;
    h->flags = flags;
    h->memfd = -1;
    h->next = fk.hosts;
    fk.hosts = h;
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemHostUnregister(void *p)
{
    FK_API("cuMemHostUnregister");
    fk_lock();
    for (struct fk_host **pp = &fk.hosts; *pp; pp = &(*pp)->next) {
        struct fk_host *h = *pp;
        if (h->va == (uintptr_t)p && h->kind == FK_HOST_REGISTERED) {
            *pp = h->next;
            free(h);
            fk_unlock();
            return CUDA_SUCCESS;
        }
    }
    fk_unlock();
    return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

FK_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    FK_API("cuMemHostGetDevicePointer_v2");
    if (!dptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    struct fk_host *h = fk_host_at((uintptr_t)p);
    CUresult r = h && !h->unmapped ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) *dptr = (CUdeviceptr)(uintptr_t)p;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemHostGetFlags(unsigned int *flags, void *p)
{
    FK_API("cuMemHostGetFlags");
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    struct fk_host *h = fk_host_at((uintptr_t)p);
    CUresult r = h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
    if (h) *flags = h->flags;
    fk_unlock();
    return r;
}

/* Not a CUDA entry point: a page-locked buffer the driver keeps for itself, as the real driver's
 * runtime threads use internal pinned buffers. No interposer knows the name, so it is never the
 * shim's memory: the checkpoint unmaps it like every cuMemHostAlloc buffer (tests of the window in
 * which no thread may run, tests/hook/test_gpu_dump.py). */
FK_EXPORT void *fakecuda_internal_buffer(size_t size)
{
    void *p = NULL;
    return fk_host_alloc(&p, size, 0) == CUDA_SUCCESS ? p : NULL;
}
