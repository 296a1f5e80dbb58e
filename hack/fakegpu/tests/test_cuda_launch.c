/*
 * test_cuda_launch.c - streams, events, modules, launches and graphs of the fake CUDA driver.
 *
 * What it proves:
 *  1. A launch occupies the GPU for launch_ns + ceil(blocks / SMs) * wave_ns, measured with
 *     events (the simulated timeline) and wall-clock synchronisation; a "__ns<N>" kernel name
 *     sets the wave time; 3-D grids count every block.
 *  2. Launches are asynchronous: a stream is NOT_READY until its work's completion time;
 *     stream, event and context synchronisation sleep until it; a launch queue that runs too far
 *     ahead of the GPU blocks the launching thread.
 *  3. Streams order work across each other through events; events report elapsed time and
 *     reject timing-disabled or unrecorded events.
 *  4. Modules/libraries hand out stable function handles; unloading invalidates them; bad
 *     launches (block too large, empty grid, oversized cooperative grid, params+extra) fail.
 *  5. Graphs replay their kernel nodes in order.
 *  6. Contexts are current per thread: two threads launch on their own contexts concurrently.
 *  7. cuModuleGetLoadingMode answers as documented: CUDA_MODULE_LOADING (EAGER, LAZY, DEFAULT;
 *     read at cuInit) decides; unset, DEFAULT or unknown means the driver's default, lazy from
 *     CUDA 12.2 on (the profiles' 13.0), eager before; NOT_INITIALIZED before cuInit, INVALID_VALUE
 *     for a NULL mode; cuGetProcAddress serves it from 11.7.
 */
#include "testutil.h"

#include <pthread.h>
#include <time.h>

#include "cuda_abi.h"

#define MS 1000000ULL

static unsigned long long wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* Float rounding of a simulated duration in ms. */
static double slack_ms(void) { return 0.001; }

static CUfunction setup(const char *kernel)
{
    setenv("VGPU_SIM_KERNEL_NS", "1000000", 1); /* 1 ms per wave */
    setenv("VGPU_SIM_LAUNCH_NS", "0", 1);
    setenv("VGPU_SIM_MAX_QUEUE_NS", "5000000000", 0); /* room for timed_launch blockers */
    tu_node(NULL);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUcontext ctx;
    CHECK(cuCtxCreate_v2(&ctx, 0, 0) == CUDA_SUCCESS); /* GPU A: 132 SMs */
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, "fake image") == CUDA_SUCCESS);
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, mod, kernel) == CUDA_SUCCESS);
    return f;
}

/* Simulated GPU time of one launch of a gx x gy x gz grid of f on stream s. A long "blocker"
 * kernel goes first, so both events and the measured kernel are placed on the simulated
 * timeline back to back: the result is exactly the kernel's duration, however late this process
 * gets the CPU (as long as it is within the blocker's time). */
static float timed_launch(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                          CUstream s)
{
    CUmodule m;
    CUfunction blocker;
    CHECK(cuModuleLoadData(&m, "blocker") == CUDA_SUCCESS);
    CHECK(cuModuleGetFunction(&blocker, m, tu_slow() ? "b__ns2000000000" : "b__ns100000000") ==
          CUDA_SUCCESS);
    CUevent a, b;
    CHECK(cuEventCreate(&a, 0) == CUDA_SUCCESS && cuEventCreate(&b, 0) == CUDA_SUCCESS);
    CHECK(cuLaunchKernel(blocker, 1, 1, 1, 32, 1, 1, 0, s, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuEventRecord(a, s) == CUDA_SUCCESS);
    CHECK(cuLaunchKernel(f, gx, gy, gz, 128, 1, 1, 0, s, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuEventRecord(b, s) == CUDA_SUCCESS);
    CHECK(cuEventSynchronize(b) == CUDA_SUCCESS);
    float ms = -1;
    CHECK(cuEventElapsedTime(&ms, a, b) == CUDA_SUCCESS);
    CHECK(cuEventDestroy_v2(a) == CUDA_SUCCESS && cuEventDestroy_v2(b) == CUDA_SUCCESS);
    CHECK(cuModuleUnload(m) == CUDA_SUCCESS);
    return ms;
}

static void check_between(float ms, double lo, double hi)
{
    if (ms < lo || ms > hi) {
        fprintf(stderr, "elapsed %.3f ms outside [%.3f, %.3f]\n", ms, lo, hi);
        exit(1);
    }
}

static void case_duration_model(void)
{
    CUfunction f = setup("plain");
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    check_between(timed_launch(f, 1, 1, 1, s), 1.0, 1.0 + slack_ms());     /* one wave */
    check_between(timed_launch(f, 132, 1, 1, s), 1.0, 1.0 + slack_ms());   /* still one */
    check_between(timed_launch(f, 133, 1, 1, s), 2.0, 2.0 + slack_ms());   /* two waves */
    check_between(timed_launch(f, 10, 10, 3, s), 3.0, 3.0 + slack_ms());   /* 300 blocks */
    /* The kernel name chooses its wave time. */
    CUmodule mod;
    CHECK(cuModuleLoadData(&mod, "x") == CUDA_SUCCESS);
    CUfunction g, g2;
    CHECK(cuModuleGetFunction(&g, mod, "_Z4spin__ns250000v") == CUDA_SUCCESS);
    CHECK(cuModuleGetFunction(&g2, mod, "_Z4spin__ns250000v") == CUDA_SUCCESS);
    CHECK(g == g2); /* stable handles */
    check_between(timed_launch(g, 264, 1, 1, s), 0.5, 0.5 + slack_ms());
    /* Launch overhead from the environment applies to a fresh process only; checked in the
     * integration tests. The default stream works too. */
    check_between(timed_launch(f, 1, 1, 1, NULL), 1.0, 1.0 + slack_ms());
    check_between(timed_launch(f, 1, 1, 1, CU_STREAM_PER_THREAD), 1.0, 1.0 + slack_ms());
    CHECK(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

static void case_async_and_sync(void)
{
    CUfunction f = setup("long__ns50000000"); /* 50 ms per wave */
    CUstream s1, s2;
    CHECK(cuStreamCreate(&s1, 0) == CUDA_SUCCESS && cuStreamCreate(&s2, 0) == CUDA_SUCCESS);
    unsigned long long t0 = wall_ns();
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s1, NULL, NULL) == CUDA_SUCCESS);
    CHECK(wall_ns() - t0 < 40 * MS); /* the launch itself returned at once */
    CHECK(cuStreamQuery(s1) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamQuery(s2) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s1) == CUDA_SUCCESS);
    CHECK(wall_ns() - t0 >= 50 * MS);
    CHECK(cuStreamQuery(s1) == CUDA_SUCCESS);

    /* Two streams: the GPU runs their kernels one after another; ctx sync waits for both. */
    t0 = wall_ns();
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s1, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s2, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(wall_ns() - t0 >= 100 * MS);

    /* s2 waits for an event recorded on s1 after a kernel. */
    CUevent e, after;
    CHECK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
    CHECK(cuEventCreate(&after, CU_EVENT_BLOCKING_SYNC) == CUDA_SUCCESS);
    t0 = wall_ns();
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, s1, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuEventRecord(e, s1) == CUDA_SUCCESS);
    CHECK(cuEventQuery(e) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamWaitEvent(s2, e, 0) == CUDA_SUCCESS);
    CHECK(cuStreamQuery(s2) == CUDA_ERROR_NOT_READY);
    CHECK(cuEventRecord(after, s2) == CUDA_SUCCESS);
    CHECK(cuEventSynchronize(after) == CUDA_SUCCESS);
    CHECK(wall_ns() - t0 >= 50 * MS);
    float ms;
    CHECK(cuEventElapsedTime(&ms, e, after) == CUDA_ERROR_INVALID_HANDLE); /* timing disabled */
    CUevent never;
    CHECK(cuEventCreate(&never, 0) == CUDA_SUCCESS);
    CHECK(cuEventQuery(never) == CUDA_SUCCESS); /* never recorded counts as complete */
    CHECK(cuEventElapsedTime(&ms, never, after) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuEventCreate(&never, CU_EVENT_INTERPROCESS) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuEventDestroy_v2(e) == CUDA_SUCCESS);
    CHECK(cuEventDestroy_v2(e) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuEventRecord(e, s1) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuEventDestroy_v2(after) == CUDA_SUCCESS);

    /* Stream properties. */
    int least = 1, greatest = 1, prio = 1;
    CHECK(cuCtxGetStreamPriorityRange(&least, &greatest) == CUDA_SUCCESS);
    CHECK(least == 0 && greatest < 0);
    CUstream sp;
    CHECK(cuStreamCreateWithPriority(&sp, CU_STREAM_NON_BLOCKING, -100) == CUDA_SUCCESS);
    CHECK(cuStreamGetPriority(sp, &prio) == CUDA_SUCCESS && prio == greatest);
    unsigned int flags = 0;
    CHECK(cuStreamGetFlags(sp, &flags) == CUDA_SUCCESS && flags == CU_STREAM_NON_BLOCKING);
    CUcontext sc, cur;
    CHECK(cuStreamGetCtx(sp, &sc) == CUDA_SUCCESS && cuCtxGetCurrent(&cur) == CUDA_SUCCESS);
    CHECK(sc == cur);
    CHECK(cuStreamCreate(&sp, 0x8) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuStreamDestroy_v2(s1) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy_v2(s1) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamSynchronize(s1) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuStreamDestroy_v2(s2) == CUDA_SUCCESS);
}

static void case_queue_bound(void)
{
    setenv("VGPU_SIM_MAX_QUEUE_NS", "10000000", 1); /* 10 ms ahead at most */
    CUfunction f = setup("plain");
    unsigned long long t0 = wall_ns();
    for (int i = 0; i < 60; i++)
        CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS);
    /* 60 ms of work, at most 10 ms (+ one kernel) of it may still be queued. */
    CHECK(wall_ns() - t0 >= 48 * MS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(wall_ns() - t0 >= 60 * MS);
}

static void case_launch_validation(void)
{
    CUfunction f = setup("plain");
    CHECK(cuLaunchKernel(f, 1, 1, 1, 1024, 2, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuLaunchKernel(f, 0, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_INVALID_VALUE);
    void *params[1] = {NULL}, *extra[1] = {CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, params, extra) ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(cuLaunchKernel((CUfunction)(void *)&params, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) ==
          CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, (CUstream)(void *)&params, NULL, NULL) ==
          CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuLaunchCooperativeKernel(f, 132, 1, 1, 32, 1, 1, 0, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuLaunchCooperativeKernel(f, 132 * 32 + 1, 1, 1, 32, 1, 1, 0, NULL, NULL) ==
          CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof(attr));
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
    CUlaunchConfig cfg = {.gridDimX = 132 * 32 + 1, .gridDimY = 1, .gridDimZ = 1,
                          .blockDimX = 64, .blockDimY = 1, .blockDimZ = 1,
                          .hStream = NULL, .attrs = &attr, .numAttrs = 1};
    CHECK(cuLaunchKernelEx(&cfg, f, NULL, NULL) == CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE);
    cfg.numAttrs = 0;
    CHECK(cuLaunchKernelEx(&cfg, f, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);

    int v = 0;
    CHECK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f) == 0 && v == 1024);
    CHECK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 65536) == 0);
    CHECK(cuFuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, f) == 0);
    CHECK(v == 65536);
    CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&v, f, 256, 0) == 0 && v == 8);

    /* Modules: files must exist; unloading invalidates functions. */
    CUmodule m;
    CHECK(cuModuleLoad(&m, "/nonexistent/kernel.cubin") == CUDA_ERROR_FILE_NOT_FOUND);
    CHECK(cuModuleLoad(&m, "/proc/self/exe") == CUDA_SUCCESS);
    CHECK(cuModuleLoadDataEx(&m, "img", 0, NULL, NULL) == CUDA_SUCCESS);
    CUfunction h;
    CHECK(cuModuleGetFunction(&h, m, "k") == CUDA_SUCCESS);
    CHECK(cuModuleUnload(m) == CUDA_SUCCESS);
    CHECK(cuModuleUnload(m) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuLaunchKernel(h, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuModuleGetFunction(&h, m, "k") == CUDA_ERROR_INVALID_HANDLE);

    /* Libraries: kernels are launchable directly and through cuKernelGetFunction. */
    CUlibrary lib;
    CHECK(cuLibraryLoadData(&lib, "img", NULL, NULL, 0, NULL, NULL, 0) == CUDA_SUCCESS);
    CUkernel k;
    CHECK(cuLibraryGetKernel(&k, lib, "lk__ns100000") == CUDA_SUCCESS);
    CHECK(cuKernelGetFunction(&h, k) == CUDA_SUCCESS);
    check_between(timed_launch(h, 1, 1, 1, NULL), 0.1, 0.1 + slack_ms());
    CHECK(cuLaunchKernel((CUfunction)(void *)k, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == 0);
    /* Names of any length (C++ template kernels' mangled names run past 128 characters). */
    char long_name[3000];
    memset(long_name, 'x', sizeof(long_name));
    snprintf(long_name + sizeof(long_name) - 16, 16, "k__ns200000");
    CUkernel lk, lk2;
    CHECK(cuLibraryGetKernel(&lk, lib, long_name) == CUDA_SUCCESS);
    CHECK(cuLibraryGetKernel(&lk2, lib, long_name) == CUDA_SUCCESS);
    CHECK(lk == lk2); /* the same kernel */
    CHECK(cuKernelGetFunction(&h, lk) == CUDA_SUCCESS);
    check_between(timed_launch(h, 1, 1, 1, NULL), 0.2, 0.2 + slack_ms());
    long_name[10] = 'y';
    CHECK(cuLibraryGetKernel(&lk2, lib, long_name) == CUDA_SUCCESS);
    CHECK(lk != lk2); /* differs in one character: another kernel */
    CHECK(cuLibraryUnload(lib) == CUDA_SUCCESS);
    CHECK(cuKernelGetFunction(&h, k) == CUDA_ERROR_INVALID_HANDLE);
}

static void note_called(void *arg)
{
    unsigned long long *when = arg;
    *when = wall_ns();
}

/* A host function runs only after the stream's prior work. */
static void case_host_func(void)
{
    CUfunction f = setup("long__ns30000000"); /* 30 ms */
    CHECK(cuFuncSetCacheConfig(f, CU_FUNC_CACHE_PREFER_SHARED) == CUDA_SUCCESS);
    CHECK(cuFuncSetCacheConfig(f, (CUfunc_cache)9) == CUDA_ERROR_INVALID_VALUE);
    unsigned long long when = 0, t0 = wall_ns();
    CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuLaunchHostFunc(NULL, note_called, &when) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(when != 0 && when - t0 >= 30 * MS);
    CHECK(cuLaunchHostFunc(NULL, NULL, NULL) == CUDA_ERROR_INVALID_VALUE);
}

static void case_graphs(void)
{
    CUfunction f = setup("plain");
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0) == CUDA_SUCCESS);
    CUgraphNode prev = NULL, node;
    for (int i = 0; i < 3; i++) {
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof(p));
        p.func = f;
        p.gridDimX = 132;
        p.gridDimY = p.gridDimZ = 1;
        p.blockDimX = 256;
        p.blockDimY = p.blockDimZ = 1;
        CHECK(cuGraphAddKernelNode_v2(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &p) == 0);
        prev = node;
    }
    CUgraphExec x, old;
    CUgraphNode err_node = (CUgraphNode)(void *)&err_node;
    char log[8] = "junk";
    CHECK(cuGraphInstantiate(&old, g, &err_node, log, sizeof(log)) == CUDA_SUCCESS); /* 10.0 ABI */
    CHECK(err_node == NULL && log[0] == '\0');
    CHECK(cuGraphExecDestroy(old) == CUDA_SUCCESS);
    CHECK(cuGraphInstantiateWithFlags(&x, g, 0) == CUDA_SUCCESS);
    CHECK(cuGraphDestroy(g) == CUDA_SUCCESS); /* the executable graph is independent */
    CUevent a, b;
    CHECK(cuEventCreate(&a, 0) == CUDA_SUCCESS && cuEventCreate(&b, 0) == CUDA_SUCCESS);
    CUmodule bm;
    CUfunction blocker;
    CHECK(cuModuleLoadData(&bm, "blocker") == CUDA_SUCCESS);
    CHECK(cuModuleGetFunction(&blocker, bm, tu_slow() ? "b__ns2000000000" : "b__ns100000000") ==
          CUDA_SUCCESS);
    CHECK(cuLaunchKernel(blocker, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuEventRecord(a, NULL) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(x, NULL) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(x, NULL) == CUDA_SUCCESS);
    CHECK(cuEventRecord(b, NULL) == CUDA_SUCCESS);
    CHECK(cuEventSynchronize(b) == CUDA_SUCCESS);
    float ms;
    CHECK(cuEventElapsedTime(&ms, a, b) == CUDA_SUCCESS);
    check_between(ms, 6.0, 6.0 + slack_ms());
    CHECK(cuGraphExecDestroy(x) == CUDA_SUCCESS);
    CHECK(cuGraphLaunch(x, NULL) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuEventDestroy_v2(a) == 0 && cuEventDestroy_v2(b) == 0);
}

/* Each thread makes its own context on GPU B, launches, and checks its own context stays. */
static void *thread_main(void *arg)
{
    CUcontext mine, cur;
    CHECK(cuCtxCreate_v2(&mine, 0, 1) == CUDA_SUCCESS);
    CUmodule m;
    CHECK(cuModuleLoadData(&m, "img") == CUDA_SUCCESS);
    CUfunction f;
    CHECK(cuModuleGetFunction(&f, m, "t") == CUDA_SUCCESS);
    for (int i = 0; i < 20; i++) {
        CHECK(cuLaunchKernel(f, 108, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS);
        CHECK(cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == mine);
    }
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(cuCtxDestroy_v2(mine) == CUDA_SUCCESS);
    *(int *)arg = 1;
    return NULL;
}

static void case_threads(void)
{
    setup("plain");
    pthread_t th[4];
    int done[4] = {0, 0, 0, 0};
    unsigned long long t0 = wall_ns();
    for (int i = 0; i < 4; i++) CHECK(pthread_create(&th[i], NULL, thread_main, &done[i]) == 0);
    for (int i = 0; i < 4; i++) CHECK(pthread_join(th[i], NULL) == 0 && done[i] == 1);
    /* 4 threads x 20 one-wave 1 ms kernels share one GPU: at least 80 ms. */
    CHECK(wall_ns() - t0 >= 80 * MS);
}

/* In a fresh process (the env is read once, at cuInit): the mode with CUDA_MODULE_LOADING=`env`
 * (NULL: unset) on a node whose driver is CUDA `cuda_version`. */
static CUmoduleLoadingMode loading_mode(const char *env, int cuda_version)
{
    fflush(NULL);
    pid_t kid = fork();
    CHECK(kid >= 0);
    if (kid == 0) {
        char profile[sizeof(TU_PROFILE_2GPU) + 16];
        snprintf(profile, sizeof(profile), "%s", TU_PROFILE_2GPU);
        char *v = strstr(profile, "node.cuda_driver_version=13000");
        CHECK(v != NULL);
        memcpy(v + strlen("node.cuda_driver_version="), cuda_version == 12010 ? "12010" : "13000",
               5);
        tu_node(profile);
        if (env != NULL)
            setenv("CUDA_MODULE_LOADING", env, 1);
        else
            unsetenv("CUDA_MODULE_LOADING");
        CUmoduleLoadingMode mode = 0;
        CHECK_EQ_U(cuModuleGetLoadingMode(&mode), CUDA_ERROR_NOT_INITIALIZED);
        CHECK(cuInit(0) == CUDA_SUCCESS);
        CHECK_EQ_U(cuModuleGetLoadingMode(NULL), CUDA_ERROR_INVALID_VALUE);
        CHECK_EQ_U(cuModuleGetLoadingMode(&mode), CUDA_SUCCESS);
        setenv("CUDA_MODULE_LOADING", mode == CU_MODULE_LAZY_LOADING ? "EAGER" : "LAZY", 1);
        CUmoduleLoadingMode again = 0;
        CHECK_EQ_U(cuModuleGetLoadingMode(&again), CUDA_SUCCESS);
        CHECK_EQ_U(again, mode); /* changing the env after cuInit changes nothing */
        _exit((int)mode);
    }
    int st = 0;
    CHECK(waitpid(kid, &st, 0) == kid && WIFEXITED(st));
    return (CUmoduleLoadingMode)WEXITSTATUS(st);
}

static void case_module_loading_mode(void)
{
    CHECK_EQ_U(loading_mode(NULL, 13000), CU_MODULE_LAZY_LOADING);
    CHECK_EQ_U(loading_mode("DEFAULT", 13000), CU_MODULE_LAZY_LOADING);
    CHECK_EQ_U(loading_mode("EAGER", 13000), CU_MODULE_EAGER_LOADING);
    CHECK_EQ_U(loading_mode("eager", 13000), CU_MODULE_EAGER_LOADING);
    CHECK_EQ_U(loading_mode("LAZY", 13000), CU_MODULE_LAZY_LOADING);
    CHECK_EQ_U(loading_mode("sometimes", 13000), CU_MODULE_LAZY_LOADING); /* warned, ignored */
    CHECK_EQ_U(loading_mode(NULL, 12010), CU_MODULE_EAGER_LOADING);
    CHECK_EQ_U(loading_mode("LAZY", 12010), CU_MODULE_LAZY_LOADING);
    /* Served by cuGetProcAddress from the version that introduced it. */
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CHECK_EQ_U(cuGetProcAddress_v2("cuModuleGetLoadingMode", &fn, 11070, 0, &st), CUDA_SUCCESS);
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && fn == (void *)cuModuleGetLoadingMode);
    CHECK_EQ_U(cuGetProcAddress_v2("cuModuleGetLoadingMode", &fn, 11060, 0, &st),
               CUDA_ERROR_NOT_FOUND);
    CHECK_EQ_U(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
}

static const struct tu_case CASES[] = {
    {"duration model", case_duration_model},
    {"asynchrony and synchronisation", case_async_and_sync},
    {"bounded launch queue", case_queue_bound},
    {"launch validation, modules, libraries", case_launch_validation},
    {"host functions", case_host_func},
    {"graphs", case_graphs},
    {"threads", case_threads},
    {"module loading mode", case_module_loading_mode},
};

int main(void)
{
    return tu_report(__FILE__, TU_RUN_CASES(CASES));
}
