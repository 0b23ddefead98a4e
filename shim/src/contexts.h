/* contexts.h: contexts the program creates with cuCtxCreate, so the drain reaches them. Layer 5. */
#ifndef GS_CONTEXTS_H
#define GS_CONTEXTS_H

#include <cuda.h>
#include <stddef.h>

/* Synchronizes every context the program created with cuCtxCreate (the drain's second half). */
CUresult gs_sync_created_contexts(char *what, size_t whatlen);
void gs_contexts_reset_after_fork(void);

#endif
