/*
 * hook_bench - times driver calls as an application makes them (through dlsym'ed pointers, so
 * with the hook preloaded the wrappers are timed, without it the fake driver alone).
 * Prints one JSON object: ns per call for each measured operation.
 *
 * usage: hook_bench ITERATIONS   (HOOK_BENCH_SETTLE_MS: pause after the warm-up)
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) return 2;
    CUresult (*cuInit)(unsigned) = (CUresult (*)(unsigned))dlsym(lib, "cuInit");
    CUresult (*cuDeviceGet)(int *, int) = (CUresult (*)(int *, int))dlsym(lib, "cuDeviceGet");
    CUresult (*retain)(void **, int) = (CUresult (*)(void **, int))dlsym(lib, "cuDevicePrimaryCtxRetain");
    CUresult (*setcur)(void *) = (CUresult (*)(void *))dlsym(lib, "cuCtxSetCurrent");
    CUresult (*sync)(void) = (CUresult (*)(void))dlsym(lib, "cuCtxSynchronize");
    CUresult (*ctxdev)(int *) = (CUresult (*)(int *))dlsym(lib, "cuCtxGetDevice");
    CUresult (*alloc)(CUdeviceptr *, size_t) = (CUresult (*)(CUdeviceptr *, size_t))dlsym(lib, "cuMemAlloc_v2");
    CUresult (*mfree)(CUdeviceptr) = (CUresult (*)(CUdeviceptr))dlsym(lib, "cuMemFree_v2");
    CUresult (*info)(size_t *, size_t *) = (CUresult (*)(size_t *, size_t *))dlsym(lib, "cuMemGetInfo_v2");
    CUresult (*load)(void **, const void *) = (CUresult (*)(void **, const void *))dlsym(lib, "cuModuleLoadData");
    CUresult (*getfn)(void **, void *, const char *) = (CUresult (*)(void **, void *, const char *))dlsym(lib, "cuModuleGetFunction");
    CUresult (*launch)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       void *, void **, void **) =
        (CUresult (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                      void *, void **, void **))dlsym(lib, "cuLaunchKernel");
    int dev = 0;
    void *ctx = NULL, *mod = NULL, *fn = NULL;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || retain(&ctx, dev) || setcur(ctx)) return 3;
    /* A real PTX module (an empty kernel), so the same program runs on a real GPU; the
     * simulated driver accepts any image and takes the kernel's duration from its name. */
    static const char ptx[] = ".version 7.0\n.target sm_50\n.address_size 64\n"
                              ".visible .entry empty__ns0()\n{\n\tret;\n}\n";
    if (load(&mod, ptx) || getfn(&fn, mod, "empty__ns0")) return 4;
    /* warm up (first calls resolve and initialise lazily) */
    for (int i = 0; i < 1000; i++) launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    sync();
    /* Time for a governor (stand-in) to publish a budget into the region before measuring. */
    const char *settle = getenv("HOOK_BENCH_SETTLE_MS");
    if (settle != NULL) {
        long ms = atol(settle);
        struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    double t0 = now_ns();
    for (long i = 0; i < n; i++) launch(fn, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
    double t1 = now_ns();
    sync();
    long m = n / 10;
    double t2 = now_ns();
    for (long i = 0; i < m; i++) {
        CUdeviceptr p = 0;
        alloc(&p, 4096);
        mfree(p);
    }
    double t3 = now_ns();
    size_t fr, tot;
    double t4 = now_ns();
    for (long i = 0; i < n; i++) info(&fr, &tot);
    double t5 = now_ns();
    int cur = 0;
    double t6 = now_ns();
    for (long i = 0; i < n; i++) ctxdev(&cur);
    double t7 = now_ns();
    printf("{\"cuLaunchKernel_ns\": %.1f, \"cuMemAlloc_cuMemFree_pair_ns\": %.1f, "
           "\"cuMemGetInfo_ns\": %.1f, \"cuCtxGetDevice_ns\": %.1f, \"iterations\": %ld}\n",
           (t1 - t0) / (double)n, (t3 - t2) / (double)m, (t5 - t4) / (double)n,
           (t7 - t6) / (double)n, n);
    return 0;
}
