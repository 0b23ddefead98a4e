/* ipc.h: the serving side of the peer commands about shared memory (whose, export) and the late
 * exporter lookup. Layer 5 (a wrapper module: export/import and legacy CUDA IPC live in ipc.c). */
#ifndef GS_IPC_H
#define GS_IPC_H

#include <stddef.h>
#include <stdint.h>

struct gs_alloc;

/* What an exported fd is: one of this process's allocations or multicast objects. */
struct gs_origin {
    uint64_t id;
    int is_mc;
    size_t size;
};
/* 0 with *out; -1 not exported here; -2 state lock busy. err says why. */
int gs_whose_fd(int fd, struct gs_origin *out, char *err, size_t errlen);
/* A fresh POSIX fd of allocation id (of a released one, a dup of the fd its release kept): 0 with
 * *fd_out; -1 failed (err begins with "gone" when the allocation no longer exists, or is released
 * without a kept fd); -2 state lock busy. */
int gs_export_id(uint64_t id, int *fd_out, char *err, size_t errlen);
/* The same for a known allocation, with the state lock held by the caller: -1 with err. */
int gs_export_alloc(struct gs_alloc *a, int *fd_out, char *err, size_t errlen);
/* ipcget: the driver's CUDA IPC handle (64 bytes) of memory at va that a lazy handle was given out
 * for, taken now. 0; -1 failed (err begins with "gone" when no such handle was given or the
 * memory was freed); -2 state lock busy. */
int gs_ipc_get(uint64_t va, unsigned char out[64], char *err, size_t errlen);
/* Tries again to find the exporters of imports made before their exporter was known. Returns the
 * number still unresolved, or -1 if the state lock stayed busy. Call without the state lock (it
 * is taken with a timeout: this runs on the control threads). */
int gs_resolve_pending_imports(void);

#endif
