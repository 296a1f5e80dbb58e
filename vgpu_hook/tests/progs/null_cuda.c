/*
 * null_cuda.c - a do-nothing libcuda.so.1 for measuring the hook's own per-call overhead.
 *
 * The simulated driver spends microseconds per call (locks, clocks, shared state), which
 * drowns a few nanoseconds of hook overhead in noise; against this driver every call returns
 * at once, so (time with hook - time without) is the hook's cost. Used only by bench/.
 *
 * NULLDRV_CTX_LOCK=1 makes the context queries (cuCtxGetDevice, cuCtxGetCurrent) do what the
 * simulated driver's do - a process mutex around a handle check - so that a hook which asks
 * the driver for the context on every launch pays that price here too, while launches
 * themselves stay free.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static unsigned long long next_ptr = 0x100000;

EXPORT CUresult cuInit(unsigned f) { (void)f; return 0; }
EXPORT CUresult cuDeviceGet(int *d, int o) { *d = o; return 0; }
EXPORT CUresult cuDeviceGetUuid_v2(char *u, int d) { memset(u, 0x11 * (d + 1), 16); return 0; }
EXPORT CUresult cuDevicePrimaryCtxRetain(void **c, int d) { (void)d; *c = (void *)1; return 0; }
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static __thread void *current_ctx;
static int ctx_lock_mode = -1;

static int ctx_query(void) {
    if (ctx_lock_mode < 0) {
        const char *v = getenv("NULLDRV_CTX_LOCK");
        ctx_lock_mode = v != NULL && v[0] == '1';
    }
    if (!ctx_lock_mode) return 0;
    pthread_mutex_lock(&ctx_lock);
    int live = current_ctx != NULL;
    pthread_mutex_unlock(&ctx_lock);
    return live ? 0 : 201; /* CUDA_ERROR_INVALID_CONTEXT */
}

EXPORT CUresult cuCtxSetCurrent(void *c) { current_ctx = c; return 0; }
EXPORT CUresult cuCtxGetDevice(int *d) { *d = 0; return ctx_query(); }
EXPORT CUresult cuCtxGetCurrent(void **c) { *c = current_ctx; return ctx_query(); }
EXPORT CUresult cuCtxSynchronize(void) { return 0; }
EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    const char *limit = getenv("NULLDRV_DEVICE_BYTES");
    if (limit != NULL && n > strtoull(limit, NULL, 10)) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *p = next_ptr;
    next_ptr += n;
    return 0;
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
    (void)flags;
    *p = next_ptr;
    next_ptr += n;
    return 0;
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return 0; }
EXPORT CUresult cuMemGetInfo_v2(size_t *f, size_t *t) { *f = 1ULL << 34; *t = 1ULL << 35; return 0; }
EXPORT CUresult cuMemGetInfo(unsigned *f, unsigned *t) { *f = 1u << 31; *t = 0xffffffffu; return 0; }
EXPORT CUresult cuDeviceTotalMem(unsigned *t, int d) { (void)d; *t = 0xffffffffu; return 0; }
EXPORT CUresult cuModuleLoadData(void **m, const void *i) { (void)i; *m = (void *)1; return 0; }
EXPORT CUresult cuModuleGetFunction(void **f, void *m, const char *n) {
    (void)m; (void)n; *f = (void *)1; return 0;
}
EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned sh, void *s, void **p, void **e) {
    (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)sh; (void)s;
    (void)p; (void)e;
    return 0;
}
