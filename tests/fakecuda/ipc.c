/* Legacy CUDA IPC: the handle names the exporter's pid and an fd it keeps open on the allocation's
 * memfd; the opener takes that fd with pidfd_getfd (or /proc/<pid>/fd/<n>) and maps it at a new VA.
 * The handle also carries the memfd's inode: after a checkpoint and restore the memory has a new
 * memfd, so a handle given out before no longer opens (CUDA_ERROR_INVALID_HANDLE, as the real
 * driver's "invalid resource handle"), even if its fd number was reused meanwhile. */
#include "fake.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

struct fk_ipc_payload {
    unsigned long long magic;
    int pid;
    int fd;
    unsigned long long size;
    unsigned long long id; /* the exporter's allocation handle: tells two opens of one handle apart */
    int dev;
    unsigned long long ino; /* of the memfd when the handle was made */
};
_Static_assert(sizeof(struct fk_ipc_payload) <= sizeof(CUipcMemHandle), "IPC payload must fit the handle");

FK_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr dptr)
{
    FK_API("cuIpcGetMemHandle");
    if (!h) return CUDA_ERROR_INVALID_VALUE;
    fk_lock();
    struct fk_map *m = fk_map_at((uintptr_t)dptr);
    if (!m || m->kind != FK_MAP_ALLOC || !m->mapped) {
        fk_unlock();
        return CUDA_ERROR_INVALID_VALUE; /* only cuMemAlloc memory is legacy-IPC capable */
    }
    struct fk_phys *p = m->phys;
    if (p->ipc_fd < 0) p->ipc_fd = fcntl(p->memfd, F_DUPFD_CLOEXEC, 512);
    if (p->ipc_fd < 0) {
        fk_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct stat st;
    if (fstat(p->memfd, &st) != 0) {
        fk_unlock();
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct fk_ipc_payload pl = {FK_IPC_MAGIC, (int)getpid(), p->ipc_fd, p->size, p->handle, p->dev,
                                (unsigned long long)st.st_ino};
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &pl, sizeof pl);
    fk_unlock();
    return CUDA_SUCCESS;
}

static int fk_fetch_fd(int pid, int fd)
{
#ifdef SYS_pidfd_open
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd >= 0) {
        int got = (int)syscall(SYS_pidfd_getfd, pidfd, fd, 0);
        close(pidfd);
        if (got >= 0) return got;
    }
#endif
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    return open(path, O_RDWR | O_CLOEXEC);
}

FK_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle h, unsigned int flags)
{
    FK_API("cuIpcOpenMemHandle_v2");
    (void)flags;
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    struct fk_ipc_payload pl;
    memcpy(&pl, h.reserved, sizeof pl);
    if (pl.magic != FK_IPC_MAGIC || pl.size == 0) return CUDA_ERROR_INVALID_VALUE;
    if (pl.pid == (int)getpid()) return CUDA_ERROR_INVALID_CONTEXT; /* no opening of one's own handle */
    fk_lock();
    /* A second open of the same handle returns the same mapping. */
    for (struct fk_map *m = fk.maps; m; m = m->next)
        if (m->kind == FK_MAP_IPC && m->phys->ipc_src_pid == pl.pid && m->phys->ipc_src_id == pl.id) {
            m->phys->map_count++;
            *dptr = (CUdeviceptr)m->va;
            fk_unlock();
            return CUDA_SUCCESS;
        }
    fk_unlock();
    int fd = fk_fetch_fd(pl.pid, pl.fd);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || (unsigned long long)st.st_size != pl.size ||
        (unsigned long long)st.st_ino != pl.ino) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_INVALID_HANDLE; /* exporter gone, or memory checkpointed since */
    }
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 512);
    if (high >= 0) {
        close(fd);
        fd = high;
    }
    fk_lock();
    uintptr_t va;
    r = fk_va_alloc(pl.size, 0, 0, &va);
    if (r == CUDA_SUCCESS && fk_map_fd(va, pl.size, fd, 0) != 0) {
        fk_va_free(va, pl.size);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (r != CUDA_SUCCESS) {
        close(fd);
        fk_unlock();
        return r;
    }
    struct fk_phys *p = fk_phys_new(FK_PHYS_IPC, pl.dev, pl.size, fd);
    p->map_count = 1;
    p->ipc_src_pid = pl.pid;
    p->ipc_src_id = pl.id;
    struct fk_map *m = calloc(1, sizeof *m);
    m->kind = FK_MAP_IPC;
    m->va = va;
    m->size = pl.size;
    m->req_size = pl.size;
    m->phys = p;
    m->mapped = 1;
    m->ctx = c;
    m->next = fk.maps;
    fk.maps = m;
    *dptr = (CUdeviceptr)va;
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    FK_API("cuIpcCloseMemHandle");
    fk_lock();
    struct fk_map *m = fk_map_at((uintptr_t)dptr);
    if (!m || m->kind != FK_MAP_IPC || m->va != (uintptr_t)dptr) {
        fk_unlock();
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fk_phys *p = m->phys;
    if (--p->map_count == 0) {
        fk_map_unlink(m);
        if (m->mapped) fk_map_none(m->va, m->size);
        fk_va_free(m->va, m->size);
        free(m);
        fk_phys_maybe_free(p);
    }
    fk_unlock();
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *h, CUevent ev)
{
    FK_API("cuIpcGetEventHandle");
    (void)h;
    (void)ev;
    return CUDA_ERROR_NOT_SUPPORTED;
}

FK_EXPORT CUresult cuIpcOpenEventHandle(CUevent *ev, CUipcEventHandle h)
{
    FK_API("cuIpcOpenEventHandle");
    (void)h;
    (void)ev;
    return CUDA_ERROR_NOT_SUPPORTED;
}
