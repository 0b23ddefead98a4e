/* Stream capture, as far as the shim's tests need it: cuStreamBeginCapture/EndCapture mark a
 * stream capturing (work submitted to it still runs at once: the fake builds no graph, and
 * cuStreamEndCapture gives a graph handle that cuGraphLaunch does not know), cuStreamIsCapturing
 * tells, and cuThreadExchangeStreamCaptureMode sets the calling thread's mode.
 *
 * The rule kept from the real driver is the one that breaks programs: while a capture in global
 * mode runs, a thread not in relaxed mode that makes a call capture forbids (here: cuEventQuery,
 * cuEventSynchronize, cuStreamSynchronize) gets CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, and every
 * such capture is invalidated: its cuStreamEndCapture fails with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 */
#include "fake.h"

static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CUresult fk_capture_unsafe_call(void)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    fk_capture_lock();
    for (struct fk_stream *s = fk_stream_list(); s; s = s->next_all)
        if (s->capturing && s->capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL) {
            s->capture_invalidated = 1;
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    fk_capture_unlock();
    return r;
}

static CUresult begin_capture(CUstream hs, CUstreamCaptureMode mode, int pt)
{
    struct fk_stream *s;
    CUresult r = fk_stream_lookup(hs, pt, &s);
    if (r) return r;
    if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    fk_capture_lock();
    if (s->capturing) r = CUDA_ERROR_ILLEGAL_STATE;
    else {
        s->capturing = 1;
        s->capture_invalidated = 0;
        s->capture_mode = mode;
    }
    fk_capture_unlock();
    return r;
}

static CUresult end_capture(CUstream hs, CUgraph *graph, int pt)
{
    static int graph_token; /* what every captured "graph" points at */
    struct fk_stream *s;
    CUresult r = fk_stream_lookup(hs, pt, &s);
    if (r) return r;
    if (!graph) return CUDA_ERROR_INVALID_VALUE;
    fk_capture_lock();
    if (!s->capturing) r = CUDA_ERROR_ILLEGAL_STATE;
    else if (s->capture_invalidated) r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    s->capturing = 0;
    fk_capture_unlock();
    *graph = r ? NULL : (CUgraph)&graph_token;
    return r;
}

static CUresult is_capturing(CUstream hs, CUstreamCaptureStatus *status, int pt)
{
    struct fk_stream *s;
    CUresult r = fk_stream_lookup(hs, pt, &s);
    if (r) return r;
    if (!status) return CUDA_ERROR_INVALID_VALUE;
    fk_capture_lock();
    *status = !s->capturing ? CU_STREAM_CAPTURE_STATUS_NONE
              : s->capture_invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    fk_capture_unlock();
    return CUDA_SUCCESS;
}

#define BEGIN_BODY(pt) begin_capture(hs, mode, pt)
#define END_BODY(pt) end_capture(hs, graph, pt)
#define IS_CAPTURING_BODY(pt) is_capturing(hs, status, pt)
FK_PAIR(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2_ptsz, (CUstream hs, CUstreamCaptureMode mode), BEGIN_BODY)
FK_PAIR(cuStreamEndCapture, cuStreamEndCapture_ptsz, (CUstream hs, CUgraph *graph), END_BODY)
FK_PAIR(cuStreamIsCapturing, cuStreamIsCapturing_ptsz, (CUstream hs, CUstreamCaptureStatus *status),
        IS_CAPTURING_BODY)

FK_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    FK_API("cuThreadExchangeStreamCaptureMode");
    if (!mode) return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}
