/* track.c: the shim's record of what the driver would lose (track.h), and the lookups, lifetimes
 * and handle translation over it. One lock guards it all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kcmp.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "track.h"

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
    return GS_FIND(gs.allocs, e->h == h && !e->app_released);
}

struct gs_alloc *gs_find_alloc_id(uint64_t id)
{
    return GS_FIND(gs.allocs, e->id == id);
}

struct gs_alloc *gs_find_backed_va(CUdeviceptr va)
{
    return GS_FIND(gs.allocs, e->origin != GS_ORIGIN_CUMEM && e->va == va);
}

/* cuMemSetAccess changes only the locations it names: PROT_NONE removes one, anything else adds
 * or replaces it. */
int gs_merge_access_list(CUmemAccessDesc *list, int *n, const CUmemAccessDesc *desc, size_t count)
{
    int overflow = 0;
    for (size_t i = 0; i < count; i++) {
        int j;
        for (j = 0; j < *n; j++)
            if (list[j].location.type == desc[i].location.type &&
                list[j].location.id == desc[i].location.id)
                break;
        if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) {
            if (j < *n)
                list[j] = list[--*n];
        } else if (j < *n) {
            list[j].flags = desc[i].flags;
        } else if (*n < GS_MAX_ACCESS) {
            list[(*n)++] = desc[i];
        } else {
            overflow = 1;
        }
    }
    return overflow;
}

void gs_merge_access(struct gs_map *m, const CUmemAccessDesc *desc, size_t count)
{
    if (gs_merge_access_list(m->access, &m->n_access, desc, count))
        m->access_overflow = 1;
}

struct gs_import *gs_find_import_h(CUmemGenericAllocationHandle h)
{
    return GS_FIND(gs.imports, e->kind == GS_IMPORT_FD && e->h == h && !e->app_released);
}

struct gs_import *gs_find_import_id(uint64_t id)
{
    return GS_FIND(gs.imports, e->id == id);
}

struct gs_mcast *gs_find_mcast_h(CUmemGenericAllocationHandle h)
{
    return GS_FIND(gs.mcasts, e->h == h && !e->app_released);
}

struct gs_mcast *gs_find_mcast_id(uint64_t id)
{
    return GS_FIND(gs.mcasts, e->id == id);
}

struct gs_map *gs_find_map_at(CUdeviceptr va)
{
    return GS_FIND(gs.maps, va >= e->va && va - e->va < e->size);
}

struct gs_lazy_ipc *gs_find_lazy_ipc(CUdeviceptr va)
{
    return GS_FIND(gs.lazy_ipc, va >= e->base && va - e->base < e->size);
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
    struct gs_alias *al = GS_FIND(gs.aliases, e->h == h);
    if (al) {
        *obj_id = al->obj_id;
        return al->kind;
    }
    *obj_id = 0;
    return GS_OBJ_UNKNOWN;
}

static int mapped(int kind, uint64_t id)
{
    return GS_FIND(gs.maps, e->kind == kind && e->obj_id == id) != NULL;
}

static int bound(uint64_t mc_id)
{
    return GS_FIND(gs.mcbinds, e->mc_id == mc_id) != NULL;
}

static void close_kept_fds(const struct gs_import *im)
{
    if (im->unresolved_fd >= 0)
        close(im->unresolved_fd);
    if (im->import_fd >= 0)
        close(im->import_fd);
}

void gs_forget_maps(CUdeviceptr va, size_t size)
{
    GS_DROP_IF(gs.maps, e->va >= va && e->va - va < size, );
}

void gs_forget_exports(int kind, uint64_t id)
{
    GS_DROP_IF(gs.exports, e->kind == kind && e->obj_id == id, close(e->fd));
}

static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    struct gs_kept {
        uint64_t id;
        int fd;
        int held; /* else the source of the live allocation id */
    } *v;
    size_t n, cap;
} kept;

void gs_kept_lock(void) { pthread_mutex_lock(&kept_mu); }
void gs_kept_unlock(void) { pthread_mutex_unlock(&kept_mu); }

int gs_kept_add(uint64_t id, int fd)
{
    *GS_PUSH(kept) = (struct gs_kept){.id = id, .fd = fd, .held = 1};
    return 0;
}

int gs_kept_held(uint64_t id)
{
    return gs_kept_state(id) == 1;
}

int gs_kept_state(uint64_t id)
{
    struct gs_kept *k = GS_FIND(kept, e->id == id);
    return k ? k->held : 0;
}

void gs_kept_hold(uint64_t id, int held)
{
    struct gs_kept *k = GS_FIND(kept, e->id == id);
    if (k)
        k->held = held;
}

int gs_kept_find(uint64_t id)
{
    struct gs_kept *k = GS_FIND(kept, e->id == id);
    return k ? k->fd : -1;
}

int gs_kept_is(int fd)
{
    return GS_FIND(kept, e->fd == fd) != NULL;
}

int gs_kept_close(uint64_t id)
{
    int n = 0;
    GS_DROP_IF(kept, e->id == id, close(e->fd); n++);
    return n;
}

int gs_kept_close_all(int held_only)
{
    int n = 0;
    gs_kept_lock();
    GS_DROP_IF(kept, e->held == 1 || !held_only, close(e->fd); n++);
    gs_kept_unlock();
    return n;
}

void gs_close_kept(const struct gs_alloc *a)
{
    gs_kept_lock();
    gs_kept_close(a->id);
    gs_kept_unlock();
}

void gs_collect(void)
{
    GS_DROP_IF(gs.allocs,
               e->origin == GS_ORIGIN_CUMEM && e->app_released && !mapped(GS_OBJ_ALLOC, e->id),
               gs_forget_exports(GS_OBJ_ALLOC, e->id); gs_close_kept(e)); /* the id dies with it */
    GS_DROP_IF(gs.imports,
               e->kind == GS_IMPORT_FD && e->app_released && !mapped(GS_OBJ_IMPORT, e->id),
               close_kept_fds(e));
    GS_DROP_IF(gs.mcasts, e->app_released && !mapped(GS_OBJ_MCAST, e->id) && !bound(e->id),
               gs_forget_exports(GS_OBJ_MCAST, e->id));
}

int gs_anything_dropped(void)
{
    return GS_FIND(gs.allocs, e->dropped) || GS_FIND(gs.imports, e->dropped) ||
           GS_FIND(gs.maps, e->dropped) || GS_FIND(gs.hosts, e->dropped);
}

int gs_import_device(uint64_t id)
{
    for (size_t i = 0; i < gs.maps.n; i++) {
        struct gs_map *m = &gs.maps.v[i];
        if (m->kind != GS_OBJ_IMPORT || m->obj_id != id)
            continue;
        for (int k = 0; k < m->n_access; k++)
            if (m->access[k].location.type == CU_MEM_LOCATION_TYPE_DEVICE)
                return m->access[k].location.id;
    }
    return 0;
}

int gs_same_open_file(int a, int b)
{
    pid_t self = getpid();
    return syscall(SYS_kcmp, self, self, KCMP_FILE, a, b) == 0;
}

void gs_state_reset_after_fork(void)
{
    /* Only the forking thread exists now; whoever held the lock in the parent is gone. */
    pthread_mutex_init(&state_mu, NULL);
    for (size_t i = 0; i < gs.exports.n; i++)
        close(gs.exports.v[i].fd);
    pthread_mutex_init(&kept_mu, NULL);
    gs_kept_close_all(0); /* the memory is the parent's to keep */
    free(kept.v);
    kept.v = NULL;
    kept.n = kept.cap = 0;
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
    free(gs.xlat.v);
    free(gs.lazy_ipc.v);
    uint64_t next = gs.next_id;
    memset(&gs, 0, sizeof(gs));
    gs.next_id = next;
}

/* ---- handle translation ------------------------------------------------------------------------ */

CUmemGenericAllocationHandle gs_xlat(CUmemGenericAllocationHandle h)
{
    if (!__atomic_load_n(&gs.xlat.n, __ATOMIC_RELAXED))
        return h;
    gs_lock();
    for (size_t i = 0; i < gs.xlat.n; i++)
        if (gs.xlat.v[i].app == h) {
            h = gs.xlat.v[i].cur;
            break;
        }
    gs_unlock();
    return h;
}

void gs_xlat_forget(CUmemGenericAllocationHandle app, int all)
{
    /* One entry per reference the program holds (a retained handle may have the same value as
     * the allocation's own): a release drops one. */
    for (size_t i = 0; i < gs.xlat.n;)
        if (gs.xlat.v[i].app == app) {
            GS_DEL(gs.xlat, i);
            if (!all)
                return;
        } else {
            i++;
        }
}

/* Whatever value the application holds for the object (old itself, or an earlier value already
 * translated to old) now means nw. */
void gs_xlat_move(CUmemGenericAllocationHandle old, CUmemGenericAllocationHandle nw)
{
    int found = 0;
    for (size_t i = 0; i < gs.xlat.n; i++)
        if (gs.xlat.v[i].cur == old) {
            gs.xlat.v[i].cur = nw;
            found = 1;
        }
    if (!found && old != nw) {
        struct gs_xlat *x = GS_PUSH(gs.xlat);
        x->app = old;
        x->cur = nw;
    }
}

int gs_held_by_app_elsewhere(CUmemGenericAllocationHandle h, CUmemGenericAllocationHandle own)
{
    for (size_t i = 0; i < gs.xlat.n; i++)
        if (gs.xlat.v[i].app == h && gs.xlat.v[i].cur != own)
            return 1;
    for (size_t i = 0; i < gs.allocs.n; i++)
        if (gs.allocs.v[i].h == h && !gs.allocs.v[i].dropped && !gs.allocs.v[i].app_released)
            return 1;
    for (size_t i = 0; i < gs.imports.n; i++)
        if (gs.imports.v[i].h == h && !gs.imports.v[i].dropped && !gs.imports.v[i].app_released)
            return 1;
    return 0;
}

/* ---- calls the shim cannot restore ------------------------------------------------------------- */

/* Only what this process itself could not get back counts: sharing it exports but cannot identify
 * (driver IPC handles, exports of imported handles) is refused in the importer, which sees it as
 * an import without a known exporter; here it is a note. */
int gs_untracked_list(char msgs[GS_UNTRACKED_MAX][GS_UNTRACKED_LEN])
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
                 "threshold, CRIU_GPUSHARE_MALLOC_MIN in the exporter's environment): the driver "
                 "cannot restore them",
                 foreign);
    if (unresolved)
        snprintf(msgs[n++], GS_UNTRACKED_LEN,
                 "%d import(s) of a shareable handle that no process with the shim exported",
                 unresolved);
    if (gs.n_pool_imports)
        snprintf(msgs[n++], GS_UNTRACKED_LEN,
                 "%d memory pool(s) imported from another process "
                 "(cuMemPoolImportFromShareableHandle): the driver cannot restore them and the "
                 "shim does not share pools", gs.n_pool_imports);
    return n;
}

int gs_untracked(char *out, size_t outlen)
{
    char msgs[GS_UNTRACKED_MAX][GS_UNTRACKED_LEN];
    int n = gs_untracked_list(msgs);
    size_t off = 0;
    out[0] = 0;
    for (int i = 0; i < n && off < outlen; i++)
        off += (size_t)snprintf(out + off, outlen - off, "%s%s", i ? "; " : "", msgs[i]);
    return n;
}
