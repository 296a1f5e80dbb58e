/*
 * test_cuda_state.c - the fake CUDA driver as the node state (and so NVML) sees it.
 *
 * The test plays the node operator: it compiles in its own private copy of the state code (as
 * libnvidia-ml does) and meets libcuda's copy in the shared state file.
 *
 * What it proves:
 *  1. Memory a CUDA process allocates is charged to it, per GPU, in the state; a context alone
 *     registers the process with the GPU.
 *  2. Launches feed the GPU's busy timeline: a kernel loop shows ~100 % utilisation for that
 *     GPU and that process; other GPUs stay idle.
 *  3. A GPU flagged lost fails allocations, launches, synchronisation and queries with
 *     CUDA_ERROR_DEVICE_UNAVAILABLE while other GPUs keep working; clearing the flag recovers.
 *  4. A GPU flagged removed is not enumerated by processes that initialise afterwards.
 */
#include "testutil.h"

#include "cuda_abi.h"
#include "simstate.h"

/* The state code, private to this test binary. */
#include "../src/simstate.c"
#include "../src/simstate_profile.c"

#define MiB (1024ULL * 1024)

static CUfunction kernel(const char *name)
{
    CUmodule m;
    CUfunction f;
    CHECK(cuModuleLoadData(&m, "img") == CUDA_SUCCESS);
    CHECK(cuModuleGetFunction(&f, m, name) == CUDA_SUCCESS);
    return f;
}

static void case_accounting_and_utilisation(void)
{
    /* A deep launch queue, so the GPU stays busy even if this process loses the CPU a while. */
    setenv("VGPU_SIM_MAX_QUEUE_NS", "200000000", 1);
    tu_node(NULL);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUcontext ctx;
    CHECK(cuCtxCreate_v2(&ctx, 0, 1) == CUDA_SUCCESS);
    struct sim_proc_usage rows[4];
    CHECK(sim_processes(1, rows, 4) == 1); /* the context alone registers the process */
    CHECK(rows[0].pid == getpid() && rows[0].bytes == 0);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 300 * MiB) == CUDA_SUCCESS);
    CHECK_EQ_U(sim_mem_used_by(1, getpid()), 300 * MiB);
    CHECK_EQ_U(sim_mem_used(0), 0);

    CUfunction f = kernel("busy__ns1000000"); /* 1 ms per wave */
    unsigned long long t0 = sim_now_ns();
    while (sim_now_ns() - t0 < 400000000ULL)
        CHECK(cuLaunchKernel(f, 108, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS);
    unsigned int total = sim_utilization(1, 0, 200000000ULL);
    unsigned int mine = sim_utilization(1, getpid(), 200000000ULL);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    if (total < 95 || mine < 95) {
        fprintf(stderr, "utilisation %u%% (this process %u%%), want >= 95\n", total, mine);
        exit(1);
    }
    CHECK(sim_utilization(0, 0, 200000000ULL) == 0);
    CHECK(cuMemFree_v2(p) == CUDA_SUCCESS);
    CHECK_EQ_U(sim_mem_used_by(1, getpid()), 0);
}

static void case_lost_gpu(void)
{
    tu_node(NULL);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUcontext c0, c1;
    CHECK(cuCtxCreate_v2(&c0, 0, 0) == CUDA_SUCCESS);
    CUfunction f0 = kernel("k");
    CHECK(cuCtxCreate_v2(&c1, 0, 1) == CUDA_SUCCESS);
    CUfunction f1 = kernel("k");
    CUdeviceptr held;
    CHECK(cuMemAlloc_v2(&held, 64 * MiB) == CUDA_SUCCESS);

    CHECK(sim_set_flag(1, SIM_GPU_LOST, 1) == 0);
    CUdeviceptr p;
    size_t fr, tot;
    int v;
    CUcontext other;
    CHECK(cuMemAlloc_v2(&p, 1) == CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(cuLaunchKernel(f1, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) ==
          CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(cuCtxSynchronize() == CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(cuMemGetInfo_v2(&fr, &tot) == CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 1) ==
          CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(cuCtxCreate_v2(&other, 0, 1) == CUDA_ERROR_DEVICE_UNAVAILABLE);
    CHECK(cuMemFree_v2(held) == CUDA_SUCCESS); /* cleanup is still allowed */

    /* The other GPU is unaffected. */
    CHECK(cuCtxPushCurrent_v2(c0) == CUDA_SUCCESS);
    CHECK(cuMemAlloc_v2(&p, 1 * MiB) == CUDA_SUCCESS);
    CHECK(cuLaunchKernel(f0, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
    CHECK(cuCtxPopCurrent_v2(NULL) == CUDA_SUCCESS);

    CHECK(sim_set_flag(1, SIM_GPU_LOST, 0) == 0);
    CHECK(cuMemAlloc_v2(&p, 1 * MiB) == CUDA_SUCCESS);
    CHECK(cuLaunchKernel(f1, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL) == CUDA_SUCCESS);
    CHECK(cuCtxSynchronize() == CUDA_SUCCESS);
}

static void case_removed_gpu(void)
{
    tu_node(NULL);
    CHECK(sim_attach() == 0);
    CHECK(sim_set_flag(0, SIM_GPU_REMOVED, 1) == 0);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    int n = 0;
    char name[64];
    CHECK(cuDeviceGetCount(&n) == CUDA_SUCCESS && n == 1);
    CHECK(cuDeviceGetName(name, sizeof(name), 0) == CUDA_SUCCESS);
    CHECK(strcmp(name, "NVIDIA Test GPU B") == 0);
}

static const struct tu_case CASES[] = {
    {"accounting and utilisation", case_accounting_and_utilisation},
    {"lost GPU", case_lost_gpu},
    {"removed GPU", case_removed_gpu},
};

int main(void)
{
    (void)tu_slow;
    return tu_report(__FILE__, TU_RUN_CASES(CASES));
}
