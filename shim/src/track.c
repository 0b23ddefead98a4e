/* track.c: the shim's record of what the driver would lose, and the `status` view of it.
 *
 * One lock guards it all. Arrays are unordered (deletion moves the last element into the hole),
 * so nothing keeps an index across an unlock; objects are named by id.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shim_internal.h"

struct gs_state gs = {.next_id = 1};
static pthread_mutex_t state_mu = PTHREAD_MUTEX_INITIALIZER;

void gs_lock(void) { pthread_mutex_lock(&state_mu); }
void gs_unlock(void) { pthread_mutex_unlock(&state_mu); }

int gs_lock_timed(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_mutex_timedlock(&state_mu, &ts) == 0 ? 0 : -1;
}

void gs_grow(void **v, size_t *cap, size_t elem)
{
    size_t ncap = *cap ? *cap * 2 : 16;
    void *p = realloc(*v, ncap * elem);
    if (!p) {
        /* Losing track of an object would make a later restore silently wrong. */
        static const char msg[] = "criu-gpushare: out of memory while tracking GPU state\n";
        ssize_t unused = write(2, msg, sizeof(msg) - 1);
        (void)unused;
        abort();
    }
    *v = p;
    *cap = ncap;
}

uint64_t gs_new_id(void) { return gs.next_id++; }

struct gs_import *gs_new_import(int kind)
{
    struct gs_import *im = GS_PUSH(gs.imports);
    memset(im, 0, sizeof(*im));
    im->id = gs_new_id();
    im->kind = kind;
    im->unresolved_fd = -1;
    im->import_fd = -1;
    return im;
}

struct gs_alloc *gs_find_alloc_h(CUmemGenericAllocationHandle h)
{
    for (size_t i = 0; i < gs.allocs.n; i++)
        if (gs.allocs.v[i].h == h && !gs.allocs.v[i].app_released)
            return &gs.allocs.v[i];
    return NULL;
}

struct gs_alloc *gs_find_alloc_id(uint64_t id)
{
    for (size_t i = 0; i < gs.allocs.n; i++)
        if (gs.allocs.v[i].id == id)
            return &gs.allocs.v[i];
    return NULL;
}

struct gs_alloc *gs_find_malloc_va(CUdeviceptr va)
{
    for (size_t i = 0; i < gs.allocs.n; i++)
        if (gs.allocs.v[i].origin == GS_ORIGIN_MALLOC && gs.allocs.v[i].va == va)
            return &gs.allocs.v[i];
    return NULL;
}

struct gs_import *gs_find_import_h(CUmemGenericAllocationHandle h)
{
    for (size_t i = 0; i < gs.imports.n; i++)
        if (gs.imports.v[i].kind == GS_IMPORT_FD && gs.imports.v[i].h == h &&
            !gs.imports.v[i].app_released)
            return &gs.imports.v[i];
    return NULL;
}

struct gs_import *gs_find_import_va(CUdeviceptr va)
{
    for (size_t i = 0; i < gs.imports.n; i++)
        if (gs.imports.v[i].kind == GS_IMPORT_IPC && gs.imports.v[i].va == va)
            return &gs.imports.v[i];
    return NULL;
}

struct gs_mcast *gs_find_mcast_h(CUmemGenericAllocationHandle h)
{
    for (size_t i = 0; i < gs.mcasts.n; i++)
        if (gs.mcasts.v[i].h == h && !gs.mcasts.v[i].app_released)
            return &gs.mcasts.v[i];
    return NULL;
}

struct gs_mcast *gs_find_mcast_id(uint64_t id)
{
    for (size_t i = 0; i < gs.mcasts.n; i++)
        if (gs.mcasts.v[i].id == id)
            return &gs.mcasts.v[i];
    return NULL;
}

struct gs_map *gs_find_map_at(CUdeviceptr va)
{
    for (size_t i = 0; i < gs.maps.n; i++)
        if (va >= gs.maps.v[i].va && va - gs.maps.v[i].va < gs.maps.v[i].size)
            return &gs.maps.v[i];
    return NULL;
}

int gs_classify_handle(CUmemGenericAllocationHandle h, uint64_t *obj_id)
{
    struct gs_alloc *a = gs_find_alloc_h(h);
    if (a) {
        *obj_id = a->id;
        return GS_OBJ_ALLOC;
    }
    struct gs_import *im = gs_find_import_h(h);
    if (im) {
        *obj_id = im->id;
        return GS_OBJ_IMPORT;
    }
    struct gs_mcast *mc = gs_find_mcast_h(h);
    if (mc) {
        *obj_id = mc->id;
        return GS_OBJ_MCAST;
    }
    for (size_t i = 0; i < gs.aliases.n; i++)
        if (gs.aliases.v[i].h == h) {
            *obj_id = gs.aliases.v[i].obj_id;
            return gs.aliases.v[i].kind;
        }
    *obj_id = 0;
    return GS_OBJ_UNKNOWN;
}

static int mapped(int kind, uint64_t id)
{
    for (size_t i = 0; i < gs.maps.n; i++)
        if (gs.maps.v[i].kind == kind && gs.maps.v[i].obj_id == id)
            return 1;
    return 0;
}

static void forget_exports(int kind, uint64_t id)
{
    for (size_t i = 0; i < gs.exports.n;)
        if (gs.exports.v[i].kind == kind && gs.exports.v[i].obj_id == id) {
            close(gs.exports.v[i].fd);
            GS_DEL(gs.exports, i);
        } else {
            i++;
        }
}

void gs_collect(void)
{
    for (size_t i = 0; i < gs.allocs.n;) {
        struct gs_alloc *a = &gs.allocs.v[i];
        if (a->origin == GS_ORIGIN_CUMEM && a->app_released && !mapped(GS_OBJ_ALLOC, a->id)) {
            forget_exports(GS_OBJ_ALLOC, a->id); /* the id dies with its allocation */
            GS_DEL(gs.allocs, i);
        } else {
            i++;
        }
    }
    for (size_t i = 0; i < gs.imports.n;) {
        struct gs_import *im = &gs.imports.v[i];
        if (im->kind == GS_IMPORT_FD && im->app_released && !mapped(GS_OBJ_IMPORT, im->id)) {
            if (im->unresolved_fd >= 0)
                close(im->unresolved_fd);
            if (im->import_fd >= 0)
                close(im->import_fd);
            GS_DEL(gs.imports, i);
        } else {
            i++;
        }
    }
    for (size_t i = 0; i < gs.mcasts.n;) {
        struct gs_mcast *mc = &gs.mcasts.v[i];
        int bound = 0;
        for (size_t j = 0; j < gs.mcbinds.n; j++)
            bound |= gs.mcbinds.v[j].mc_id == mc->id;
        if (mc->app_released && !mapped(GS_OBJ_MCAST, mc->id) && !bound) {
            forget_exports(GS_OBJ_MCAST, mc->id);
            GS_DEL(gs.mcasts, i);
        } else {
            i++;
        }
    }
}

void gs_state_reset_after_fork(void)
{
    /* Only the forking thread exists now; whoever held the lock in the parent is gone. */
    pthread_mutex_init(&state_mu, NULL);
    for (size_t i = 0; i < gs.exports.n; i++)
        close(gs.exports.v[i].fd);
    for (size_t i = 0; i < gs.imports.n; i++) {
        if (gs.imports.v[i].unresolved_fd >= 0)
            close(gs.imports.v[i].unresolved_fd);
        if (gs.imports.v[i].import_fd >= 0)
            close(gs.imports.v[i].import_fd);
    }
    /* CUDA objects do not survive fork: the child starts with nothing tracked. Host buffers the
     * shim mmapped stay mapped (fork copies them) but are no longer page-locked. */
    free(gs.allocs.v);
    free(gs.maps.v);
    free(gs.exports.v);
    free(gs.imports.v);
    free(gs.hosts.v);
    free(gs.mcasts.v);
    free(gs.mcbinds.v);
    free(gs.aliases.v);
    uint64_t next = gs.next_id;
    memset(&gs, 0, sizeof(gs));
    gs.next_id = next;
}

/* ---- calls the shim cannot restore ------------------------------------------------------------- */

/* Only what this process itself could not get back counts: sharing it exports but cannot identify
 * (driver IPC handles, exports of imported handles) is refused in the importer, which sees it as
 * an import without a known exporter; here it is a note. */
static int untracked_list(char msgs[4][GS_UNTRACKED_LEN])
{
    int n = 0, foreign = 0, unresolved = 0;
    for (size_t i = 0; i < gs.imports.n; i++) {
        foreign += gs.imports.v[i].kind == GS_IMPORT_IPC && !gs.imports.v[i].exporter_pid;
        unresolved += gs.imports.v[i].kind == GS_IMPORT_FD && !gs.imports.v[i].exporter_pid;
    }
    if (foreign)
        snprintf(msgs[n++], GS_UNTRACKED_LEN,
                 "%d CUDA IPC import(s) of memory not allocated through the shim (its exporter "
                 "runs without the shim, or the allocation is below the cuMem backing "
                 "threshold): the driver cannot restore them",
                 foreign);
    if (unresolved)
        snprintf(msgs[n++], GS_UNTRACKED_LEN,
                 "%d import(s) of a shareable handle that no process with the shim exported",
                 unresolved);
    return n;
}

int gs_untracked(char *out, size_t outlen)
{
    char msgs[4][GS_UNTRACKED_LEN];
    int n = untracked_list(msgs);
    size_t off = 0;
    out[0] = 0;
    for (int i = 0; i < n && off < outlen; i++)
        off += (size_t)snprintf(out + off, outlen - off, "%s%s", i ? "; " : "", msgs[i]);
    return n;
}

/* ---- status ----------------------------------------------------------------------------------- */

static const char *kind_name(int kind)
{
    switch (kind) {
    case GS_OBJ_ALLOC: return "allocation";
    case GS_OBJ_IMPORT: return "import";
    case GS_OBJ_MCAST: return "multicast";
    default: return "unknown";
    }
}

static void access_json(struct gs_buf *b, const struct gs_map *m)
{
    gs_buf_printf(b, "[");
    for (int i = 0; i < m->n_access; i++) {
        const CUmemAccessDesc *d = &m->access[i];
        const char *prot = d->flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE ? "rw"
                           : d->flags == CU_MEM_ACCESS_FLAGS_PROT_READ  ? "r"
                                                                        : "none";
        gs_buf_printf(b, "%s{\"location_type\":%d,\"location\":%d,\"prot\":\"%s\"}", i ? "," : "",
                      (int)d->location.type, d->location.id, prot);
    }
    gs_buf_printf(b, "]");
}

void gs_status_json(struct gs_buf *b)
{
    gs_buf_printf(b, "\"allocations\":[");
    for (size_t i = 0; i < gs.allocs.n; i++) {
        const struct gs_alloc *a = &gs.allocs.v[i];
        int n_exp = 0;
        for (size_t j = 0; j < gs.exports.n; j++)
            n_exp += gs.exports.v[j].kind == GS_OBJ_ALLOC && gs.exports.v[j].obj_id == a->id;
        gs_buf_printf(b,
                      "%s{\"id\":%llu,\"origin\":\"%s\",\"device\":%d,\"size\":%zu,"
                      "\"va\":%llu,\"handle_types\":%llu,\"exports\":%d,\"ipc_handles\":%d,"
                      "\"app_released\":%s,\"dropped\":%s}",
                      i ? "," : "", (unsigned long long)a->id,
                      a->origin == GS_ORIGIN_MALLOC ? "cuMemAlloc" : "cuMemCreate", a->dev, a->size,
                      (unsigned long long)a->va, a->handle_types, n_exp, a->ipc_handles,
                      a->app_released ? "true" : "false", a->dropped ? "true" : "false");
    }
    gs_buf_printf(b, "],\"mappings\":[");
    for (size_t i = 0; i < gs.maps.n; i++) {
        const struct gs_map *m = &gs.maps.v[i];
        gs_buf_printf(b,
                      "%s{\"va\":%llu,\"size\":%zu,\"offset\":%zu,\"object\":\"%s\",\"id\":%llu,"
                      "\"access\":",
                      i ? "," : "", (unsigned long long)m->va, m->size, m->offset, kind_name(m->kind),
                      (unsigned long long)m->obj_id);
        access_json(b, m);
        gs_buf_printf(b, ",\"access_overflow\":%s,\"dropped\":%s}",
                      m->access_overflow ? "true" : "false", m->dropped ? "true" : "false");
    }
    gs_buf_printf(b, "],\"exports\":[");
    for (size_t i = 0; i < gs.exports.n; i++) {
        const struct gs_export *e = &gs.exports.v[i];
        gs_buf_printf(b, "%s{\"object\":\"%s\",\"id\":%llu,\"voided\":%s}", i ? "," : "",
                      kind_name(e->kind), (unsigned long long)e->obj_id,
                      e->voided ? "true" : "false");
    }
    gs_buf_printf(b, "],\"imports\":[");
    for (size_t i = 0; i < gs.imports.n; i++) {
        const struct gs_import *im = &gs.imports.v[i];
        gs_buf_printf(b, "%s{\"id\":%llu,\"kind\":\"%s\",\"size\":%zu,\"va\":%llu,\"exporter\":",
                      i ? "," : "", (unsigned long long)im->id,
                      im->kind == GS_IMPORT_IPC ? "cuda-ipc" : "posix-fd", im->size,
                      (unsigned long long)im->va);
        if (im->exporter_pid)
            gs_buf_printf(b, "{\"pid\":%d,\"id\":%llu}", (int)im->exporter_pid,
                          (unsigned long long)im->exporter_id);
        else
            gs_buf_printf(b, "null");
        gs_buf_printf(b, ",\"app_released\":%s,\"dropped\":%s}", im->app_released ? "true" : "false",
                      im->dropped ? "true" : "false");
    }
    gs_buf_printf(b, "],\"host_buffers\":[");
    for (size_t i = 0; i < gs.hosts.n; i++) {
        const struct gs_host *h = &gs.hosts.v[i];
        gs_buf_printf(b,
                      "%s{\"ptr\":%llu,\"size\":%zu,\"register_flags\":%u,\"owned\":%s,"
                      "\"device_ptr\":%llu,\"dropped\":%s}",
                      i ? "," : "", (unsigned long long)(uintptr_t)h->p, h->size, h->flags,
                      h->owned ? "true" : "false", (unsigned long long)h->dptr,
                      h->dropped ? "true" : "false");
    }
    gs_buf_printf(b, "],\"peer_access\":[");
    int first = 1;
    for (int o = 0; o < GS_MAX_DEV; o++)
        for (int a = 0; a < GS_MAX_DEV; a++)
            if (gs.peer[o][a]) {
                gs_buf_printf(b, "%s{\"owner\":%d,\"accessor\":%d}", first ? "" : ",", o, a);
                first = 0;
            }
    gs_buf_printf(b, "],\"multicast\":[");
    for (size_t i = 0; i < gs.mcasts.n; i++) {
        const struct gs_mcast *mc = &gs.mcasts.v[i];
        gs_buf_printf(b, "%s{\"id\":%llu,\"size\":%zu,\"num_devices\":%u,\"creator\":",
                      i ? "," : "", (unsigned long long)mc->id, mc->prop.size, mc->prop.numDevices);
        if (mc->creator_pid)
            gs_buf_printf(b, "{\"pid\":%d,\"id\":%llu}", (int)mc->creator_pid,
                          (unsigned long long)mc->creator_id);
        else
            gs_buf_printf(b, "null");
        gs_buf_printf(b, ",\"devices\":[");
        for (int d = 0; d < mc->n_devs; d++)
            gs_buf_printf(b, "%s%d", d ? "," : "", mc->devs[d]);
        gs_buf_printf(b, "],\"app_released\":%s}", mc->app_released ? "true" : "false");
    }
    gs_buf_printf(b, "],\"multicast_binds\":[");
    for (size_t i = 0; i < gs.mcbinds.n; i++) {
        const struct gs_mcbind *mb = &gs.mcbinds.v[i];
        gs_buf_printf(b,
                      "%s{\"multicast\":%llu,\"device\":%d,\"mc_offset\":%zu,\"size\":%zu,"
                      "\"allocation\":%llu,\"mem_offset\":%zu,\"mem_ptr\":%llu}",
                      i ? "," : "", (unsigned long long)mb->mc_id, mb->dev, mb->mc_offset, mb->size,
                      (unsigned long long)mb->mem_alloc_id, mb->mem_offset,
                      (unsigned long long)mb->mem_ptr);
    }
    /* What a checkpoint would have to refuse, in words the user can act on. */
    char msgs[4][GS_UNTRACKED_LEN];
    int n = untracked_list(msgs);
    gs_buf_printf(b, "],\"untracked\":[");
    for (int i = 0; i < n; i++) {
        gs_buf_printf(b, "%s", i ? "," : "");
        gs_buf_str(b, msgs[i]);
    }
    gs_buf_printf(b, "],\"notes\":[");
    int k = 0;
    if (gs.n_foreign_ipc_exports) {
        char msg[160];
        snprintf(msg, sizeof(msg), "%d CUDA IPC handle(s) of memory not allocated through the "
                 "shim were given out: their importers cannot be checkpointed",
                 gs.n_foreign_ipc_exports);
        gs_buf_str(b, msg);
        k++;
    }
    if (gs.n_untracked_exports) {
        char msg[400];
        snprintf(msg, sizeof(msg), "%d export(s) of handles that are not this process's "
                 "allocations (last: %s): their importers cannot be checkpointed",
                 gs.n_untracked_exports, gs.last_untracked);
        gs_buf_printf(b, "%s", k ? "," : "");
        gs_buf_str(b, msg);
    }
    gs_buf_printf(b, "]");
}
