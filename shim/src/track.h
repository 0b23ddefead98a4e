/* track.h: the shim's record of what the driver would lose: allocations, mappings with merged
 * access, exports, imports linked to their exporter, host buffers, peer access, multicast objects,
 * retained handles, handle translation; one state lock. Layer 3 (above devices; no driver calls).
 *
 * Arrays are unordered (deletion moves the last element into the hole), so nothing keeps an index
 * across an unlock; objects are named by id (monotonic per process, never reused).
 */
#ifndef GS_TRACK_H
#define GS_TRACK_H

#include <cuda.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "devices.h"

#define GS_MAX_ACCESS 16 /* access entries per mapping (locations) */

enum gs_obj_kind { GS_OBJ_UNKNOWN = 0, GS_OBJ_ALLOC, GS_OBJ_IMPORT, GS_OBJ_MCAST };
enum gs_alloc_origin { GS_ORIGIN_CUMEM = 1, GS_ORIGIN_MALLOC, GS_ORIGIN_ASYNC };
enum gs_import_kind { GS_IMPORT_FD = 1, GS_IMPORT_IPC };

/* An allocation this process created: cuMemCreate by the app, or the cuMem memory behind a large
 * cuMemAlloc or stream-ordered allocation (backing.c). Identified by id (monotonic per process), never by handle or VA (both are reused). */
struct gs_alloc {
    uint64_t id;
    CUmemGenericAllocationHandle h;
    size_t size;
    int dev;
    int origin;
    unsigned long long handle_types; /* requested, after the shim added POSIX fd */
    CUdeviceptr va;                  /* MALLOC, ASYNC: the pointer the program was given */
    CUmemoryPool pool;               /* ASYNC: the pool it came from */
    int app_released;                /* cuMemRelease done (mappings may keep it alive) */
    int ipc_handles;                 /* shim CUDA IPC handles given out for it */
    int dropped;                     /* released by the shim (lifecycle.c) */
    CUmemAllocationProp prop;        /* read at release, for recreate */
    int have_prop;
    int remapped;                    /* dropped, and moved by a devices map (lifecycle.c) */
    int intact;                      /* re-created from its kept fd (gs_kept_*): the bytes it had */
    int fresh;                       /* re-created as new memory: its bytes must be loaded */
};

/* A cuMemMap of any handle, with the access merged over every cuMemSetAccess on it. */
struct gs_map {
    CUdeviceptr va;
    size_t size, offset;
    int kind;        /* enum gs_obj_kind */
    uint64_t obj_id; /* alloc, import or multicast id */
    CUmemGenericAllocationHandle h;
    int n_access;
    CUmemAccessDesc access[GS_MAX_ACCESS];
    int access_overflow; /* more locations than GS_MAX_ACCESS were given */
    int dropped;
    int remapped; /* dropped, and its access moved by a devices map (lifecycle.c) */
};

/* A POSIX-fd export. The dup identifies copies of the fd (kcmp) when a peer imports one. */
struct gs_export {
    int fd;          /* kept F_DUPFD_CLOEXEC dup */
    uint64_t obj_id; /* 0: not identified (handle not tracked) */
    int kind;        /* enum gs_obj_kind of obj_id */
    CUmemGenericAllocationHandle h;
    int voided;
};

/* An import (shareable fd or legacy IPC through the shim) linked to its exporter (pid, id). */
struct gs_import {
    uint64_t id;
    int kind; /* enum gs_import_kind */
    CUmemGenericAllocationHandle h;
    size_t size;
    CUdeviceptr va; /* GS_IMPORT_IPC: the VA the shim reserved */
    pid_t exporter_pid;
    uint64_t exporter_id;
    int unresolved_fd; /* kept dup while the exporter is unknown, else -1 */
    int import_fd;     /* kept dup of the fd it was imported from, else -1: the driver will not
                        * export an imported handle, so memory whose exporter freed it is saved
                        * through this fd (closed at release: it pins the memory) */
    int app_released;
    int dropped;
};

struct gs_host {
    void *p;
    size_t size;
    unsigned flags; /* CU_MEMHOSTREGISTER_* used */
    int owned;      /* allocated by the shim (cuMemHostAlloc/cuMemAllocHost) */
    CUdeviceptr dptr;
    int dropped;
};

/* A multicast object: created here (creator_pid 0), or imported from its creator. */
struct gs_mcast {
    uint64_t id;
    CUmemGenericAllocationHandle h;
    CUmulticastObjectProp prop; /* creator only */
    pid_t creator_pid;
    uint64_t creator_id;
    int n_devs;
    int devs[GS_MAX_DEV];
    int app_released;
    int dropped;
};

struct gs_mcbind {
    uint64_t mc_id;
    int dev;
    size_t mc_offset, size, mem_offset;
    CUmemGenericAllocationHandle mem_h; /* BindMem */
    CUdeviceptr mem_ptr;                /* BindAddr */
    uint64_t mem_alloc_id;
    unsigned long long flags;
    int dropped;
};

/* A handle from cuMemRetainAllocationHandle, resolved to the object mapped at its address. */
struct gs_alias {
    CUmemGenericAllocationHandle h;
    int kind;
    uint64_t obj_id;
    int dropped; /* released by the shim with its object; retained again when it comes back */
};

/* A handle value the program holds whose object was re-created with another handle (lifecycle.c). */
struct gs_xlat {
    CUmemGenericAllocationHandle app, cur;
};

/* A lazy CUDA IPC handle given out (ipc.c) for driver memory the shim does not back: the driver
 * sees nothing until an opener asks (`ipcget`). One record per allocation, by its base. */
struct gs_lazy_ipc {
    CUdeviceptr base;
    size_t size;
    int opened; /* ipcget answered: driver IPC handles of it are out */
};

#define GS_ARRAY(type) struct { type *v; size_t n, cap; }

struct gs_state {
    uint64_t next_id;
    GS_ARRAY(struct gs_alloc) allocs;
    GS_ARRAY(struct gs_map) maps;
    GS_ARRAY(struct gs_export) exports;
    GS_ARRAY(struct gs_import) imports;
    GS_ARRAY(struct gs_host) hosts;
    GS_ARRAY(struct gs_mcast) mcasts;
    GS_ARRAY(struct gs_mcbind) mcbinds;
    GS_ARRAY(struct gs_alias) aliases;
    GS_ARRAY(struct gs_xlat) xlat;
    GS_ARRAY(struct gs_lazy_ipc) lazy_ipc;
    unsigned char peer[GS_MAX_DEV][GS_MAX_DEV]; /* [owner][accessor] enabled by the app */
    /* Sharing this process gave out but cannot identify (a status note; importers refuse). */
    int n_foreign_ipc_exports;
    int n_untracked_exports;
    int n_pool_imports; /* pools imported from other processes: a checkpoint refuses them */
    int n_async;        /* allocations of origin ASYNC (atomic): 0 lets a free skip the lookup */
    char last_untracked[256];
};

extern struct gs_state gs;

/* The state lock. App threads take it untimed; the control threads take it with a timeout
 * (GS_LOCK_TIMEOUT_MS) because app threads may be frozen while holding it. */
#define GS_LOCK_TIMEOUT_MS 2000
void gs_lock(void);
int gs_lock_timed(int ms); /* 0 on success */
void gs_unlock(void);

/* Append (aborts on out of memory: losing track of an object would make a restore wrong). */
#define GS_PUSH(arr) ((arr).n == (arr).cap ? gs_grow((void **)&(arr).v, &(arr).cap, sizeof(*(arr).v)) : (void)0, \
                      &(arr).v[(arr).n++])
#define GS_DEL(arr, i) ((arr).v[i] = (arr).v[--(arr).n])
/* Removes every element `e` of arr for which cond holds, running `then` (statements over e, or
 * nothing) on it first. The order of the rest changes, as with GS_DEL. */
#define GS_DROP_IF(arr, cond, then)                                                                \
    for (size_t gs_i_ = 0; gs_i_ < (arr).n;) {                                                     \
        __typeof__((arr).v) e = &(arr).v[gs_i_];                                                   \
        if (cond) {                                                                                \
            then;                                                                                  \
            GS_DEL(arr, gs_i_);                                                                    \
        } else {                                                                                   \
            gs_i_++;                                                                               \
        }                                                                                          \
    }
/* The first element `e` of arr for which cond (an expression over e) holds, or NULL. */
#define GS_FIND(arr, cond)                                                                         \
    ({                                                                                             \
        __typeof__((arr).v) gs_found_ = NULL;                                                      \
        for (size_t gs_i_ = 0; gs_i_ < (arr).n; gs_i_++) {                                         \
            __typeof__((arr).v) e = &(arr).v[gs_i_];                                               \
            if (cond) {                                                                            \
                gs_found_ = e;                                                                     \
                break;                                                                             \
            }                                                                                      \
        }                                                                                          \
        gs_found_;                                                                                 \
    })
void gs_grow(void **v, size_t *cap, size_t elem);

uint64_t gs_new_id(void);
/* A new import record of `kind` with a fresh id and no kept fds (call with the lock held). */
struct gs_import *gs_new_import(int kind);
struct gs_alloc *gs_find_alloc_h(CUmemGenericAllocationHandle h);
struct gs_alloc *gs_find_alloc_id(uint64_t id);
struct gs_alloc *gs_find_backed_va(CUdeviceptr va); /* origin MALLOC or ASYNC, by its base */
struct gs_import *gs_find_import_h(CUmemGenericAllocationHandle h);
struct gs_import *gs_find_import_id(uint64_t id);
struct gs_mcast *gs_find_mcast_h(CUmemGenericAllocationHandle h);
struct gs_mcast *gs_find_mcast_id(uint64_t id);
struct gs_map *gs_find_map_at(CUdeviceptr va); /* the mapping containing va */
struct gs_lazy_ipc *gs_find_lazy_ipc(CUdeviceptr va); /* the lazy IPC record containing va */
/* What a handle the app holds refers to (alloc, import, multicast object or retained alias). */
int gs_classify_handle(CUmemGenericAllocationHandle h, uint64_t *obj_id);
/* Forget the mappings inside [va, va+size); the export dups of object (kind, id), closed. */
void gs_forget_maps(CUdeviceptr va, size_t size);
void gs_forget_exports(int kind, uint64_t id);
/* The fds `release` with keep took of allocations' memory (which lives on while one is open), by
 * allocation id. They have their own lock, which no application thread ever takes: drop-kept runs
 * while the group's threads are frozen by ptrace, even one frozen inside the state lock. An entry
 * is "held" from release until recreate imports it again; then it is the live allocation's source,
 * kept for its exports (a driver will not export an imported handle) until the next release holds
 * it again or the allocation goes. */
void gs_kept_lock(void);
void gs_kept_unlock(void);
int gs_kept_add(uint64_t id, int fd); /* with gs_kept_lock; the table owns fd from then on (held) */
int gs_kept_find(uint64_t id);        /* with gs_kept_lock: the fd (held or source), or -1 */
int gs_kept_held(uint64_t id);        /* with gs_kept_lock: whether a held fd is kept for id */
int gs_kept_state(uint64_t id);       /* with gs_kept_lock: the value gs_kept_hold gave, 0 if none */
void gs_kept_hold(uint64_t id, int held); /* with gs_kept_lock: held, or the live one's source */
int gs_kept_is(int fd);               /* with gs_kept_lock: whether fd is one of the table's */
int gs_kept_close(uint64_t id);       /* with gs_kept_lock: 1 if one was kept (now closed), else 0 */
int gs_kept_close_all(int held_only); /* takes gs_kept_lock itself: how many were closed */
/* a's kept fd closed, if it has one (takes gs_kept_lock). */
void gs_close_kept(const struct gs_alloc *a);
/* Forget objects the app released that nothing maps any more; close their export dups. */
void gs_collect(void);
/* What a checkpoint must refuse (CUDA IPC imports of foreign memory, imports without a known
 * exporter, pools imported from another process), joined in out. Returns how many kinds; call with the lock held. */
#define GS_UNTRACKED_LEN 320
#define GS_UNTRACKED_MAX 4
int gs_untracked(char *out, size_t outlen);
/* The same as separate sentences; returns how many. */
int gs_untracked_list(char msgs[GS_UNTRACKED_MAX][GS_UNTRACKED_LEN]);
/* cuMemSetAccess changes only the locations it names: PROT_NONE removes one, anything else adds
 * or replaces it; m keeps the merged list. */
void gs_merge_access(struct gs_map *m, const CUmemAccessDesc *desc, size_t count);
/* The same on a list of *n (at most GS_MAX_ACCESS) entries; 1 when a location did not fit. */
int gs_merge_access_list(CUmemAccessDesc *list, int *n, const CUmemAccessDesc *desc, size_t count);
/* Anything released by the suspend commands (an allocation, import, mapping or host buffer). */
int gs_anything_dropped(void);
/* The device an import's memory lives on: the first device its mappings give access to, else 0
 * (where adopt and attach work when nothing says otherwise). */
int gs_import_device(uint64_t id);
/* Two fds of one open file (kcmp KCMP_FILE): copies of one export. */
int gs_same_open_file(int a, int b);
/* After fork in the child: the driver's objects did not come along. */
void gs_state_reset_after_fork(void);

/* ---- handle translation ---------------------------------------------------------------------- */
/* Re-created memory gets new driver handles while the program keeps its old values: gs.xlat maps
 * each value the program holds to the object's current handle. */

/* The program's handle value -> the object's current handle (unchanged when not re-created).
 * Call without the state lock. */
CUmemGenericAllocationHandle gs_xlat(CUmemGenericAllocationHandle h);
/* The program released one reference of value app (all = 0), or the driver handed the value out
 * anew (all = 1). Lock held. */
void gs_xlat_forget(CUmemGenericAllocationHandle app, int all);
/* The object whose current handle is old now has handle nw. Lock held. */
void gs_xlat_move(CUmemGenericAllocationHandle old, CUmemGenericAllocationHandle nw);
/* A value the program holds for something other than the object whose current handle is own. */
int gs_held_by_app_elsewhere(CUmemGenericAllocationHandle h, CUmemGenericAllocationHandle own);

#endif
