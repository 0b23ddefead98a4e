/* gates.h: holding the program's GPU work on command (quiesce/resume) and the drain. Layer 5 (a
 * wrapper module: the gated wrappers live in gates.c). */
#ifndef GS_GATES_H
#define GS_GATES_H

#include <stddef.h>

enum gs_gate_id { GS_GATE_LAUNCH = 0, GS_GATE_MEMORY = 1 };
/* Closes both gates in order and drains the GPU; on timeout reopens both. 0 = quiesced,
 * -1 = busy (reason in err). */
int gs_quiesce(int timeout_ms, char *err, size_t errlen);
/* Opens both gates once any quiesce in progress has finished. */
void gs_resume(void);
/* Both gates closed; with wait, by a finished quiesce (waits for a quiesce or resume in
 * progress), else as seen now. */
int gs_quiesced(int wait);
/* One gate as seen now, for status. */
void gs_gate_state(int gate, int *closed, long *inflight);
void gs_gates_reset_after_fork(void);

#endif
