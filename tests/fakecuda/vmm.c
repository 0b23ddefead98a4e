/* The virtual memory management API (cuMemCreate, reserve, map, access, export/import as real fds)
 * and multicast objects (fake only: never create them on a real GPU). */
#include "fake.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int fk_aligned(size_t v) { return v % FK_GRANULARITY == 0; }

FK_EXPORT CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                                 CUmemAllocationGranularity_flags option)
{
    FK_API("cuMemGetAllocationGranularity");
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && (prop->location.id < 0 || prop->location.id >= fk.ndev))
        return CUDA_ERROR_INVALID_DEVICE;
    *g = FK_GRANULARITY;
    return CUDA_SUCCESS;
}

static CUresult fk_new_backed_phys(enum fk_phys_kind kind, int dev, size_t size, const char *tag,
                                   struct fk_phys **out)
{
    int fd = fk_memfd_new(size, tag);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = fk_phys_new(kind, dev, size, fd);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                               unsigned long long flags)
{
    FK_API("cuMemCreate");
    if (!h || !prop || flags != 0 || size == 0 || !fk_aligned(size)) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->location.id;
    if (dev < 0 || dev >= fk.ndev) return CUDA_ERROR_INVALID_DEVICE;
    if (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_FABRIC) return CUDA_ERROR_NOT_SUPPORTED;
    fk_lock();
    size_t used = fk_node_used(dev), total = fk.dev[dev].total;
    size_t free_bytes = used >= total ? 0 : total - used;
    if (size > free_bytes) {
        fk_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    char tag[32];
    snprintf(tag, sizeof tag, "fakecuda-dev%d", dev);
    struct fk_phys *p;
    CUresult r = fk_new_backed_phys(FK_PHYS_CREATE, dev, size, tag, &p);
    if (r == CUDA_SUCCESS) {
        p->handle_held = 1;
        p->handle_types = prop->requestedHandleTypes;
        fk_charge(p, 1);
        *h = p->handle;
    }
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
    FK_API("cuMemRelease");
    fk_lock();
    struct fk_phys *p = fk_phys_by_handle(h);
    if (!p || p->handle_held <= 0 || p->kind == FK_PHYS_ALLOC || p->kind == FK_PHYS_IPC) {
        fk_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    p->handle_held--;
    fk_phys_maybe_free(p);
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                       unsigned long long flags)
{
    FK_API("cuMemAddressReserve");
    if (!ptr || size == 0 || !fk_aligned(size) || (alignment & (alignment - 1))) return CUDA_ERROR_INVALID_VALUE;
    (void)flags;
    fk_lock();
    uintptr_t va;
    CUresult r = fk_va_alloc(size, alignment, (uintptr_t)addr, &va);
    if (r == CUDA_SUCCESS) {
        struct fk_resv *rv = calloc(1, sizeof *rv);
        rv->va = va;
        rv->size = size;
        rv->next = fk.resvs;
        fk.resvs = rv;
        *ptr = (CUdeviceptr)va;
    }
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FK_API("cuMemAddressFree");
    fk_lock();
    for (struct fk_resv **pp = &fk.resvs; *pp; pp = &(*pp)->next) {
        struct fk_resv *rv = *pp;
        if (rv->va == (uintptr_t)ptr && rv->size == size && !rv->internal) {
            for (struct fk_map *m = fk.maps; m; m = m->next)
                if (m->va >= rv->va && m->va < rv->va + rv->size) {
                    fk_unlock();
                    return CUDA_ERROR_INVALID_VALUE; /* still mapped */
                }
            *pp = rv->next;
            fk_va_free(rv->va, rv->size);
            free(rv);
            fk_unlock();
            return CUDA_SUCCESS;
        }
    }
    fk_unlock();
    return CUDA_ERROR_INVALID_VALUE;
}

FK_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                            unsigned long long flags)
{
    FK_API("cuMemMap");
    uintptr_t va = (uintptr_t)ptr;
    if (flags != 0 || size == 0 || !fk_aligned(size) || !fk_aligned(offset) || !fk_aligned(va))
        return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    CUresult r = CUDA_SUCCESS;
    struct fk_resv *rv = fk_resv_at(va);
    struct fk_phys *p = fk_phys_by_handle(h);
    if (!rv || rv->internal || va + size > rv->va + rv->size) r = CUDA_ERROR_INVALID_VALUE;
    else if (!p || p->handle_held <= 0 || p->memfd < 0) r = CUDA_ERROR_INVALID_HANDLE;
    else if (offset + size > p->size) r = CUDA_ERROR_INVALID_VALUE;
    else
        for (struct fk_map *m = fk.maps; m; m = m->next)
            if (m->va < va + size && va < m->va + m->size) r = CUDA_ERROR_ALREADY_MAPPED;
    if (r == CUDA_SUCCESS && fk_map_fd(va, size, p->memfd, offset) != 0) r = CUDA_ERROR_OUT_OF_MEMORY;
    if (r == CUDA_SUCCESS) {
        struct fk_map *m = calloc(1, sizeof *m);
        m->kind = FK_MAP_VMM;
        m->va = va;
        m->size = size;
        m->req_size = size;
        m->phys = p;
        m->offset = offset;
        m->mapped = 1;
        m->next = fk.maps;
        fk.maps = m;
        p->map_count++;
    }
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FK_API("cuMemUnmap");
    uintptr_t va = (uintptr_t)ptr;
    fk_lock();
    struct fk_resv *rv = fk_resv_at(va);
    if (!rv || rv->internal || va + size > rv->va + rv->size || !fk_aligned(va) || !fk_aligned(size)) {
        fk_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    /* The range must cover whole mappings. */
    for (struct fk_map *m = fk.maps; m; m = m->next)
        if (m->va < va + size && va < m->va + m->size && (m->va < va || m->va + m->size > va + size)) {
            fk_unlock();
            return CUDA_ERROR_INVALID_VALUE;
        }
    for (struct fk_map **pp = &fk.maps; *pp;) {
        struct fk_map *m = *pp;
        if (m->kind == FK_MAP_VMM && m->va >= va && m->va + m->size <= va + size) {
            *pp = m->next;
            fk_map_none(m->va, m->size);
            m->phys->map_count--;
            fk_phys_maybe_free(m->phys);
            free(m);
        } else {
            pp = &m->next;
        }
    }
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    FK_API("cuMemSetAccess");
    uintptr_t va = (uintptr_t)ptr;
    if (!desc || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < count; i++)
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc[i].location.id < 0 ||
            desc[i].location.id >= fk.ndev)
            return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    /* The whole range must be mapped. */
    for (uintptr_t cur = va; cur < va + size;) {
        struct fk_map *m = fk_map_at(cur);
        if (!m || m->kind != FK_MAP_VMM) {
            fk_unlock();
            return CUDA_ERROR_INVALID_VALUE;
        }
        cur = m->va + m->size;
    }
    for (struct fk_map *m = fk.maps; m; m = m->next)
        if (m->kind == FK_MAP_VMM && m->va < va + size && va < m->va + m->size)
            for (size_t i = 0; i < count; i++) m->access[desc[i].location.id] = desc[i].flags;
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *loc, CUdeviceptr ptr)
{
    FK_API("cuMemGetAccess");
    if (!flags || !loc) return CUDA_ERROR_INVALID_VALUE;
    if (loc->type != CU_MEM_LOCATION_TYPE_DEVICE || loc->id < 0 || loc->id >= fk.ndev) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    struct fk_map *m = fk_map_at((uintptr_t)ptr);
    CUresult r = CUDA_SUCCESS;
    if (!m) r = CUDA_ERROR_INVALID_VALUE;
    else *flags = m->kind == FK_MAP_VMM ? m->access[loc->id] : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *h, void *addr)
{
    FK_API("cuMemRetainAllocationHandle");
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    struct fk_map *m = fk_map_at((uintptr_t)addr);
    CUresult r = CUDA_SUCCESS;
    if (!m || m->kind != FK_MAP_VMM) r = CUDA_ERROR_INVALID_VALUE;
    else {
        m->phys->handle_held++;
        *h = m->phys->handle;
    }
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle h)
{
    FK_API("cuMemGetAllocationPropertiesFromHandle");
    if (!prop) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    struct fk_phys *p = fk_phys_by_handle(h);
    CUresult r = CUDA_SUCCESS;
    if (!p || p->kind == FK_PHYS_ALLOC || p->kind == FK_PHYS_IPC || p->kind == FK_PHYS_MULTICAST)
        r = CUDA_ERROR_INVALID_VALUE;
    else {
        memset(prop, 0, sizeof *prop);
        prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop->location.id = p->dev;
        prop->requestedHandleTypes = (CUmemAllocationHandleType)p->handle_types;
    }
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
                                                CUmemAllocationHandleType type, unsigned long long flags)
{
    FK_API("cuMemExportToShareableHandle");
    if (!out || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    fk_lock();
    struct fk_phys *p = fk_phys_by_handle(h);
    CUresult r = CUDA_SUCCESS;
    if (!p || p->handle_held <= 0 || p->memfd < 0) r = CUDA_ERROR_INVALID_HANDLE;
    else if (!(p->handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) r = CUDA_ERROR_INVALID_VALUE;
    /* The real driver exports no imported handle (INVALID_VALUE, driver 580 on the H200). */
    else if (p->kind == FK_PHYS_IMPORT) r = CUDA_ERROR_INVALID_VALUE;
    else {
        /* The app owns this fd; like the driver's export it is not close-on-exec. */
        int fd = fcntl(p->memfd, F_DUPFD, 3);
        if (fd < 0) r = CUDA_ERROR_OUT_OF_MEMORY;
        else *(int *)out = fd;
    }
    fk_unlock();
    return r;
}

/* An fd made by a fake driver's export: "/memfd:fakecuda-dev<N>" or "/memfd:fakecuda-mc<N>". */
static int fk_fd_kind(int fd, int *dev, int *multicast)
{
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return -1;
    target[n] = 0;
    if (sscanf(target, "/memfd:fakecuda-dev%d", dev) == 1) {
        *multicast = 0;
        return 0;
    }
    if (sscanf(target, "/memfd:fakecuda-mc%d", dev) == 1) {
        *multicast = 1;
        return 0;
    }
    return -1;
}

FK_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
                                                  CUmemAllocationHandleType type)
{
    FK_API("cuMemImportFromShareableHandle");
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)os_handle, dev, multicast;
    struct stat st;
    if (fk_fd_kind(fd, &dev, &multicast) != 0 || fstat(fd, &st) != 0) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    /* Importing our own export gives back our own allocation, as the driver does. */
    for (struct fk_phys *p = fk.phys; p; p = p->next) {
        struct stat own;
        if (p->memfd >= 0 && p->kind != FK_PHYS_IMPORT && fstat(p->memfd, &own) == 0 && own.st_ino == st.st_ino &&
            own.st_dev == st.st_dev) {
            p->handle_held++;
            *h = p->handle;
            fk_unlock();
            return CUDA_SUCCESS;
        }
    }
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 512);
    if (mine < 0) {
        fk_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fk_phys *p = fk_phys_new(multicast ? FK_PHYS_MULTICAST : FK_PHYS_IMPORT, dev, (size_t)st.st_size, mine);
    p->handle_held = 1;
    p->handle_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    if (multicast) p->mc_num_devices = fk.ndev;
    *h = p->handle;
    fk_unlock();
    return CUDA_SUCCESS;
}

/* ---- multicast objects (fake only) ------------------------------------------------------------
 * Modelled as handles with their own memfd: devices join, memory binds and unbinds are checked and
 * recorded; writes through a multicast mapping are not broadcast to the bound memory. */

FK_EXPORT CUresult cuMulticastGetGranularity(size_t *g, const CUmulticastObjectProp *prop,
                                             CUmulticastGranularity_flags option)
{
    FK_API("cuMulticastGetGranularity");
    (void)option;
    if (!g || !prop) return CUDA_ERROR_INVALID_VALUE;
    *g = FK_GRANULARITY;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMulticastCreate(CUmemGenericAllocationHandle *h, const CUmulticastObjectProp *prop)
{
    FK_API("cuMulticastCreate");
    if (!h || !prop || prop->numDevices == 0 || prop->numDevices > (unsigned)fk.ndev || prop->size == 0 ||
        !fk_aligned(prop->size))
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->handleTypes & CU_MEM_HANDLE_TYPE_FABRIC) return CUDA_ERROR_NOT_SUPPORTED;
    fk_lock();
    struct fk_phys *p;
    CUresult r = fk_new_backed_phys(FK_PHYS_MULTICAST, -1, prop->size, "fakecuda-mc0", &p);
    if (r == CUDA_SUCCESS) {
        p->handle_held = 1;
        p->handle_types = prop->handleTypes;
        p->mc_num_devices = (int)prop->numDevices;
        *h = p->handle;
    }
    fk_unlock();
    return r;
}

static struct fk_phys *fk_mc_get(CUmemGenericAllocationHandle h)
{
    struct fk_phys *p = fk_phys_by_handle(h);
    return p && p->kind == FK_PHYS_MULTICAST ? p : NULL;
}

static int fk_popcount(int v) { return __builtin_popcount((unsigned)v); }

FK_EXPORT CUresult cuMulticastAddDevice(CUmemGenericAllocationHandle mc, CUdevice dev)
{
    FK_API("cuMulticastAddDevice");
    if (dev < 0 || dev >= fk.ndev) return CUDA_ERROR_INVALID_DEVICE;
    fk_lock();
    struct fk_phys *p = fk_mc_get(mc);
    CUresult r = CUDA_SUCCESS;
    if (!p) r = CUDA_ERROR_INVALID_HANDLE;
    else if (p->mc_devices & (1 << dev)) r = CUDA_ERROR_INVALID_VALUE;
    else if (fk_popcount(p->mc_devices) >= p->mc_num_devices) r = CUDA_ERROR_INVALID_VALUE;
    else p->mc_devices |= 1 << dev;
    fk_unlock();
    return r;
}

static CUresult fk_mc_bind_check(struct fk_phys *mc, size_t mc_offset, size_t size)
{
    if (!mc) return CUDA_ERROR_INVALID_HANDLE;
    if (!fk_aligned(mc_offset) || !fk_aligned(size) || mc_offset + size > mc->size) return CUDA_ERROR_INVALID_VALUE;
    if (mc->mc_devices == 0) return CUDA_ERROR_ILLEGAL_STATE;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMulticastBindMem(CUmemGenericAllocationHandle mc, size_t mc_offset,
                                      CUmemGenericAllocationHandle mem, size_t mem_offset, size_t size,
                                      unsigned long long flags)
{
    FK_API("cuMulticastBindMem");
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    struct fk_phys *p = fk_mc_get(mc), *m = fk_phys_by_handle(mem);
    CUresult r = fk_mc_bind_check(p, mc_offset, size);
    if (r == CUDA_SUCCESS && (!m || m->kind == FK_PHYS_MULTICAST)) r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && mem_offset + size > m->size) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !(p->mc_devices & (1 << m->dev))) r = CUDA_ERROR_INVALID_DEVICE;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMulticastBindAddr(CUmemGenericAllocationHandle mc, size_t mc_offset, CUdeviceptr memptr,
                                       size_t size, unsigned long long flags)
{
    FK_API("cuMulticastBindAddr");
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    struct fk_phys *p = fk_mc_get(mc);
    struct fk_map *m = fk_map_at((uintptr_t)memptr);
    CUresult r = fk_mc_bind_check(p, mc_offset, size);
    if (r == CUDA_SUCCESS && (!m || (uintptr_t)memptr + size > m->va + m->size)) r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !(p->mc_devices & (1 << m->phys->dev))) r = CUDA_ERROR_INVALID_DEVICE;
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuMulticastUnbind(CUmemGenericAllocationHandle mc, CUdevice dev, size_t mc_offset, size_t size)
{
    FK_API("cuMulticastUnbind");
    fk_lock();
    struct fk_phys *p = fk_mc_get(mc);
    CUresult r = fk_mc_bind_check(p, mc_offset, size);
    if (r == CUDA_SUCCESS && (dev < 0 || dev >= fk.ndev || !(p->mc_devices & (1 << dev)))) r = CUDA_ERROR_INVALID_DEVICE;
    fk_unlock();
    return r;
}
