/*
 * cudart_device.c - devices: count, selection, properties, attributes, flags, limits, peers,
 * synchronisation and reset.
 *
 * Everything is answered by the driver: cudaGetDeviceProperties fills each field from the
 * driver attribute it stands for (the simulated driver answers from the machine profile), so a
 * property and the matching cudaDeviceGetAttribute / cuDeviceGetAttribute always agree. The
 * runtime's cudaDevAttr values are the driver's CU_DEVICE_ATTRIBUTE values and are forwarded as
 * they are.
 */
#include <string.h>

#include "cudart_internal.h"

/* The cudaDevAttr (= CU_DEVICE_ATTRIBUTE) values cudaGetDeviceProperties reads. */
enum prop_attr {
    A_MAX_THREADS_PER_BLOCK = 1, A_MAX_BLOCK_DIM_X = 2, A_MAX_GRID_DIM_X = 5,
    A_SHARED_PER_BLOCK = 8, A_TOTAL_CONST = 9, A_WARP_SIZE = 10, A_MAX_PITCH = 11,
    A_REGS_PER_BLOCK = 12, A_CLOCK_RATE = 13, A_TEXTURE_ALIGNMENT = 14, A_GPU_OVERLAP = 15,
    A_SM_COUNT = 16, A_KERNEL_EXEC_TIMEOUT = 17, A_INTEGRATED = 18, A_CAN_MAP_HOST = 19,
    A_COMPUTE_MODE = 20, A_TEX1D_W = 21, A_TEX2D_W = 22, A_TEX2D_H = 23, A_TEX3D_W = 24,
    A_TEX3D_H = 25, A_TEX3D_D = 26, A_TEX2D_LAYERED_W = 27, A_TEX2D_LAYERED_H = 28,
    A_TEX2D_LAYERED_L = 29, A_SURFACE_ALIGNMENT = 30, A_CONCURRENT_KERNELS = 31, A_ECC = 32,
    A_PCI_BUS = 33, A_PCI_DEVICE = 34, A_TCC = 35, A_MEMORY_CLOCK = 36, A_BUS_WIDTH = 37,
    A_L2 = 38, A_THREADS_PER_SM = 39, A_ASYNC_ENGINES = 40, A_UNIFIED_ADDRESSING = 41,
    A_TEX1D_LAYERED_W = 42, A_TEX1D_LAYERED_L = 43, A_TEX2D_GATHER_W = 45, A_TEX2D_GATHER_H = 46,
    A_TEX3D_W_ALT = 47, A_TEX3D_H_ALT = 48, A_TEX3D_D_ALT = 49, A_PCI_DOMAIN = 50,
    A_TEXTURE_PITCH_ALIGNMENT = 51, A_TEXCUBE_W = 52, A_TEXCUBE_LAYERED_W = 53,
    A_TEXCUBE_LAYERED_L = 54, A_SURF1D_W = 55, A_SURF2D_W = 56, A_SURF2D_H = 57, A_SURF3D_W = 58,
    A_SURF3D_H = 59, A_SURF3D_D = 60, A_SURF1D_LAYERED_W = 61, A_SURF1D_LAYERED_L = 62,
    A_SURF2D_LAYERED_W = 63, A_SURF2D_LAYERED_H = 64, A_SURF2D_LAYERED_L = 65,
    A_SURFCUBE_W = 66, A_SURFCUBE_LAYERED_W = 67, A_SURFCUBE_LAYERED_L = 68,
    A_TEX1D_LINEAR_W = 69, A_TEX2D_LINEAR_W = 70, A_TEX2D_LINEAR_H = 71, A_TEX2D_LINEAR_P = 72,
    A_TEX2D_MIPMAP_W = 73, A_TEX2D_MIPMAP_H = 74, A_CC_MAJOR = 75, A_CC_MINOR = 76,
    A_TEX1D_MIPMAP_W = 77, A_STREAM_PRIORITIES = 78, A_GLOBAL_L1 = 79, A_LOCAL_L1 = 80,
    A_SHARED_PER_SM = 81, A_REGS_PER_SM = 82, A_MANAGED = 83, A_MULTI_GPU_BOARD = 84,
    A_MULTI_GPU_BOARD_GROUP = 85, A_HOST_NATIVE_ATOMIC = 86, A_SINGLE_TO_DOUBLE = 87,
    A_PAGEABLE_ACCESS = 88, A_CONCURRENT_MANAGED = 89, A_PREEMPTION = 90,
    A_HOST_POINTER_FOR_REGISTERED = 91, A_COOPERATIVE = 95, A_COOPERATIVE_MULTI_DEVICE = 96,
    A_SHARED_PER_BLOCK_OPTIN = 97, A_HOST_REGISTER = 99, A_PAGEABLE_USES_HOST_TABLES = 100,
    A_DIRECT_MANAGED_FROM_HOST = 101, A_BLOCKS_PER_SM = 106, A_PERSISTING_L2 = 108,
    A_ACCESS_POLICY_WINDOW = 109, A_RESERVED_SHARED_PER_BLOCK = 111, A_SPARSE_ARRAYS = 112,
    A_HOST_REGISTER_READ_ONLY = 113, A_TIMELINE_SEMAPHORE = 114, A_MEMORY_POOLS = 115,
    A_RDMA = 116, A_RDMA_FLUSH = 117, A_RDMA_ORDERING = 118, A_POOL_HANDLE_TYPES = 119,
    A_CLUSTER_LAUNCH = 120, A_DEFERRED_MAPPING = 121, A_IPC_EVENT = 125,
    A_UNIFIED_FUNCTION_POINTERS = 129, A_NUMA_CONFIG = 130, A_NUMA_ID = 131, A_MPS = 133,
    A_HOST_NUMA_ID = 134, A_GPU_PCI_DEVICE_ID = 139, A_GPU_PCI_SUBSYSTEM_ID = 140,
    A_HOST_NUMA_MULTINODE_IPC = 143,
};

static cudaError_t check_device(int device) {
    CUDART_TRY(cudart_init());
    return device >= 0 && device < cudart_device_count() ? cudaSuccess : cudaErrorInvalidDevice;
}

CUDART_API cudaError_t cudaGetDeviceCount(int *count) {
    if (count == NULL) return cudart_ret(cudaErrorInvalidValue);
    *count = 0;
    CUDART_TRY(cudart_init());
    *count = cudart_device_count();
    return cudaSuccess;
}

CUDART_API cudaError_t cudaSetDevice(int device) {
    CUDART_TRY(check_device(device));
    CUcontext primary;
    CUDART_TRY(cudart_primary(device, &primary));
    CUDART_TRY_DRIVER(cuCtxSetCurrent, primary);
    cudart_set_thread_device(device);
    return cudaSuccess;
}

CUDART_API cudaError_t cudaGetDevice(int *device) {
    if (device == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_init());
    CUcontext cur = NULL;
    if (cudart_drv.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != NULL) {
        CUdevice d = 0;
        CUDART_TRY_DRIVER(cuCtxGetDevice, &d);
        *device = d;
        return cudaSuccess;
    }
    *device = cudart_thread_device();
    return cudaSuccess;
}

/* The device the runtime's "current device" calls work on. */
static cudaError_t current_device(int *dev) { return cudart_ctx(NULL, dev); }

CUDART_API cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags) {
    if (flags & ~(unsigned int)cudaInitDeviceFlagsAreValid) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(check_device(device));
    if (flags & cudaInitDeviceFlagsAreValid)
        CUDART_TRY_DRIVER(cuDevicePrimaryCtxSetFlags_v2, device,
                          deviceFlags & ~(unsigned int)cudaDeviceMapHost);
    CUcontext primary;
    return cudart_ret(cudart_primary(device, &primary));
}

CUDART_API cudaError_t cudaSetDeviceFlags(unsigned int flags) {
    if (flags & ~(unsigned int)cudaDeviceMask) return cudart_ret(cudaErrorInvalidValue);
    int dev;
    CUDART_TRY(current_device(&dev));
    /* Mapped pinned memory is always on (unified addressing); the driver takes the rest. */
    return CUDART_DRIVER(cuDevicePrimaryCtxSetFlags_v2, dev,
                         flags & ~(unsigned int)cudaDeviceMapHost);
}

CUDART_API cudaError_t cudaGetDeviceFlags(unsigned int *flags) {
    if (flags == NULL) return cudart_ret(cudaErrorInvalidValue);
    int dev, active = 0;
    CUDART_TRY(current_device(&dev));
    CUDART_TRY_DRIVER(cuDevicePrimaryCtxGetState, dev, flags, &active);
    *flags |= cudaDeviceMapHost;
    return cudaSuccess;
}

static int attr(int dev, int a) {
    int v = 0;
    if (cudart_drv.cuDeviceGetAttribute(&v, (CUdevice_attribute)a, dev) != CUDA_SUCCESS) v = 0;
    return v;
}

static void attrs(int dev, int *out, int first, int n) {
    for (int i = 0; i < n; i++) out[i] = attr(dev, first + i);
}

static cudaError_t properties(struct cudaDeviceProp *p, int dev) {
    if (p == NULL) return cudaErrorInvalidValue;
    CUDART_TRY(check_device(dev));
    memset(p, 0, sizeof(*p));
    CUdevice d = dev;
    size_t total = 0;
    CUDART_TRY(cudart_error(cudart_drv.cuDeviceGetName(p->name, (int)sizeof(p->name), d)));
    CUDART_TRY(cudart_error(cudart_drv.cuDeviceGetUuid_v2((CUuuid *)&p->uuid, d)));
    CUDART_TRY(cudart_error(cudart_drv.cuDeviceTotalMem_v2(&total, d)));
    p->totalGlobalMem = total;
    p->sharedMemPerBlock = (size_t)attr(dev, A_SHARED_PER_BLOCK);
    p->regsPerBlock = attr(dev, A_REGS_PER_BLOCK);
    p->warpSize = attr(dev, A_WARP_SIZE);
    p->memPitch = (size_t)attr(dev, A_MAX_PITCH);
    p->maxThreadsPerBlock = attr(dev, A_MAX_THREADS_PER_BLOCK);
    attrs(dev, p->maxThreadsDim, A_MAX_BLOCK_DIM_X, 3);
    attrs(dev, p->maxGridSize, A_MAX_GRID_DIM_X, 3);
    p->totalConstMem = (size_t)attr(dev, A_TOTAL_CONST);
    p->major = attr(dev, A_CC_MAJOR);
    p->minor = attr(dev, A_CC_MINOR);
    p->textureAlignment = (size_t)attr(dev, A_TEXTURE_ALIGNMENT);
    p->texturePitchAlignment = (size_t)attr(dev, A_TEXTURE_PITCH_ALIGNMENT);
    p->multiProcessorCount = attr(dev, A_SM_COUNT);
    p->integrated = attr(dev, A_INTEGRATED);
    p->canMapHostMemory = attr(dev, A_CAN_MAP_HOST);
    p->maxTexture1D = attr(dev, A_TEX1D_W);
    p->maxTexture1DMipmap = attr(dev, A_TEX1D_MIPMAP_W);
    p->maxTexture2D[0] = attr(dev, A_TEX2D_W);
    p->maxTexture2D[1] = attr(dev, A_TEX2D_H);
    p->maxTexture2DMipmap[0] = attr(dev, A_TEX2D_MIPMAP_W);
    p->maxTexture2DMipmap[1] = attr(dev, A_TEX2D_MIPMAP_H);
    attrs(dev, p->maxTexture2DLinear, A_TEX2D_LINEAR_W, 3);
    p->maxTexture2DGather[0] = attr(dev, A_TEX2D_GATHER_W);
    p->maxTexture2DGather[1] = attr(dev, A_TEX2D_GATHER_H);
    attrs(dev, p->maxTexture3D, A_TEX3D_W, 3);
    attrs(dev, p->maxTexture3DAlt, A_TEX3D_W_ALT, 3);
    p->maxTextureCubemap = attr(dev, A_TEXCUBE_W);
    p->maxTexture1DLayered[0] = attr(dev, A_TEX1D_LAYERED_W);
    p->maxTexture1DLayered[1] = attr(dev, A_TEX1D_LAYERED_L);
    attrs(dev, p->maxTexture2DLayered, A_TEX2D_LAYERED_W, 3);
    p->maxTextureCubemapLayered[0] = attr(dev, A_TEXCUBE_LAYERED_W);
    p->maxTextureCubemapLayered[1] = attr(dev, A_TEXCUBE_LAYERED_L);
    p->maxSurface1D = attr(dev, A_SURF1D_W);
    p->maxSurface2D[0] = attr(dev, A_SURF2D_W);
    p->maxSurface2D[1] = attr(dev, A_SURF2D_H);
    attrs(dev, p->maxSurface3D, A_SURF3D_W, 3);
    p->maxSurface1DLayered[0] = attr(dev, A_SURF1D_LAYERED_W);
    p->maxSurface1DLayered[1] = attr(dev, A_SURF1D_LAYERED_L);
    attrs(dev, p->maxSurface2DLayered, A_SURF2D_LAYERED_W, 3);
    p->maxSurfaceCubemap = attr(dev, A_SURFCUBE_W);
    p->maxSurfaceCubemapLayered[0] = attr(dev, A_SURFCUBE_LAYERED_W);
    p->maxSurfaceCubemapLayered[1] = attr(dev, A_SURFCUBE_LAYERED_L);
    p->surfaceAlignment = (size_t)attr(dev, A_SURFACE_ALIGNMENT);
    p->concurrentKernels = attr(dev, A_CONCURRENT_KERNELS);
    p->ECCEnabled = attr(dev, A_ECC);
    p->pciBusID = attr(dev, A_PCI_BUS);
    p->pciDeviceID = attr(dev, A_PCI_DEVICE);
    p->pciDomainID = attr(dev, A_PCI_DOMAIN);
    p->tccDriver = attr(dev, A_TCC);
    p->asyncEngineCount = attr(dev, A_ASYNC_ENGINES);
    p->unifiedAddressing = attr(dev, A_UNIFIED_ADDRESSING);
    p->memoryBusWidth = attr(dev, A_BUS_WIDTH);
    p->l2CacheSize = attr(dev, A_L2);
    p->persistingL2CacheMaxSize = attr(dev, A_PERSISTING_L2);
    p->maxThreadsPerMultiProcessor = attr(dev, A_THREADS_PER_SM);
    p->streamPrioritiesSupported = attr(dev, A_STREAM_PRIORITIES);
    p->globalL1CacheSupported = attr(dev, A_GLOBAL_L1);
    p->localL1CacheSupported = attr(dev, A_LOCAL_L1);
    p->sharedMemPerMultiprocessor = (size_t)attr(dev, A_SHARED_PER_SM);
    p->regsPerMultiprocessor = attr(dev, A_REGS_PER_SM);
    p->managedMemory = attr(dev, A_MANAGED);
    p->isMultiGpuBoard = attr(dev, A_MULTI_GPU_BOARD);
    p->multiGpuBoardGroupID = attr(dev, A_MULTI_GPU_BOARD_GROUP);
    p->hostNativeAtomicSupported = attr(dev, A_HOST_NATIVE_ATOMIC);
    p->pageableMemoryAccess = attr(dev, A_PAGEABLE_ACCESS);
    p->concurrentManagedAccess = attr(dev, A_CONCURRENT_MANAGED);
    p->computePreemptionSupported = attr(dev, A_PREEMPTION);
    p->canUseHostPointerForRegisteredMem = attr(dev, A_HOST_POINTER_FOR_REGISTERED);
    p->cooperativeLaunch = attr(dev, A_COOPERATIVE);
    p->sharedMemPerBlockOptin = (size_t)attr(dev, A_SHARED_PER_BLOCK_OPTIN);
    p->pageableMemoryAccessUsesHostPageTables = attr(dev, A_PAGEABLE_USES_HOST_TABLES);
    p->directManagedMemAccessFromHost = attr(dev, A_DIRECT_MANAGED_FROM_HOST);
    p->maxBlocksPerMultiProcessor = attr(dev, A_BLOCKS_PER_SM);
    p->accessPolicyMaxWindowSize = attr(dev, A_ACCESS_POLICY_WINDOW);
    p->reservedSharedMemPerBlock = (size_t)attr(dev, A_RESERVED_SHARED_PER_BLOCK);
    p->hostRegisterSupported = attr(dev, A_HOST_REGISTER);
    p->sparseCudaArraySupported = attr(dev, A_SPARSE_ARRAYS);
    p->hostRegisterReadOnlySupported = attr(dev, A_HOST_REGISTER_READ_ONLY);
    p->timelineSemaphoreInteropSupported = attr(dev, A_TIMELINE_SEMAPHORE);
    p->memoryPoolsSupported = attr(dev, A_MEMORY_POOLS);
    p->gpuDirectRDMASupported = attr(dev, A_RDMA);
    p->gpuDirectRDMAFlushWritesOptions = (unsigned int)attr(dev, A_RDMA_FLUSH);
    p->gpuDirectRDMAWritesOrdering = attr(dev, A_RDMA_ORDERING);
    p->memoryPoolSupportedHandleTypes = (unsigned int)attr(dev, A_POOL_HANDLE_TYPES);
    p->deferredMappingCudaArraySupported = attr(dev, A_DEFERRED_MAPPING);
    p->ipcEventSupported = attr(dev, A_IPC_EVENT);
    p->clusterLaunch = attr(dev, A_CLUSTER_LAUNCH);
    p->unifiedFunctionPointers = attr(dev, A_UNIFIED_FUNCTION_POINTERS);
#if VGPU_CUDART_MAJOR == 12
    p->clockRate = attr(dev, A_CLOCK_RATE);
    p->deviceOverlap = attr(dev, A_GPU_OVERLAP);
    p->kernelExecTimeoutEnabled = attr(dev, A_KERNEL_EXEC_TIMEOUT);
    p->computeMode = attr(dev, A_COMPUTE_MODE);
    p->maxTexture1DLinear = attr(dev, A_TEX1D_LINEAR_W);
    p->memoryClockRate = attr(dev, A_MEMORY_CLOCK);
    p->singleToDoublePrecisionPerfRatio = attr(dev, A_SINGLE_TO_DOUBLE);
    p->cooperativeMultiDeviceLaunch = attr(dev, A_COOPERATIVE_MULTI_DEVICE);
#else
    p->deviceNumaConfig = attr(dev, A_NUMA_CONFIG);
    p->deviceNumaId = attr(dev, A_NUMA_ID);
    p->mpsEnabled = attr(dev, A_MPS);
    p->hostNumaId = attr(dev, A_HOST_NUMA_ID);
    p->gpuPciDeviceID = (unsigned int)attr(dev, A_GPU_PCI_DEVICE_ID);
    p->gpuPciSubsystemID = (unsigned int)attr(dev, A_GPU_PCI_SUBSYSTEM_ID);
    p->hostNumaMultinodeIpcSupported = attr(dev, A_HOST_NUMA_MULTINODE_IPC);
#endif
    return cudaSuccess;
}

CUDART_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device) {
    return cudart_ret(properties(prop, device));
}

#if VGPU_CUDART_MAJOR == 12
/* What CUDA 12's headers call under the name cudaGetDeviceProperties (same structure). */
CUDART_API cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device) {
    return cudart_ret(properties(prop, device));
}
#endif

CUDART_API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr_id,
                                              int device) {
    if (value == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(check_device(device));
    return CUDART_DRIVER(cuDeviceGetAttribute, value, (CUdevice_attribute)attr_id, device);
}

CUDART_API cudaError_t cudaDeviceSynchronize(void) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuCtxSynchronize);
}

#if VGPU_CUDART_MAJOR == 12
CUDART_API cudaError_t cudaThreadSynchronize(void) { return cudaDeviceSynchronize(); }
CUDART_API cudaError_t cudaThreadExit(void) { return cudaDeviceReset(); }
#endif

/* Destroys the current device's primary context and everything in it; the next call that needs
 * the device creates it again. */
CUDART_API cudaError_t cudaDeviceReset(void) {
    CUcontext ctx;
    int dev;
    CUDART_TRY(cudart_ctx(&ctx, &dev));
    CUcontext primary;
    CUDART_TRY(cudart_primary(dev, &primary));
    (void)cudart_drv.cuCtxSynchronize();
    CUDART_TRY_DRIVER(cuDevicePrimaryCtxReset_v2, dev);
    cudart_forget_primary(dev);
    if (ctx == primary) (void)cudart_drv.cuCtxSetCurrent(NULL);
    return cudaSuccess;
}

CUDART_API cudaError_t cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit) {
    if (pValue == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuCtxGetLimit, pValue, (CUlimit)limit);
}

CUDART_API cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuCtxSetLimit, (CUlimit)limit, value);
}

/* Cache preferences are accepted and remembered per thread: simulated kernels have no cache. */
static __thread enum cudaFuncCache tls_cache_config = cudaFuncCachePreferNone;

CUDART_API cudaError_t cudaDeviceGetCacheConfig(enum cudaFuncCache *pCacheConfig) {
    if (pCacheConfig == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    *pCacheConfig = tls_cache_config;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaDeviceSetCacheConfig(enum cudaFuncCache cacheConfig) {
    if ((unsigned int)cacheConfig > cudaFuncCachePreferEqual)
        return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    tls_cache_config = cacheConfig;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority,
                                                        int *greatestPriority) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuCtxGetStreamPriorityRange, leastPriority, greatestPriority);
}

CUDART_API cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice) {
    if (canAccessPeer == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(check_device(device));
    CUDART_TRY(check_device(peerDevice));
    if (device == peerDevice) {
        *canAccessPeer = 0; /* a device is not its own peer */
        return cudaSuccess;
    }
    return CUDART_DRIVER(cuDeviceCanAccessPeer, canAccessPeer, device, peerDevice);
}

CUDART_API cudaError_t cudaDeviceEnablePeerAccess(int peerDevice, unsigned int flags) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUcontext peer;
    CUDART_TRY(check_device(peerDevice));
    CUDART_TRY(cudart_primary(peerDevice, &peer));
    return CUDART_DRIVER(cuCtxEnablePeerAccess, peer, flags);
}

CUDART_API cudaError_t cudaDeviceDisablePeerAccess(int peerDevice) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUcontext peer;
    CUDART_TRY(check_device(peerDevice));
    CUDART_TRY(cudart_primary(peerDevice, &peer));
    return CUDART_DRIVER(cuCtxDisablePeerAccess, peer);
}

CUDART_API cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device) {
    CUDART_TRY(check_device(device));
    return CUDART_DRIVER(cuDeviceGetPCIBusId, pciBusId, len, device);
}

CUDART_API cudaError_t cudaDeviceGetByPCIBusId(int *device, const char *pciBusId) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuDeviceGetByPCIBusId, device, pciBusId);
}

CUDART_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device) {
    CUDART_TRY(check_device(device));
    return CUDART_DRIVER(cuDeviceGetDefaultMemPool, memPool, device);
}

CUDART_API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device) {
    CUDART_TRY(check_device(device));
    return CUDART_DRIVER(cuDeviceGetMemPool, memPool, device);
}
