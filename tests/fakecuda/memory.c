/* Device memory: the VA arena, memfd-backed physical allocations, mappings, usage accounting,
 * cuMemAlloc/cuMemFree, cuMemGetInfo, cuMemGetAddressRange and pointer attributes. */
#include "fake.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- VA arena: one PROT_NONE reservation; spans handed out first-fit ------------------------ */

struct fk_span { uintptr_t va; size_t size; };
static struct fk_span *fk_spans; /* sorted by va */
static size_t fk_nspans, fk_capspans;

int fk_in_arena(uintptr_t p) { return fk.arena && p >= fk.arena && p < fk.arena + FK_ARENA_SIZE; }

static int fk_span_free(uintptr_t va, size_t size, size_t *insert_at)
{
    size_t i = 0;
    while (i < fk_nspans && fk_spans[i].va + fk_spans[i].size <= va) i++;
    if (i < fk_nspans && fk_spans[i].va < va + size) return 0;
    *insert_at = i;
    return 1;
}

static void fk_span_insert(size_t at, uintptr_t va, size_t size)
{
    if (fk_nspans == fk_capspans) {
        fk_capspans = fk_capspans ? fk_capspans * 2 : 64;
        fk_spans = realloc(fk_spans, fk_capspans * sizeof *fk_spans);
    }
    memmove(&fk_spans[at + 1], &fk_spans[at], (fk_nspans - at) * sizeof *fk_spans);
    fk_spans[at].va = va;
    fk_spans[at].size = size;
    fk_nspans++;
}

/* Caller holds fk.mu. size 0 only creates the arena. fixed: a preferred address (a hint). */
CUresult fk_va_alloc(size_t size, size_t align, uintptr_t fixed, uintptr_t *out)
{
    if (!fk.arena) {
        void *a = mmap(NULL, FK_ARENA_SIZE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (a == MAP_FAILED) {
            fk_log("cannot reserve the device VA arena: %s", strerror(errno));
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        fk.arena = (uintptr_t)a;
    }
    if (size == 0) return CUDA_SUCCESS;
    if (align < FK_GRANULARITY) align = FK_GRANULARITY;
    size = (size + FK_GRANULARITY - 1) & ~(FK_GRANULARITY - 1);
    size_t at;
    if (fixed && fixed % align == 0 && fk_in_arena(fixed) && fixed + size <= fk.arena + FK_ARENA_SIZE &&
        fk_span_free(fixed, size, &at)) {
        fk_span_insert(at, fixed, size);
        *out = fixed;
        return CUDA_SUCCESS;
    }
    /* The first GiB of the arena stays unused so that small integers are never valid pointers. */
    uintptr_t cur = fk.arena + (1ull << 30);
    for (size_t i = 0; i <= fk_nspans; i++) {
        cur = (cur + align - 1) & ~(uintptr_t)(align - 1);
        uintptr_t limit = i < fk_nspans ? fk_spans[i].va : fk.arena + FK_ARENA_SIZE;
        if (cur + size <= limit) {
            fk_span_insert(i, cur, size);
            *out = cur;
            return CUDA_SUCCESS;
        }
        if (i < fk_nspans && fk_spans[i].va + fk_spans[i].size > cur) cur = fk_spans[i].va + fk_spans[i].size;
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
}

void fk_va_free(uintptr_t va, size_t size)
{
    (void)size;
    for (size_t i = 0; i < fk_nspans; i++)
        if (fk_spans[i].va == va) {
            memmove(&fk_spans[i], &fk_spans[i + 1], (fk_nspans - i - 1) * sizeof *fk_spans);
            fk_nspans--;
            return;
        }
}

/* ---- memfds and mappings --------------------------------------------------------------- */

int fk_memfd_new(size_t size, const char *tag)
{
    int fd = memfd_create(tag, MFD_CLOEXEC);
    if (fd < 0) return -1;
    if (ftruncate(fd, (off_t)size) != 0) {
        close(fd);
        return -1;
    }
    /* Keep the fake's own fds away from the low numbers programs and tests use. */
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 512);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    return fd;
}

int fk_map_fd(uintptr_t va, size_t size, int fd, size_t offset)
{
    void *p = mmap((void *)va, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)offset);
    return p == MAP_FAILED ? -1 : 0;
}

/* Put the range back to reserved-but-inaccessible: a CPU touch faults, the VA stays ours. */
void fk_map_none(uintptr_t va, size_t size)
{
    mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
}

struct fk_phys *fk_phys_new(enum fk_phys_kind kind, int dev, size_t size, int memfd)
{
    struct fk_phys *p = calloc(1, sizeof *p);
    p->kind = kind;
    p->dev = dev;
    p->size = size;
    p->memfd = memfd;
    p->ipc_fd = -1;
    p->handle = fk.next_handle++;
    p->next = fk.phys;
    fk.phys = p;
    return p;
}

struct fk_phys *fk_phys_by_handle(unsigned long long h)
{
    for (struct fk_phys *p = fk.phys; p; p = p->next)
        if (p->handle == h && (p->handle_held > 0 || p->map_count > 0)) return p;
    return NULL;
}

/* Free physical memory nobody holds any more. Caller holds fk.mu. */
void fk_phys_maybe_free(struct fk_phys *p)
{
    if (p->handle_held > 0 || p->map_count > 0) return;
    for (struct fk_phys **pp = &fk.phys; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    if (p->charged) fk_charge(p, 0);
    if (p->memfd >= 0) close(p->memfd);
    if (p->ipc_fd >= 0) close(p->ipc_fd);
    free(p->saved);
    free(p);
}

/* ---- usage accounting: $FAKECUDA_STATE/usage/<pid>, one "<dev> <bytes>" line per device --------- */

void fk_charge(struct fk_phys *p, int on)
{
    if (p->dev < 0 || p->dev >= FK_MAX_DEVICES) return;
    if (on && !p->charged) fk.used[p->dev] += p->size;
    if (!on && p->charged) fk.used[p->dev] -= p->size;
    p->charged = on;
    fk_usage_write();
}

void fk_usage_write(void)
{
    if (!fk.state_dir[0]) return;
    char path[700], tmp[720], text[FK_MAX_DEVICES * 48] = "";
    snprintf(path, sizeof path, "%s/usage/%d", fk.state_dir, (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    size_t len = 0;
    for (int i = 0; i < fk.ndev; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%d %zu\n", i, fk.used[i]);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ssize_t w = write(fd, text, len);
    close(fd);
    if (w == (ssize_t)len) rename(tmp, path);
    else unlink(tmp);
}

/* Bytes used on device dev by all live processes of this state directory. */
size_t fk_node_used(int dev)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s/usage", fk.state_dir);
    DIR *d = opendir(dir);
    if (!d) return fk.used[dev];
    size_t total = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        char *end;
        long pid = strtol(e->d_name, &end, 10);
        if (*end || pid <= 0) continue;
        if (pid == getpid()) {
            total += fk.used[dev];
            continue;
        }
        char proc[64];
        snprintf(proc, sizeof proc, "/proc/%ld", pid);
        if (access(proc, F_OK) != 0) continue;
        char path[900];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(path, "re");
        if (!f) continue;
        int dv;
        size_t bytes;
        while (fscanf(f, "%d %zu", &dv, &bytes) == 2)
            if (dv == dev) total += bytes;
        fclose(f);
    }
    closedir(d);
    return total;
}

/* ---- lookups ------------------------------------------------------------------------------- */

struct fk_map *fk_map_at(uintptr_t p)
{
    for (struct fk_map *m = fk.maps; m; m = m->next)
        if (p >= m->va && p < m->va + m->size) return m;
    return NULL;
}

struct fk_resv *fk_resv_at(uintptr_t p)
{
    for (struct fk_resv *r = fk.resvs; r; r = r->next)
        if (p >= r->va && p < r->va + r->size) return r;
    return NULL;
}

struct fk_host *fk_host_at(uintptr_t p)
{
    for (struct fk_host *h = fk.hosts; h; h = h->next)
        if (p >= h->va && p < h->va + h->size) return h;
    return NULL;
}

void fk_map_unlink(struct fk_map *m)
{
    for (struct fk_map **pp = &fk.maps; *pp; pp = &(*pp)->next)
        if (*pp == m) {
            *pp = m->next;
            return;
        }
}

static int fk_map_accessible(const struct fk_map *m, int write)
{
    if (m->kind != FK_MAP_VMM) return 1;
    for (int d = 0; d < fk.ndev; d++) {
        if (m->access[d] == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) return 1;
        if (!write && m->access[d] == CU_MEM_ACCESS_FLAGS_PROT_READ) return 1;
    }
    return 0;
}

CUresult fk_check_range(uintptr_t p, size_t n, int device_side, int write)
{
    CUresult r = CUDA_SUCCESS;
    if (n == 0) return CUDA_SUCCESS;
    if (p + n < p) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    for (uintptr_t cur = p; cur < p + n;) {
        struct fk_map *m = fk_map_at(cur);
        if (m) {
            if (!m->mapped || !fk_map_accessible(m, write)) {
                r = CUDA_ERROR_INVALID_VALUE;
                break;
            }
            cur = m->va + m->size;
            continue;
        }
        struct fk_host *h = fk_host_at(cur);
        if (h && !h->unmapped) {
            cur = h->va + h->size;
            continue;
        }
        if (!device_side && !fk_in_arena(cur) && !h) break; /* pageable host memory */
        r = CUDA_ERROR_INVALID_VALUE;
        break;
    }
    fk_unlock();
    return r;
}

/* ---- cuMemAlloc / cuMemFree ------------------------------------------------------------------ */

/* A cuMemAlloc-kind allocation in context c (pool: the memory pool it came from, or NULL). */
CUresult fk_alloc_device(struct fk_ctx *c, size_t bytesize, void *pool, CUdeviceptr *dptr)
{
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t size = (bytesize + FK_GRANULARITY - 1) & ~(FK_GRANULARITY - 1);
    fk_lock();
    if (fk_node_used(c->dev) + size > fk.dev[c->dev].total) {
        fk_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    char tag[32];
    snprintf(tag, sizeof tag, "fakecuda-dev%d", c->dev);
    int fd = fk_memfd_new(size, tag);
    uintptr_t va;
    if (fd < 0 || fk_va_alloc(size, 0, 0, &va) != CUDA_SUCCESS) {
        if (fd >= 0) close(fd);
        fk_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (fk_map_fd(va, size, fd, 0) != 0) {
        fk_va_free(va, size);
        close(fd);
        fk_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fk_phys *p = fk_phys_new(FK_PHYS_ALLOC, c->dev, size, fd);
    p->map_count = 1;
    fk_charge(p, 1);
    struct fk_map *m = calloc(1, sizeof *m);
    m->kind = FK_MAP_ALLOC;
    m->va = va;
    m->size = size;
    m->req_size = bytesize;
    m->phys = p;
    m->mapped = 1;
    m->ctx = c;
    m->pool = pool;
    m->next = fk.maps;
    fk.maps = m;
    fk_unlock();
    *dptr = (CUdeviceptr)va;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FK_API("cuMemAlloc_v2");
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    return fk_alloc_device(c, bytesize, NULL, dptr);
}

/* Frees a cuMemAlloc-kind allocation; sync_ctx: first wait for its context's work (cuMemFree). */
CUresult fk_free_device(CUdeviceptr dptr, int sync_ctx)
{
    if (dptr == 0) return CUDA_SUCCESS;
    fk_lock();
    struct fk_map *m = fk_map_at((uintptr_t)dptr);
    if (!m || m->kind != FK_MAP_ALLOC || m->va != (uintptr_t)dptr) {
        fk_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fk_ctx *c = m->ctx;
    fk_unlock();
    /* cuMemFree waits for the work that may use the memory; cuMemUnmap does not. */
    if (sync_ctx && fk_valid_ctx(c)) fk_stream_sync_ctx(c);
    fk_lock();
    m = fk_map_at((uintptr_t)dptr);
    if (!m || m->kind != FK_MAP_ALLOC) {
        fk_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    fk_map_unlink(m);
    if (m->mapped) fk_map_none(m->va, m->size);
    fk_va_free(m->va, m->size);
    m->phys->map_count--;
    fk_phys_maybe_free(m->phys);
    free(m);
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FK_API("cuMemFree_v2");
    return fk_free_device(dptr, 1);
}

FK_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    FK_API("cuMemGetInfo_v2");
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    fk_lock();
    size_t used = fk_node_used(c->dev), tot = fk.dev[c->dev].total;
    fk_unlock();
    if (free_bytes) *free_bytes = used >= tot ? 0 : tot - used;
    if (total) *total = tot;
    return CUDA_SUCCESS;
}

/* Unlike the pointer attributes, the real driver answers this only with a context current on the
 * calling thread (CUDA_ERROR_INVALID_CONTEXT otherwise, whichever context owns the memory). */
FK_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr dptr)
{
    FK_API("cuMemGetAddressRange_v2");
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    fk_lock();
    struct fk_map *m = fk_map_at((uintptr_t)dptr);
    struct fk_host *h = m ? NULL : fk_host_at((uintptr_t)dptr);
    if (!m && !h) {
        fk_unlock();
        return CUDA_ERROR_NOT_FOUND;
    }
    if (base) *base = (CUdeviceptr)(m ? m->va : h->va);
    if (size) *size = m ? (m->kind == FK_MAP_ALLOC ? m->req_size : m->size) : h->size;
    fk_unlock();
    return CUDA_SUCCESS;
}

/* ---- pointer attributes ---------------------------------------------------------------- */

static CUresult fk_pointer_attr(CUpointer_attribute attr, uintptr_t p, void *data, int lenient)
{
    struct fk_map *m = fk_map_at(p);
    struct fk_host *h = m ? NULL : fk_host_at(p);
    if (!m && !h) {
        if (!lenient) return CUDA_ERROR_INVALID_VALUE;
        /* cuPointerGetAttributes reports unknown pointers as unregistered host memory. */
        switch (attr) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE: *(unsigned *)data = 0; break;
        case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = NULL; break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = -2; break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        case CU_POINTER_ATTRIBUTE_MAPPED:
        case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE: *(unsigned char *)data = 0; break;
        default: break;
        }
        return CUDA_SUCCESS;
    }
    int dev = m && m->phys->dev >= 0 ? m->phys->dev : 0; /* a multicast object has no single device */
    switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
        *(CUcontext *)data = m ? (CUcontext)(m->ctx ? m->ctx : &fk.dev[dev].primary) : NULL;
        break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned *)data = m ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        *(uintptr_t *)data = p;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
        *(uintptr_t *)data = m ? m->va : h->va;
        break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
        *(size_t *)data = m ? (m->kind == FK_MAP_ALLOC ? m->req_size : m->size) : h->size;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
        *(int *)data = m ? dev : -1;
        break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED:
        *(unsigned char *)data = 0;
        break;
    case CU_POINTER_ATTRIBUTE_MAPPED:
        *(unsigned char *)data = m ? (unsigned char)m->mapped : (unsigned char)!h->unmapped;
        break;
    case CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE:
        *(unsigned char *)data = m && m->kind == FK_MAP_ALLOC;
        break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS:
        *(unsigned char *)data = 1;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID:
        *(unsigned long long *)data = m ? m->phys->handle : (unsigned long long)h->va;
        break;
    case CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES:
        *(unsigned long long *)data = m ? m->phys->handle_types : 0;
        break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
        *(unsigned *)data = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
        break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE:
        *(void **)data = NULL;
        break;
    case CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE:
        *(unsigned char *)data = 0;
        break;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr ptr)
{
    FK_API("cuPointerGetAttribute");
    if (!data) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    CUresult r = fk_pointer_attr(attr, (uintptr_t)ptr, data, 0);
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuPointerGetAttributes(unsigned int n, CUpointer_attribute *attrs, void **data, CUdeviceptr ptr)
{
    FK_API("cuPointerGetAttributes");
    if (!attrs || !data) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    fk_lock();
    for (unsigned i = 0; i < n && r == CUDA_SUCCESS; i++)
        if (data[i]) r = fk_pointer_attr(attrs[i], (uintptr_t)ptr, data[i], 1);
    fk_unlock();
    return r;
}

FK_EXPORT CUresult cuPointerSetAttribute(const void *value, CUpointer_attribute attr, CUdeviceptr ptr)
{
    FK_API("cuPointerSetAttribute");
    (void)value;
    (void)ptr;
    return attr == CU_POINTER_ATTRIBUTE_SYNC_MEMOPS ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
