/*
 * cuda_context.c - contexts: primary contexts, created contexts and the per-thread stack.
 *
 * Each thread has its own stack of current contexts (thread-local), as in the real driver. A
 * context owns its default stream, its created streams, and every allocation, module, pool and
 * array made in it; destroying it (or releasing/resetting a primary context to zero) frees and
 * uncharges all of them, so the node state never keeps memory a context no longer has.
 * Creating a context registers the process with the GPU in the state, which is what makes it
 * appear in NVML's process list.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

#define CTX_STACK_MAX 64

static __thread struct CUctx_st *tls_stack[CTX_STACK_MAX];
static __thread int tls_depth;

static struct CUctx_st primary[SIM_MAX_GPUS];
static unsigned int primary_flags[SIM_MAX_GPUS];
static unsigned long long next_ctx_id = 1;
static unsigned long long next_stream_id = 1;

struct CUctx_st *cu_ctx_current(void) {
    return tls_depth > 0 ? tls_stack[tls_depth - 1] : NULL;
}

CUresult cu_ctx_require(struct CUctx_st **out) {
    CU_TRY(cu_check_init());
    struct CUctx_st *ctx = cu_ctx_current();
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(ctx, CU_KIND_CONTEXT);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_CONTEXT;
    CU_TRY(cu_phys_alive(ctx->phys));
    *out = ctx;
    return CUDA_SUCCESS;
}

/* Initialise a context's fields and register it (lock held). */
static int ctx_setup(struct CUctx_st *ctx, CUdevice dev, int phys, unsigned int flags,
                     int is_primary) {
    memset(ctx, 0, sizeof(*ctx));
    ctx->ordinal = dev;
    ctx->phys = phys;
    ctx->flags = flags;
    ctx->primary = is_primary;
    ctx->refcount = 1;
    ctx->id = next_ctx_id++;
    ctx->null_stream.ctx = ctx;
    ctx->null_stream.id = next_stream_id++;
    /* The real driver's defaults. */
    ctx->limits[CU_LIMIT_STACK_SIZE] = 1024;
    ctx->limits[CU_LIMIT_PRINTF_FIFO_SIZE] = 1 << 20;
    ctx->limits[CU_LIMIT_MALLOC_HEAP_SIZE] = 8 << 20;
    ctx->limits[CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH] = 2;
    ctx->limits[CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT] = 2048;
    ctx->limits[CU_LIMIT_MAX_L2_FETCH_GRANULARITY] = 64;
    ctx->limits[CU_LIMIT_PERSISTING_L2_CACHE_SIZE] = 0;
    if (cu_handle_add(ctx, CU_KIND_CONTEXT) != 0) return -1;
    /* The null stream is a valid handle too (cuStreamGetCtx etc. accept it by pointer). */
    if (cu_handle_add(&ctx->null_stream, CU_KIND_STREAM) != 0) {
        cu_handle_remove(ctx);
        return -1;
    }
    return 0;
}

/* Free everything a context owns. Called without the lock, after the context was unregistered so
 * no other call can start using it. */
static void ctx_teardown(struct CUctx_st *ctx) {
    cu_launch_release_ctx(ctx);
    cu_pool_release_ctx(ctx);
    cu_array_release_ctx(ctx);
    cu_vmm_release_ctx(ctx);
    cu_mem_release_ctx(ctx);
    pthread_mutex_lock(&cu_drv.lock);
    struct CUstream_st *s = ctx->streams;
    while (s != NULL) {
        struct CUstream_st *next = s->next;
        cu_handle_remove(s);
        free(s);
        s = next;
    }
    ctx->streams = NULL;
    pthread_mutex_unlock(&cu_drv.lock);
}

/* Remove ctx from the calling thread's stack wherever it is (other threads check the registry). */
static void forget_in_this_thread(struct CUctx_st *ctx) {
    int w = 0;
    for (int r = 0; r < tls_depth; r++)
        if (tls_stack[r] != ctx) tls_stack[w++] = tls_stack[r];
    tls_depth = w;
}

CU_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    int phys;
    CU_TRY(cu_device_phys(dev, &phys));
    struct CUctx_st *ctx = &primary[dev];
    pthread_mutex_lock(&cu_drv.lock);
    if (ctx->refcount > 0) {
        ctx->refcount++;
    } else {
        if (ctx_setup(ctx, dev, phys, primary_flags[dev], 1) != 0) {
            pthread_mutex_unlock(&cu_drv.lock);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        (void)sim_proc_register(phys);
    }
    pthread_mutex_unlock(&cu_drv.lock);
    *pctx = ctx;
    return CUDA_SUCCESS;
}

/* Drop one reference (or all, for reset) of a device's primary context. */
static CUresult primary_drop(CUdevice dev, int all) {
    CU_TRY(cu_check_init());
    if (dev < 0 || dev >= cu_drv.count) return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *ctx = &primary[dev];
    pthread_mutex_lock(&cu_drv.lock);
    if (ctx->refcount <= 0) {
        pthread_mutex_unlock(&cu_drv.lock);
        return all ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
    }
    ctx->refcount = all ? 0 : ctx->refcount - 1;
    int dead = ctx->refcount == 0;
    if (dead) {
        cu_handle_remove(&ctx->null_stream);
        cu_handle_remove(ctx);
    }
    pthread_mutex_unlock(&cu_drv.lock);
    if (dead) {
        ctx_teardown(ctx);
        forget_in_this_thread(ctx);
    }
    return CUDA_SUCCESS;
}

CU_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return primary_drop(dev, 0);
}

CU_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    return primary_drop(dev, 1);
}

/* The pre-11.0 ABIs have the same signatures; the simulator gives them the same behaviour. */
CU_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
    return primary_drop(dev, 0);
}

CU_API CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
    return primary_drop(dev, 1);
}

CU_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    if (flags == NULL || active == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    if (dev < 0 || dev >= cu_drv.count) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&cu_drv.lock);
    *flags = primary_flags[dev];
    *active = primary[dev].refcount > 0;
    pthread_mutex_unlock(&cu_drv.lock);
    return CUDA_SUCCESS;
}

CU_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags) {
    CU_TRY(cu_check_init());
    if (dev < 0 || dev >= cu_drv.count) return CUDA_ERROR_INVALID_DEVICE;
    if (flags & ~(unsigned int)(CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX |
                                CU_CTX_SYNC_MEMOPS))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&cu_drv.lock);
    primary_flags[dev] = flags;
    if (primary[dev].refcount > 0) primary[dev].flags = flags;
    pthread_mutex_unlock(&cu_drv.lock);
    return CUDA_SUCCESS;
}

CU_API CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags) {
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

static CUresult ctx_create(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    int phys;
    CU_TRY(cu_device_phys(dev, &phys));
    if (tls_depth >= CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    struct CUctx_st *ctx = malloc(sizeof(*ctx));
    if (ctx == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&cu_drv.lock);
    int rc = ctx_setup(ctx, dev, phys, flags, 0);
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) {
        free(ctx);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (void)sim_proc_register(phys);
    tls_stack[tls_depth++] = ctx; /* a new context becomes current */
    *pctx = ctx;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    return ctx_create(pctx, flags, dev);
}

/* Execution-affinity parameters are accepted and ignored (MPS-only feature). */
CU_API CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                               unsigned int flags, CUdevice dev) {
    if (numParams < 0 || (numParams > 0 && paramsArray == NULL)) return CUDA_ERROR_INVALID_VALUE;
    return ctx_create(pctx, flags, dev);
}

CU_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                               unsigned int flags, CUdevice dev) {
    if (ctxCreateParams != NULL && ctxCreateParams->cigParams != NULL)
        return CUDA_ERROR_NOT_SUPPORTED; /* no graphics interop in the simulator */
    return ctx_create(pctx, flags, dev);
}

CU_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int ok = cu_handle_is(ctx, CU_KIND_CONTEXT) && !ctx->primary;
    if (ok) {
        cu_handle_remove(&ctx->null_stream);
        cu_handle_remove(ctx);
    }
    pthread_mutex_unlock(&cu_drv.lock);
    if (!ok) return CUDA_ERROR_INVALID_CONTEXT;
    ctx_teardown(ctx);
    forget_in_this_thread(ctx);
    free(ctx);
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxGetCurrent(CUcontext *pctx) {
    if (pctx == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    *pctx = cu_ctx_current();
    return CUDA_SUCCESS;
}

static int ctx_live(CUcontext ctx) {
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(ctx, CU_KIND_CONTEXT);
    pthread_mutex_unlock(&cu_drv.lock);
    return live;
}

CU_API CUresult cuCtxSetCurrent(CUcontext ctx) {
    CU_TRY(cu_check_init());
    if (ctx == NULL) {
        if (tls_depth > 0) tls_depth--;
        return CUDA_SUCCESS;
    }
    if (!ctx_live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth == 0) tls_depth = 1;
    tls_stack[tls_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    CU_TRY(cu_check_init());
    if (!ctx_live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (tls_depth >= CTX_STACK_MAX) return CUDA_ERROR_OUT_OF_MEMORY;
    tls_stack[tls_depth++] = ctx;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx) {
    CU_TRY(cu_check_init());
    if (tls_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    struct CUctx_st *ctx = tls_stack[--tls_depth];
    if (pctx != NULL) *pctx = ctx;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxGetDevice(CUdevice *device) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    *device = ctx->ordinal;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxGetFlags(unsigned int *flags) {
    if (flags == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    *flags = ctx->flags;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxSynchronize(void) {
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    pthread_mutex_lock(&cu_drv.lock);
    unsigned long long until = ctx->done_ns;
    pthread_mutex_unlock(&cu_drv.lock);
    cu_sleep_until(until);
    return cu_phys_alive(ctx->phys);
}

CU_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version) {
    if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    if (ctx == NULL) ctx = cu_ctx_current();
    if (!ctx_live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020; /* the value the real driver reports for contexts of the v2+ API */
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority) {
    CU_TRY(cu_check_init());
    if (leastPriority != NULL) *leastPriority = 0;
    if (greatestPriority != NULL) *greatestPriority = -5;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxGetId(CUcontext ctx, unsigned long long *ctxId) {
    if (ctxId == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    if (ctx == NULL) ctx = cu_ctx_current();
    if (!ctx_live(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    *ctxId = ctx->id;
    return CUDA_SUCCESS;
}

CU_API CUresult cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
    if (pvalue == NULL || (unsigned int)limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    pthread_mutex_lock(&cu_drv.lock);
    *pvalue = ctx->limits[limit];
    pthread_mutex_unlock(&cu_drv.lock);
    return CUDA_SUCCESS;
}

/* Values are stored and reported back; they constrain nothing in the simulator. */
CU_API CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
    if ((unsigned int)limit > CU_LIMIT_PERSISTING_L2_CACHE_SIZE) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    pthread_mutex_lock(&cu_drv.lock);
    ctx->limits[limit] = value;
    pthread_mutex_unlock(&cu_drv.lock);
    return CUDA_SUCCESS;
}

/* ---- Peer access ------------------------------------------------------------------------------
 * The current context may map another device's context when cuDeviceCanAccessPeer allows it (the
 * profile links the two GPUs over NVLink). Only the set of enabled peer devices is kept: copies
 * between devices work with or without it (unified addressing). */

static CUresult peer_ctx(CUcontext peer, struct CUctx_st **self) {
    CU_TRY(cu_ctx_require(self));
    if (!ctx_live(peer)) return CUDA_ERROR_INVALID_CONTEXT;
    return peer->ordinal == (*self)->ordinal ? CUDA_ERROR_INVALID_DEVICE : CUDA_SUCCESS;
}

CU_API CUresult cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(peer_ctx(peerContext, &ctx));
    int can = 0;
    CU_TRY(cuDeviceCanAccessPeer(&can, ctx->ordinal, peerContext->ordinal));
    if (!can) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    unsigned int bit = 1u << peerContext->ordinal;
    pthread_mutex_lock(&cu_drv.lock);
    int already = (ctx->peers & bit) != 0;
    ctx->peers |= bit;
    pthread_mutex_unlock(&cu_drv.lock);
    return already ? CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED : CUDA_SUCCESS;
}

CU_API CUresult cuCtxDisablePeerAccess(CUcontext peerContext) {
    struct CUctx_st *ctx;
    CU_TRY(peer_ctx(peerContext, &ctx));
    unsigned int bit = 1u << peerContext->ordinal;
    pthread_mutex_lock(&cu_drv.lock);
    int enabled = (ctx->peers & bit) != 0;
    ctx->peers &= ~bit;
    pthread_mutex_unlock(&cu_drv.lock);
    return enabled ? CUDA_SUCCESS : CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
}

/* ---- Streams (creation lives here because streams are owned by contexts) -------------------- */

CUresult cu_stream_resolve(CUstream h, struct CUstream_st **out) {
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct CUctx_st *ctx;
        CU_TRY(cu_ctx_require(&ctx));
        *out = &ctx->null_stream;
        return CUDA_SUCCESS;
    }
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(h, CU_KIND_STREAM);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_HANDLE;
    CU_TRY(cu_phys_alive(h->ctx->phys));
    *out = h;
    return CUDA_SUCCESS;
}

CU_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority) {
    if (phStream == NULL || (flags & ~(unsigned int)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (s == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    /* Out-of-range priorities are clamped, as documented for the real driver. */
    s->priority = priority > 0 ? 0 : (priority < -5 ? -5 : priority);
    s->flags = flags;
    s->ctx = ctx;
    pthread_mutex_lock(&cu_drv.lock);
    s->id = next_stream_id++;
    if (cu_handle_add(s, CU_KIND_STREAM) != 0) {
        pthread_mutex_unlock(&cu_drv.lock);
        free(s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    s->next = ctx->streams;
    ctx->streams = s;
    pthread_mutex_unlock(&cu_drv.lock);
    *phStream = s;
    return CUDA_SUCCESS;
}

CU_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags) {
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

CU_API CUresult cuStreamDestroy_v2(CUstream hStream) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    /* A context's null stream cannot be destroyed. */
    if (!cu_handle_is(hStream, CU_KIND_STREAM) || hStream == &hStream->ctx->null_stream) {
        pthread_mutex_unlock(&cu_drv.lock);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    cu_handle_remove(hStream);
    struct CUstream_st **pp = &hStream->ctx->streams;
    while (*pp != NULL && *pp != hStream) pp = &(*pp)->next;
    if (*pp != NULL) *pp = hStream->next;
    pthread_mutex_unlock(&cu_drv.lock);
    /* Work already queued still completes (the GPU timeline keeps it); nothing to wait for. */
    free(hStream);
    return CUDA_SUCCESS;
}
