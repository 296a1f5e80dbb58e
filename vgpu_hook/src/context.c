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

/* The wrappers: X(name, drop, (parameters), (arguments)). Each calls the real function, then
 * drops the cached answer: drop_thread when only the caller's context stack changes, drop_all
 * when a context may go away under any thread. */
#define CTX_WRAPPERS(X)                                                                          \
    X(cuCtxCreate_v2, drop_thread, (CUcontext * pctx, unsigned int flags, CUdevice dev),          \
      (pctx, flags, dev))                                                                        \
    X(cuCtxCreate_v3, drop_thread,                                                               \
      (CUcontext * pctx, CUexecAffinityParam * paramsArray, int numParams, unsigned int flags,   \
       CUdevice dev),                                                                            \
      (pctx, paramsArray, numParams, flags, dev))                                                \
    X(cuCtxCreate_v4, drop_thread,                                                               \
      (CUcontext * pctx, CUctxCreateParams * ctxCreateParams, unsigned int flags, CUdevice dev), \
      (pctx, ctxCreateParams, flags, dev))                                                       \
    X(cuCtxSetCurrent, drop_thread, (CUcontext ctx), (ctx))                                      \
    X(cuCtxPushCurrent, drop_thread, (CUcontext ctx), (ctx))                                     \
    X(cuCtxPushCurrent_v2, drop_thread, (CUcontext ctx), (ctx))                                  \
    X(cuCtxPopCurrent, drop_thread, (CUcontext * pctx), (pctx))                                  \
    X(cuCtxPopCurrent_v2, drop_thread, (CUcontext * pctx), (pctx))                               \
    X(cuCtxDestroy, drop_all, (CUcontext ctx), (ctx))                                            \
    X(cuCtxDestroy_v2, drop_all, (CUcontext ctx), (ctx))                                         \
    X(cuDevicePrimaryCtxRelease, drop_all, (CUdevice dev), (dev))                                \
    X(cuDevicePrimaryCtxRelease_v2, drop_all, (CUdevice dev), (dev))                             \
    X(cuDevicePrimaryCtxReset, drop_all, (CUdevice dev), (dev))                                  \
    X(cuDevicePrimaryCtxReset_v2, drop_all, (CUdevice dev), (dev))

#define DEFINE_CTX_WRAPPER(fn, drop, params, args) \
    VGPU_EXPORT CUresult fn params {               \
        CTX_REAL_OR_RETURN(fn);                    \
        CUresult rc = vgpu_cu.fn args;             \
        drop();                                    \
        return rc;                                 \
    }
CTX_WRAPPERS(DEFINE_CTX_WRAPPER)
#undef DEFINE_CTX_WRAPPER
