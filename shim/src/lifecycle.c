/* lifecycle.c: the shim's side of suspend/resume (protocol.md, "Suspend and resume").
 *
 * The tool drives these commands over the control socket while the process is quiesced:
 *   release        drop imports, then owned memory (VA reservations kept), then host registrations,
 *                  then every context's stack reservation (contexts.c);
 *                  with keep, an fd of each allocation is kept first: its memory outlives the release
 *                  (the tool copies it out while the driver checkpoints) until drop-kept or recreate
 *   drop-kept      close the kept fds (the memory goes once the tool's imports of it go too)
 *   void-exports   point every copy of an exported fd at /dev/null, close the kept dups
 *   recreate       new memory for every dropped allocation, mapped at the same VAs
 *   adopt {id}     an import whose exporter freed the memory becomes memory of this process
 *   attach {id}+fd an import maps its exporter's (re-created) memory again at the same VAs
 *   export-import  an fd of the memory behind an import (to save memory nobody else holds)
 *   resume         (commands.c) first re-registers host memory and sets the stack limits again
 *                  here, then opens the gates
 * Every object carries a `dropped` flag set only once its own step succeeded, so a failure half-way
 * is undone exactly, and every command skips what is already done (a retried resume re-sends all).
 *
 * Handles: re-created memory gets new driver handles, but the application keeps the old values.
 * The translation table (track.c, gs.xlat) maps each value the application holds to the object's
 * current handle; wrappers that take a handle translate it once on entry (gs_xlat). Since the
 * driver may reuse a released value, recreate never keeps a new handle equal to a value the
 * application holds for another object.
 *
 * The control threads have no CUDA context: each driver call runs with a primary context pushed.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backing.h"
#include "contexts.h"
#include "devices.h"
#include "ipc.h"
#include "lifecycle.h"
#include "resolve.h"
#include "track.h"

#define LC_COLLISION_TRIES 8

/* ---- mapping helpers --------------------------------------------------------------------------- */

/* Maps h at every dropped mapping of (kind, id) and applies each mapping's merged access. On
 * failure the mappings made here are unmapped again (still dropped) and the error is in err. */
static CUresult map_dropped(int kind, uint64_t id, CUmemGenericAllocationHandle h, char *err,
                            size_t errlen)
{
    CUresult r = CUDA_SUCCESS;
    size_t i;
    for (i = 0; i < gs.maps.n; i++) {
        struct gs_map *m = &gs.maps.v[i];
        if (m->kind != kind || m->obj_id != id || !m->dropped)
            continue;
        r = REAL(cuMemMap)(m->va, m->size, m->offset, h, 0);
        if (r != CUDA_SUCCESS) {
            snprintf(err, errlen, "cuMemMap at 0x%llx (+%zu, offset %zu): %s",
                     (unsigned long long)m->va, m->size, m->offset, gs_cu_name(r));
            break;
        }
        if (m->n_access) {
            r = REAL(cuMemSetAccess)(m->va, m->size, m->access, (size_t)m->n_access);
            if (r != CUDA_SUCCESS) {
                REAL(cuMemUnmap)(m->va, m->size);
                snprintf(err, errlen, "cuMemSetAccess at 0x%llx: %s", (unsigned long long)m->va,
                         gs_cu_name(r));
                break;
            }
        }
        m->h = h;
        m->dropped = -1; /* mapped in this call: committed below, undone on failure */
    }
    for (size_t j = 0; j < gs.maps.n; j++) {
        struct gs_map *m = &gs.maps.v[j];
        if (m->kind != kind || m->obj_id != id || m->dropped != -1)
            continue;
        if (r != CUDA_SUCCESS) {
            REAL(cuMemUnmap)(m->va, m->size);
            m->dropped = 1;
        } else {
            m->dropped = 0;
            m->remapped = 0;
        }
    }
    return r;
}

static int first_map_va(int kind, uint64_t id, CUdeviceptr *va)
{
    for (size_t i = 0; i < gs.maps.n; i++)
        if (gs.maps.v[i].kind == kind && gs.maps.v[i].obj_id == id && !gs.maps.v[i].dropped) {
            *va = gs.maps.v[i].va;
            return 1;
        }
    return 0;
}

/* Creates memory like prop (or, kept_fd >= 0, imports the kept memory again), never keeping a
 * handle the application holds for something else. */
static CUresult create_fresh(size_t size, const CUmemAllocationProp *prop, int kept_fd,
                             CUmemGenericAllocationHandle own, CUmemGenericAllocationHandle *out)
{
    CUmemGenericAllocationHandle aside[LC_COLLISION_TRIES];
    int n_aside = 0;
    CUresult r;
    for (;;) {
        r = kept_fd >= 0 ? REAL(cuMemImportFromShareableHandle)(out, (void *)(intptr_t)kept_fd,
                                                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
                         : REAL(cuMemCreate)(out, size, prop, 0);
        if (r != CUDA_SUCCESS || !gs_held_by_app_elsewhere(*out, own) || n_aside == LC_COLLISION_TRIES)
            break;
        aside[n_aside++] = *out;
    }
    for (int k = 0; k < n_aside; k++)
        REAL(cuMemRelease)(aside[k]);
    if (r == CUDA_SUCCESS && gs_held_by_app_elsewhere(*out, own)) {
        REAL(cuMemRelease)(*out);
        r = CUDA_ERROR_ALREADY_MAPPED;
    }
    return r;
}

/* ---- release ----------------------------------------------------------------------------------- */

/* The allocation's properties, kept for recreate (read before its handle goes). */
static void remember_prop(struct gs_alloc *a)
{
    if (a->have_prop)
        return;
    CUmemGenericAllocationHandle h = a->h;
    int retained = 0;
    CUdeviceptr va;
    if (a->app_released) {
        if (!first_map_va(GS_OBJ_ALLOC, a->id, &va) ||
            REAL(cuMemRetainAllocationHandle)(&h, (void *)(uintptr_t)va) != CUDA_SUCCESS)
            h = 0;
        retained = h != 0;
    }
    if (h && CU(CUresult(*)(CUmemAllocationProp *, CUmemGenericAllocationHandle),
                cuMemGetAllocationPropertiesFromHandle, &a->prop, h) == CUDA_SUCCESS)
        a->have_prop = 1;
    if (retained)
        REAL(cuMemRelease)(h);
    if (!a->have_prop) {
        gs_backing_prop(&a->prop, a->dev);
        a->prop.requestedHandleTypes = (CUmemAllocationHandleType)a->handle_types;
        a->have_prop = 1;
    }
    /* The tool exports re-created memory by fd, whatever the program asked for. */
    a->prop.requestedHandleTypes |= CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Releases the handles the program retained (cuMemRetainAllocationHandle) on objects of `kind`. */
static int release_aliases(int kind, const char *what, char *err, size_t errlen)
{
    for (size_t i = 0; i < gs.aliases.n; i++) {
        struct gs_alias *al = &gs.aliases.v[i];
        if (al->dropped || al->kind != kind)
            continue;
        CUresult r = REAL(cuMemRelease)(al->h);
        if (r != CUDA_SUCCESS) {
            snprintf(err, errlen, "release: cuMemRelease of a retained handle of %s %llu: %s", what,
                     (unsigned long long)al->obj_id, gs_cu_name(r));
            return -1;
        }
        al->dropped = 1;
    }
    return 0;
}

/* Unmaps every mapping of objects of `kind` not dropped yet (each marked as it goes). */
static int unmap_kind(int kind, const char *what, int *n_maps, char *err, size_t errlen)
{
    for (size_t i = 0; i < gs.maps.n; i++) {
        struct gs_map *m = &gs.maps.v[i];
        if (m->kind != kind || m->dropped)
            continue;
        CUresult r = REAL(cuMemUnmap)(m->va, m->size);
        if (r != CUDA_SUCCESS) {
            snprintf(err, errlen, "release: cuMemUnmap of %s %llu at 0x%llx: %s", what,
                     (unsigned long long)m->obj_id, (unsigned long long)m->va, gs_cu_name(r));
            return -1;
        }
        m->dropped = 1;
        (*n_maps)++;
    }
    return 0;
}

/* An fd of every allocation not dropped yet kept, before anything of owned memory is dropped; a
 * failure closes those kept here and drops nothing. */
static int keep_all(int *n_kept, char *err, size_t errlen)
{
    enum { MADE_NOW = -1 }; /* an entry this call made, until every allocation has one */
    int rc = 0;
    gs_kept_lock();
    /* an fd of each allocation that has none (memory a recreate imported has its source fd) */
    for (size_t i = 0; i < gs.allocs.n && !rc; i++) {
        struct gs_alloc *a = &gs.allocs.v[i];
        int fd;
        if (a->dropped || gs_kept_find(a->id) >= 0)
            continue;
        rc = gs_export_alloc(a, &fd, err, errlen);
        if (rc == 0) {
            gs_kept_add(a->id, fd);
            gs_kept_hold(a->id, MADE_NOW);
        }
    }
    for (size_t i = 0; i < gs.allocs.n; i++) {
        const struct gs_alloc *a = &gs.allocs.v[i];
        if (a->dropped || gs_kept_find(a->id) < 0)
            continue;
        if (rc) {
            if (gs_kept_state(a->id) == MADE_NOW)
                gs_kept_close(a->id);
        } else {
            gs_kept_hold(a->id, 1);
            (*n_kept)++;
        }
    }
    gs_kept_unlock();
    if (rc) {
        char why[200];
        snprintf(why, sizeof(why), "%s", err);
        snprintf(err, errlen, "release: keeping %s; nothing of owned memory was released", why);
    }
    return rc;
}

static int release_all(int imports_only, int keep, struct gs_buf *body, char *err, size_t errlen)
{
    int n_imports = 0, n_allocs = 0, n_maps = 0, n_hosts = 0, n_kept = 0;
    CUresult r;
    /* imports: mappings, then handles (the VA reservations stay) */
    if (unmap_kind(GS_OBJ_IMPORT, "import", &n_maps, err, errlen))
        return -1;
    if (release_aliases(GS_OBJ_IMPORT, "import", err, errlen))
        return -1;
    for (size_t i = 0; i < gs.imports.n; i++) {
        struct gs_import *im = &gs.imports.v[i];
        if (im->dropped)
            continue;
        if (im->kind == GS_IMPORT_FD && !im->app_released &&
            (r = REAL(cuMemRelease)(im->h)) != CUDA_SUCCESS) {
            snprintf(err, errlen, "release: cuMemRelease of import %llu: %s",
                     (unsigned long long)im->id, gs_cu_name(r));
            return -1;
        }
        im->dropped = 1;
        if (im->import_fd >= 0) { /* it pins the memory the checkpoint must free */
            close(im->import_fd);
            im->import_fd = -1;
        }
        n_imports++;
    }
    if (imports_only)
        goto done;
    /* owned memory: kept fds, mappings, retained handles, then the handles themselves */
    if (keep && keep_all(&n_kept, err, errlen))
        return -1;
    for (size_t i = 0; i < gs.allocs.n; i++)
        if (!gs.allocs.v[i].dropped)
            remember_prop(&gs.allocs.v[i]);
    if (unmap_kind(GS_OBJ_ALLOC, "allocation", &n_maps, err, errlen))
        return -1;
    if (release_aliases(GS_OBJ_ALLOC, "allocation", err, errlen))
        return -1;
    for (size_t i = 0; i < gs.allocs.n; i++) {
        struct gs_alloc *a = &gs.allocs.v[i];
        if (a->dropped)
            continue;
        if (!a->app_released && (r = REAL(cuMemRelease)(a->h)) != CUDA_SUCCESS) {
            snprintf(err, errlen, "release: cuMemRelease of allocation %llu: %s",
                     (unsigned long long)a->id, gs_cu_name(r));
            return -1;
        }
        a->dropped = 1;
        a->intact = a->fresh = 0;
        if (!keep) /* the source fd of memory a recreate imported would pin it */
            gs_close_kept(a);
        n_allocs++;
    }
    /* page-locked host memory: unregistered, the memory itself stays where it is */
    for (size_t i = 0; i < gs.hosts.n; i++) {
        struct gs_host *h = &gs.hosts.v[i];
        if (h->dropped)
            continue;
        r = REAL(cuMemHostUnregister)(h->p);
        if (r == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
            continue; /* a shim buffer the program unregistered itself: nothing to bring back */
        if (r != CUDA_SUCCESS) {
            snprintf(err, errlen, "release: cuMemHostUnregister of host buffer %p: %s", h->p,
                     gs_cu_name(r));
            return -1;
        }
        h->dropped = 1;
        n_hosts++;
    }
done:
    gs_buf_printf(body, "\"imports\":%d,\"allocations\":%d,\"mappings\":%d,\"host_buffers\":%d,"
                  "\"kept\":%d", n_imports, n_allocs, n_maps, n_hosts, n_kept);
    return 0;
}

int gs_lc_drop_kept(struct gs_buf *body)
{
    gs_buf_printf(body, "\"closed\":%d", gs_kept_close_all(1));
    return 0;
}

int gs_lc_release(int imports_only, int keep, struct gs_buf *body, char *err, size_t errlen)
{
    if (gs.mcasts.n) {
        snprintf(err, errlen, "release: %zu multicast object(s): suspend does not support "
                 "multicast yet; nothing was released", gs.mcasts.n);
        return GS_LC_REFUSED;
    }
    int pushed = gs_push_ctx(0);
    int rc = release_all(imports_only, keep, body, err, errlen);
    gs_pop_ctx(pushed);
    if (rc == 0 && !imports_only) /* nothing runs until resume: the stacks' memory can go too */
        gs_buf_printf(body, ",\"stacks\":%d", gs_contexts_lower_stacks());
    return rc;
}

/* ---- void-exports ------------------------------------------------------------------------------ */

/* Exports whose memory is dropped (or freed): only those may be voided (a live allocation's export
 * may share its open file with the driver's own). */
static int export_voidable(const struct gs_export *e)
{
    if (e->kind != GS_OBJ_ALLOC || e->voided || e->fd < 0)
        return 0;
    struct gs_alloc *a = gs_find_alloc_id(e->obj_id);
    return !a || a->dropped;
}

int gs_lc_void_exports(struct gs_buf *body, char *err, size_t errlen)
{
    int n_voided = 0, n_closed = 0;
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd < 0) {
        snprintf(err, errlen, "void-exports: open /dev/null: %s", strerror(errno));
        return -1;
    }
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        snprintf(err, errlen, "void-exports: /proc/self/fd: %s", strerror(errno));
        close(null_fd);
        return -1;
    }
    int dfd = dirfd(d);
    struct dirent *de;
    gs_kept_lock(); /* the fds release kept share their open file with exports: never voided */
    while ((de = readdir(d))) {
        char *end;
        long fd = strtol(de->d_name, &end, 10);
        if (*end || de->d_name[0] == '.' || fd == dfd || fd == null_fd || gs_kept_is((int)fd))
            continue;
        for (size_t i = 0; i < gs.exports.n; i++) {
            struct gs_export *e = &gs.exports.v[i];
            if ((int)fd == e->fd || !export_voidable(e) || !gs_same_open_file((int)fd, e->fd))
                continue;
            int fl = fcntl((int)fd, F_GETFD);
            if (dup3(null_fd, (int)fd, fl >= 0 && (fl & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
                snprintf(err, errlen, "void-exports: dup3 of /dev/null onto fd %ld: %s", fd,
                         strerror(errno));
                gs_kept_unlock();
                closedir(d);
                close(null_fd);
                return -1;
            }
            n_voided++;
            break;
        }
    }
    gs_kept_unlock();
    closedir(d);
    close(null_fd);
    GS_DROP_IF(gs.exports, export_voidable(e), close(e->fd); n_closed++);
    gs_buf_printf(body, "\"voided\":%d,\"closed\":%d", n_voided, n_closed);
    return 0;
}

/* ---- devices map ------------------------------------------------------------------------------- */

/* Memory recorded on device old comes back on map's new one, and so does everything recorded with
 * that ordinal: the allocation's device and properties, the mappings' access locations. Each
 * released object moves once (flag `remapped`, cleared when it is mapped again), so a retried
 * command, or adopt after recreate in one resume, does not move it twice. */
static void remap_access(struct gs_map *m, const struct gs_devmap *map)
{
    for (int k = 0; k < m->n_access; k++)
        if (m->access[k].location.type == CU_MEM_LOCATION_TYPE_DEVICE)
            m->access[k].location.id = gs_devmap_apply(map, m->access[k].location.id);
    /* Two old devices mapped onto one: one entry, with the wider access. */
    for (int j = 0; j < m->n_access; j++)
        for (int k = j + 1; k < m->n_access;)
            if (m->access[k].location.type == m->access[j].location.type &&
                m->access[k].location.id == m->access[j].location.id) {
                if (m->access[k].flags > m->access[j].flags)
                    m->access[j].flags = m->access[k].flags;
                m->access[k] = m->access[--m->n_access];
            } else {
                k++;
            }
}

static void remap_released(const struct gs_devmap *map)
{
    if (!map)
        return;
    for (size_t i = 0; i < gs.allocs.n; i++) {
        struct gs_alloc *a = &gs.allocs.v[i];
        if (!a->dropped || a->remapped)
            continue;
        a->dev = gs_devmap_apply(map, a->dev);
        if (a->prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
            a->prop.location.id = gs_devmap_apply(map, a->prop.location.id);
        a->remapped = 1;
    }
    for (size_t i = 0; i < gs.maps.n; i++) {
        struct gs_map *m = &gs.maps.v[i];
        if (m->dropped && !m->remapped) {
            remap_access(m, map);
            m->remapped = 1;
        }
    }
}

/* ---- recreate ---------------------------------------------------------------------------------- */

static int recreate_one(struct gs_alloc *a, char *err, size_t errlen)
{
    CUmemAllocationProp prop = a->prop;
    if (!a->have_prop) {
        gs_backing_prop(&prop, a->dev);
        prop.requestedHandleTypes |= (CUmemAllocationHandleType)a->handle_types;
    }
    int pushed = gs_push_ctx(a->dev);
    CUmemGenericAllocationHandle nh;
    /* Kept memory comes back itself, bytes and all (a devices map cannot move it: it stays where
     * it is, and the tool only keeps memory for a suspend it has not finished). The kept lock is
     * held until the fd is closed: drop-kept cannot close it under the import. */
    gs_kept_lock();
    int kept_fd = gs_kept_find(a->id);
    CUresult r = create_fresh(a->size, &prop, kept_fd, a->h, &nh);
    if (r != CUDA_SUCCESS) {
        gs_kept_unlock();
        gs_pop_ctx(pushed);
        snprintf(err, errlen, "recreate: %s of allocation %llu (%zu bytes on device %d): %s",
                 kept_fd >= 0 ? "cuMemImportFromShareableHandle of its kept fd" : "cuMemCreate",
                 (unsigned long long)a->id, a->size, a->dev, gs_cu_name(r));
        return -1;
    }
    char why[200];
    r = map_dropped(GS_OBJ_ALLOC, a->id, nh, why, sizeof(why));
    a->intact = r == CUDA_SUCCESS && kept_fd >= 0;
    a->fresh = r == CUDA_SUCCESS && kept_fd < 0;
    if (a->intact)
        gs_kept_hold(a->id, 0); /* now its source: its exports are dups of it */
    gs_kept_unlock();
    if (r != CUDA_SUCCESS) {
        REAL(cuMemRelease)(nh);
        gs_pop_ctx(pushed);
        snprintf(err, errlen, "recreate: allocation %llu: %s", (unsigned long long)a->id, why);
        return -1;
    }
    /* Retained handles the program holds: retained again from the new memory. */
    CUdeviceptr va;
    for (size_t i = 0; i < gs.aliases.n; i++) {
        struct gs_alias *al = &gs.aliases.v[i];
        CUmemGenericAllocationHandle rh;
        if (al->kind != GS_OBJ_ALLOC || al->obj_id != a->id || !al->dropped)
            continue;
        if (first_map_va(GS_OBJ_ALLOC, a->id, &va) &&
            REAL(cuMemRetainAllocationHandle)(&rh, (void *)(uintptr_t)va) == CUDA_SUCCESS) {
            gs_xlat_move(al->h, rh);
            al->h = rh;
            al->dropped = 0;
        }
    }
    if (a->app_released) {
        REAL(cuMemRelease)(nh); /* the mappings hold the memory, as before */
    } else if (a->origin == GS_ORIGIN_CUMEM) {
        gs_xlat_move(a->h, nh);
    }
    a->h = nh;
    a->dropped = 0;
    a->remapped = 0;
    gs_pop_ctx(pushed);
    return 0;
}

int gs_lc_recreate(const struct gs_devmap *map, struct gs_buf *body, char *err, size_t errlen)
{
    int n = 0;
    remap_released(map);
    for (size_t i = 0; i < gs.allocs.n; i++) {
        struct gs_alloc *a = &gs.allocs.v[i];
        if (!a->dropped)
            continue;
        if (recreate_one(a, err, errlen))
            return -1;
        n++;
    }
    gs_buf_printf(body, "\"recreated\":%d", n);
    return 0;
}

/* ---- imports: adopt, attach, export-import ---------------------------------------------------- */

/* The import now holds handle nh (mapped at every dropped mapping): records and the program's
 * handle follow it. */
static void import_now(struct gs_import *im, CUmemGenericAllocationHandle nh)
{
    if (im->app_released) {
        REAL(cuMemRelease)(nh); /* the mappings hold the memory */
    } else {
        if (im->kind == GS_IMPORT_FD)
            gs_xlat_move(im->h, nh);
        im->h = nh;
    }
    im->dropped = 0;
}

/* Maps import id's dropped mappings onto nh, the memory that replaces it; on failure releases nh,
 * pops the context pushed for it and says why in err, naming the command (`what`). */
static int map_import(const char *what, uint64_t id, CUmemGenericAllocationHandle nh, int pushed,
                      char *err, size_t errlen)
{
    char why[200];
    if (map_dropped(GS_OBJ_IMPORT, id, nh, why, sizeof(why)) == CUDA_SUCCESS)
        return 0;
    REAL(cuMemRelease)(nh);
    gs_pop_ctx(pushed);
    snprintf(err, errlen, "%s: import %llu: %s", what, (unsigned long long)id, why);
    return -1;
}

int gs_lc_adopt(uint64_t id, int dev, const struct gs_devmap *map, struct gs_buf *body,
                char *err, size_t errlen)
{
    struct gs_import *im = gs_find_import_id(id);
    if (!im) {
        snprintf(err, errlen, "adopt: no import %llu", (unsigned long long)id);
        return GS_LC_GONE;
    }
    remap_released(map);
    if (!im->dropped) {
        gs_buf_printf(body, "\"adopted\":false");
        return 0;
    }
    if (dev < 0)
        dev = gs_import_device(id);
    CUmemAllocationProp prop;
    gs_backing_prop(&prop, dev);
    int pushed = gs_push_ctx(dev);
    CUmemGenericAllocationHandle nh;
    CUresult r = create_fresh(im->size, &prop, -1, im->h, &nh);
    if (r != CUDA_SUCCESS) {
        gs_pop_ctx(pushed);
        snprintf(err, errlen, "adopt: cuMemCreate for import %llu (%zu bytes on device %d): %s",
                 (unsigned long long)id, im->size, dev, gs_cu_name(r));
        return -1;
    }
    if (map_import("adopt", id, nh, pushed, err, errlen))
        return -1;
    import_now(im, nh);
    gs_pop_ctx(pushed);
    gs_buf_printf(body, "\"adopted\":true");
    return 0;
}

int gs_lc_attach(uint64_t id, int fd, struct gs_buf *body, char *err, size_t errlen)
{
    struct gs_import *im = gs_find_import_id(id);
    if (!im) {
        snprintf(err, errlen, "attach: no import %llu", (unsigned long long)id);
        return GS_LC_GONE;
    }
    if (!im->dropped) {
        gs_buf_printf(body, "\"attached\":false");
        return 0;
    }
    int pushed = gs_push_ctx(gs_import_device(id));
    CUmemGenericAllocationHandle nh;
    CUresult r = REAL(cuMemImportFromShareableHandle)(&nh, (void *)(intptr_t)fd,
                                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        gs_pop_ctx(pushed);
        snprintf(err, errlen, "attach: cuMemImportFromShareableHandle for import %llu: %s",
                 (unsigned long long)id, gs_cu_name(r));
        return -1;
    }
    if (map_import("attach", id, nh, pushed, err, errlen))
        return -1;
    for (size_t i = 0; i < gs.aliases.n; i++) {
        struct gs_alias *al = &gs.aliases.v[i];
        CUmemGenericAllocationHandle rh;
        CUdeviceptr va;
        if (al->kind == GS_OBJ_IMPORT && al->obj_id == id && al->dropped &&
            first_map_va(GS_OBJ_IMPORT, id, &va) &&
            REAL(cuMemRetainAllocationHandle)(&rh, (void *)(uintptr_t)va) == CUDA_SUCCESS) {
            gs_xlat_move(al->h, rh);
            al->h = rh;
            al->dropped = 0;
        }
    }
    import_now(im, nh);
    if (im->import_fd < 0)
        im->import_fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    gs_pop_ctx(pushed);
    gs_buf_printf(body, "\"attached\":true");
    return 0;
}

int gs_lc_export_import(uint64_t id, int *fd_out, char *err, size_t errlen)
{
    struct gs_import *im = gs_find_import_id(id);
    if (!im) {
        snprintf(err, errlen, "export-import: no import %llu", (unsigned long long)id);
        return GS_LC_GONE;
    }
    if (im->dropped) {
        snprintf(err, errlen, "export-import: import %llu is released (adopt or attach it first)",
                 (unsigned long long)id);
        return -1;
    }
    /* The fd it was imported from, when kept: a driver will not export an imported handle. */
    if (im->import_fd >= 0) {
        *fd_out = fcntl(im->import_fd, F_DUPFD_CLOEXEC, 3);
        if (*fd_out < 0) {
            snprintf(err, errlen, "export-import: import %llu: dup: %s", (unsigned long long)id,
                     strerror(errno));
            return -1;
        }
        return 0;
    }
    /* A handle of the memory mapped here (the program's may be released, or a legacy IPC
     * import has none). */
    CUmemGenericAllocationHandle h = im->h;
    int retained = 0;
    CUresult r = CUDA_SUCCESS;
    CUdeviceptr va;
    if (first_map_va(GS_OBJ_IMPORT, id, &va)) {
        r = REAL(cuMemRetainAllocationHandle)(&h, (void *)(uintptr_t)va);
        retained = r == CUDA_SUCCESS;
    } else if (im->app_released || im->kind != GS_IMPORT_FD) {
        r = CUDA_ERROR_NOT_MAPPED;
    }
    int pushed = gs_push_ctx(gs_import_device(id));
    if (r == CUDA_SUCCESS)
        r = REAL(cuMemExportToShareableHandle)(fd_out, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (retained)
        REAL(cuMemRelease)(h);
    gs_pop_ctx(pushed);
    if (r != CUDA_SUCCESS) {
        snprintf(err, errlen, "export-import: import %llu: %s", (unsigned long long)id, gs_cu_name(r));
        return -1;
    }
    return 0;
}

/* ---- host memory (before the gates open) ------------------------------------------------------- */

int gs_lifecycle_before_resume(char *err, size_t errlen)
{
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        snprintf(err, errlen, "state lock held for 2 s");
        return GS_LC_BUSY;
    }
    int n_dropped = 0;
    for (size_t i = 0; i < gs.allocs.n; i++)
        n_dropped += gs.allocs.v[i].dropped != 0;
    for (size_t i = 0; i < gs.imports.n; i++)
        n_dropped += gs.imports.v[i].dropped != 0;
    if (n_dropped) {
        gs_unlock();
        snprintf(err, errlen, "%d allocation(s) or import(s) are still released: recreate, adopt "
                 "or attach them before resume (the gates stay closed)", n_dropped);
        return GS_LC_REFUSED;
    }
    int rc = 0, pushed = -2;
    for (size_t i = 0; i < gs.hosts.n && !rc; i++) {
        struct gs_host *h = &gs.hosts.v[i];
        if (!h->dropped)
            continue;
        if (pushed == -2)
            pushed = gs_push_ctx(0);
        CUresult r = REAL(cuMemHostRegister_v2)(h->p, h->size, h->flags);
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) {
            snprintf(err, errlen, "resume: cuMemHostRegister of host buffer %p (%zu bytes): %s",
                     h->p, h->size, gs_cu_name(r));
            rc = -1;
            break;
        }
        if (h->flags & CU_MEMHOSTREGISTER_DEVICEMAP) {
            CUdeviceptr dptr = 0;
            r = CU(CUresult(*)(CUdeviceptr *, void *, unsigned), cuMemHostGetDevicePointer_v2,
                   &dptr, h->p, 0);
            if (r != CUDA_SUCCESS || dptr != h->dptr) {
                REAL(cuMemHostUnregister)(h->p);
                snprintf(err, errlen, "resume: host buffer %p came back at device pointer 0x%llx, "
                         "not 0x%llx", h->p, (unsigned long long)dptr, (unsigned long long)h->dptr);
                rc = -1;
                break;
            }
        }
        h->dropped = 0;
    }
    if (pushed != -2)
        gs_pop_ctx(pushed);
    if (rc == 0)
        gs_contexts_restore_stacks();
    gs_unlock();
    return rc;
}
