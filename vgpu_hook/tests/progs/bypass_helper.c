/*
 * bypass_helper.so - a library that calls the driver directly (DT_NEEDED libcuda.so.1), for
 * bypass_probe's dlmopen and RTLD_DEEPBIND paths: both change which definition of cu* its
 * calls bind to. bypass_helper_alloc sets up a context and returns cuMemAlloc_v2's result.
 */
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
CUresult cuInit(unsigned flags);
CUresult cuDeviceGet(int *dev, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, int dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
int bypass_helper_alloc(size_t bytes);

__attribute__((visibility("default"))) int bypass_helper_alloc(size_t bytes) {
    int dev = 0;
    CUcontext ctx = NULL;
    CUdeviceptr ptr = 0;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx))
        return -1;
    return cuMemAlloc_v2(&ptr, bytes);
}
