/*
 * cudart_memory.c - device, pitched, managed, host and stream-ordered allocations, pools, copies,
 * sets and pointer attributes.
 *
 * Each call is its driver counterpart in the current device's context: cudaMalloc is
 * cuMemAlloc_v2, cudaMemGetInfo is cuMemGetInfo_v2, cudaMallocAsync is cuMemAllocAsync, ... so the
 * simulated driver charges the node's GPU and a preloaded vgpu_hook sees (and caps) every
 * allocation on the same path as with NVIDIA's runtime. Device pointers are the driver's
 * (unified addressing), so copies of every kind are cuMemcpy / cuMemcpyAsync.
 */
#include <stdint.h>
#include <string.h>

#include "cudart_internal.h"

static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

CUDART_API cudaError_t cudaMalloc(void **devPtr, size_t size) {
    if (devPtr == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    *devPtr = NULL;
    if (size == 0) return cudaSuccess;
    CUdeviceptr d = 0;
    CUDART_TRY_DRIVER(cuMemAlloc_v2, &d, size);
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

/* cudaFree(NULL) only makes sure the device's context exists (the usual way to initialise it). */
CUDART_API cudaError_t cudaFree(void *devPtr) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (devPtr == NULL) return cudaSuccess;
    return CUDART_DRIVER(cuMemFree_v2, dptr(devPtr));
}

CUDART_API cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuMemGetInfo_v2, free, total);
}

/* Rows are padded by the driver (cuMemAllocPitch_v2, widest element size). */
CUDART_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
    if (devPtr == NULL || pitch == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUdeviceptr d = 0;
    CUDART_TRY_DRIVER(cuMemAllocPitch_v2, &d, pitch, width, height, 16);
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

/* A 3-D allocation is a pitched 2-D one of height x depth rows. */
CUDART_API cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pitchedDevPtr, struct cudaExtent extent) {
    if (pitchedDevPtr == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    memset(pitchedDevPtr, 0, sizeof(*pitchedDevPtr));
    pitchedDevPtr->xsize = extent.width;
    pitchedDevPtr->ysize = extent.height;
    if (extent.width == 0 || extent.height == 0 || extent.depth == 0) return cudaSuccess;
    if (extent.height > SIZE_MAX / extent.depth) return cudart_ret(cudaErrorInvalidValue);
    CUdeviceptr d = 0;
    size_t pitch = 0;
    CUDART_TRY_DRIVER(cuMemAllocPitch_v2, &d, &pitch, extent.width, extent.height * extent.depth,
                      16);
    pitchedDevPtr->ptr = (void *)(uintptr_t)d;
    pitchedDevPtr->pitch = pitch;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags) {
    if (devPtr == NULL || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
        return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUdeviceptr d = 0;
    CUDART_TRY_DRIVER(cuMemAllocManaged, &d, size, flags);
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}

CUDART_API cudaError_t cudaMallocHost(void **ptr, size_t size) {
    if (ptr == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuMemAllocHost_v2, ptr, size);
}

/* The cudaHostAlloc* flags are the driver's CU_MEMHOSTALLOC_* values. */
CUDART_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags) {
    if (pHost == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuMemHostAlloc, pHost, size, flags);
}

CUDART_API cudaError_t cudaFreeHost(void *ptr) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (ptr == NULL) return cudaSuccess;
    return CUDART_DRIVER(cuMemFreeHost, ptr);
}

/* The cudaHostRegister* flags are the driver's CU_MEMHOSTREGISTER_* values. */
CUDART_API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuMemHostRegister_v2, ptr, size, flags);
}

CUDART_API cudaError_t cudaHostUnregister(void *ptr) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuMemHostUnregister, ptr);
}

CUDART_API cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags) {
    if (pDevice == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUdeviceptr d = 0;
    CUDART_TRY_DRIVER(cuMemHostGetDevicePointer_v2, &d, pHost, flags);
    *pDevice = (void *)(uintptr_t)d;
    return cudaSuccess;
}

/* ---- Copies and sets ------------------------------------------------------------------------- */

static cudaError_t copy_args(const void *dst, const void *src, enum cudaMemcpyKind kind) {
    if ((unsigned int)kind > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    return dst == NULL || src == NULL ? cudaErrorInvalidValue : cudaSuccess;
}

CUDART_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count,
                                  enum cudaMemcpyKind kind) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (count == 0) return cudaSuccess;
    CUDART_TRY(copy_args(dst, src, kind));
    return CUDART_DRIVER(cuMemcpy, dptr(dst), dptr(src), count);
}
CUDART_PER_THREAD(cudaMemcpy, cudaMemcpy_ptds);

CUDART_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                       enum cudaMemcpyKind kind, cudaStream_t stream) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (count == 0) return cudaSuccess;
    CUDART_TRY(copy_args(dst, src, kind));
    return CUDART_DRIVER(cuMemcpyAsync, dptr(dst), dptr(src), count, stream);
}
CUDART_PER_THREAD(cudaMemcpyAsync, cudaMemcpyAsync_ptsz);

static cudaError_t peers_valid(int dstDevice, int srcDevice) {
    int n = cudart_device_count();
    return dstDevice >= 0 && dstDevice < n && srcDevice >= 0 && srcDevice < n
               ? cudaSuccess
               : cudaErrorInvalidDevice;
}

CUDART_API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
                                      size_t count) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUDART_TRY(peers_valid(dstDevice, srcDevice));
    if (count == 0) return cudaSuccess;
    CUDART_TRY(copy_args(dst, src, cudaMemcpyDefault));
    return CUDART_DRIVER(cuMemcpy, dptr(dst), dptr(src), count);
}

CUDART_API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src,
                                           int srcDevice, size_t count, cudaStream_t stream) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUDART_TRY(peers_valid(dstDevice, srcDevice));
    if (count == 0) return cudaSuccess;
    CUDART_TRY(copy_args(dst, src, cudaMemcpyDefault));
    return CUDART_DRIVER(cuMemcpyAsync, dptr(dst), dptr(src), count, stream);
}

CUDART_API cudaError_t cudaMemset(void *devPtr, int value, size_t count) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (count == 0) return cudaSuccess;
    return CUDART_DRIVER(cuMemsetD8_v2, dptr(devPtr), (unsigned char)value, count);
}
CUDART_PER_THREAD(cudaMemset, cudaMemset_ptds);

CUDART_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count,
                                       cudaStream_t stream) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    if (count == 0) return cudaSuccess;
    return CUDART_DRIVER(cuMemsetD8Async, dptr(devPtr), (unsigned char)value, count, stream);
}
CUDART_PER_THREAD(cudaMemsetAsync, cudaMemsetAsync_ptsz);

/* ---- Stream-ordered allocation and pools ----------------------------------------------------- */

CUDART_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
    if (devPtr == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUdeviceptr d = 0;
    CUDART_TRY_DRIVER(cuMemAllocAsync, &d, size, hStream);
    *devPtr = (void *)(uintptr_t)d;
    return cudaSuccess;
}
CUDART_PER_THREAD(cudaMallocAsync, cudaMallocAsync_ptsz);

CUDART_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
    CUDART_TRY(cudart_ctx(NULL, NULL));
    return CUDART_DRIVER(cuMemFreeAsync, dptr(devPtr), hStream);
}
CUDART_PER_THREAD(cudaFreeAsync, cudaFreeAsync_ptsz);

CUDART_API cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
                                               cudaStream_t stream) {
    if (ptr == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_ctx(NULL, NULL));
    CUdeviceptr d = 0;
    CUDART_TRY_DRIVER(cuMemAllocFromPoolAsync, &d, size, memPool, stream);
    *ptr = (void *)(uintptr_t)d;
    return cudaSuccess;
}
CUDART_PER_THREAD(cudaMallocFromPoolAsync, cudaMallocFromPoolAsync_ptsz);

/* The runtime's pool properties and their enum values are the driver's, field by field. */
CUDART_API cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool,
                                         const struct cudaMemPoolProps *poolProps) {
    if (memPool == NULL || poolProps == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_init());
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = (CUmemAllocationType)poolProps->allocType;
    props.handleTypes = (CUmemAllocationHandleType)poolProps->handleTypes;
    props.location.type = (CUmemLocationType)poolProps->location.type;
    props.location.id = poolProps->location.id;
    props.win32SecurityAttributes = poolProps->win32SecurityAttributes;
    props.maxSize = poolProps->maxSize;
    props.usage = poolProps->usage;
    return CUDART_DRIVER(cuMemPoolCreate, memPool, &props);
}

CUDART_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuMemPoolDestroy, memPool);
}

CUDART_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuMemPoolTrimTo, memPool, minBytesToKeep);
}

CUDART_API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                               void *value) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuMemPoolSetAttribute, memPool, (CUmemPool_attribute)attr, value);
}

CUDART_API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr,
                                               void *value) {
    CUDART_TRY(cudart_init());
    return CUDART_DRIVER(cuMemPoolGetAttribute, memPool, (CUmemPool_attribute)attr, value);
}

/* ---- Pointer attributes ---------------------------------------------------------------------- */

/* Memory the driver does not know is ordinary host memory: since CUDA 11 that is a success with
 * type cudaMemoryTypeUnregistered, not an error. */
CUDART_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes,
                                                const void *ptr) {
    if (attributes == NULL) return cudart_ret(cudaErrorInvalidValue);
    CUDART_TRY(cudart_init());
    memset(attributes, 0, sizeof(*attributes));
    unsigned int type = 0;
    CUresult rc = cudart_drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                                   dptr(ptr));
    if (rc == CUDA_ERROR_INVALID_VALUE) {
        attributes->type = cudaMemoryTypeUnregistered;
        attributes->device = cudaInvalidDeviceId;
        attributes->hostPointer = (void *)(uintptr_t)ptr;
        return cudaSuccess;
    }
    CUDART_TRY(cudart_error(rc));
    int managed = 0, ordinal = -1;
    void *host = NULL;
    CUdeviceptr dev = 0;
    (void)cudart_drv.cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dptr(ptr));
    (void)cudart_drv.cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                           dptr(ptr));
    if (cudart_drv.cuPointerGetAttribute(&host, CU_POINTER_ATTRIBUTE_HOST_POINTER, dptr(ptr)) !=
        CUDA_SUCCESS)
        host = NULL;
    (void)cudart_drv.cuPointerGetAttribute(&dev, CU_POINTER_ATTRIBUTE_DEVICE_POINTER, dptr(ptr));
    attributes->type = managed                            ? cudaMemoryTypeManaged
                       : type == CU_MEMORYTYPE_HOST       ? cudaMemoryTypeHost
                                                          : cudaMemoryTypeDevice;
    attributes->device = ordinal;
    attributes->devicePointer = (void *)(uintptr_t)dev;
    attributes->hostPointer = host;
    return cudaSuccess;
}

CUDART_API struct cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w,
                                                              enum cudaChannelFormatKind f) {
    struct cudaChannelFormatDesc desc = {x, y, z, w, f};
    return desc;
}
