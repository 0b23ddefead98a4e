/* shim_internal.h: what the shim's source files share. Not an ABI: nothing here is exported.
 *
 * Module map (shim/src/):
 *   resolve.c  real driver symbols, the hook table, dlsym and cuGetProcAddress interposition,
 *              cuInit (starts the control server), the per-thread re-entrancy guard
 *   track.c    the state: allocations, mappings, exports, imports, host buffers, peer access,
 *              multicast objects; one state lock; allocation ids
 *   alloc.c    cuMem* (create, map, access, retain, release), cuMemAlloc backed by cuMem memory,
 *              peer access, multicast
 *   ipc.c      shareable-handle export/import with exporter lookup, legacy CUDA IPC
 *   host.c     page-locked host memory
 *   gates.c    the launch and memory gates, the gated wrappers, the drain
 *   contexts.c contexts from cuCtxCreate, so the drain reaches them too
 *   control.c  the control socket: server threads, authentication, commands; peer requests
 *   lifecycle.c suspend/resume commands (release, void-exports, recreate, adopt, attach,
 *              export-import), host re-registration before resume, handle translation
 *   json.c     a small JSON writer and a flat-object reader for the protocol
 */
#ifndef CRIU_GPUSHARE_SHIM_INTERNAL_H
#define CRIU_GPUSHARE_SHIM_INTERNAL_H

#include <cuda.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "criu_gpushare_shim.h"

/* ---- resolve.c -------------------------------------------------------------------------------- */

/* Every function the shim interposes. Each has a wrapper exported under the driver's name and a
 * slot holding the driver's own function. X(name) */
#include "hooks.def"

enum gs_hook_id {
#define X(name) GS_HOOK_##name,
    GS_HOOKS(X)
#undef X
    GS_HOOK_COUNT
};

/* The driver's own function for hook id (resolved on first use; NULL if libcuda lacks it). */
void *gs_real_hook(int id);
/* The driver's own function by name, never one of the shim's wrappers. Loads libcuda if needed. */
void *gs_real(const char *name);

/* Older entry points cuda.h (CUDA 13) declares only for the driver's own build. */
CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
CUresult CUDAAPI cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                                unsigned int flags, CUdevice dev);

/* The wrappers are exported under the driver's names (direct linking reaches them too). */
#define GS_DECLARE_EXPORT(name) GS_EXPORT __typeof__(name) name;
GS_TRACKED_HOOKS(GS_DECLARE_EXPORT)
#define GS_DECLARE_GATED(gate, name, twin, params, args) \
    GS_EXPORT CUresult CUDAAPI name params;              \
    GS_EXPORT CUresult CUDAAPI twin params;
GS_GATED_HOOKS(GS_DECLARE_GATED)

/* Finds the shim's wrapper for a driver function that a lookup returned (by pointer: the lookup
 * may use an unversioned name and return the _v2 or _ptsz function); exact_name also accepts a
 * hook of exactly that name. Returns real unchanged when the shim does not wrap it. */
void *gs_wrapper_for(const char *name, void *real, int exact_name);

#define REAL(name) ((__typeof__(&name))gs_real_hook(GS_HOOK_##name))

/* Unwrapped driver call by its exact (versioned) name, cached at the call site. Evaluates to
 * CUDA_ERROR_NOT_FOUND when the driver lacks the function. */
#define CU(type, name, ...)                                                                  \
    ({                                                                                       \
        static __typeof__(type) gs_p_;                                                                 \
        __typeof__(type) gs_f_ = __atomic_load_n(&gs_p_, __ATOMIC_RELAXED);                              \
        if (!gs_f_) {                                                                        \
            gs_f_ = (__typeof__(type))gs_real(#name);                                                  \
            __atomic_store_n(&gs_p_, gs_f_, __ATOMIC_RELAXED);                               \
        }                                                                                    \
        gs_f_ ? gs_f_(__VA_ARGS__) : CUDA_ERROR_NOT_FOUND;                                   \
    })

/* Re-entrancy guard: a wrapper entered again on the same thread (the driver calling an exported
 * name, a callback) passes straight through without tracking. */
extern __thread int gs_depth __attribute__((tls_model("initial-exec")));

/* ---- track.c ---------------------------------------------------------------------------------- */

#define GS_MAX_ACCESS 16 /* access entries per mapping (locations) */
#define GS_MAX_DEV 64    /* devices in the peer-access matrix and per multicast object */

enum gs_obj_kind { GS_OBJ_UNKNOWN = 0, GS_OBJ_ALLOC, GS_OBJ_IMPORT, GS_OBJ_MCAST };
enum gs_alloc_origin { GS_ORIGIN_CUMEM = 1, GS_ORIGIN_MALLOC };
enum gs_import_kind { GS_IMPORT_FD = 1, GS_IMPORT_IPC };

/* An allocation this process created: cuMemCreate by the app, or the cuMem memory behind a large
 * cuMemAlloc. Identified by id (monotonic per process), never by handle or VA (both are reused). */
struct gs_alloc {
    uint64_t id;
    CUmemGenericAllocationHandle h;
    size_t size;
    int dev;
    int origin;
    unsigned long long handle_types; /* requested, after the shim added POSIX fd */
    CUdeviceptr va;                  /* ORIGIN_MALLOC: the pointer cuMemAlloc returned */
    int app_released;                /* cuMemRelease done (mappings may keep it alive) */
    int ipc_handles;                 /* shim CUDA IPC handles given out for it */
    int dropped;                     /* released by the shim (lifecycle.c) */
    CUmemAllocationProp prop;        /* read at release, for recreate */
    int have_prop;
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
    unsigned char peer[GS_MAX_DEV][GS_MAX_DEV]; /* [owner][accessor] enabled by the app */
    /* Sharing this process gave out but cannot identify (a status note; importers refuse). */
    int n_foreign_ipc_exports;
    int n_untracked_exports;
    char last_untracked[256];
};

extern struct gs_state gs;

/* The state lock. App threads take it untimed; the control threads take it with a timeout
 * because app threads may be frozen while holding it. */
void gs_lock(void);
int gs_lock_timed(int ms); /* 0 on success */
void gs_unlock(void);

/* Append (aborts on out of memory: losing track of an object would make a restore wrong). */
#define GS_PUSH(arr) ((arr).n == (arr).cap ? gs_grow((void **)&(arr).v, &(arr).cap, sizeof(*(arr).v)) : (void)0, \
                      &(arr).v[(arr).n++])
#define GS_DEL(arr, i) ((arr).v[i] = (arr).v[--(arr).n])
void gs_grow(void **v, size_t *cap, size_t elem);

uint64_t gs_new_id(void);
/* A new import record of `kind` with a fresh id and no kept fds (call with the lock held). */
struct gs_import *gs_new_import(int kind);
struct gs_alloc *gs_find_alloc_h(CUmemGenericAllocationHandle h);
struct gs_alloc *gs_find_alloc_id(uint64_t id);
struct gs_alloc *gs_find_malloc_va(CUdeviceptr va);
struct gs_import *gs_find_import_h(CUmemGenericAllocationHandle h);
struct gs_import *gs_find_import_va(CUdeviceptr va);
struct gs_mcast *gs_find_mcast_h(CUmemGenericAllocationHandle h);
struct gs_mcast *gs_find_mcast_id(uint64_t id);
struct gs_map *gs_find_map_at(CUdeviceptr va); /* the mapping containing va */
/* What a handle the app holds refers to (alloc, import, multicast object or retained alias). */
int gs_classify_handle(CUmemGenericAllocationHandle h, uint64_t *obj_id);
/* Forget objects the app released that nothing maps any more; close their export dups. */
void gs_collect(void);
/* What a checkpoint must refuse (CUDA IPC imports of foreign memory, imports without a known
 * exporter), joined in out. Returns how many kinds; call with the lock held. */
#define GS_UNTRACKED_LEN 320
int gs_untracked(char *out, size_t outlen);
/* After fork in the child: the driver's objects did not come along. */
void gs_state_reset_after_fork(void);

/* ---- json.c ------------------------------------------------------------------------------------ */

struct gs_buf {
    char *p;
    size_t n, cap;
    int oom;
};
void gs_buf_printf(struct gs_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void gs_buf_str(struct gs_buf *b, const char *s); /* a JSON string literal, escaped */
void gs_buf_free(struct gs_buf *b);

#define GS_JSON_MAX_FIELDS 16
struct gs_json_field {
    char key[32];
    int type; /* 's' string, 'i' integer, 'b' boolean, 'n' null */
    char str[256];
    long long num;
};
struct gs_json {
    int n;
    struct gs_json_field f[GS_JSON_MAX_FIELDS];
};
/* Parses one flat JSON object (string keys; string, integer, boolean or null values). Returns 0,
 * or -1 with a reason in err. */
int gs_json_parse(const char *text, size_t len, struct gs_json *out, char *err, size_t errlen);
const struct gs_json_field *gs_json_get(const struct gs_json *j, const char *key, int type);

/* ---- gates.c ----------------------------------------------------------------------------------- */

enum gs_gate_id { GS_GATE_LAUNCH = 0, GS_GATE_MEMORY = 1 };
/* Closes both gates in order and drains the GPU; on timeout reopens both. 0 = quiesced,
 * -1 = busy (reason in err). */
int gs_quiesce(int timeout_ms, char *err, size_t errlen);
void gs_gates_open(void);
/* Opens both gates once any quiesce in progress has finished. */
void gs_resume(void);
void gs_gates_status(struct gs_buf *b);
/* Both gates closed; with wait, by a finished quiesce (waits for a quiesce or resume in
 * progress), else as seen now. */
int gs_quiesced(int wait);
void gs_gates_reset_after_fork(void);
/* Synchronizes every active primary context, waiting at most ms. 0 = done. */
int gs_sync_all(int ms, char *err, size_t errlen);

/* ---- contexts.c -------------------------------------------------------------------------------- */

/* Synchronizes every context the program created with cuCtxCreate (the drain's second half). */
CUresult gs_sync_created_contexts(char *what, size_t whatlen);
void gs_contexts_reset_after_fork(void);

/* ---- control.c --------------------------------------------------------------------------------- */

/* Starts the control server of this pid if it is not running (lazily: first driver use). */
void gs_control_ensure(void);
/* Asks the shim of pid: one JSON request (and optionally an fd), one reply (and optionally an fd).
 * Returns 0 with the reply in reply (NUL-terminated), or -1. */
int gs_peer_request(pid_t pid, const char *req, int fd_in, char *reply, size_t replylen, int *fd_out,
                    int timeout_ms);
/* Pids with a control socket in this network namespace, from /proc/net/unix. */
int gs_peer_pids(pid_t *pids, int max);
void gs_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Starts a detached thread that blocks signals and is named "criu-gpushare". */
int gs_start_thread(void *(*fn)(void *), void *arg);
void gs_thread_init(void);

/* ---- ipc.c ------------------------------------------------------------------------------------- */

/* Server side of the peer commands. */
/* What an exported fd is: one of this process's allocations or multicast objects. */
struct gs_origin {
    uint64_t id;
    int is_mc;
    size_t size;
};
int gs_whose_fd(int fd, struct gs_origin *out, char *err, size_t errlen);
int gs_export_id(uint64_t id, int *fd_out, char *err, size_t errlen);
/* Tries again to find the exporters of imports made before their exporter was known. Returns the
 * number still unresolved, or -1 if the state lock stayed busy. Call without the state lock (it
 * is taken with a timeout: this runs on the control threads). */
int gs_resolve_pending_imports(void);

/* ---- lifecycle.c ------------------------------------------------------------------------------ */

/* The program's handle value -> the object's current handle (unchanged when not re-created).
 * Call without the state lock. */
CUmemGenericAllocationHandle gs_xlat(CUmemGenericAllocationHandle h);
/* The program released one reference of value app (all = 0), or the driver handed the value out
 * anew (all = 1). Lock held. */
void gs_xlat_forget(CUmemGenericAllocationHandle app, int all);
int gs_lifecycle_command_known(const char *cmd);
int gs_lifecycle_takes_fd(const char *cmd);
/* Runs a suspend/resume command: NULL on success (reply fields in body, *fd_out an fd to send or
 * -1), else the error code with the reason in err. */
const char *gs_lifecycle_command(const char *cmd, const struct gs_json *req, const int *fds,
                                 int nfds, struct gs_buf *body, int *fd_out, char *err,
                                 size_t errlen);
/* Before the gates open: refuses while memory is still released (-3), re-registers released host
 * buffers at their device pointers (-1 on failure), -2 when the state lock stays busy. */
int gs_lifecycle_before_resume(char *err, size_t errlen);
/* "released" when anything is dropped, else "quiesced" or "running". Lock held. */
const char *gs_lifecycle_state_locked(void);

/* The `status` reply body (track.c): every tracked object, as JSON fields. Takes no lock. */
void gs_status_json(struct gs_buf *b);

#endif
