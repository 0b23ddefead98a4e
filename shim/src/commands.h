/* commands.h: the control protocol's requests and replies (protocol.md): parsing, the version
 * check, the command table and its handlers. Layer 7 (below only the server, which carries the
 * bytes). */
#ifndef GS_COMMANDS_H
#define GS_COMMANDS_H

#include <stddef.h>

#include "json.h"
#include "wire.h"

#define GS_REPLY_MAX_FDS GS_MAX_SEND_FDS /* an `export` of "ids" names at most this many */

struct gs_reply {
    const char *error; /* NULL: success */
    char reason[400];  /* with error */
    struct gs_buf body; /* with success: the reply's fields after "ok" */
    int fds[GS_REPLY_MAX_FDS]; /* sent with the reply (closed by gs_reply_free) */
    int nfds;
};
void gs_reply_init(struct gs_reply *r);
void gs_reply_fail(struct gs_reply *r, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The reply's text, {"v":N,"ok":...}; out->oom when it could not be built. */
void gs_reply_text(const struct gs_reply *r, struct gs_buf *out);
void gs_reply_free(struct gs_reply *r);
/* Adds fd to the reply (the reply owns it from now on): 0, or -1 when it is full (fd closed). */
int gs_reply_add_fd(struct gs_reply *r, int fd);

/* Parses one request (any bytes) and runs it; fds came with it (the caller closes them). */
void gs_command_run(const char *req, size_t len, const int *fds, int nfds, struct gs_reply *r);

#endif
