/*
 * cuda_stream.c - stream ordering, synchronisation and events on the simulated GPU timeline.
 *
 * The model: every piece of GPU work (a kernel, a copy) is submitted to the node state, which
 * time-slices each GPU FIFO across processes and returns the work's completion time. A stream
 * remembers the completion time of the last work queued on it (done_ns) and its context the
 * latest of all its streams. Synchronising sleeps until that time; querying compares it with now.
 * An event captures the stream's done time when recorded. All times are CLOCK_MONOTONIC ns.
 */
#include <stdlib.h>

#include "cuda_internal.h"

struct CUevent_st {
    struct CUctx_st *ctx;
    unsigned int flags;
    int recorded;
    unsigned long long time_ns; /* completion time of the work before the record */
};

static unsigned long long max_ull(unsigned long long a, unsigned long long b) {
    return a > b ? a : b;
}

void cu_stream_extend(struct CUstream_st *s, unsigned long long t_ns) {
    pthread_mutex_lock(&cu_drv.lock);
    s->done_ns = max_ull(s->done_ns, t_ns);
    s->ctx->done_ns = max_ull(s->ctx->done_ns, t_ns);
    pthread_mutex_unlock(&cu_drv.lock);
}

unsigned long long cu_stream_done(const struct CUstream_st *s) {
    pthread_mutex_lock(&cu_drv.lock);
    unsigned long long t = s->done_ns;
    pthread_mutex_unlock(&cu_drv.lock);
    return t;
}

CUresult cu_stream_submit(struct CUstream_st *s, unsigned long long duration_ns) {
    /* A bounded launch queue: a process cannot run arbitrarily far ahead of the GPU. */
    unsigned long long ahead = cu_drv.cfg.max_queue_ns;
    unsigned long long done = cu_stream_done(s);
    unsigned long long now = sim_now_ns();
    if (done > now + ahead) cu_sleep_until(done - ahead);
    unsigned long long end = sim_submit_work(s->ctx->phys, duration_ns);
    if (end == 0) return cu_phys_alive(s->ctx->phys) == CUDA_SUCCESS ? CUDA_ERROR_LAUNCH_FAILED
                                                                    : CUDA_ERROR_DEVICE_UNAVAILABLE;
    cu_stream_extend(s, end);
    return CUDA_SUCCESS;
}

CU_API CUresult cuStreamSynchronize(CUstream hStream) {
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(hStream, &s));
    cu_sleep_until(cu_stream_done(s));
    return cu_phys_alive(s->ctx->phys);
}
CU_ALIAS(cuStreamSynchronize, cuStreamSynchronize_ptsz);

CU_API CUresult cuStreamQuery(CUstream hStream) {
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(hStream, &s));
    return cu_stream_done(s) <= sim_now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CU_ALIAS(cuStreamQuery, cuStreamQuery_ptsz);

/* The stream attribute getters (and their _ptsz names): X(name, type of *out, value read from
 * the stream `s`). A NULL output is INVALID_VALUE before the handle is looked at. Stream capture
 * is not simulated, so no stream is ever capturing. */
#define STREAM_GETTERS(X)                                                                         \
    X(cuStreamGetPriority, int, s->priority)                                                      \
    X(cuStreamGetFlags, unsigned int, s->flags)                                                   \
    X(cuStreamGetCtx, CUcontext, s->ctx)                                                          \
    X(cuStreamIsCapturing, CUstreamCaptureStatus, CU_STREAM_CAPTURE_STATUS_NONE)

#define DEFINE_STREAM_GETTER(name, type, value)                                                   \
    CU_API CUresult name(CUstream hStream, type *out) {                                           \
        if (out == NULL) return CUDA_ERROR_INVALID_VALUE;                                         \
        struct CUstream_st *s;                                                                    \
        CU_TRY(cu_stream_resolve(hStream, &s));                                                   \
        *out = (value);                                                                           \
        return CUDA_SUCCESS;                                                                      \
    }                                                                                             \
    CU_ALIAS(name, name##_ptsz);
STREAM_GETTERS(DEFINE_STREAM_GETTER)
#undef DEFINE_STREAM_GETTER

/* The calling thread's stream-capture interaction mode. Capture itself is not simulated, so the
 * mode changes nothing, but it is kept and exchanged per thread as the driver does (the CUDA
 * runtime and PyTorch swap it around calls that are unsafe during a capture). */
static __thread CUstreamCaptureMode tls_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;

CU_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode) {
    if (mode == NULL || (unsigned int)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    CUstreamCaptureMode old = tls_capture_mode;
    tls_capture_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

/* ---- Events ---------------------------------------------------------------------------------- */

static CUresult event_get(CUevent h, struct CUevent_st **out) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(h, CU_KIND_EVENT);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_HANDLE;
    *out = h;
    return CUDA_SUCCESS;
}

CU_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags) {
    if (phEvent == NULL ||
        (Flags & ~(unsigned int)(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING |
                                 CU_EVENT_INTERPROCESS)))
        return CUDA_ERROR_INVALID_VALUE;
    /* Interprocess events must disable timing, as the real driver requires. */
    if ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    struct CUevent_st *e = calloc(1, sizeof(*e));
    if (e == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    e->ctx = ctx;
    e->flags = Flags;
    pthread_mutex_lock(&cu_drv.lock);
    int rc = cu_handle_add(e, CU_KIND_EVENT);
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) {
        free(e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *phEvent = e;
    return CUDA_SUCCESS;
}

CU_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags) {
    if (flags > 1) return CUDA_ERROR_INVALID_VALUE; /* only CU_EVENT_RECORD_EXTERNAL (1) */
    struct CUevent_st *e;
    struct CUstream_st *s;
    CU_TRY(event_get(hEvent, &e));
    CU_TRY(cu_stream_resolve(hStream, &s));
    unsigned long long now = sim_now_ns();
    unsigned long long done = cu_stream_done(s);
    pthread_mutex_lock(&cu_drv.lock);
    e->time_ns = done > now ? done : now;
    e->recorded = 1;
    pthread_mutex_unlock(&cu_drv.lock);
    return CUDA_SUCCESS;
}
CU_ALIAS(cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz);

CU_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream) {
    return cuEventRecordWithFlags(hEvent, hStream, 0);
}
CU_ALIAS(cuEventRecord, cuEventRecord_ptsz);

/* Time the event completes; an event never recorded counts as complete (real semantics). */
static unsigned long long event_time(struct CUevent_st *e, int *recorded) {
    pthread_mutex_lock(&cu_drv.lock);
    unsigned long long t = e->time_ns;
    *recorded = e->recorded;
    pthread_mutex_unlock(&cu_drv.lock);
    return t;
}

CU_API CUresult cuEventSynchronize(CUevent hEvent) {
    struct CUevent_st *e;
    CU_TRY(event_get(hEvent, &e));
    int recorded;
    cu_sleep_until(event_time(e, &recorded));
    return CUDA_SUCCESS;
}

CU_API CUresult cuEventQuery(CUevent hEvent) {
    struct CUevent_st *e;
    CU_TRY(event_get(hEvent, &e));
    int recorded;
    return event_time(e, &recorded) <= sim_now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CU_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    if (pMilliseconds == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUevent_st *a, *b;
    CU_TRY(event_get(hStart, &a));
    CU_TRY(event_get(hEnd, &b));
    if ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
    int ra, rb;
    unsigned long long ta = event_time(a, &ra), tb = event_time(b, &rb);
    if (!ra || !rb) return CUDA_ERROR_INVALID_HANDLE;
    unsigned long long now = sim_now_ns();
    if (ta > now || tb > now) return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)((double)((long long)(tb - ta)) / 1e6);
    return CUDA_SUCCESS;
}

/* CUDA 12.8's _v2 differs only in how it reports never-recorded events; same here. */
CU_API CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd) {
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

CU_API CUresult cuEventDestroy_v2(CUevent hEvent) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(hEvent, CU_KIND_EVENT);
    if (live) cu_handle_remove(hEvent);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_HANDLE;
    free(hEvent);
    return CUDA_SUCCESS;
}

CU_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags) {
    if (Flags > 1) return CUDA_ERROR_INVALID_VALUE; /* CU_EVENT_WAIT_DEFAULT / _EXTERNAL */
    struct CUstream_st *s;
    struct CUevent_st *e;
    CU_TRY(cu_stream_resolve(hStream, &s));
    CU_TRY(event_get(hEvent, &e));
    int recorded;
    unsigned long long t = event_time(e, &recorded);
    if (recorded) cu_stream_extend(s, t);
    return CUDA_SUCCESS;
}
CU_ALIAS(cuStreamWaitEvent, cuStreamWaitEvent_ptsz);
