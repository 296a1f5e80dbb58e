/*
 * cuda_bench - per-call cost of the simulated driver's hot paths, for bench/fakegpu_cuda_bench.py.
 *
 *   cuda_bench ORDINAL ITERATIONS
 * Prints one JSON object of nanoseconds per call (median of 5 rounds of ITERATIONS calls):
 *   launch_ns        cuLaunchKernel of a 1 ns kernel, never synchronised (the enqueue cost,
 *                    including the node state's cross-process lock);
 *   launch_sync_ns   cuLaunchKernel + cuStreamSynchronize of a 1 ns kernel (the round trip);
 *   alloc_free_ns    cuMemAlloc_v2 + cuMemFree_v2 of 4 KiB (two state updates);
 *   mem_get_info_ns  cuMemGetInfo_v2;
 *   proc_address_ns  cuGetProcAddress_v2("cuMemAlloc", 12000) (a table scan).
 */
#include "cuda_prog.h"

#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

enum bench { LAUNCH, LAUNCH_SYNC, ALLOC_FREE, MEM_GET_INFO, PROC_ADDRESS, NBENCH };
static const char *const names[NBENCH] = {"launch_ns", "launch_sync_ns", "alloc_free_ns",
                                          "mem_get_info_ns", "proc_address_ns"};

static CUfunction fn;
static CUstream stream;

static void run_once(enum bench b)
{
    CUdeviceptr p;
    size_t fr, tot;
    void *sym;
    CUdriverProcAddressQueryResult st;
    switch (b) {
    case LAUNCH: CU_OK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL)); break;
    case LAUNCH_SYNC:
        CU_OK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, NULL, NULL));
        CU_OK(cuStreamSynchronize(stream));
        break;
    case ALLOC_FREE:
        CU_OK(cuMemAlloc_v2(&p, 4096));
        CU_OK(cuMemFree_v2(p));
        break;
    case MEM_GET_INFO: CU_OK(cuMemGetInfo_v2(&fr, &tot)); break;
    case PROC_ADDRESS: CU_OK(cuGetProcAddress_v2("cuMemAlloc", &sym, 12000, 0, &st)); break;
    default: break;
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cuda_bench ORDINAL ITERATIONS\n");
        return 2;
    }
    prog_context(atoi(argv[1]));
    long iterations = atol(argv[2]);
    CUmodule mod;
    CU_OK(cuModuleLoadData(&mod, "simulated"));
    CU_OK(cuModuleGetFunction(&fn, mod, "bench__ns1"));
    CU_OK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    printf("{");
    for (int b = 0; b < NBENCH; b++) {
        double rounds[5];
        for (int r = 0; r < 5; r++) {
            double t0 = prog_now();
            for (long i = 0; i < iterations; i++) run_once((enum bench)b);
            rounds[r] = (prog_now() - t0) * 1e9 / (double)iterations;
            CU_OK(cuStreamSynchronize(stream));
        }
        qsort(rounds, 5, sizeof(double), cmp_double);
        printf("%s\"%s\": %.1f", b ? ", " : "", names[b], rounds[2]);
    }
    printf("}\n");
    return 0;
}
