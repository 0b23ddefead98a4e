/* status.h: the `status` reply (protocol.md, "status"). Layer 6 (reads track, gates, devices). */
#ifndef GS_STATUS_H
#define GS_STATUS_H

#include "json.h"

/* Every tracked object as reply fields (the text between the envelope's braces). Takes the state
 * lock with its timeout: 0, or -1 when it stayed busy. */
int gs_status_json(struct gs_buf *b);

#endif
