/* commands.c: what the control server does with a request (protocol.md).
 *
 * A request is parsed (json.c: bounded, strict), its version checked, and its command looked up in
 * one table that says, per command, whether it takes an fd, needs an "id", needs the quiesced
 * state and runs under the state lock; the dispatcher enforces all four before the handler runs,
 * so handlers only read their own fields. Every reply, error or not, is valid JSON whatever the
 * request held (gs_buf_str).
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "criu_gpushare_shim.h"
#include "devices.h"
#include "gates.h"
#include "ipc.h"
#include "lifecycle.h"
#include "pools.h"
#include "status.h"
#include "track.h"

/* ---- replies ---------------------------------------------------------------------------------- */

void gs_reply_init(struct gs_reply *r)
{
    memset(r, 0, sizeof(*r));
}

int gs_reply_add_fd(struct gs_reply *r, int fd)
{
    if (r->nfds == GS_REPLY_MAX_FDS) {
        close(fd);
        return -1;
    }
    r->fds[r->nfds++] = fd;
    return 0;
}

void gs_reply_fail(struct gs_reply *r, const char *code, const char *fmt, ...)
{
    r->error = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->reason, sizeof(r->reason), fmt, ap);
    va_end(ap);
}

void gs_reply_text(const struct gs_reply *r, struct gs_buf *out)
{
    const char *code = r->error, *reason = r->reason;
    if (!code && r->body.oom) {
        code = "failed";
        reason = "out of memory building the reply";
    }
    gs_buf_printf(out, "{\"v\":%d,\"ok\":%s", CRIU_GPUSHARE_PROTOCOL, code ? "false" : "true");
    if (code) {
        gs_buf_printf(out, ",\"error\":");
        gs_buf_str(out, code);
        if (!strcmp(code, "version")) /* the version this shim speaks, for the client's message */
            gs_buf_printf(out, ",\"protocol\":%d", CRIU_GPUSHARE_PROTOCOL);
        gs_buf_printf(out, ",\"reason\":");
        gs_buf_str(out, reason);
    } else if (r->body.n) {
        gs_buf_printf(out, ",%s", r->body.p);
    }
    gs_buf_printf(out, "}");
}

void gs_reply_free(struct gs_reply *r)
{
    for (int i = 0; i < r->nfds; i++)
        close(r->fds[i]);
    r->nfds = 0;
    gs_buf_free(&r->body);
}

/* ---- handlers ----------------------------------------------------------------------------------- */

struct call {
    const struct gs_json *req;
    uint64_t id;     /* "id", for commands that need one */
    int fd;          /* the fd, for commands that take one */
    struct gs_reply *out;
    char err[320];   /* reason buffer for the modules below */
};

static void cmd_status(struct call *c)
{
    if (gs_status_json(&c->out->body))
        gs_reply_fail(c->out, "busy", "state lock held for 2 s (an application thread is stopped "
                                      "inside the shim?)");
}

static void cmd_quiesce(struct call *c)
{
    const struct gs_json_field *t = gs_json_get(c->req, "timeout_ms", 'i');
    long long timeout = t ? t->num : 2000;
    if (timeout < 1 || timeout > 600000) {
        gs_reply_fail(c->out, "bad-request", "timeout_ms must be between 1 and 600000");
        return;
    }
    gs_resolve_pending_imports();
    char untracked[512];
    if (gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        gs_reply_fail(c->out, "busy", "state lock held for 2 s");
        return;
    }
    int n = gs_untracked(untracked, sizeof(untracked));
    gs_unlock();
    if (n) {
        gs_reply_fail(c->out, "refused", "%s", untracked);
        return;
    }
    if (gs_quiesce((int)timeout, c->err, sizeof(c->err))) {
        gs_reply_fail(c->out, "busy", "%s", c->err);
        return;
    }
    gs_pools_trim(); /* drained: the blocks the pools keep free are nobody's data */
    gs_buf_printf(&c->out->body, "\"quiesced\":true");
}

/* Host memory released by `release` is registered again first; the gates stay closed while
 * anything is still released. */
static void cmd_resume(struct call *c)
{
    int r = gs_lifecycle_before_resume(c->err, sizeof(c->err));
    if (r) {
        gs_reply_fail(c->out, r == GS_LC_BUSY ? "busy" : r == GS_LC_REFUSED ? "refused" : "failed",
                      "%s", c->err);
        return;
    }
    gs_resume();
    gs_buf_printf(&c->out->body, "\"resumed\":true");
}

static void cmd_whose(struct call *c)
{
    struct gs_origin o;
    int r = gs_whose_fd(c->fd, &o, c->err, sizeof(c->err));
    if (r) {
        gs_reply_fail(c->out, r == -2 ? "busy" : "not-ours", "%s", c->err);
        return;
    }
    gs_buf_printf(&c->out->body, "\"id\":%llu,\"multicast\":%s,\"size\":%zu",
                  (unsigned long long)o.id, o.is_mc ? "true" : "false", o.size);
}

/* export and ipcget: -2 busy, -1 failed, "gone" when the reason says so. */
static int memory_result(struct call *c, int r)
{
    if (r)
        gs_reply_fail(c->out, r == -2 ? "busy" : strncmp(c->err, "gone", 4) == 0 ? "gone" : "failed",
                      "%s", c->err);
    return r;
}

/* "ids": "3,7,12": the ids of an `export` of many allocations at once (up to GS_REPLY_MAX_FDS). */
static int parse_ids(const char *s, uint64_t *ids, int max, int *n)
{
    for (*n = 0; *n < max; s++) {
        if (*s < '0' || *s > '9') /* strtoull would take signs and blanks */
            return -1;
        char *end;
        ids[*n] = strtoull(s, &end, 10);
        if (ids[(*n)++] == 0 || (*end && *end != ','))
            return -1;
        if (!*end)
            return 0;
        s = end; /* at the comma: a digit must follow */
    }
    return -1; /* more than max */
}

/* One allocation ("id") or many ("ids", one round trip for a copy of many small ones): the fds
 * in the order named. A failure sends none. */
static void cmd_export(struct call *c)
{
    const struct gs_json_field *id = gs_json_get(c->req, "id", 'i');
    const struct gs_json_field *list = gs_json_get(c->req, "ids", 's');
    uint64_t ids[GS_REPLY_MAX_FDS];
    int n = 1;
    if (id && !list && id->num > 0)
        ids[0] = (uint64_t)id->num;
    else if (id || !list || parse_ids(list->str, ids, GS_REPLY_MAX_FDS, &n)) {
        gs_reply_fail(c->out, "bad-request", "export needs \"id\" (a positive integer) or \"ids\" "
                      "(up to %d of them, comma-separated)", GS_REPLY_MAX_FDS);
        return;
    }
    for (int i = 0; i < n; i++) {
        int fd = -1;
        if (memory_result(c, gs_export_id(ids[i], &fd, c->err, sizeof(c->err))))
            return; /* a failed reply carries no fd; gs_reply_free closes those taken */
        gs_reply_add_fd(c->out, fd);
    }
}

static void cmd_ipcget(struct call *c)
{
    const struct gs_json_field *va = gs_json_get(c->req, "va", 'i');
    unsigned char h[64];
    if (!va || va->num <= 0) {
        gs_reply_fail(c->out, "bad-request", "ipcget needs \"va\": a positive integer");
        return;
    }
    if (memory_result(c, gs_ipc_get((uint64_t)va->num, h, c->err, sizeof(c->err))))
        return;
    gs_buf_printf(&c->out->body, "\"handle\":");
    gs_buf_hex(&c->out->body, h, sizeof(h));
}

/* The suspend/resume operations (lifecycle.c) and what their results mean on the wire. */
static int lifecycle_result(struct call *c, int rc)
{
    if (rc)
        gs_reply_fail(c->out, rc == GS_LC_GONE ? "gone" : rc == GS_LC_REFUSED ? "refused" : "failed",
                      "%s", c->err);
    return rc;
}

static void cmd_release(struct call *c)
{
    const struct gs_json_field *only = gs_json_get(c->req, "only", 's');
    const struct gs_json_field *keep = gs_json_get(c->req, "keep", 's');
    if (only && strcmp(only->str, "imports")) {
        gs_reply_fail(c->out, "bad-request", "release: \"only\" can only be \"imports\"");
        return;
    }
    if ((keep && strcmp(keep->str, "fds")) || (!keep && gs_json_has(c->req, "keep"))) {
        gs_reply_fail(c->out, "bad-request", "release: \"keep\" can only be \"fds\"");
        return;
    }
    lifecycle_result(c, gs_lc_release(only != NULL, keep != NULL, &c->out->body, c->err,
                                      sizeof(c->err)));
}

static void cmd_drop_kept(struct call *c)
{
    lifecycle_result(c, gs_lc_drop_kept(&c->out->body));
}

static void cmd_void_exports(struct call *c)
{
    lifecycle_result(c, gs_lc_void_exports(&c->out->body, c->err, sizeof(c->err)));
}

/* recreate and adopt run after a driver restore, which may have put the process on other GPUs:
 * the devices are read again first. Their optional "devices" field ("OLD:NEW,...", this process's
 * ordinals) moves released memory to other devices. Returns 0 with *map (NULL: none), else -1
 * with the reply failed. */
static int devices_arg(struct call *c, struct gs_devmap *storage, const struct gs_devmap **map)
{
    gs_devices_refresh();
    *map = NULL;
    if (!gs_json_has(c->req, "devices"))
        return 0;
    const struct gs_json_field *f = gs_json_get(c->req, "devices", 's');
    struct gs_devices d;
    gs_devices_get(&d);
    if (!f) {
        gs_reply_fail(c->out, "bad-request", "\"devices\" must be a string of OLD:NEW pairs");
        return -1;
    }
    if (gs_devmap_parse(f->str, d.n, storage, c->err, sizeof(c->err))) {
        gs_reply_fail(c->out, "bad-request", "%s", c->err);
        return -1;
    }
    *map = storage;
    return 0;
}

static void cmd_recreate(struct call *c)
{
    struct gs_devmap storage;
    const struct gs_devmap *map;
    if (devices_arg(c, &storage, &map) == 0)
        lifecycle_result(c, gs_lc_recreate(map, &c->out->body, c->err, sizeof(c->err)));
}

static void cmd_adopt(struct call *c)
{
    const struct gs_json_field *dev = gs_json_get(c->req, "device", 'i');
    struct gs_devmap storage;
    const struct gs_devmap *map;
    if (devices_arg(c, &storage, &map) == 0)
        lifecycle_result(c, gs_lc_adopt(c->id, dev ? (int)dev->num : -1, map, &c->out->body,
                                        c->err, sizeof(c->err)));
}

static void cmd_attach(struct call *c)
{
    lifecycle_result(c, gs_lc_attach(c->id, c->fd, &c->out->body, c->err, sizeof(c->err)));
}

static void cmd_export_import(struct call *c)
{
    int fd = -1;
    if (!lifecycle_result(c, gs_lc_export_import(c->id, &fd, c->err, sizeof(c->err))))
        gs_reply_add_fd(c->out, fd);
}

/* ---- the table ----------------------------------------------------------------------------------- */

static const struct command {
    const char *name;
    int takes_fd;  /* exactly one fd comes with it (any other command: none) */
    int needs_id;  /* "id": a positive integer */
    int quiesced;  /* refused (not-quiesced) unless a finished quiesce closed both gates */
    int locked;    /* runs with the state lock held (taken with its timeout: else busy) */
    void (*run)(struct call *c);
} commands[] = {
    {"status", 0, 0, 0, 0, cmd_status},
    {"quiesce", 0, 0, 0, 0, cmd_quiesce},
    {"resume", 0, 0, 0, 0, cmd_resume},
    {"whose", 1, 0, 0, 0, cmd_whose},
    {"export", 0, 0, 0, 0, cmd_export}, /* checks "id" or "ids" itself */
    {"ipcget", 0, 0, 0, 0, cmd_ipcget},
    {"release", 0, 0, 1, 1, cmd_release},
    {"void-exports", 0, 0, 1, 1, cmd_void_exports},
    {"drop-kept", 0, 0, 1, 0, cmd_drop_kept}, /* its own lock: works with threads frozen */
    {"recreate", 0, 0, 1, 1, cmd_recreate},
    {"adopt", 0, 1, 1, 1, cmd_adopt},
    {"attach", 1, 1, 1, 1, cmd_attach},
    {"export-import", 0, 1, 1, 1, cmd_export_import},
};

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

void gs_command_run(const char *text, size_t len, const int *fds, int nfds, struct gs_reply *r)
{
    struct gs_json req;
    char err[160];
    if (gs_json_parse(text, len, &req, err, sizeof(err))) {
        gs_reply_fail(r, "bad-request", "%s", err);
        return;
    }
    const struct gs_json_field *v = gs_json_get(&req, "v", 'i');
    if (!v) {
        gs_reply_fail(r, "version", "the request has no protocol version (\"v\": an integer); "
                      "this shim speaks %d", CRIU_GPUSHARE_PROTOCOL);
        return;
    }
    if (v->num != CRIU_GPUSHARE_PROTOCOL) {
        gs_reply_fail(r, "version", "protocol version %lld is not supported (this shim speaks %d)",
                      v->num, CRIU_GPUSHARE_PROTOCOL);
        return;
    }
    const struct gs_json_field *name = gs_json_get(&req, "cmd", 's');
    if (!name) {
        gs_reply_fail(r, "bad-request", "missing \"cmd\"");
        return;
    }
    const struct command *cmd = find_command(name->str);
    if (nfds && !(cmd && cmd->takes_fd)) {
        gs_reply_fail(r, "bad-request", "unexpected fd with this command");
        return;
    }
    if (!cmd) {
        gs_reply_fail(r, "unknown-command", "unknown command \"%.64s\"", name->str);
        return;
    }
    struct call c = {.req = &req, .fd = nfds ? fds[0] : -1, .out = r};
    const struct gs_json_field *id = gs_json_get(&req, "id", 'i');
    if (cmd->needs_id) {
        if (!id || id->num <= 0) {
            gs_reply_fail(r, "bad-request", "%s needs \"id\": a positive integer", cmd->name);
            return;
        }
        c.id = (uint64_t)id->num;
    }
    if (cmd->takes_fd && nfds != 1) {
        gs_reply_fail(r, "bad-request", "%s takes exactly one fd", cmd->name);
        return;
    }
    if (cmd->quiesced && !gs_quiesced(1)) {
        gs_reply_fail(r, "not-quiesced", "%s needs the process quiesced (send quiesce first)",
                      cmd->name);
        return;
    }
    if (cmd->locked && gs_lock_timed(GS_LOCK_TIMEOUT_MS)) {
        gs_reply_fail(r, "busy", "state lock held for 2 s (an application thread is stopped "
                                 "inside the shim?)");
        return;
    }
    cmd->run(&c);
    if (cmd->locked)
        gs_unlock();
}
