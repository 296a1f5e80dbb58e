/*
 * test_cudart_launch.c - kernels through the simulated CUDA runtime, called the way nvcc's
 * generated host code calls it (built and run once per major version).
 *
 * The "program" below is what nvcc emits for a .cu file with one kernel: a fat binary wrapper
 * registered by a static initialiser (__cudaRegisterFatBinary, __cudaRegisterFunction with the
 * host stub's address and the kernel's mangled device name, __cudaRegisterFatBinaryEnd), a host
 * stub that pops the launch configuration and calls cudaLaunchKernel with its own address, and a
 * `<<<grid, block, 0, stream>>>` call site that pushes the configuration and calls the stub. CUDA
 * 13's stubs call __cudaGetKernel once and __cudaLaunchKernel instead; both paths are used.
 *
 * What it proves:
 *  1. A launch occupies the GPU for launch_ns + ceil(blocks / SMs) * wave_ns, with the wave time
 *     from the registered device name's "__ns<N>" part: 10 launches x 4 waves of a 500 us kernel
 *     take exactly 20 ms of simulated GPU time (events) and at least 20 ms of wall time
 *     (synchronisation); a kernel whose name carries no time runs VGPU_SIM_KERNEL_NS per wave.
 *  2. The CUDA 13 path (__cudaGetKernel + __cudaLaunchKernel) times the same way.
 *  3. Errors: an unregistered address is cudaErrorInvalidDeviceFunction, an empty grid or a
 *     1025-thread block cudaErrorInvalidConfiguration, an oversized cooperative grid
 *     cudaErrorCooperativeLaunchTooLarge; popping without a pushed configuration fails.
 *  4. Function attributes, cudaFuncSetAttribute, occupancy, cudaFuncGetName and
 *     cudaGetFuncBySymbol answer for registered kernels.
 *  5. Registration is bookkeeping only: 20,000 kernels register with no GPU node at all, and
 *     unregistering the fat binary forgets them.
 */
#include "testutil.h"

#include <time.h>

#include "cudart_abi.h"

#define MS 1000000ULL

/* ---- What nvcc generates for one .cu file ----------------------------------------------------- */

struct fatbin_wrapper { /* nvcc's __fatBinC_Wrapper_t: never read by the simulator */
    int magic;
    int version;
    const unsigned long long *data;
    void *filename_or_fatbins;
};

static const unsigned long long fatbin_data[4] = {0};
static const struct fatbin_wrapper fatbin = {0x466243b1, 1, fatbin_data, NULL};
static void **fatbin_handle;

/* The host stubs (their addresses name the kernels). */
static void step(int *x);
static void plain(int *x);
static void coop(int *x);

static void register_program(void)
{
    fatbin_handle = __cudaRegisterFatBinary((void *)&fatbin);
    CHECK(fatbin_handle != NULL);
    __cudaRegisterFunction(fatbin_handle, (const char *)step, (char *)"_Z11step__ns500000Pi",
                           "_Z11step__ns500000Pi", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(fatbin_handle, (const char *)plain, (char *)"_Z5plainPi",
                           "_Z5plainPi", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFunction(fatbin_handle, (const char *)coop, (char *)"_Z4coopPi",
                           "_Z4coopPi", -1, NULL, NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(fatbin_handle);
}

/* A stub as nvcc writes it (CUDA 12: cudaLaunchKernel with the stub's own address). */
#define STUB_BODY(self)                                                                           \
    void *args[] = {&x};                                                                          \
    dim3 grid, block;                                                                             \
    size_t smem;                                                                                  \
    cudaStream_t stream;                                                                          \
    if (__cudaPopCallConfiguration(&grid, &block, &smem, &stream) != cudaSuccess) return;        \
    (void)cudaLaunchKernel((const void *)self, grid, block, args, smem, stream)

static void step(int *x) { STUB_BODY(step); }
static void plain(int *x) { STUB_BODY(plain); }
static void coop(int *x) { STUB_BODY(coop); }

/* kernel<<<grid, block, 0, stream>>>(x) */
#define LAUNCH(kernel, grid, block, stream, x)                                                    \
    (__cudaPushCallConfiguration(grid, block, 0, stream) ? (void)0 : kernel(x))

/* ---- Helpers --------------------------------------------------------------------------------- */

static unsigned long long wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

static void setup(void)
{
    setenv("VGPU_SIM_LAUNCH_NS", "0", 1);
    setenv("VGPU_SIM_KERNEL_NS", "100000", 1); /* 100 us per wave for unnamed durations */
    setenv("VGPU_SIM_MAX_QUEUE_NS", "5000000000", 1);
    tu_node(NULL); /* GPU 0: 132 SMs */
    register_program();
}

static const dim3 ONE = {1, 1, 1};
static const dim3 BLOCK = {128, 1, 1};

/* Simulated GPU time of `launches` launches of `kernel` with `blocks` blocks, measured with
 * events placed behind a long blocker so the measurement is exactly the kernels' time. */
static float timed(void (*kernel)(int *), unsigned int blocks, int launches, cudaStream_t s)
{
    int x = 0;
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
    dim3 blocker_grid = {132 * (tu_slow() ? 4000 : 200), 1, 1}; /* 200 waves x 500 us = 100 ms */
    LAUNCH(step, blocker_grid, BLOCK, s, &x);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaEventRecord(a, s) == cudaSuccess);
    dim3 grid = {blocks, 1, 1};
    for (int i = 0; i < launches; i++) LAUNCH(kernel, grid, BLOCK, s, &x);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaEventRecord(b, s) == cudaSuccess);
    CHECK(cudaEventSynchronize(b) == cudaSuccess);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
    CHECK(cudaEventDestroy(a) == cudaSuccess && cudaEventDestroy(b) == cudaSuccess);
    return ms;
}

static void check_ms(float ms, double want)
{
    if (ms < want - 0.001 || ms > want + 0.001) {
        fprintf(stderr, "elapsed %.4f ms, expected %.4f\n", ms, want);
        exit(1);
    }
}

/* ---- Cases ----------------------------------------------------------------------------------- */

static void case_timed_launches(void)
{
    setup();
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    /* 10 launches x 4 waves (528 blocks on 132 SMs) x 500 us = 20 ms of GPU time. */
    check_ms(timed(step, 4 * 132, 10, s), 20.0);
    check_ms(timed(step, 1, 1, s), 0.5);
    check_ms(timed(step, 133, 1, s), 1.0);
    check_ms(timed(plain, 1, 3, s), 0.3); /* no time in the name: VGPU_SIM_KERNEL_NS */
    check_ms(timed(step, 1, 1, NULL), 0.5); /* the default stream */
    check_ms(timed(step, 1, 1, cudaStreamPerThread), 0.5);

    /* Wall clock: the launches return at once, synchronisation waits for the GPU. */
    int x = 0;
    dim3 grid = {4 * 132, 1, 1};
    unsigned long long t0 = wall_ns();
    for (int i = 0; i < 10; i++) LAUNCH(step, grid, BLOCK, s, &x);
    CHECK(cudaStreamQuery(s) == cudaErrorNotReady);
    CHECK(cudaGetLastError() == cudaErrorNotReady);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    unsigned long long took = wall_ns() - t0;
    CHECK(took >= 20 * MS);
    if (!tu_slow()) CHECK(took < 40 * MS);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

static void case_cuda13_launch_path(void)
{
    setup();
    cudaKernel_t k = NULL, k2 = NULL;
    CHECK(__cudaGetKernel(&k, (const void *)step) == cudaSuccess && k != NULL);
    CHECK(cudaGetKernel(&k2, (const void *)step) == cudaSuccess && k2 == k);
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
    int x = 0;
    void *args[] = {&x};
    dim3 blocker = {132 * 200, 1, 1}, grid = {2 * 132, 1, 1};
    CHECK(__cudaLaunchKernel(k, blocker, BLOCK, args, 0, NULL) == cudaSuccess);
    CHECK(cudaEventRecord(a, NULL) == cudaSuccess);
    CHECK(__cudaLaunchKernel(k, grid, BLOCK, args, 0, NULL) == cudaSuccess);
    CHECK(cudaEventRecord(b, NULL) == cudaSuccess);
    CHECK(cudaEventSynchronize(b) == cudaSuccess);
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess);
    check_ms(ms, 1.0);
    CHECK(__cudaGetKernel(&k, (const void *)case_cuda13_launch_path) ==
          cudaErrorInvalidDeviceFunction);
}

static void case_launch_errors(void)
{
    setup();
    int x = 0;
    void *args[] = {&x};
    dim3 empty = {0, 1, 1}, fat = {1025, 1, 1}, huge = {132 * 32 + 1, 1, 1};
    CHECK(cudaLaunchKernel((const void *)case_launch_errors, ONE, BLOCK, args, 0, NULL) ==
          cudaErrorInvalidDeviceFunction);
    CHECK(cudaGetLastError() == cudaErrorInvalidDeviceFunction);
    CHECK(cudaLaunchKernel((const void *)plain, empty, BLOCK, args, 0, NULL) ==
          cudaErrorInvalidConfiguration);
    CHECK(cudaLaunchKernel((const void *)plain, ONE, fat, args, 0, NULL) ==
          cudaErrorInvalidConfiguration);
    CHECK(cudaLaunchCooperativeKernel((const void *)coop, huge, BLOCK, args, 0, NULL) ==
          cudaErrorCooperativeLaunchTooLarge);
    CHECK(cudaLaunchCooperativeKernel((const void *)coop, ONE, BLOCK, args, 0, NULL) ==
          cudaSuccess);
    cudaLaunchAttribute attr;
    memset(&attr, 0, sizeof(attr));
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    cudaLaunchConfig_t cfg = {huge, BLOCK, 0, NULL, &attr, 1};
    CHECK(cudaLaunchKernelExC(&cfg, (const void *)coop, args) == cudaErrorCooperativeLaunchTooLarge);
    cfg.gridDim = ONE;
    CHECK(cudaLaunchKernelExC(&cfg, (const void *)coop, args) == cudaSuccess);
    dim3 g, b;
    size_t smem;
    cudaStream_t st;
    CHECK(__cudaPopCallConfiguration(&g, &b, &smem, &st) == cudaErrorMissingConfiguration);
    (void)cudaGetLastError();
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
}

static void case_attributes_and_occupancy(void)
{
    setup();
    struct cudaFuncAttributes fa;
    CHECK(cudaFuncGetAttributes(&fa, (const void *)step) == cudaSuccess);
    CHECK(fa.maxThreadsPerBlock == 1024 && fa.numRegs > 0 && fa.maxDynamicSharedSizeBytes == 0);
    CHECK(cudaFuncSetAttribute((const void *)step, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               65536) == cudaSuccess);
    CHECK(cudaFuncGetAttributes(&fa, (const void *)step) == cudaSuccess);
    CHECK(fa.maxDynamicSharedSizeBytes == 65536);
    CHECK(cudaFuncGetAttributes(&fa, (const void *)case_attributes_and_occupancy) ==
          cudaErrorInvalidDeviceFunction);
    CHECK(cudaFuncSetCacheConfig((const void *)step, cudaFuncCachePreferShared) == cudaSuccess);
    int blocks = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, (const void *)step, 256, 0) ==
          cudaSuccess);
    CHECK(blocks > 0);
    const char *name = NULL;
    CHECK(cudaFuncGetName(&name, (const void *)plain) == cudaSuccess);
    CHECK(strcmp(name, "_Z5plainPi") == 0);
    cudaFunction_t f = NULL;
    CHECK(cudaGetFuncBySymbol(&f, (const void *)plain) == cudaSuccess && f != NULL);
}

static void nothing(int *x) { (void)x; }

static void case_registration_is_lazy(void)
{
    /* No node at all: registration never reaches the driver. */
    unsetenv("VGPU_SIM_STATE");
    enum { N = 20000 };
    static char names[N][32];
    void **h = __cudaRegisterFatBinary((void *)&fatbin);
    CHECK(h != NULL);
    unsigned long long t0 = wall_ns();
    /* Distinct "host stub" addresses: bytes of one array stand in for N functions. */
    static char stubs[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "_Z6kernel%dv", i);
        __cudaRegisterFunction(h, &stubs[i], names[i], names[i], -1, NULL, NULL, NULL, NULL,
                               NULL);
    }
    __cudaRegisterFatBinaryEnd(h);
    if (!tu_slow()) CHECK(wall_ns() - t0 < 500 * MS);
    const char *name = NULL;
    CHECK(cudaFuncGetName(&name, &stubs[12345]) == cudaSuccess);
    CHECK(strcmp(name, "_Z6kernel12345v") == 0);
    /* The first launch needs the driver, which has no device here. */
    int x = 0;
    void *args[] = {&x};
    CHECK(cudaLaunchKernel(&stubs[1], ONE, BLOCK, args, 0, NULL) == cudaErrorNoDevice);
    __cudaUnregisterFatBinary(h);
    CHECK(cudaFuncGetName(&name, &stubs[12345]) == cudaErrorInvalidDeviceFunction);
    nothing(&x);
}

static void case_unregister_forgets_kernels(void)
{
    setup();
    int x = 0;
    LAUNCH(step, ONE, BLOCK, NULL, &x);
    CHECK(cudaGetLastError() == cudaSuccess);
    __cudaUnregisterFatBinary(fatbin_handle);
    void *args[] = {&x};
    CHECK(cudaLaunchKernel((const void *)step, ONE, BLOCK, args, 0, NULL) ==
          cudaErrorInvalidDeviceFunction);
    register_program(); /* a library loaded again registers again */
    CHECK(cudaLaunchKernel((const void *)step, ONE, BLOCK, args, 0, NULL) == cudaSuccess);
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    __cudaUnregisterFatBinary(fatbin_handle);
}

static const struct tu_case CASES[] = {
    {"timed launches", case_timed_launches},
    {"CUDA 13 launch path", case_cuda13_launch_path},
    {"launch errors", case_launch_errors},
    {"attributes and occupancy", case_attributes_and_occupancy},
    {"registration is lazy", case_registration_is_lazy},
    {"unregister forgets kernels", case_unregister_forgets_kernels},
};

int main(void)
{
    return tu_report(__FILE__, TU_RUN_CASES(CASES));
}
