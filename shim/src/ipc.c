/* ipc.c: memory shared between processes, linked to its exporter by (pid, allocation id).
 *
 * Shareable handles (POSIX fd):
 *   export  the shim keeps a dup of every exported fd; a copy of that fd, wherever it travelled,
 *           is recognised with kcmp(KCMP_FILE) against the dup
 *   import  the shim asks itself, then the shim of every process with a control socket in this
 *           network namespace ("whose", with the fd attached) who exported it; an import nobody
 *           claims keeps a dup and is asked about again at quiesce, then refused if still unknown
 *
 * Legacy CUDA IPC (cuIpcGetMemHandle/cuIpcOpenMemHandle), two kinds of shim handle:
 *   backed  memory behind a shim-backed cuMemAlloc (magic CRIUGSH1: pid, allocation id); the opener
 *           asks the exporter's shim for a POSIX fd of that allocation ("export"), imports and maps
 *           it at a fresh VA. The driver never sees a legacy IPC handle of this memory.
 *   lazy    other memory the driver can share by legacy IPC (a small cuMemAlloc; magic CRIUGSL1:
 *           pid, base VA, size, offset). Nothing is asked of the driver until an opener asks the
 *           exporter's shim ("ipcget"), which takes the driver's handle then; the opener opens that.
 *           So a handle nobody opened survives the exporter's checkpoints (a driver handle taken
 *           before a checkpoint does not open after the restore), while an opened one is a driver
 *           IPC import like any other, which a checkpoint must refuse.
 * Handles of anything else go to the driver.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "devices.h"
#include "ipc.h"
#include "json.h"
#include "peer.h"
#include "resolve.h"
#include "threads.h"
#include "track.h"

#define GS_IPC_MAGIC "CRIUGSH1"

struct gs_ipc_handle {
    char magic[8];
    uint32_t version;
    int32_t pid;
    uint64_t alloc_id;
    uint64_t size;
    uint64_t offset;
    int32_t dev;
};
_Static_assert(sizeof(struct gs_ipc_handle) <= sizeof(((CUipcMemHandle *)0)->reserved),
               "the shim's IPC handle must fit in CUipcMemHandle");

#define GS_IPC_LAZY_MAGIC "CRIUGSL1"

struct gs_ipc_lazy {
    char magic[8];
    uint32_t version;
    int32_t pid;
    uint64_t base; /* of the allocation (cuMemGetAddressRange) */
    uint64_t size;
    uint64_t offset; /* of the pointer the handle was taken for */
};
_Static_assert(sizeof(struct gs_ipc_lazy) <= sizeof(((CUipcMemHandle *)0)->reserved),
               "the shim's lazy IPC handle must fit in CUipcMemHandle");

/* Do two fds name the same exported memory? The same open file (kcmp), or for file-backed exports
 * the same inode; device nodes (the real driver's fds) all share one inode, so only kcmp counts
 * for them. */
static int same_file(int a, int b)
{
    if (gs_same_open_file(a, b))
        return 1;
    /* A file-backed export (memfd) reopened through /proc/PID/fd is a new open file of the same
     * inode, and the same memory. */
    struct stat sa, sb;
    if (fstat(a, &sa) || fstat(b, &sb) || S_ISCHR(sa.st_mode))
        return 0;
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

int gs_whose_fd(int fd, struct gs_origin *out, char *err, size_t errlen)
{
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        snprintf(err, errlen, "busy (state lock)");
        return -2;
    }
    int found = -1;
    for (size_t i = 0; i < gs.exports.n && found; i++) {
        struct gs_export *e = &gs.exports.v[i];
        if (!e->obj_id || !same_file(fd, e->fd))
            continue;
        struct gs_mcast *mc = e->kind == GS_OBJ_MCAST ? gs_find_mcast_id(e->obj_id) : NULL;
        struct gs_alloc *a = e->kind == GS_OBJ_ALLOC ? gs_find_alloc_id(e->obj_id) : NULL;
        /* Ids are per creator: an importer's re-export of a multicast object is not claimed. */
        if (a || (mc && !mc->creator_pid)) {
            out->id = e->obj_id;
            out->is_mc = mc != NULL;
            out->size = a ? a->size : mc->prop.size;
            found = 0;
        }
    }
    gs_unlock();
    if (found)
        snprintf(err, errlen, "not exported by this process");
    return found;
}

int gs_export_id(uint64_t id, int *fd_out, char *err, size_t errlen)
{
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        snprintf(err, errlen, "busy (state lock)");
        return -2;
    }
    struct gs_alloc *a = gs_find_alloc_id(id);
    int rc = -1;
    if (!a) {
        /* Freed: never export a handle the shim does not hold. */
        snprintf(err, errlen, "gone: allocation %llu no longer exists", (unsigned long long)id);
    } else {
        /* Released with keep (the tool copies it out), or memory a recreate imported from what
         * it kept (the driver exports no imported handle): a dup of that fd. */
        gs_kept_lock();
        int kept = gs_kept_find(id);
        *fd_out = kept >= 0 ? fcntl(kept, F_DUPFD_CLOEXEC, 0) : -1;
        gs_kept_unlock();
        if (*fd_out >= 0)
            rc = 0;
        else if (kept >= 0)
            snprintf(err, errlen, "dup of the kept fd of allocation %llu: %s", (unsigned long long)id,
                     strerror(errno));
        else if (a->dropped)
            snprintf(err, errlen, "gone: allocation %llu is released", (unsigned long long)id);
        else
            rc = gs_export_alloc(a, fd_out, err, errlen);
    }
    gs_unlock();
    return rc;
}

int gs_export_alloc(struct gs_alloc *a, int *fd_out, char *err, size_t errlen)
{
    uint64_t id = a->id;
    CUmemGenericAllocationHandle h = a->h;
    int dev = a->dev, retained = 0;
    CUresult r = CUDA_SUCCESS;
    if (a->app_released) {
        /* The app released its handle; a mapping keeps the memory: take a handle of our own. */
        struct gs_map *m = NULL;
        for (size_t i = 0; i < gs.maps.n && !m; i++)
            if (gs.maps.v[i].kind == GS_OBJ_ALLOC && gs.maps.v[i].obj_id == id)
                m = &gs.maps.v[i];
        r = m ? REAL(cuMemRetainAllocationHandle)(&h, (void *)(uintptr_t)m->va)
              : CUDA_ERROR_NOT_FOUND;
        retained = r == CUDA_SUCCESS;
    }
    int fd = -1;
    if (r == CUDA_SUCCESS) {
        int pushed = gs_push_ctx(dev);
        r = REAL(cuMemExportToShareableHandle)(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        gs_pop_ctx(pushed);
    }
    if (retained)
        REAL(cuMemRelease)(h);
    if (r != CUDA_SUCCESS) {
        snprintf(err, errlen, "cuMemExportToShareableHandle of allocation %llu: %s",
                 (unsigned long long)id, gs_cu_name(r));
        return -1;
    }
    *fd_out = fd;
    return 0;
}

/* Reads a reply {"v":1,"ok":true,"id":N,"multicast":B,"size":S}. */
static int reply_origin(const char *reply, struct gs_origin *out)
{
    struct gs_json j;
    char err[128];
    if (gs_json_parse(reply, strlen(reply), &j, err, sizeof(err)))
        return -1;
    const struct gs_json_field *ok = gs_json_get(&j, "ok", 'b');
    const struct gs_json_field *f = gs_json_get(&j, "id", 'i');
    const struct gs_json_field *mc = gs_json_get(&j, "multicast", 'b');
    const struct gs_json_field *size = gs_json_get(&j, "size", 'i');
    if (!ok || !ok->num || !f || f->num <= 0)
        return -1;
    out->id = (uint64_t)f->num;
    out->is_mc = mc && mc->num;
    out->size = size && size->num > 0 ? (size_t)size->num : 0;
    return 0;
}

/* Who exported this fd: this process, or a peer with the shim. Call without the state lock. */
static int find_exporter(int fd, pid_t *pid, struct gs_origin *origin)
{
    char err[128];
    if (gs_whose_fd(fd, origin, err, sizeof(err)) == 0) {
        *pid = getpid();
        return 0;
    }
    size_t n;
    pid_t *pids = gs_peer_pids(&n);
    char req[64], reply[512];
    int rc = -1;
    snprintf(req, sizeof(req), "{\"v\":%d,\"cmd\":\"whose\"}", CRIU_GPUSHARE_PROTOCOL);
    for (size_t i = 0; i < n && rc; i++) {
        if (pids[i] == getpid())
            continue;
        if (gs_peer_request(pids[i], req, fd, reply, sizeof(reply), NULL, 2000) == 0 &&
            reply_origin(reply, origin) == 0) {
            *pid = pids[i];
            rc = 0;
        }
    }
    free(pids);
    return rc;
}

int gs_resolve_pending_imports(void)
{
    struct pending {
        uint64_t id;
        int fd;
    } todo[256];
    int n = 0, left = 0;
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS))
        return -1;
    for (size_t i = 0; i < gs.imports.n; i++) {
        struct gs_import *im = &gs.imports.v[i];
        if (im->kind != GS_IMPORT_FD || im->exporter_pid)
            continue;
        if (im->unresolved_fd >= 0 && n < 256) {
            int fd = fcntl(im->unresolved_fd, F_DUPFD_CLOEXEC, 3);
            if (fd >= 0) {
                todo[n].id = im->id;
                todo[n++].fd = fd;
            }
        }
    }
    gs_unlock();
    for (int k = 0; k < n; k++) {
        pid_t pid;
        struct gs_origin o;
        int found = find_exporter(todo[k].fd, &pid, &o) == 0;
        close(todo[k].fd);
        if (!found || gs_lock_timed(GS_LOCK_TIMEOUT_MS))
            continue;
        for (size_t i = 0; i < gs.imports.n; i++) {
            struct gs_import *im = &gs.imports.v[i];
            if (im->id == todo[k].id && !im->exporter_pid) {
                im->exporter_pid = pid;
                im->exporter_id = o.id;
                if (o.size)
                    im->size = o.size;
                if (im->unresolved_fd >= 0)
                    close(im->unresolved_fd);
                im->unresolved_fd = -1;
            }
        }
        gs_unlock();
    }
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS))
        return -1;
    for (size_t i = 0; i < gs.imports.n; i++)
        left += gs.imports.v[i].kind == GS_IMPORT_FD && gs.imports.v[i].exporter_pid == 0;
    gs_unlock();
    return left;
}

CUresult CUDAAPI cuMemExportToShareableHandle(void *shareableHandle,
                                              CUmemGenericAllocationHandle handle,
                                              CUmemAllocationHandleType handleType,
                                              unsigned long long flags)
{
    GS_ENTER(cuMemExportToShareableHandle, shareableHandle, handle, handleType, flags);
    handle = gs_xlat(handle); /* memory re-created by a resume has a new handle */
    CUresult r = real(shareableHandle, handle, handleType, flags);
    if (r == CUDA_SUCCESS && handleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR &&
        shareableHandle) {
        gs_want_server();
        int dup = fcntl(*(int *)shareableHandle, F_DUPFD_CLOEXEC, 3);
        gs_lock();
        uint64_t id;
        int kind = gs_classify_handle(handle, &id);
        struct gs_mcast *mc = kind == GS_OBJ_MCAST ? gs_find_mcast_id(id) : NULL;
        if (kind != GS_OBJ_ALLOC && !(mc && !mc->creator_pid)) {
            gs.n_untracked_exports++;
            snprintf(gs.last_untracked, sizeof(gs.last_untracked),
                     "cuMemExportToShareableHandle of %s handle 0x%llx",
                     kind == GS_OBJ_IMPORT  ? "imported"
                     : kind == GS_OBJ_MCAST ? "joined multicast"
                                            : "an unknown",
                     (unsigned long long)handle);
        }
        if (dup >= 0)
            *GS_PUSH(gs.exports) =
                (struct gs_export){.fd = dup, .obj_id = id, .kind = kind, .h = handle};
        gs_unlock();
    }
    return gs_leave(r);
}

CUresult CUDAAPI cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                void *osHandle,
                                                CUmemAllocationHandleType shHandleType)
{
    GS_ENTER(cuMemImportFromShareableHandle, handle, osHandle, shHandleType);
    CUresult r = real(handle, osHandle, shHandleType);
    if (r != CUDA_SUCCESS || !handle)
        return gs_leave(r);
    gs_want_server();
    pid_t pid = 0;
    struct gs_origin o = {0, 0, 0};
    int keep = -1;
    if (shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        int fd = (int)(intptr_t)osHandle;
        if (find_exporter(fd, &pid, &o))
            keep = fcntl(fd, F_DUPFD_CLOEXEC, 3); /* ask again at quiesce */
    }
    gs_lock();
    gs_xlat_forget(*handle, 1); /* a value the driver reuses means the new object now */
    if (o.is_mc) {
        /* A multicast object joined from its creator: devices and binds are tracked on it. */
        struct gs_mcast *mc = GS_PUSH(gs.mcasts);
        memset(mc, 0, sizeof(*mc));
        mc->id = gs_new_id();
        mc->h = *handle;
        mc->creator_pid = pid;
        mc->creator_id = o.id;
        mc->prop.size = o.size;
        gs_unlock();
        return gs_leave(r);
    }
    struct gs_import *im = gs_new_import(GS_IMPORT_FD);
    im->h = *handle;
    im->exporter_pid = pid;
    im->exporter_id = o.id;
    im->size = o.size; /* 0 until the exporter is known, or the first mapping tells */
    im->unresolved_fd = keep;
    im->import_fd = shHandleType == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                        ? fcntl((int)(intptr_t)osHandle, F_DUPFD_CLOEXEC, 3)
                        : -1;
    gs_unlock();
    return gs_leave(r);
}

/* ---- legacy CUDA IPC ---------------------------------------------------------------------------- */

/* Makes the context that owns the memory at va current on this thread: the driver answers
 * cuMemGetAddressRange (and cuIpcGetMemHandle) only on a thread with a current context, and the
 * control thread that serves ipcget has none. Pointer attributes need none. Returns 1 if pushed. */
static int push_owner_ctx(CUdeviceptr va)
{
    CUcontext ctx = NULL;
    if (CU(CUresult(*)(void *, CUpointer_attribute, CUdeviceptr), cuPointerGetAttribute, &ctx,
           CU_POINTER_ATTRIBUTE_CONTEXT, va) != CUDA_SUCCESS || !ctx)
        return 0;
    return CU(CUresult(*)(CUcontext), cuCtxPushCurrent_v2, ctx) == CUDA_SUCCESS;
}

static void pop_owner_ctx(int pushed)
{
    CUcontext old;
    if (pushed)
        CU(CUresult(*)(CUcontext *), cuCtxPopCurrent_v2, &old);
}

/* The allocation holding va, which the driver's legacy IPC shares whole. Both callers ask with the
 * owner's context pushed, so the program's thread and the control thread get the same answer. */
static CUresult alloc_range(CUdeviceptr va, CUdeviceptr *base, size_t *size)
{
    return CU(CUresult(*)(CUdeviceptr *, size_t *, CUdeviceptr), cuMemGetAddressRange_v2, base,
              size, va);
}

/* Driver memory that legacy IPC can share: its base and size. */
static int legacy_ipc_capable(CUdeviceptr dptr, CUdeviceptr *base, size_t *size)
{
    unsigned char capable = 0;
    if (CU(CUresult(*)(void *, CUpointer_attribute, CUdeviceptr), cuPointerGetAttribute, &capable,
           CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, dptr) != CUDA_SUCCESS || !capable)
        return 0;
    int pushed = push_owner_ctx(dptr);
    CUresult r = alloc_range(dptr, base, size);
    pop_owner_ctx(pushed);
    return r == CUDA_SUCCESS;
}

CUresult CUDAAPI cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    GS_ENTER_UNLESS(!pHandle, cuIpcGetMemHandle, pHandle, dptr);
    struct gs_ipc_handle w;
    memset(&w, 0, sizeof(w));
    gs_lock();
    struct gs_map *m = gs_find_map_at(dptr);
    struct gs_alloc *a = m && m->kind == GS_OBJ_ALLOC ? gs_find_alloc_id(m->obj_id) : NULL;
    if (a && a->origin == GS_ORIGIN_MALLOC) {
        memcpy(w.magic, GS_IPC_MAGIC, sizeof(w.magic));
        w.version = 1;
        w.pid = (int32_t)getpid();
        w.alloc_id = a->id;
        w.size = a->size;
        w.offset = dptr - a->va;
        w.dev = a->dev;
        a->ipc_handles++;
    }
    gs_unlock();
    CUresult r = CUDA_SUCCESS;
    CUdeviceptr base;
    size_t size;
    memset(pHandle, 0, sizeof(*pHandle));
    if (w.alloc_id) {
        memcpy(pHandle->reserved, &w, sizeof(w));
    } else if (legacy_ipc_capable(dptr, &base, &size)) {
        struct gs_ipc_lazy l = {.version = 1, .pid = (int32_t)getpid(), .base = base,
                                .size = size, .offset = dptr - base};
        memcpy(l.magic, GS_IPC_LAZY_MAGIC, sizeof(l.magic));
        memcpy(pHandle->reserved, &l, sizeof(l));
        gs_lock();
        if (!gs_find_lazy_ipc(base)) {
            struct gs_lazy_ipc *rec = GS_PUSH(gs.lazy_ipc);
            memset(rec, 0, sizeof(*rec));
            rec->base = base;
            rec->size = size;
        }
        gs_unlock();
    } else {
        r = real(pHandle, dptr);
        if (r == CUDA_SUCCESS) {
            gs_lock();
            gs.n_foreign_ipc_exports++;
            gs_unlock();
        }
    }
    if (r == CUDA_SUCCESS)
        gs_want_server(); /* peers will ask for the memory */
    return gs_leave(r);
}

/* ipcget (a peer opens a lazy handle): the driver's own handle of the memory at va, taken now. */
int gs_ipc_get(uint64_t va, unsigned char out[64], char *err, size_t errlen)
{
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        snprintf(err, errlen, "busy (state lock)");
        return -2;
    }
    struct gs_lazy_ipc *rec = gs_find_lazy_ipc((CUdeviceptr)va);
    CUdeviceptr want_base = rec ? rec->base : 0;
    size_t want_size = rec ? rec->size : 0;
    gs_unlock();
    CUdeviceptr base = 0;
    size_t size = 0;
    if (!want_base) {
        snprintf(err, errlen, "gone: no CUDA IPC handle of memory at 0x%llx was given out here",
                 (unsigned long long)va);
        return -1;
    }
    int pushed = push_owner_ctx((CUdeviceptr)va);
    /* Still the allocation the handle was given for (not freed and allocated again there)? Each
     * answer is named, so a driver that reports the range otherwise shows which one differs. */
    CUresult r = alloc_range((CUdeviceptr)va, &base, &size);
    if (r != CUDA_SUCCESS || base != want_base || size != want_size) {
        pop_owner_ctx(pushed);
        if (r != CUDA_SUCCESS)
            snprintf(err, errlen,
                     "gone: the memory at 0x%llx is not there (cuMemGetAddressRange: %s)",
                     (unsigned long long)va, gs_cu_name(r));
        else
            snprintf(err, errlen,
                     "gone: the allocation at 0x%llx is not the one the handle was given for "
                     "(given for 0x%llx, %zu bytes; cuMemGetAddressRange now: 0x%llx, %zu bytes)",
                     (unsigned long long)va, (unsigned long long)want_base, want_size,
                     (unsigned long long)base, size);
        return -1;
    }
    CUipcMemHandle h;
    r = REAL(cuIpcGetMemHandle)(&h, (CUdeviceptr)va);
    pop_owner_ctx(pushed);
    if (r != CUDA_SUCCESS) {
        snprintf(err, errlen, "cuIpcGetMemHandle of 0x%llx: %s", (unsigned long long)va,
                 gs_cu_name(r));
        return -1;
    }
    memcpy(out, h.reserved, 64);
    gs_lock();
    rec = gs_find_lazy_ipc((CUdeviceptr)va);
    if (rec)
        rec->opened++;
    gs.n_foreign_ipc_exports++; /* a driver handle is out now: its importer cannot be restored */
    gs_unlock();
    return 0;
}

static CUresult open_shim_handle(const struct gs_ipc_handle *w, unsigned flags, CUdeviceptr *out)
{
    if (w->pid == (int32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: a process cannot open its own handle */
    char req[128], reply[512];
    snprintf(req, sizeof(req), "{\"v\":%d,\"cmd\":\"export\",\"id\":%llu}", CRIU_GPUSHARE_PROTOCOL,
             (unsigned long long)w->alloc_id);
    int fd = -1;
    if (gs_peer_request(w->pid, req, -1, reply, sizeof(reply), &fd, 10000) || fd < 0) {
        gs_log("cuIpcOpenMemHandle: pid %d did not export allocation %llu: %s", (int)w->pid,
               (unsigned long long)w->alloc_id, reply[0] ? reply : "no reply");
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    CUmemGenericAllocationHandle h;
    CUresult r = REAL(cuMemImportFromShareableHandle)(&h, (void *)(intptr_t)fd,
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        close(fd);
        return r;
    }
    int kept_fd = fd; /* becomes the import's import_fd, or is closed on failure below */
    CUdeviceptr va = 0;
    r = CU(CUresult(*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long),
           cuMemAddressReserve, &va, w->size, 0, 0, 0);
    if (r != CUDA_SUCCESS)
        goto release;
    r = REAL(cuMemMap)(va, w->size, 0, h, 0);
    if (r != CUDA_SUCCESS)
        goto free_va;
    CUmemAccessDesc desc[2];
    int n = 0;
    CUdevice cur = 0;
    if (CU(CUresult(*)(CUdevice *), cuCtxGetDevice, &cur) != CUDA_SUCCESS)
        cur = w->dev;
    desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[n].location.id = cur;
    desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) && w->dev != cur) {
        desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[n].location.id = w->dev;
        desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    r = REAL(cuMemSetAccess)(va, w->size, desc, (size_t)n);
    if (r != CUDA_SUCCESS)
        goto unmap;
    REAL(cuMemRelease)(h); /* the mapping holds the memory */
    gs_lock();
    struct gs_import *im = gs_new_import(GS_IMPORT_IPC);
    im->size = w->size;
    im->va = va;
    im->exporter_pid = w->pid;
    im->exporter_id = w->alloc_id;
    im->import_fd = kept_fd;
    kept_fd = -1;
    im->app_released = 1;
    struct gs_map *m = GS_PUSH(gs.maps);
    memset(m, 0, sizeof(*m));
    m->va = va;
    m->size = w->size;
    m->kind = GS_OBJ_IMPORT;
    m->obj_id = im->id;
    for (int i = 0; i < n && i < GS_MAX_ACCESS; i++)
        m->access[m->n_access++] = desc[i];
    gs_unlock();
    *out = va + w->offset;
    return CUDA_SUCCESS;
unmap:
    REAL(cuMemUnmap)(va, w->size);
free_va:
    CU(CUresult(*)(CUdeviceptr, size_t), cuMemAddressFree, va, w->size);
release:
    REAL(cuMemRelease)(h);
    close(kept_fd);
    return r;
}

/* Opens a lazy handle: the exporter's shim takes the driver's handle now (ipcget). */
static int fetch_lazy_handle(const struct gs_ipc_lazy *l, CUipcMemHandle *h)
{
    char req[128], reply[512], err[128];
    snprintf(req, sizeof(req), "{\"v\":%d,\"cmd\":\"ipcget\",\"va\":%llu}",
             CRIU_GPUSHARE_PROTOCOL, (unsigned long long)(l->base + l->offset));
    struct gs_json j;
    const struct gs_json_field *ok, *hex;
    if (gs_peer_request(l->pid, req, -1, reply, sizeof(reply), NULL, 10000) ||
        gs_json_parse(reply, strlen(reply), &j, err, sizeof(err)) ||
        !(ok = gs_json_get(&j, "ok", 'b')) || !ok->num || !(hex = gs_json_get(&j, "handle", 's')) ||
        gs_hex_decode(hex->str, (unsigned char *)h->reserved, sizeof(h->reserved))) {
        gs_log("cuIpcOpenMemHandle: pid %d did not give a handle of 0x%llx: %s", (int)l->pid,
               (unsigned long long)(l->base + l->offset), reply[0] ? reply : "no reply");
        return -1;
    }
    return 0;
}

CUresult CUDAAPI cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                       unsigned int Flags)
{
    GS_ENTER_UNLESS(!pdptr, cuIpcOpenMemHandle_v2, pdptr, handle, Flags);
    gs_want_server();
    struct gs_ipc_handle w;
    struct gs_ipc_lazy l;
    memcpy(&w, handle.reserved, sizeof(w));
    memcpy(&l, handle.reserved, sizeof(l));
    CUresult r;
    if (!memcmp(w.magic, GS_IPC_MAGIC, sizeof(w.magic)) && w.version == 1) {
        r = open_shim_handle(&w, Flags, pdptr);
        return gs_leave(r);
    }
    int lazy = !memcmp(l.magic, GS_IPC_LAZY_MAGIC, sizeof(l.magic)) && l.version == 1;
    if (lazy) {
        if (l.pid == (int32_t)getpid()) {
            gs_depth--;
            return CUDA_ERROR_INVALID_CONTEXT; /* as the driver: no opening of one's own handle */
        }
        if (fetch_lazy_handle(&l, &handle)) {
            gs_depth--;
            return CUDA_ERROR_INVALID_HANDLE;
        }
    }
    r = real(pdptr, handle, Flags);
    if (r != CUDA_SUCCESS && lazy)
        gs_log("cuIpcOpenMemHandle: the driver refuses pid %d's handle of 0x%llx (%llu bytes, "
               "below the backing threshold: the driver's own memory): %s", (int)l.pid,
               (unsigned long long)(l.base + l.offset), (unsigned long long)l.size,
               gs_cu_name(r));
    if (r == CUDA_SUCCESS) {
        /* Memory of a process without the shim, or driver memory of one with it: recorded so a
         * checkpoint refuses it instead of failing in the driver's restore. */
        gs_lock();
        struct gs_import *im = gs_new_import(GS_IMPORT_IPC);
        im->va = *pdptr;
        im->app_released = 1;
        gs_unlock();
    }
    return gs_leave(r);
}

CUresult CUDAAPI cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    GS_ENTER(cuIpcCloseMemHandle, dptr);
    gs_lock();
    struct gs_import *im = NULL;
    for (size_t i = 0; i < gs.imports.n && !im; i++) {
        struct gs_import *c = &gs.imports.v[i];
        if (c->kind == GS_IMPORT_IPC && dptr >= c->va && (c->size ? dptr - c->va < c->size : dptr == c->va))
            im = c;
    }
    int ours = im && im->exporter_pid;
    CUdeviceptr va = im ? im->va : 0;
    size_t size = im ? im->size : 0;
    if (im) {
        GS_DROP_IF(gs.maps, e->kind == GS_OBJ_IMPORT && e->obj_id == im->id, );
        GS_DEL(gs.imports, (size_t)(im - gs.imports.v));
    }
    gs_unlock();
    CUresult r;
    if (ours) {
        /* Like the driver's close: work still using the memory finishes first. */
        CU(CUresult(*)(void), cuCtxSynchronize);
        r = REAL(cuMemUnmap)(va, size);
        CU(CUresult(*)(CUdeviceptr, size_t), cuMemAddressFree, va, size);
    } else {
        r = real(dptr);
    }
    return gs_leave(r);
}
