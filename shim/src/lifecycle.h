/* lifecycle.h: the shim's side of suspend/resume (protocol.md, "Suspend and resume"). Layer 6
 * (above the wrappers: it drives the driver on the records track.c keeps).
 *
 * The gs_lc_* operations run with the state lock held and the process quiesced (commands.c sees
 * to both). Each returns 0 with its reply fields in body, or one of the codes below with the
 * reason in err.
 */
#ifndef GS_LIFECYCLE_H
#define GS_LIFECYCLE_H

#include <stddef.h>
#include <stdint.h>

#include "devices.h"
#include "json.h"

enum { GS_LC_FAILED = -1, GS_LC_GONE = -2, GS_LC_REFUSED = -3, GS_LC_BUSY = -4 };

/* imports_only: the group's first pass (every importer drops its imports before any owner drops
 * memory, so a failure never leaves an import mapping memory that a rollback re-creates). */
int gs_lc_release(int imports_only, int keep, struct gs_buf *body, char *err, size_t errlen);
/* The fds a release with keep took closed (their memory goes once nothing else holds it). */
int gs_lc_drop_kept(struct gs_buf *body);
int gs_lc_void_exports(struct gs_buf *body, char *err, size_t errlen);
/* map (or NULL): this process's ordinals old -> new for everything still released (see
 * lifecycle.c, "devices map"); recreate and adopt both apply it, once per object. */
int gs_lc_recreate(const struct gs_devmap *map, struct gs_buf *body, char *err, size_t errlen);
/* dev < 0: the device the import's mappings give access to (after map). */
int gs_lc_adopt(uint64_t id, int dev, const struct gs_devmap *map, struct gs_buf *body,
                char *err, size_t errlen);
/* fd: the exporter's memory; not closed here. */
int gs_lc_attach(uint64_t id, int fd, struct gs_buf *body, char *err, size_t errlen);
int gs_lc_export_import(uint64_t id, int *fd_out, char *err, size_t errlen);
/* Before the gates open (takes the state lock itself): GS_LC_REFUSED while memory is still
 * released, re-registers released host buffers at their device pointers (GS_LC_FAILED on
 * failure), GS_LC_BUSY when the state lock stays busy. */
int gs_lifecycle_before_resume(char *err, size_t errlen);

#endif
