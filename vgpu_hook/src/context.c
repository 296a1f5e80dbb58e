/*
 * context.c - the configured device of the calling thread's current context, without a driver
 * call per launch.
 *
 * A capped launch needs the device of the current context. Asking the driver (cuCtxGetDevice)
 * on every launch costs a round trip: a lock and a handle check in the simulated driver (about
 * 30-40 ns), similar work in the real one. The answer only changes when this thread makes
 * another context current, or when a context goes away (its address may then be reused by a
 * new context on another device). All of those calls pass through the wrappers below, so the
 * answer is cached per thread and dropped:
 *   - for the calling thread, by cuCtxCreate_v2/_v3/_v4, cuCtxSetCurrent, cuCtxPushCurrent(_v2)
 *     and cuCtxPopCurrent(_v2) (they change only the caller's context stack);
 *   - for every thread (one global generation), by cuCtxDestroy(_v2) and by primary context
 *     release/reset: another thread's current context may be the one that went away.
 * Only capped devices are cached: an answer of "not one of ours" (or a failed query) is asked
 * again next time, so a transient driver error can never leave a thread uncapped.
 * Not covered: green contexts (cuCtxFromGreenCtx) and the deprecated cuCtxAttach/cuCtxDetach;
 * launches in those are capped by the device of the last context this thread made current.
 */
#include <stdatomic.h>

#include "vgpu.h"

struct ctx_cache {
    uint64_t gen;          /* g_ctx_gen when `dev` was looked up; 0 = empty */
    struct vgpu_dev *dev;
};

/* initial-exec: one TLS load on the hot path, never a __tls_get_addr call. */
static __thread struct ctx_cache t_cache __attribute__((tls_model("initial-exec")));
static _Atomic uint64_t g_ctx_gen = 1;

struct vgpu_dev *vgpu_dev_current_cached(void) {
    uint64_t gen = atomic_load_explicit(&g_ctx_gen, memory_order_acquire);
    if (__builtin_expect(t_cache.gen == gen, 1)) return t_cache.dev;
    /* The generation is read before the driver: a destroy racing with this lookup bumps it,
     * so the answer stored below is dropped at the next launch. */
    struct vgpu_dev *d = vgpu_dev_current();
    if (d != NULL) {
        t_cache.dev = d;
        t_cache.gen = gen;
    }
    return d;
}

static void drop_thread(void) { t_cache.gen = 0; }
static void drop_all(void) { atomic_fetch_add_explicit(&g_ctx_gen, 1, memory_order_acq_rel); }

#define CTX_REAL_OR_RETURN(fn)                                    \
    do {                                                          \
        if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED; \
        if (vgpu_cu.fn == NULL) return CUDA_ERROR_NOT_FOUND;      \
    } while (0)

VGPU_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CTX_REAL_OR_RETURN(cuCtxCreate_v2);
    CUresult rc = vgpu_cu.cuCtxCreate_v2(pctx, flags, dev);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                    int numParams, unsigned int flags, CUdevice dev) {
    CTX_REAL_OR_RETURN(cuCtxCreate_v3);
    CUresult rc = vgpu_cu.cuCtxCreate_v3(pctx, paramsArray, numParams, flags, dev);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                    unsigned int flags, CUdevice dev) {
    CTX_REAL_OR_RETURN(cuCtxCreate_v4);
    CUresult rc = vgpu_cu.cuCtxCreate_v4(pctx, ctxCreateParams, flags, dev);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    CTX_REAL_OR_RETURN(cuCtxSetCurrent);
    CUresult rc = vgpu_cu.cuCtxSetCurrent(ctx);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxPushCurrent(CUcontext ctx) {
    CTX_REAL_OR_RETURN(cuCtxPushCurrent);
    CUresult rc = vgpu_cu.cuCtxPushCurrent(ctx);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CTX_REAL_OR_RETURN(cuCtxPushCurrent_v2);
    CUresult rc = vgpu_cu.cuCtxPushCurrent_v2(ctx);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxPopCurrent(CUcontext *pctx) {
    CTX_REAL_OR_RETURN(cuCtxPopCurrent);
    CUresult rc = vgpu_cu.cuCtxPopCurrent(pctx);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CTX_REAL_OR_RETURN(cuCtxPopCurrent_v2);
    CUresult rc = vgpu_cu.cuCtxPopCurrent_v2(pctx);
    drop_thread();
    return rc;
}

VGPU_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
    CTX_REAL_OR_RETURN(cuCtxDestroy);
    CUresult rc = vgpu_cu.cuCtxDestroy(ctx);
    drop_all();
    return rc;
}

VGPU_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CTX_REAL_OR_RETURN(cuCtxDestroy_v2);
    CUresult rc = vgpu_cu.cuCtxDestroy_v2(ctx);
    drop_all();
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    CTX_REAL_OR_RETURN(cuDevicePrimaryCtxRelease);
    CUresult rc = vgpu_cu.cuDevicePrimaryCtxRelease(dev);
    drop_all();
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    CTX_REAL_OR_RETURN(cuDevicePrimaryCtxRelease_v2);
    CUresult rc = vgpu_cu.cuDevicePrimaryCtxRelease_v2(dev);
    drop_all();
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    CTX_REAL_OR_RETURN(cuDevicePrimaryCtxReset);
    CUresult rc = vgpu_cu.cuDevicePrimaryCtxReset(dev);
    drop_all();
    return rc;
}

VGPU_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    CTX_REAL_OR_RETURN(cuDevicePrimaryCtxReset_v2);
    CUresult rc = vgpu_cu.cuDevicePrimaryCtxReset_v2(dev);
    drop_all();
    return rc;
}
