/* contexts.h: contexts the program creates with cuCtxCreate, so the drain reaches them; the stack
 * reservation of every context while the memory is out. Layer 5. */
#ifndef GS_CONTEXTS_H
#define GS_CONTEXTS_H

#include <cuda.h>
#include <stddef.h>

/* Synchronizes every context the program created with cuCtxCreate (the drain's second half). */
CUresult gs_sync_created_contexts(char *what, size_t whatlen);
/* After a release: every context's stack limit set to 0 (its local memory given back, so the
 * driver's checkpoint does not copy it), the program's values kept; -> contexts lowered now. */
int gs_contexts_lower_stacks(void);
/* Before the gates open: the program's stack limits set again (a failure: a line on stderr). */
void gs_contexts_restore_stacks(void);
void gs_contexts_reset_after_fork(void);

#endif
