/*
 * nvml.c - NVML queries seen from inside the container report the claim, not the GPU:
 * memory total = the cap, used = the claim's usage across its processes, free = cap - used
 * clamped at 0 (never negative or wrapped, even if usage exceeds the cap).
 */
#include "vgpu.h"

#define NVML_REAL_OR_RETURN(fn)                                       \
    do {                                                              \
        if (!vgpu_nvml_load()) return NVML_ERROR_UNINITIALIZED;       \
        if (vgpu_nvml.fn == NULL) return NVML_ERROR_FUNCTION_NOT_FOUND; \
    } while (0)

static void claim_view(struct vgpu_dev *d, unsigned long long *total, unsigned long long *used,
                       unsigned long long *free_bytes) {
    uint64_t cap = d->conf.memory_invalid ? 0 : d->conf.memory;
    vgpu_region_reclaim_if_due(d->region, vgpu_now_ns());
    uint64_t u = vgpu_region_used(d->region, d->region_dev);
    *total = cap;
    *used = u;
    *free_bytes = u < cap ? cap - u : 0;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    NVML_REAL_OR_RETURN(nvmlDeviceGetMemoryInfo);
    nvmlReturn_t rc = vgpu_nvml.nvmlDeviceGetMemoryInfo(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    struct vgpu_dev *d = vgpu_dev_for_nvml(device);
    if (d != NULL) claim_view(d, &memory->total, &memory->used, &memory->free);
    return rc;
}

VGPU_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    NVML_REAL_OR_RETURN(nvmlDeviceGetMemoryInfo_v2);
    nvmlReturn_t rc = vgpu_nvml.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    struct vgpu_dev *d = vgpu_dev_for_nvml(device);
    if (d != NULL) {
        claim_view(d, &memory->total, &memory->used, &memory->free);
        memory->reserved = 0; /* total = used + free for the claim */
    }
    return rc;
}
