/* Internal header of the fake CUDA driver (a libcuda.so.1 test double; see README.md).
 *
 * Model: device memory is host memory. Device virtual addresses lie inside one big PROT_NONE
 * reservation (the "arena"); every physical allocation is a memfd mapped MAP_SHARED|MAP_FIXED at its
 * VA, so it can be exported as a real fd, imported by another process and unmapped and re-mapped at
 * the same VA. One mutex (fk.mu) guards all object state; stream work runs on one worker thread per
 * stream under a second mutex (fk_sq.mu). Every public entry point starts with FK_API(), which
 * checks cuInit, applies FAKECUDA_FAIL and blocks while the process is locked for a checkpoint. */
#ifndef FAKECUDA_FAKE_H
#define FAKECUDA_FAKE_H

#define _GNU_SOURCE
#include <cuda.h>
/* The fake also exports these older unversioned entry points, which cuda.h renames to _v2. */
#undef cuDeviceGetUuid
#undef cuGetProcAddress
#undef cuEventElapsedTime
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define FK_EXPORT __attribute__((visibility("default")))
#define FK_MAX_DEVICES 16
/* A context's local memory is its stack limit times this many threads (a real H100: 1 KiB x
 * 2048 threads x 132 SMs = 264 MiB); a checkpoint copies it into the process with the rest. */
#define FK_LMEM_THREADS 32768
#define FK_DEFAULT_STACK 1024
#define FK_GRANULARITY (2ull << 20) /* VMM granularity, and the rounding of cuMemAlloc */
#define FK_ARENA_SIZE (1ull << 40)  /* device VA space per process */
#define FK_IPC_MAGIC 0x4650494b4146ull /* "FAKIPF" */

/* ---- objects ---------------------------------------------------------------------------- */

enum fk_phys_kind {
    FK_PHYS_ALLOC,      /* behind a cuMemAlloc */
    FK_PHYS_CREATE,     /* cuMemCreate */
    FK_PHYS_IMPORT,     /* cuMemImportFromShareableHandle of another process's (or own) fd */
    FK_PHYS_IPC,        /* behind a cuIpcOpenMemHandle */
    FK_PHYS_MULTICAST,  /* a multicast object's own backing */
};

/* Physical memory: one memfd. Lives while the app holds its handle or a mapping uses it. */
struct fk_phys {
    struct fk_phys *next;
    unsigned long long handle; /* CUmemGenericAllocationHandle value seen by the app */
    enum fk_phys_kind kind;
    int dev;
    size_t size;               /* rounded to FK_GRANULARITY */
    int memfd;                 /* -1 while checkpointed */
    int handle_held;           /* app holds the handle (cuMemCreate/import/retain count) */
    int map_count;
    unsigned long long handle_types; /* requestedHandleTypes */
    int charged;               /* counted in this process's device usage */
    void *saved;               /* contents while checkpointed */
    int ipc_fd;                /* fd kept for legacy IPC exports of a cuMemAlloc, or -1 */
    int ipc_src_pid;           /* FK_PHYS_IPC: the exporter */
    unsigned long long ipc_src_id;
    /* multicast objects */
    int mc_devices;            /* bitmask of devices added */
    int mc_num_devices;
};

enum fk_map_kind { FK_MAP_ALLOC, FK_MAP_VMM, FK_MAP_IPC };

/* A mapping of [va, va+size) onto phys at offset. */
struct fk_map {
    struct fk_map *next;
    enum fk_map_kind kind;
    uintptr_t va;
    size_t size;
    size_t req_size;            /* cuMemAlloc: the size asked for */
    struct fk_phys *phys;
    size_t offset;
    unsigned access[FK_MAX_DEVICES]; /* CUmemAccess_flags per device (VMM); ALLOC/IPC: all RW */
    int mapped;                 /* 0 while checkpointed */
    void *ctx;                  /* context the allocation was made in */
    void *pool;                 /* FK_MAP_ALLOC from cuMemAllocAsync: its struct fk_pool */
};

/* cuMemAddressReserve ranges (and the internal ones behind cuMemAlloc / IPC opens). */
struct fk_resv {
    struct fk_resv *next;
    uintptr_t va;
    size_t size;
    int internal;
};

enum fk_host_kind { FK_HOST_ALLOC, FK_HOST_REGISTERED };

struct fk_host {
    struct fk_host *next;
    enum fk_host_kind kind;
    uintptr_t va;
    size_t size;
    unsigned flags;
    int memfd;                  /* FK_HOST_ALLOC only */
    void *saved;
    int unmapped;
};

#define FK_CTX_MAGIC 0x6b63747846414b45ull
struct fk_ctx {
    unsigned long long magic;
    int dev;
    int primary;
    int refcount;
    unsigned flags;
    unsigned long long id;
    unsigned peers;             /* bitmask of devices whose memory this context may access */
    struct fk_stream *legacy;   /* the NULL stream */
    size_t stack;               /* CU_LIMIT_STACK_SIZE: bytes of local memory per thread */
    void *lmem_saved;           /* a primary context's local memory, copied by a checkpoint */
};

struct fk_op;
#define FK_STREAM_MAGIC 0x6d61657274734b46ull
struct fk_stream {
    unsigned long long magic;
    struct fk_stream *next_all;
    struct fk_ctx *ctx;
    unsigned flags;
    int priority;
    int legacy;                 /* the context's NULL stream */
    int per_thread;             /* a per-thread default stream */
    unsigned long long id;
    unsigned long long submitted, completed;
    struct fk_op *head, *tail;
    pthread_t thread;
    int thread_started;
    int destroyed;
    /* capture.c */
    int capturing;              /* between cuStreamBeginCapture and cuStreamEndCapture */
    int capture_invalidated;
    CUstreamCaptureMode capture_mode;
};

#define FK_EVENT_MAGIC 0x746e6576454b46ull
struct fk_event {
    unsigned long long magic;
    unsigned flags;
    struct fk_stream *stream;   /* NULL: never recorded */
    unsigned long long seq;
    unsigned long long gen;
    double time_ms;
};

#define FK_MODULE_MAGIC 0x6c75646f4d4b46ull
struct fk_module { unsigned long long magic; };
#define FK_FUNC_MAGIC 0x636e75464b46ull
struct fk_func { unsigned long long magic; int kind; const char *name; int nparams; };

/* ---- global state -------------------------------------------------------------------- */

struct fk_device {
    char name[64];
    CUuuid uuid;
    size_t total;
    struct fk_ctx primary;
};

enum fk_cstate { FK_RUNNING = 0, FK_LOCKED = 1, FK_CHECKPOINTED = 2, FK_FAILED = 3 };

struct fk_global {
    pthread_mutex_t mu;         /* all object state */
    int initialized;
    int forked;                 /* this is a child forked after cuInit: CUDA is unusable here */
    pid_t init_pid;
    int ndev;
    struct fk_device dev[FK_MAX_DEVICES];
    uintptr_t arena;
    struct fk_phys *phys;
    struct fk_map *maps;
    struct fk_resv *resvs;
    struct fk_host *hosts;
    unsigned long long next_handle;
    size_t used[FK_MAX_DEVICES]; /* bytes charged by this process */
    char state_dir[512];
    /* checkpoint gate */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    enum fk_cstate cstate;
    int locking;                /* a lock is in progress: new calls wait */
    int inflight;               /* API calls running now */
    int stuck;                  /* a restore failed: CHECKPOINTED for good */
    CUresult stuck_error;
    pid_t restore_tid;
};
extern struct fk_global fk;

/* ---- core.c -------------------------------------------------------------------------- */
CUresult fk_enter(const char *name, int gate);
void fk_leave_cleanup(int *entered);
/* FK_API(name): first statement of every public entry point: needs cuInit, applies FAKECUDA_FAIL,
 * waits while the process is locked and counts the call as in flight until it returns.
 * FK_API_NOGATE: the same without the gate (the checkpoint API itself). */
#define FK_API_(name, gate)                                                                   \
    CUresult fk__r = fk_enter(name, gate);                                                    \
    __attribute__((cleanup(fk_leave_cleanup))) int fk__entered = (fk__r == CUDA_SUCCESS) && (gate); \
    if (fk__r != CUDA_SUCCESS) return fk__r
#define FK_API(name) FK_API_(name, 1)
#define FK_API_NOGATE(name) FK_API_(name, 0)
/* Defines NAME and its per-thread twin TWIN with the same parameters; BODY(pt) is the shared
 * implementation, with pt = 1 in the twin. */
#define FK_PAIR(NAME, TWIN, PARAMS, BODY)                          \
    FK_EXPORT CUresult NAME PARAMS { FK_API(#NAME); return BODY(0); } \
    FK_EXPORT CUresult TWIN PARAMS { FK_API(#TWIN); return BODY(1); }

void fk_lock(void);
void fk_unlock(void);
struct fk_ctx *fk_current_ctx(void);
CUresult fk_require_ctx(struct fk_ctx **out);
int fk_valid_ctx(struct fk_ctx *c);
int fk_dev_by_uuid(const CUuuid *u);
void fk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
double fk_now_ms(void);

/* ---- memory.c ------------------------------------------------------------------------ */
int fk_in_arena(uintptr_t p);
CUresult fk_va_alloc(size_t size, size_t align, uintptr_t fixed, uintptr_t *out);
void fk_va_free(uintptr_t va, size_t size);
int fk_memfd_new(size_t size, const char *tag);
int fk_map_fd(uintptr_t va, size_t size, int fd, size_t offset);
void fk_map_none(uintptr_t va, size_t size);
struct fk_phys *fk_phys_new(enum fk_phys_kind kind, int dev, size_t size, int memfd);
struct fk_phys *fk_phys_by_handle(unsigned long long h);
void fk_phys_maybe_free(struct fk_phys *p);
void fk_charge(struct fk_phys *p, int on);
void fk_usage_write(void);
size_t fk_node_used(int dev); /* bytes on dev used by all live processes */
struct fk_map *fk_map_at(uintptr_t p);
CUresult fk_alloc_device(struct fk_ctx *c, size_t bytesize, void *pool, CUdeviceptr *dptr);
CUresult fk_free_device(CUdeviceptr dptr, int sync_ctx);
struct fk_resv *fk_resv_at(uintptr_t p);
struct fk_host *fk_host_at(uintptr_t p);
void fk_map_unlink(struct fk_map *m);
/* Check that [p, p+n) is memory a copy may touch. device_side: must be device or pinned memory. */
CUresult fk_check_range(uintptr_t p, size_t n, int device_side, int write);

/* ---- stream.c ------------------------------------------------------------------------ */
/* A strided copy: depth slices of height rows of width bytes. */
struct fk_copy3d {
    uintptr_t dst, src;
    size_t width, height, depth;
    size_t dpitch, spitch, dslice, sslice;
};
/* A stream memory operation (cuStreamWriteValue*, cuStreamWaitValue*). */
struct fk_memop {
    int write;                  /* 1: write value; 0: wait until the condition holds */
    int bits;                   /* 32 or 64 */
    uintptr_t addr;
    unsigned long long value;
    unsigned flags;             /* CUstreamWaitValue_flags for waits */
};
CUresult fk_submit_copy3d(const struct fk_copy3d *c, CUstream hs, int pt, int sync);
CUresult fk_submit_memop(const struct fk_memop *m, CUstream hs, int pt);
CUresult fk_launch_function(CUfunction f, CUstream hs, void **params, int pt);
void fk_run_memop(const struct fk_memop *m); /* memops.c; runs on a stream worker */
void fk_streams_drain_all(void);
int fk_streams_drain_until(double deadline_ms);
void fk_stream_sync_ctx(struct fk_ctx *c);
/* The context of stream hs (pt: reached through a _ptsz entry point), and waiting for it. */
CUresult fk_stream_context(CUstream hs, int pt, struct fk_ctx **out);
CUresult fk_stream_lookup(CUstream hs, int pt, struct fk_stream **out);
struct fk_stream *fk_stream_list(void); /* every stream of the process (next_all), under fk_capture_lock */
void fk_capture_lock(void);
void fk_capture_unlock(void);

/* ---- capture.c ------------------------------------------------------------------------ */
/* A call that stream capture forbids (a query or synchronize) while a global-mode capture runs,
 * made by a thread not in relaxed mode: it invalidates those captures and gives
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; else CUDA_SUCCESS. */
CUresult fk_capture_unsafe_call(void);
CUresult fk_stream_wait_all(CUstream hs, int pt);

/* ---- checkpoint.c -------------------------------------------------------------------- */
void fk_checkpoint_start_restore_thread(void);

/* ---- fault injection (core.c) -------------------------------------------------------- */
CUresult fk_fail_point(const char *name);

#endif
