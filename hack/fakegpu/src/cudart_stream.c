/*
 * cudart_stream.c - streams, events, stream-capture queries and host callbacks.
 *
 * A runtime stream or event is the driver's handle (cudaStream_t and CUstream are the same
 * type); the special streams 0, cudaStreamLegacy and cudaStreamPerThread are passed on as the
 * driver's NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD. Stream capture is not simulated (the
 * driver never reports a capturing stream), so the capture queries PyTorch makes around its
 * allocations and synchronisations answer "not capturing" through the driver.
 */
#include <stdlib.h>

#include "cudart_internal.h"

CUDART_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
                                                    int priority) {
    if (pStream == NULL || (flags & ~(unsigned int)cudaStreamNonBlocking))
        return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuStreamCreateWithPriority, pStream, flags, priority);
}

CUDART_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags) {
    return cudaStreamCreateWithPriority(pStream, flags, 0);
}

CUDART_API cudaError_t cudaStreamCreate(cudaStream_t *pStream) {
    return cudaStreamCreateWithPriority(pStream, cudaStreamDefault, 0);
}

CUDART_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    CUDART_TRY(cudart_init());
    if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
        return cudart_ret(cudaErrorInvalidResourceHandle);
    return CUDART_DRIVER(cuStreamDestroy_v2, stream);
}

CUDART_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuStreamSynchronize, stream);
}
CUDART_PER_THREAD(cudaStreamSynchronize, cudaStreamSynchronize_ptsz);

CUDART_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuStreamQuery, stream);
}
CUDART_PER_THREAD(cudaStreamQuery, cudaStreamQuery_ptsz);

CUDART_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                           unsigned int flags) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuStreamWaitEvent, stream, event, flags);
}
CUDART_PER_THREAD(cudaStreamWaitEvent, cudaStreamWaitEvent_ptsz);

CUDART_API cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuStreamGetPriority, hStream, priority);
}
CUDART_PER_THREAD(cudaStreamGetPriority, cudaStreamGetPriority_ptsz);

CUDART_API cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuStreamGetFlags, hStream, flags);
}
CUDART_PER_THREAD(cudaStreamGetFlags, cudaStreamGetFlags_ptsz);

/* The device of a stream's context: that context is made current for the question only. */
CUDART_API cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int *device) {
    if (device == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUcontext ctx = NULL;
    CUDART_TRY_DRIVER(cuStreamGetCtx, hStream, &ctx);
    CUDART_TRY_DRIVER(cuCtxPushCurrent_v2, ctx);
    CUdevice d = 0;
    CUresult rc = cudart_drv.cuCtxGetDevice(&d);
    (void)cudart_drv.cuCtxPopCurrent_v2(&ctx);
    CUDART_TRY(cudart_error(rc));
    *device = d;
    return cudaSuccess;
}
CUDART_PER_THREAD(cudaStreamGetDevice, cudaStreamGetDevice_ptsz);

CUDART_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                             enum cudaStreamCaptureStatus *pCaptureStatus) {
    if (pCaptureStatus == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUDART_TRY_DRIVER(cuStreamIsCapturing, stream, &status);
    *pCaptureStatus = (enum cudaStreamCaptureStatus)status;
    return cudaSuccess;
}
CUDART_PER_THREAD(cudaStreamIsCapturing, cudaStreamIsCapturing_ptsz);

/* The capture-info queries, from the driver's capture status. Capture is never active in the
 * simulator, so there is no capture id, graph or dependency set to report. */
static cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *status_out,
                                unsigned long long *id_out, cudaGraph_t *graph_out,
                                const cudaGraphNode_t **deps_out, size_t *num_deps_out) {
    CUDART_TRY(cudaStreamIsCapturing(stream, status_out));
    if (id_out != NULL) *id_out = 0;
    if (graph_out != NULL) *graph_out = NULL;
    if (deps_out != NULL) *deps_out = NULL;
    if (num_deps_out != NULL) *num_deps_out = 0;
    return cudaSuccess;
}

#if VGPU_CUDART_MAJOR == 12
CUDART_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                enum cudaStreamCaptureStatus *captureStatus_out,
                                                unsigned long long *id_out) {
    return capture_info(stream, captureStatus_out, id_out, NULL, NULL, NULL);
}
CUDART_PER_THREAD(cudaStreamGetCaptureInfo, cudaStreamGetCaptureInfo_ptsz);

CUDART_API cudaError_t cudaStreamGetCaptureInfo_v2(cudaStream_t stream,
                                                   enum cudaStreamCaptureStatus *captureStatus_out,
                                                   unsigned long long *id_out,
                                                   cudaGraph_t *graph_out,
                                                   const cudaGraphNode_t **dependencies_out,
                                                   size_t *numDependencies_out) {
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
                        numDependencies_out);
}
CUDART_PER_THREAD(cudaStreamGetCaptureInfo_v2, cudaStreamGetCaptureInfo_v2_ptsz);

CUDART_API cudaError_t cudaStreamGetCaptureInfo_v3(cudaStream_t stream,
                                                   enum cudaStreamCaptureStatus *captureStatus_out,
                                                   unsigned long long *id_out,
                                                   cudaGraph_t *graph_out,
                                                   const cudaGraphNode_t **dependencies_out,
                                                   const cudaGraphEdgeData **edgeData_out,
                                                   size_t *numDependencies_out) {
    if (edgeData_out != NULL) *edgeData_out = NULL;
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
                        numDependencies_out);
}
CUDART_PER_THREAD(cudaStreamGetCaptureInfo_v3, cudaStreamGetCaptureInfo_v3_ptsz);
#else
CUDART_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
                                                enum cudaStreamCaptureStatus *captureStatus_out,
                                                unsigned long long *id_out,
                                                cudaGraph_t *graph_out,
                                                const cudaGraphNode_t **dependencies_out,
                                                const cudaGraphEdgeData **edgeData_out,
                                                size_t *numDependencies_out) {
    if (edgeData_out != NULL) *edgeData_out = NULL;
    return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
                        numDependencies_out);
}
CUDART_PER_THREAD(cudaStreamGetCaptureInfo, cudaStreamGetCaptureInfo_ptsz);
#endif

CUDART_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    if (mode == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *)mode);
}

/* ---- Host functions and callbacks ------------------------------------------------------------ */

CUDART_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData) {
    if (fn == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuLaunchHostFunc, stream, fn, userData);
}
CUDART_PER_THREAD(cudaLaunchHostFunc, cudaLaunchHostFunc_ptsz);

/* A stream callback runs as a driver host function that calls it with the stream and the
 * stream's status (always success: simulated work does not fail). */
struct callback {
    cudaStreamCallback_t fn;
    cudaStream_t stream;
    void *user;
};

static void run_callback(void *arg) {
    struct callback *cb = arg;
    cb->fn(cb->stream, cudaSuccess, cb->user);
    free(cb);
}

CUDART_API cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
                                             void *userData, unsigned int flags) {
    if (callback == NULL || flags != 0) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (cudart_drv.cuLaunchHostFunc == NULL) return cudart_ret(cudaErrorNotSupported);
    struct callback *cb = malloc(sizeof(*cb));
    if (cb == NULL) return cudart_ret(cudaErrorMemoryAllocation);
    *cb = (struct callback){callback, stream, userData};
    CUresult rc = cudart_drv.cuLaunchHostFunc(stream, run_callback, cb);
    if (rc != CUDA_SUCCESS) free(cb);
    return cudart_ret(cudart_error(rc));
}
CUDART_PER_THREAD(cudaStreamAddCallback, cudaStreamAddCallback_ptsz);

/* ---- Events ---------------------------------------------------------------------------------- */

/* The cudaEvent* flags are the driver's CU_EVENT_* values. */
CUDART_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags) {
    if (event == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuEventCreate, event, flags);
}

CUDART_API cudaError_t cudaEventCreate(cudaEvent_t *event) {
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

CUDART_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                                unsigned int flags) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuEventRecordWithFlags, event, stream, flags);
}
CUDART_PER_THREAD(cudaEventRecordWithFlags, cudaEventRecordWithFlags_ptsz);

CUDART_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    return cudaEventRecordWithFlags(event, stream, cudaEventRecordDefault);
}
CUDART_PER_THREAD(cudaEventRecord, cudaEventRecord_ptsz);

CUDART_API cudaError_t cudaEventQuery(cudaEvent_t event) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuEventQuery, event);
}

CUDART_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuEventSynchronize, event);
}

CUDART_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuEventElapsedTime, ms, start, end);
}

#if VGPU_CUDART_MAJOR == 12
CUDART_API cudaError_t cudaEventElapsedTime_v2(float *ms, cudaEvent_t start, cudaEvent_t end) {
    return cudaEventElapsedTime(ms, start, end);
}
#endif

CUDART_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuEventDestroy_v2, event);
}
