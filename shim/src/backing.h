/* backing.h: the shim's own exportable cuMem memory behind large cuMemAlloc and stream-ordered
 * allocations (the driver restores neither legacy IPC imports nor the ability to export such
 * memory, and its checkpoint moves it slowly). Layer 4 (calls the driver, records in track). */
#ifndef GS_BACKING_H
#define GS_BACKING_H

#include <cuda.h>
#include <stddef.h>

#include "track.h"

/* Allocations below this many bytes stay the driver's (CRIU_GPUSHARE_MALLOC_MIN, default 2 MiB;
 * 0 turns backing off). */
size_t gs_backing_min(void);

/* The properties of the backing's memory (and of memory re-created without its own): pinned on
 * dev, exportable as a POSIX fd. */
void gs_backing_prop(CUmemAllocationProp *prop, int dev);

/* bytesize rounded up to the backing's granularity on dev; 0 when the driver cannot say. */
size_t gs_backing_rounded(size_t bytesize, int dev);

/* New memory of at least bytesize on dev: created, VA reserved, mapped with access, and recorded
 * as an allocation of origin (GS_ORIGIN_MALLOC or GS_ORIGIN_ASYNC, with its pool). Everything is
 * undone on failure. Call without the state lock. */
CUresult gs_backing_alloc(CUdeviceptr *va, size_t bytesize, int dev, int origin, CUmemoryPool pool,
                          const CUmemAccessDesc *access, int n_access);

/* Records memory already created and mapped (a block a pool kept) as a new allocation. Lock held. */
void gs_backing_record(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h, int dev,
                       int origin, CUmemoryPool pool, const CUmemAccessDesc *access, int n_access);

/* Forgets the backed allocation at va (its records and export dups): 0 with its current handle,
 * size and (pool not NULL) pool, NULL unless stream-ordered; -1 when va is not one. Lock held. */
int gs_backing_forget(CUdeviceptr va, CUmemGenericAllocationHandle *h, size_t *size,
                      CUmemoryPool *pool);

/* Unmaps, frees the VA and releases the memory (after the work using it is done). */
CUresult gs_backing_destroy(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h);

#endif
