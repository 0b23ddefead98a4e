/* pools.h: stream-ordered allocation and memory pools on the shim's own memory (pools.c). Layer 5
 * (a wrapper module over backing). */
#ifndef GS_POOLS_H
#define GS_POOLS_H

/* Releases every freed block the pools keep (quiesce: the work is drained, so a checkpoint never
 * carries a free block). Called from a control thread. */
void gs_pools_trim(void);
void gs_pools_reset_after_fork(void);

#endif
