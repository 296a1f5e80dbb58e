/*
 * device.c - context/device queries that must show the claim's view of memory:
 * cuMemGetInfo_v2 and cuDeviceTotalMem_v2 report the cap, and cuInit triggers configuration
 * loading early so that configuration errors are logged when the application starts.
 */
#include "vgpu.h"

VGPU_EXPORT CUresult cuInit(unsigned int Flags) {
    if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_cu.cuInit == NULL) return CUDA_ERROR_NOT_FOUND;
    (void)vgpu_state();
    return vgpu_cu.cuInit(Flags);
}

VGPU_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_cu.cuDeviceTotalMem_v2 == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = vgpu_cu.cuDeviceTotalMem_v2(bytes, dev);
    if (rc != CUDA_SUCCESS || bytes == NULL) return rc;
    struct vgpu_dev *d = vgpu_dev_for_ordinal(dev);
    if (d != NULL) *bytes = d->conf.memory_invalid ? 0 : (size_t)d->conf.memory;
    return rc;
}

static unsigned int clamp_u32(uint64_t v) { return v > 0xffffffffULL ? 0xffffffffU : (unsigned)v; }

/* Legacy 32-bit ABI: the claim's view, clamped to what 32 bits can say. */
VGPU_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) {
    if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_cu.cuDeviceTotalMem == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = vgpu_cu.cuDeviceTotalMem(bytes, dev);
    if (rc != CUDA_SUCCESS || bytes == NULL) return rc;
    struct vgpu_dev *d = vgpu_dev_for_ordinal(dev);
    if (d != NULL) *bytes = clamp_u32(d->conf.memory_invalid ? 0 : d->conf.memory);
    return rc;
}

VGPU_EXPORT CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes) {
    if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_cu.cuMemGetInfo == NULL) return CUDA_ERROR_NOT_FOUND;
    if (vgpu_dev_current() == NULL || vgpu_cu.cuMemGetInfo_v2 == NULL)
        return vgpu_cu.cuMemGetInfo(free_bytes, total_bytes);
    size_t fr = 0, tot = 0;
    CUresult rc = cuMemGetInfo_v2(free_bytes ? &fr : NULL, total_bytes ? &tot : NULL);
    if (rc != CUDA_SUCCESS) return rc;
    if (free_bytes != NULL) *free_bytes = clamp_u32(fr);
    if (total_bytes != NULL) *total_bytes = clamp_u32(tot);
    return rc;
}

VGPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED;
    if (vgpu_cu.cuMemGetInfo_v2 == NULL) return CUDA_ERROR_NOT_FOUND;
    /* Either pointer may be NULL (the caller wants only the other figure); never both. */
    if (free_bytes == NULL && total_bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    size_t real_free = 0, real_total = 0;
    CUresult rc = vgpu_cu.cuMemGetInfo_v2(&real_free, &real_total);
    if (rc != CUDA_SUCCESS) return rc;
    struct vgpu_dev *d = vgpu_dev_current();
    if (d != NULL) {
        uint64_t cap = d->conf.memory_invalid ? 0 : d->conf.memory;
        vgpu_region_reclaim_if_due(d->region, vgpu_now_ns());
        uint64_t used = vgpu_region_used(d->region, d->region_dev);
        uint64_t avail = used < cap ? cap - used : 0;
        /* Without oversubscription the claim also cannot get more than the GPU has free. */
        if (!d->conf.oversubscribe && avail > real_free) avail = real_free;
        real_free = (size_t)avail;
        real_total = (size_t)cap;
    }
    if (free_bytes != NULL) *free_bytes = real_free;
    if (total_bytes != NULL) *total_bytes = real_total;
    return rc;
}
