/*
 * cuda_spin - keep a GPU busy by launching simulated kernels in a loop.
 *
 *   cuda_spin ORDINAL SECONDS [BLOCKS [SYNC_EVERY]]
 * Launches a kernel of BLOCKS blocks (default: one wave = the device's SM count) on a stream
 * again and again for SECONDS of wall time, synchronising the stream every SYNC_EVERY launches
 * (default 0: never, so the launch queue stays full as in a throughput-bound training loop; the
 * driver's bounded queue paces the loop). The kernel's per-wave time is the driver's
 * VGPU_SIM_KERNEL_NS unless the environment sets CUDA_SPIN_KERNEL (a kernel name, e.g.
 * "step__ns500000"). Prints "launches=<n> seconds=<wall> gpu_ms=<simulated busy time>".
 */
#include "cuda_prog.h"

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cuda_spin ORDINAL SECONDS [BLOCKS [SYNC_EVERY]]\n");
        return 2;
    }
    int ordinal = atoi(argv[1]);
    double seconds = atof(argv[2]);
    prog_context(ordinal);
    int sms = 0;
    CU_OK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal));
    unsigned int blocks = argc > 3 ? (unsigned int)atoi(argv[3]) : (unsigned int)sms;
    int sync_every = argc > 4 ? atoi(argv[4]) : 0;
    const char *kernel = getenv("CUDA_SPIN_KERNEL");

    CUmodule mod;
    CUfunction fn;
    CUstream s;
    CUevent start, stop;
    CU_OK(cuModuleLoadData(&mod, "simulated"));
    CU_OK(cuModuleGetFunction(&fn, mod, kernel && *kernel ? kernel : "spin"));
    CU_OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CU_OK(cuEventCreate(&start, 0));
    CU_OK(cuEventCreate(&stop, 0));
    printf("started\n");
    fflush(stdout);

    double t0 = prog_now();
    unsigned long long launches = 0;
    CU_OK(cuEventRecord(start, s));
    while (prog_now() - t0 < seconds) {
        CU_OK(cuLaunchKernel(fn, blocks, 1, 1, 256, 1, 1, 0, s, NULL, NULL));
        launches++;
        if (sync_every > 0 && launches % (unsigned long long)sync_every == 0)
            CU_OK(cuStreamSynchronize(s));
    }
    CU_OK(cuEventRecord(stop, s));
    CU_OK(cuEventSynchronize(stop));
    float ms = 0;
    CU_OK(cuEventElapsedTime(&ms, start, stop));
    printf("launches=%llu seconds=%.3f gpu_ms=%.1f\n", launches, prog_now() - t0, (double)ms);
    return 0;
}
