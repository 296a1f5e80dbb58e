/*
 * cuda_prog.h - helpers shared by the small CUDA driver-API programs the integration tests run
 * against the simulated GPUs (tests/integration/fakegpu/). Each program is an ordinary CUDA
 * client: it links libcuda.so.1 and finds it through the loader's normal search
 * (LD_LIBRARY_PATH), so the same binaries can run under the vgpu_hook interception library.
 */
#ifndef VGPU_CUDA_PROG_H
#define VGPU_CUDA_PROG_H

#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_abi.h"

/* Exit with status 3 and the CUDA error's name when a call fails. */
#define CU_OK(call)                                                                        \
    do {                                                                                   \
        CUresult rc_ = (call);                                                             \
        if (rc_ != CUDA_SUCCESS) {                                                         \
            const char *name_ = NULL;                                                      \
            cuGetErrorName(rc_, &name_);                                                   \
            printf("error %s %s\n", #call, name_ ? name_ : "?");                         \
            fflush(stdout);                                                                \
            exit(3);                                                                       \
        }                                                                                  \
    } while (0)

static inline double prog_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Initialise the driver and make device `ordinal`'s primary context current. */
static inline CUcontext prog_context(int ordinal)
{
    CUdevice dev;
    CUcontext ctx;
    CU_OK(cuInit(0));
    CU_OK(cuDeviceGet(&dev, ordinal));
    CU_OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CU_OK(cuCtxSetCurrent(ctx));
    return ctx;
}

#endif
