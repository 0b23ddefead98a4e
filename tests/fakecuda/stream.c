/* Streams, events, copies, memsets, fake kernels and host functions.
 *
 * Every stream has a FIFO of operations run by its own worker thread (started at the first
 * operation). The NULL stream is the context's legacy stream: work on it waits for earlier work of
 * all blocking streams of the context, and work on a blocking stream waits for earlier work on it.
 * The _ptds/_ptsz entry points map the NULL stream to a per-thread default stream instead.
 * Synchronous copies and memsets run on the default stream and wait for it. */
#include "fake.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum fk_op_kind { OP_COPY, OP_COPY3D, OP_SET, OP_KERNEL, OP_EVENT, OP_WAIT, OP_HOSTFN, OP_CALLBACK, OP_MEMOP };
enum fk_kernel_kind { K_SLEEP_US, K_FILL32, K_ADD32, K_COPY8 };

struct fk_op {
    struct fk_op *next;
    enum fk_op_kind kind;
    unsigned long long seq;
    uintptr_t dst, src;
    size_t n;                  /* bytes for COPY; elements for SET and kernels */
    unsigned value;
    int elem;                  /* SET: 1, 2 or 4 bytes */
    size_t pitch, width, height; /* SET 2D (height 0: plain) */
    enum fk_kernel_kind kernel;
    struct fk_event *event;
    unsigned long long event_gen;
    struct fk_stream *wait_stream;
    unsigned long long wait_seq;
    CUhostFn hostfn;
    CUstreamCallback callback;
    CUstream callback_stream;
    void *data;
    struct fk_copy3d copy3d;
    struct fk_memop memop;
};

static CUresult fk_launch(CUfunction hf, CUstream hs, void **params, int pt);

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct fk_stream *all;
    unsigned long long next_id;
} fk_sq = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 1};

/* ---- the worker ---------------------------------------------------------------------------- */

static void fk_run_op(struct fk_op *op)
{
    switch (op->kind) {
    case OP_COPY:
        memmove((void *)op->dst, (const void *)op->src, op->n);
        break;
    case OP_COPY3D:
        for (size_t z = 0; z < op->copy3d.depth; z++)
            for (size_t y = 0; y < op->copy3d.height; y++)
                memmove((void *)(op->copy3d.dst + z * op->copy3d.dslice + y * op->copy3d.dpitch),
                        (const void *)(op->copy3d.src + z * op->copy3d.sslice + y * op->copy3d.spitch),
                        op->copy3d.width);
        break;
    case OP_MEMOP:
        fk_run_memop(&op->memop);
        break;
    case OP_SET:
        for (size_t row = 0; row < (op->height ? op->height : 1); row++) {
            uintptr_t base = op->dst + row * op->pitch;
            size_t count = op->height ? op->width : op->n;
            if (op->elem == 1) memset((void *)base, (int)(op->value & 0xff), count);
            else if (op->elem == 2)
                for (size_t i = 0; i < count; i++) ((uint16_t *)base)[i] = (uint16_t)op->value;
            else
                for (size_t i = 0; i < count; i++) ((uint32_t *)base)[i] = op->value;
        }
        break;
    case OP_KERNEL:
        switch (op->kernel) {
        case K_SLEEP_US: usleep((useconds_t)op->n); break;
        case K_FILL32: for (size_t i = 0; i < op->n; i++) ((uint32_t *)op->dst)[i] = op->value; break;
        case K_ADD32: for (size_t i = 0; i < op->n; i++) ((uint32_t *)op->dst)[i] += op->value; break;
        case K_COPY8: memmove((void *)op->dst, (const void *)op->src, op->n); break;
        }
        break;
    case OP_EVENT:
        if (op->event->gen == op->event_gen) op->event->time_ms = fk_now_ms();
        break;
    case OP_WAIT: /* handled in the worker loop, under fk_sq.mu */
        break;
    case OP_HOSTFN:
        op->hostfn(op->data);
        break;
    case OP_CALLBACK:
        op->callback(op->callback_stream, CUDA_SUCCESS, op->data);
        break;
    }
}

static void *fk_stream_worker(void *arg)
{
    struct fk_stream *s = arg;
    pthread_mutex_lock(&fk_sq.mu);
    for (;;) {
        while (!s->head && !s->destroyed) pthread_cond_wait(&fk_sq.cv, &fk_sq.mu);
        if (!s->head) break; /* destroyed and drained */
        struct fk_op *op = s->head;
        if (op->kind == OP_WAIT)
            while (op->wait_stream->completed < op->wait_seq) pthread_cond_wait(&fk_sq.cv, &fk_sq.mu);
        else {
            pthread_mutex_unlock(&fk_sq.mu);
            fk_run_op(op);
            pthread_mutex_lock(&fk_sq.mu);
        }
        s->head = op->next;
        if (!s->head) s->tail = NULL;
        s->completed = op->seq;
        free(op);
        pthread_cond_broadcast(&fk_sq.cv);
    }
    s->thread_started = 0;
    pthread_mutex_unlock(&fk_sq.mu);
    return NULL;
}

/* Caller holds fk_sq.mu. */
static void fk_append(struct fk_stream *s, struct fk_op *op)
{
    op->seq = ++s->submitted;
    op->next = NULL;
    if (s->tail) s->tail->next = op;
    else s->head = op;
    s->tail = op;
    if (!s->thread_started) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&s->thread, &attr, fk_stream_worker, s) == 0) s->thread_started = 1;
        else fk_log("cannot start a stream worker thread: %s", strerror(errno));
        pthread_attr_destroy(&attr);
    }
    pthread_cond_broadcast(&fk_sq.cv);
}

static void fk_append_wait(struct fk_stream *s, struct fk_stream *on, unsigned long long seq)
{
    struct fk_op *w = calloc(1, sizeof *w);
    w->kind = OP_WAIT;
    w->wait_stream = on;
    w->wait_seq = seq;
    fk_append(s, w);
}

/* Queue op on s with the legacy-stream ordering rules; returns its sequence number. */
static unsigned long long fk_submit(struct fk_stream *s, struct fk_op *op)
{
    pthread_mutex_lock(&fk_sq.mu);
    if (s->legacy) {
        for (struct fk_stream *o = fk_sq.all; o; o = o->next_all)
            if (o != s && o->ctx == s->ctx && !(o->flags & CU_STREAM_NON_BLOCKING) && o->completed < o->submitted)
                fk_append_wait(s, o, o->submitted);
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && s->ctx->legacy &&
               s->ctx->legacy->completed < s->ctx->legacy->submitted) {
        fk_append_wait(s, s->ctx->legacy, s->ctx->legacy->submitted);
    }
    fk_append(s, op);
    unsigned long long seq = op->seq;
    if (op->kind == OP_EVENT) { /* the event now stands for this point of the stream, atomically */
        op->event->stream = s;
        op->event->seq = seq;
    }
    pthread_mutex_unlock(&fk_sq.mu);
    return seq;
}

static void fk_wait_seq(struct fk_stream *s, unsigned long long seq)
{
    pthread_mutex_lock(&fk_sq.mu);
    while (s->completed < seq) pthread_cond_wait(&fk_sq.cv, &fk_sq.mu);
    pthread_mutex_unlock(&fk_sq.mu);
}

void fk_stream_sync_ctx(struct fk_ctx *c)
{
    pthread_mutex_lock(&fk_sq.mu);
    for (struct fk_stream *s = fk_sq.all; s; s = s->next_all) {
        if (s->ctx != c) continue;
        unsigned long long target = s->submitted;
        while (s->completed < target) pthread_cond_wait(&fk_sq.cv, &fk_sq.mu);
    }
    pthread_mutex_unlock(&fk_sq.mu);
}

/* Wait for all submitted work of the process; 0 when done, -1 at the deadline (0: none). */
int fk_streams_drain_until(double deadline_ms)
{
    int rc = 0;
    pthread_mutex_lock(&fk_sq.mu);
    for (struct fk_stream *s = fk_sq.all; s && rc == 0; s = s->next_all) {
        while (s->completed < s->submitted && rc == 0) {
            if (deadline_ms <= 0) {
                pthread_cond_wait(&fk_sq.cv, &fk_sq.mu);
                continue;
            }
            double left = deadline_ms - fk_now_ms();
            if (left <= 0) {
                rc = -1;
                break;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            long long ns = ts.tv_nsec + (long long)(left * 1e6);
            ts.tv_sec += ns / 1000000000;
            ts.tv_nsec = ns % 1000000000;
            pthread_cond_timedwait(&fk_sq.cv, &fk_sq.mu, &ts);
        }
    }
    pthread_mutex_unlock(&fk_sq.mu);
    return rc;
}

void fk_streams_drain_all(void) { fk_streams_drain_until(0); }

/* ---- stream handles -------------------------------------------------------------------------- */

static struct fk_stream *fk_stream_new(struct fk_ctx *c, unsigned flags, int priority)
{
    struct fk_stream *s = calloc(1, sizeof *s);
    s->magic = FK_STREAM_MAGIC;
    s->ctx = c;
    s->flags = flags;
    s->priority = priority;
    pthread_mutex_lock(&fk_sq.mu);
    s->id = fk_sq.next_id++;
    s->next_all = fk_sq.all;
    fk_sq.all = s;
    pthread_mutex_unlock(&fk_sq.mu);
    return s;
}

#define FK_PT_SLOTS 16
static __thread struct { struct fk_ctx *ctx; struct fk_stream *s; } fk_pt_streams[FK_PT_SLOTS];

static struct fk_stream *fk_default_stream(struct fk_ctx *c, int per_thread)
{
    if (per_thread) {
        for (int i = 0; i < FK_PT_SLOTS; i++)
            if (fk_pt_streams[i].ctx == c) return fk_pt_streams[i].s;
        struct fk_stream *s = fk_stream_new(c, 0, 0);
        s->per_thread = 1;
        for (int i = 0; i < FK_PT_SLOTS; i++)
            if (!fk_pt_streams[i].ctx) {
                fk_pt_streams[i].ctx = c;
                fk_pt_streams[i].s = s;
                break;
            }
        return s;
    }
    fk_lock();
    if (!c->legacy) {
        c->legacy = fk_stream_new(c, 0, 0);
        c->legacy->legacy = 1;
    }
    struct fk_stream *s = c->legacy;
    fk_unlock();
    return s;
}

/* ptds: the entry point was a _ptds/_ptsz twin, so NULL means the per-thread stream. */
static CUresult fk_stream_get(CUstream hs, int ptds, struct fk_stream **out)
{
    uintptr_t v = (uintptr_t)hs;
    if (v == 0 || v == (uintptr_t)CU_STREAM_LEGACY || v == (uintptr_t)CU_STREAM_PER_THREAD) {
        struct fk_ctx *c;
        CUresult r = fk_require_ctx(&c);
        if (r) return r;
        int per_thread = v == (uintptr_t)CU_STREAM_PER_THREAD || (v == 0 && ptds);
        *out = fk_default_stream(c, per_thread);
        return CUDA_SUCCESS;
    }
    struct fk_stream *s = (struct fk_stream *)hs;
    if (s->magic != FK_STREAM_MAGIC || s->destroyed) return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

/* Queue op on stream hs; sync: wait for it. Frees op on error. */
static CUresult fk_enqueue(CUstream hs, int ptds, struct fk_op *op, int sync)
{
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, ptds, &s);
    if (r) {
        free(op);
        return r;
    }
    unsigned long long seq = fk_submit(s, op);
    if (sync) fk_wait_seq(s, seq);
    return CUDA_SUCCESS;
}

CUresult fk_submit_copy3d(const struct fk_copy3d *c, CUstream hs, int pt, int sync)
{
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = OP_COPY3D;
    op->copy3d = *c;
    return fk_enqueue(hs, pt, op, sync);
}

CUresult fk_submit_memop(const struct fk_memop *m, CUstream hs, int pt)
{
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = OP_MEMOP;
    op->memop = *m;
    return fk_enqueue(hs, pt, op, 0);
}

CUresult fk_launch_function(CUfunction f, CUstream hs, void **params, int pt) { return fk_launch(f, hs, params, pt); }

CUresult fk_stream_lookup(CUstream hs, int pt, struct fk_stream **out) { return fk_stream_get(hs, pt, out); }
struct fk_stream *fk_stream_list(void) { return fk_sq.all; }
void fk_capture_lock(void) { pthread_mutex_lock(&fk_sq.mu); }
void fk_capture_unlock(void) { pthread_mutex_unlock(&fk_sq.mu); }

CUresult fk_stream_context(CUstream hs, int pt, struct fk_ctx **out)
{
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, pt, &s);
    if (r == CUDA_SUCCESS) *out = s->ctx;
    return r;
}

static void fk_stream_wait(struct fk_stream *s);
CUresult fk_stream_wait_all(CUstream hs, int pt)
{
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, pt, &s);
    if (r == CUDA_SUCCESS) fk_stream_wait(s);
    return r;
}

FK_EXPORT CUresult cuStreamCreate(CUstream *ph, unsigned int flags)
{
    FK_API("cuStreamCreate");
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    if (!ph || (flags & ~CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    *ph = (CUstream)fk_stream_new(c, flags, 0);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuStreamCreateWithPriority(CUstream *ph, unsigned int flags, int priority)
{
    FK_API("cuStreamCreateWithPriority");
    struct fk_ctx *c;
    CUresult r = fk_require_ctx(&c);
    if (r) return r;
    if (!ph || (flags & ~CU_STREAM_NON_BLOCKING)) return CUDA_ERROR_INVALID_VALUE;
    *ph = (CUstream)fk_stream_new(c, flags, priority);
    return CUDA_SUCCESS;
}

/* Work already queued still runs; the struct is never freed (events may point at it). */
FK_EXPORT CUresult cuStreamDestroy_v2(CUstream hs)
{
    FK_API("cuStreamDestroy_v2");
    struct fk_stream *s = (struct fk_stream *)hs;
    if (!s || s->magic != FK_STREAM_MAGIC || s->destroyed || s->legacy) return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&fk_sq.mu);
    s->destroyed = 1;
    pthread_cond_broadcast(&fk_sq.cv);
    pthread_mutex_unlock(&fk_sq.mu);
    return CUDA_SUCCESS;
}

#define SYNC_BODY(pt) fk_stream_synchronize(hs, pt)
static CUresult fk_stream_synchronize(CUstream hs, int pt)
{
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, pt, &s);
    if (r) return r;
    if ((r = fk_capture_unsafe_call())) return r;
    fk_stream_wait(s);
    return CUDA_SUCCESS;
}

static void fk_stream_wait(struct fk_stream *s)
{
    pthread_mutex_lock(&fk_sq.mu);
    unsigned long long target = s->submitted;
    pthread_mutex_unlock(&fk_sq.mu);
    fk_wait_seq(s, target);
}
FK_PAIR(cuStreamSynchronize, cuStreamSynchronize_ptsz, (CUstream hs), SYNC_BODY)

#define QUERY_BODY(pt) fk_stream_query(hs, pt)
static CUresult fk_stream_query(CUstream hs, int pt)
{
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, pt, &s);
    if (r) return r;
    pthread_mutex_lock(&fk_sq.mu);
    r = s->completed < s->submitted ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&fk_sq.mu);
    return r;
}
FK_PAIR(cuStreamQuery, cuStreamQuery_ptsz, (CUstream hs), QUERY_BODY)

#define GETFLAGS_BODY(pt) fk_stream_info(hs, pt, flags, NULL, NULL, NULL)
#define GETPRIO_BODY(pt) fk_stream_info(hs, pt, NULL, priority, NULL, NULL)
#define GETCTX_BODY(pt) fk_stream_info(hs, pt, NULL, NULL, pctx, NULL)
#define GETID_BODY(pt) fk_stream_info(hs, pt, NULL, NULL, NULL, id)
static CUresult fk_stream_info(CUstream hs, int pt, unsigned *flags, int *prio, CUcontext *pctx,
                               unsigned long long *id)
{
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, pt, &s);
    if (r) return r;
    if (flags) *flags = s->flags;
    if (prio) *prio = s->priority;
    if (pctx) *pctx = (CUcontext)s->ctx;
    if (id) *id = s->id;
    return CUDA_SUCCESS;
}
FK_PAIR(cuStreamGetFlags, cuStreamGetFlags_ptsz, (CUstream hs, unsigned int *flags), GETFLAGS_BODY)
FK_PAIR(cuStreamGetPriority, cuStreamGetPriority_ptsz, (CUstream hs, int *priority), GETPRIO_BODY)
FK_PAIR(cuStreamGetCtx, cuStreamGetCtx_ptsz, (CUstream hs, CUcontext *pctx), GETCTX_BODY)
FK_PAIR(cuStreamGetId, cuStreamGetId_ptsz, (CUstream hs, unsigned long long *id), GETID_BODY)

/* ---- events ------------------------------------------------------------------------------------ */

FK_EXPORT CUresult cuEventCreate(CUevent *ph, unsigned int flags)
{
    FK_API("cuEventCreate");
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if (!ph) return CUDA_ERROR_INVALID_VALUE;
    struct fk_event *e = calloc(1, sizeof *e);
    e->magic = FK_EVENT_MAGIC;
    e->flags = flags;
    *ph = (CUevent)e;
    return CUDA_SUCCESS;
}

static struct fk_event *fk_event_get(CUevent h)
{
    struct fk_event *e = (struct fk_event *)h;
    return e && e->magic == FK_EVENT_MAGIC ? e : NULL;
}

FK_EXPORT CUresult cuEventDestroy_v2(CUevent h)
{
    FK_API("cuEventDestroy_v2");
    struct fk_event *e = fk_event_get(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    e->magic = 0; /* kept: a queued record may still point at it */
    return CUDA_SUCCESS;
}

#define RECORD_BODY(pt) fk_event_record(h, hs, pt)
#define RECORDF_BODY(pt) ((void)flags, fk_event_record(h, hs, pt))
static CUresult fk_event_record(CUevent h, CUstream hs, int pt)
{
    struct fk_event *e = fk_event_get(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, pt, &s);
    if (r) return r;
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = OP_EVENT;
    op->event = e;
    pthread_mutex_lock(&fk_sq.mu);
    op->event_gen = ++e->gen;
    pthread_mutex_unlock(&fk_sq.mu);
    fk_submit(s, op);
    return CUDA_SUCCESS;
}
FK_PAIR(cuEventRecord, cuEventRecord_ptsz, (CUevent h, CUstream hs), RECORD_BODY)
FK_PAIR(cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz, (CUevent h, CUstream hs, unsigned int flags),
        RECORDF_BODY)

FK_EXPORT CUresult cuEventQuery(CUevent h)
{
    FK_API("cuEventQuery");
    struct fk_event *e = fk_event_get(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r0 = fk_capture_unsafe_call();
    if (r0) return r0;
    pthread_mutex_lock(&fk_sq.mu);
    CUresult r = e->stream && e->stream->completed < e->seq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&fk_sq.mu);
    return r;
}

FK_EXPORT CUresult cuEventSynchronize(CUevent h)
{
    FK_API("cuEventSynchronize");
    struct fk_event *e = fk_event_get(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r0 = fk_capture_unsafe_call();
    if (r0) return r0;
    pthread_mutex_lock(&fk_sq.mu);
    struct fk_stream *s = e->stream;
    unsigned long long seq = e->seq;
    pthread_mutex_unlock(&fk_sq.mu);
    if (s) fk_wait_seq(s, seq);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuEventElapsedTime_v2(float *ms, CUevent start, CUevent end)
{
    FK_API("cuEventElapsedTime_v2");
    struct fk_event *a = fk_event_get(start), *b = fk_event_get(end);
    if (!ms) return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || (a->flags & CU_EVENT_DISABLE_TIMING) || (b->flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&fk_sq.mu);
    CUresult r = CUDA_SUCCESS;
    if (!a->stream || !b->stream) r = CUDA_ERROR_INVALID_HANDLE;
    else if (a->stream->completed < a->seq || b->stream->completed < b->seq) r = CUDA_ERROR_NOT_READY;
    else *ms = (float)(b->time_ms - a->time_ms);
    pthread_mutex_unlock(&fk_sq.mu);
    return r;
}

FK_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    return cuEventElapsedTime_v2(ms, start, end);
}

#define WAITEV_BODY(pt) fk_stream_wait_event(hs, h, flags, pt)
static CUresult fk_stream_wait_event(CUstream hs, CUevent h, unsigned flags, int pt)
{
    (void)flags;
    struct fk_event *e = fk_event_get(h);
    if (!e) return CUDA_ERROR_INVALID_HANDLE;
    struct fk_stream *s;
    CUresult r = fk_stream_get(hs, pt, &s);
    if (r) return r;
    pthread_mutex_lock(&fk_sq.mu);
    struct fk_stream *on = e->stream;
    unsigned long long seq = e->seq;
    pthread_mutex_unlock(&fk_sq.mu);
    if (!on || on == s) return CUDA_SUCCESS;
    struct fk_op *w = calloc(1, sizeof *w);
    w->kind = OP_WAIT;
    w->wait_stream = on;
    w->wait_seq = seq;
    fk_submit(s, w);
    return CUDA_SUCCESS;
}
FK_PAIR(cuStreamWaitEvent, cuStreamWaitEvent_ptsz, (CUstream hs, CUevent h, unsigned int flags), WAITEV_BODY)

/* ---- copies ------------------------------------------------------------------------------------ */

/* dst_dev/src_dev: 1 when that side must be device (or pinned) memory; 0 for any host memory. */
static CUresult fk_copy(uintptr_t dst, uintptr_t src, size_t n, int dst_dev, int src_dev, CUstream hs, int pt,
                        int sync)
{
    if (n == 0) return CUDA_SUCCESS;
    if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if ((r = fk_check_range(dst, n, dst_dev, 1)) || (r = fk_check_range(src, n, src_dev, 0))) return r;
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = OP_COPY;
    op->dst = dst;
    op->src = src;
    op->n = n;
    return fk_enqueue(hs, pt, op, sync);
}

#define COPY_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 0, 0, NULL, pt, 1)
#define HTOD_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 1, 0, NULL, pt, 1)
#define DTOH_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 0, 1, NULL, pt, 1)
#define DTOD_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 1, 1, NULL, pt, 1)
#define PEER_BODY(pt) ((void)dctx, (void)sctx, fk_copy((uintptr_t)dst, (uintptr_t)src, n, 1, 1, NULL, pt, 1))
#define COPYA_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 0, 0, hs, pt, 0)
#define HTODA_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 1, 0, hs, pt, 0)
#define DTOHA_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 0, 1, hs, pt, 0)
#define DTODA_BODY(pt) fk_copy((uintptr_t)dst, (uintptr_t)src, n, 1, 1, hs, pt, 0)
#define PEERA_BODY(pt) ((void)dctx, (void)sctx, fk_copy((uintptr_t)dst, (uintptr_t)src, n, 1, 1, hs, pt, 0))

FK_PAIR(cuMemcpy, cuMemcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n), COPY_BODY)
FK_PAIR(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, (CUdeviceptr dst, const void *src, size_t n), HTOD_BODY)
FK_PAIR(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, (void *dst, CUdeviceptr src, size_t n), DTOH_BODY)
FK_PAIR(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n), DTOD_BODY)
FK_PAIR(cuMemcpyPeer, cuMemcpyPeer_ptds,
        (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n), PEER_BODY)
FK_PAIR(cuMemcpyAsync, cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs),
        COPYA_BODY)
FK_PAIR(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz,
        (CUdeviceptr dst, const void *src, size_t n, CUstream hs), HTODA_BODY)
FK_PAIR(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, (void *dst, CUdeviceptr src, size_t n, CUstream hs),
        DTOHA_BODY)
FK_PAIR(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz,
        (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs), DTODA_BODY)
FK_PAIR(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz,
        (CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream hs), PEERA_BODY)

/* ---- memsets ------------------------------------------------------------------------------------ */

static CUresult fk_memset(uintptr_t dst, unsigned value, int elem, size_t count, size_t pitch, size_t height,
                          CUstream hs, int pt, int sync)
{
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if (dst % (uintptr_t)elem) return CUDA_ERROR_INVALID_VALUE;
    size_t rows = height ? height : 1;
    size_t span = height ? pitch * (rows - 1) + count * (size_t)elem : count * (size_t)elem;
    if (height && pitch < count * (size_t)elem) return CUDA_ERROR_INVALID_VALUE;
    if (span == 0) return CUDA_SUCCESS;
    if ((r = fk_check_range(dst, span, 1, 1))) return r;
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = OP_SET;
    op->dst = dst;
    op->value = value;
    op->elem = elem;
    op->n = count;
    op->width = count;
    op->pitch = pitch;
    op->height = height;
    return fk_enqueue(hs, pt, op, sync);
}

#define SET8_BODY(pt) fk_memset((uintptr_t)dst, uc, 1, n, 0, 0, NULL, pt, 1)
#define SET16_BODY(pt) fk_memset((uintptr_t)dst, us, 2, n, 0, 0, NULL, pt, 1)
#define SET32_BODY(pt) fk_memset((uintptr_t)dst, ui, 4, n, 0, 0, NULL, pt, 1)
#define SET8A_BODY(pt) fk_memset((uintptr_t)dst, uc, 1, n, 0, 0, hs, pt, 0)
#define SET16A_BODY(pt) fk_memset((uintptr_t)dst, us, 2, n, 0, 0, hs, pt, 0)
#define SET32A_BODY(pt) fk_memset((uintptr_t)dst, ui, 4, n, 0, 0, hs, pt, 0)
#define SET2D8_BODY(pt) fk_memset((uintptr_t)dst, uc, 1, w, pitch, h, NULL, pt, 1)
#define SET2D16_BODY(pt) fk_memset((uintptr_t)dst, us, 2, w, pitch, h, NULL, pt, 1)
#define SET2D32_BODY(pt) fk_memset((uintptr_t)dst, ui, 4, w, pitch, h, NULL, pt, 1)
#define SET2D8A_BODY(pt) fk_memset((uintptr_t)dst, uc, 1, w, pitch, h, hs, pt, 0)
#define SET2D16A_BODY(pt) fk_memset((uintptr_t)dst, us, 2, w, pitch, h, hs, pt, 0)
#define SET2D32A_BODY(pt) fk_memset((uintptr_t)dst, ui, 4, w, pitch, h, hs, pt, 0)

FK_PAIR(cuMemsetD8_v2, cuMemsetD8_v2_ptds, (CUdeviceptr dst, unsigned char uc, size_t n), SET8_BODY)
FK_PAIR(cuMemsetD16_v2, cuMemsetD16_v2_ptds, (CUdeviceptr dst, unsigned short us, size_t n), SET16_BODY)
FK_PAIR(cuMemsetD32_v2, cuMemsetD32_v2_ptds, (CUdeviceptr dst, unsigned int ui, size_t n), SET32_BODY)
FK_PAIR(cuMemsetD8Async, cuMemsetD8Async_ptsz, (CUdeviceptr dst, unsigned char uc, size_t n, CUstream hs),
        SET8A_BODY)
FK_PAIR(cuMemsetD16Async, cuMemsetD16Async_ptsz, (CUdeviceptr dst, unsigned short us, size_t n, CUstream hs),
        SET16A_BODY)
FK_PAIR(cuMemsetD32Async, cuMemsetD32Async_ptsz, (CUdeviceptr dst, unsigned int ui, size_t n, CUstream hs),
        SET32A_BODY)
FK_PAIR(cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, (CUdeviceptr dst, size_t pitch, unsigned char uc, size_t w, size_t h),
        SET2D8_BODY)
FK_PAIR(cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds,
        (CUdeviceptr dst, size_t pitch, unsigned short us, size_t w, size_t h), SET2D16_BODY)
FK_PAIR(cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds, (CUdeviceptr dst, size_t pitch, unsigned int ui, size_t w, size_t h),
        SET2D32_BODY)
FK_PAIR(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz,
        (CUdeviceptr dst, size_t pitch, unsigned char uc, size_t w, size_t h, CUstream hs), SET2D8A_BODY)
FK_PAIR(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz,
        (CUdeviceptr dst, size_t pitch, unsigned short us, size_t w, size_t h, CUstream hs), SET2D16A_BODY)
FK_PAIR(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz,
        (CUdeviceptr dst, size_t pitch, unsigned int ui, size_t w, size_t h, CUstream hs), SET2D32A_BODY)

/* ---- modules and fake kernels ----------------------------------------------------------------- */

static const struct { const char *name; enum fk_kernel_kind kind; int nparams; } fk_kernels[] = {
    {"sleep_us", K_SLEEP_US, 1},
    {"fill32", K_FILL32, 3},
    {"add32", K_ADD32, 3},
    {"copy8", K_COPY8, 3},
};
static struct fk_func fk_funcs[sizeof fk_kernels / sizeof fk_kernels[0]];

static CUresult fk_module_load(CUmodule *m, const void *image)
{
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    if (!m || !image) return CUDA_ERROR_INVALID_VALUE;
    if (memcmp(image, "fakecuda", 8) != 0) return CUDA_ERROR_INVALID_IMAGE;
    struct fk_module *mod = calloc(1, sizeof *mod);
    mod->magic = FK_MODULE_MAGIC;
    *m = (CUmodule)mod;
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    FK_API("cuModuleLoadData");
    return fk_module_load(m, image);
}

FK_EXPORT CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned int n, CUjit_option *o, void **v)
{
    FK_API("cuModuleLoadDataEx");
    (void)n;
    (void)o;
    (void)v;
    return fk_module_load(m, image);
}

FK_EXPORT CUresult cuModuleUnload(CUmodule hm)
{
    FK_API("cuModuleUnload");
    struct fk_module *mod = (struct fk_module *)hm;
    if (!mod || mod->magic != FK_MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    mod->magic = 0;
    free(mod);
    return CUDA_SUCCESS;
}

FK_EXPORT CUresult cuModuleGetFunction(CUfunction *f, CUmodule hm, const char *name)
{
    FK_API("cuModuleGetFunction");
    struct fk_module *mod = (struct fk_module *)hm;
    if (!f || !name) return CUDA_ERROR_INVALID_VALUE;
    if (!mod || mod->magic != FK_MODULE_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    for (size_t i = 0; i < sizeof fk_kernels / sizeof fk_kernels[0]; i++)
        if (strcmp(name, fk_kernels[i].name) == 0) {
            fk_funcs[i].magic = FK_FUNC_MAGIC;
            fk_funcs[i].kind = (int)fk_kernels[i].kind;
            fk_funcs[i].name = fk_kernels[i].name;
            fk_funcs[i].nparams = fk_kernels[i].nparams;
            *f = (CUfunction)&fk_funcs[i];
            return CUDA_SUCCESS;
        }
    return CUDA_ERROR_NOT_FOUND;
}

static CUresult fk_launch(CUfunction hf, CUstream hs, void **params, int pt)
{
    struct fk_func *f = (struct fk_func *)hf;
    if (!f || f->magic != FK_FUNC_MAGIC) return CUDA_ERROR_INVALID_HANDLE;
    if (!params) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = fk_require_ctx(NULL);
    if (r) return r;
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = OP_KERNEL;
    op->kernel = (enum fk_kernel_kind)f->kind;
    switch (op->kernel) {
    case K_SLEEP_US:
        op->n = (size_t)*(uint64_t *)params[0];
        break;
    case K_FILL32:
    case K_ADD32:
        op->dst = (uintptr_t)*(CUdeviceptr *)params[0];
        op->value = *(uint32_t *)params[1];
        op->n = (size_t)*(uint64_t *)params[2];
        r = fk_check_range(op->dst, op->n * 4, 1, 1);
        break;
    case K_COPY8:
        op->dst = (uintptr_t)*(CUdeviceptr *)params[0];
        op->src = (uintptr_t)*(CUdeviceptr *)params[1];
        op->n = (size_t)*(uint64_t *)params[2];
        r = fk_check_range(op->dst, op->n, 1, 1);
        if (!r) r = fk_check_range(op->src, op->n, 1, 0);
        break;
    }
    if (r) {
        free(op);
        return CUDA_ERROR_ILLEGAL_ADDRESS;
    }
    return fk_enqueue(hs, pt, op, 0);
}

#define LAUNCH_BODY(pt)                                                              \
    ((void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shm, (void)extra, \
     fk_launch(f, hs, params, pt))
FK_PAIR(cuLaunchKernel, cuLaunchKernel_ptsz,
        (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx, unsigned int by,
         unsigned int bz, unsigned int shm, CUstream hs, void **params, void **extra),
        LAUNCH_BODY)

#define LAUNCHEX_BODY(pt) ((void)extra, config ? fk_launch(f, config->hStream, params, pt) : CUDA_ERROR_INVALID_VALUE)
FK_PAIR(cuLaunchKernelEx, cuLaunchKernelEx_ptsz,
        (const CUlaunchConfig *config, CUfunction f, void **params, void **extra), LAUNCHEX_BODY)

static CUresult fk_host_fn(CUstream hs, CUhostFn fn, CUstreamCallback cb, void *data, int pt)
{
    if (!fn && !cb) return CUDA_ERROR_INVALID_VALUE;
    struct fk_op *op = calloc(1, sizeof *op);
    op->kind = fn ? OP_HOSTFN : OP_CALLBACK;
    op->hostfn = fn;
    op->callback = cb;
    op->callback_stream = hs;
    op->data = data;
    return fk_enqueue(hs, pt, op, 0);
}
#define HOSTFN_BODY(pt) fk_host_fn(hs, fn, NULL, data, pt)
#define CALLBACK_BODY(pt) ((void)flags, fk_host_fn(hs, NULL, cb, data, pt))
FK_PAIR(cuLaunchHostFunc, cuLaunchHostFunc_ptsz, (CUstream hs, CUhostFn fn, void *data), HOSTFN_BODY)
FK_PAIR(cuStreamAddCallback, cuStreamAddCallback_ptsz,
        (CUstream hs, CUstreamCallback cb, void *data, unsigned int flags), CALLBACK_BODY)

#define GETCTX2_BODY(pt) ((green ? (void)(*green = NULL) : (void)0), fk_stream_info(hs, pt, NULL, NULL, pctx, NULL))
FK_PAIR(cuStreamGetCtx_v2, cuStreamGetCtx_v2_ptsz, (CUstream hs, CUcontext *pctx, CUgreenCtx *green), GETCTX2_BODY)
