/*
 * memory.c - device-memory allocation paths: charge the claim's shared usage before the real
 * allocation, refund on failure, remember the charge so the matching free refunds exactly it.
 *
 * Covered: cuMemAlloc(_v2), cuMemAllocPitch_v2, cuMemAllocManaged, cuMemAllocAsync(_ptsz),
 * cuMemAllocFromPoolAsync(_ptsz), cuMemCreate (VMM), cuArrayCreate_v2, cuArray3DCreate_v2,
 * cuMipmappedArrayCreate, and their frees. With oversubscribe=1 a plain allocation the GPU
 * cannot satisfy falls back to managed memory (still within the cap), logged and counted.
 */
#include <string.h>

#include "vgpu.h"

enum key_ns { NS_PTR = 0, NS_VMM = 1, NS_ARRAY = 2, NS_MIPMAP = 3 };

static uint64_t key_of(enum key_ns ns, uint64_t value) { return value ^ ((uint64_t)ns << 62); }

#define REAL_OR_RETURN(fn)                                        \
    do {                                                          \
        if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED; \
        if (vgpu_cu.fn == NULL) return CUDA_ERROR_NOT_FOUND;      \
    } while (0)

static int dev_index(const struct vgpu_dev *d) { return (int)(d - vgpu_state()->devs); }

static bool charge(struct vgpu_dev *d, uint64_t bytes, const char *api) {
    uint64_t limit = d->conf.memory_invalid ? 0 : d->conf.memory;
    if (vgpu_region_charge(d->region, d->region_dev, bytes, limit, false) == 0) return true;
    LOG_WARN("%s: %llu bytes on %s refused: the claim already uses %llu of its %llu byte cap",
             api, (unsigned long long)bytes, d->conf.uuid,
             (unsigned long long)vgpu_region_used(d->region, d->region_dev),
             (unsigned long long)limit);
    return false;
}

static void uncharge(struct vgpu_dev *d, uint64_t bytes, bool managed) {
    vgpu_region_uncharge(d->region, d->region_dev, bytes, managed);
}

static void remember(enum key_ns ns, uint64_t handle, struct vgpu_dev *d, uint64_t bytes,
                     bool managed) {
    vgpu_alloc_put(key_of(ns, handle), dev_index(d), bytes, managed);
}

static void refund(enum key_ns ns, uint64_t handle) {
    int dev = 0;
    uint64_t bytes = 0;
    bool managed = false;
    if (vgpu_alloc_take(key_of(ns, handle), &dev, &bytes, &managed))
        uncharge(&vgpu_state()->devs[dev], bytes, managed);
}

/* ---- linear allocations ------------------------------------------------------------------ */

enum linear_kind { LIN_PLAIN, LIN_MANAGED, LIN_ASYNC, LIN_ASYNC_PTSZ, LIN_POOL, LIN_POOL_PTSZ };
struct linear_req {
    enum linear_kind kind;
    size_t bytes;
    unsigned int flags;
    CUstream stream;
    CUmemoryPool pool;
};

static CUresult real_linear(const struct linear_req *r, CUdeviceptr *dptr) {
    switch (r->kind) {
    case LIN_PLAIN: return vgpu_cu.cuMemAlloc_v2(dptr, r->bytes);
    case LIN_MANAGED: return vgpu_cu.cuMemAllocManaged(dptr, r->bytes, r->flags);
    case LIN_ASYNC: return vgpu_cu.cuMemAllocAsync(dptr, r->bytes, r->stream);
    case LIN_ASYNC_PTSZ: return vgpu_cu.cuMemAllocAsync_ptsz(dptr, r->bytes, r->stream);
    case LIN_POOL: return vgpu_cu.cuMemAllocFromPoolAsync(dptr, r->bytes, r->pool, r->stream);
    case LIN_POOL_PTSZ:
        return vgpu_cu.cuMemAllocFromPoolAsync_ptsz(dptr, r->bytes, r->pool, r->stream);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult linear_alloc(const struct linear_req *r, CUdeviceptr *dptr, const char *api) {
    struct vgpu_dev *d = vgpu_dev_current();
    if (d == NULL || dptr == NULL || r->bytes == 0) return real_linear(r, dptr);
    if (!charge(d, r->bytes, api)) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_linear(r, dptr);
    bool managed = false;
    if (rc == CUDA_ERROR_OUT_OF_MEMORY && r->kind == LIN_PLAIN && d->conf.oversubscribe &&
        vgpu_cu.cuMemAllocManaged != NULL) {
        rc = vgpu_cu.cuMemAllocManaged(dptr, r->bytes, CU_MEM_ATTACH_GLOBAL);
        if (rc == CUDA_SUCCESS) {
            managed = true;
            vgpu_region_mark_managed(d->region, d->region_dev, r->bytes);
            LOG_INFO("%s: %zu bytes on %s exceed free device memory; oversubscribed into "
                     "managed memory", api, r->bytes, d->conf.uuid);
        }
    }
    if (rc != CUDA_SUCCESS) {
        uncharge(d, r->bytes, false);
        return rc;
    }
    remember(NS_PTR, *dptr, d, r->bytes, managed);
    return rc;
}

VGPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    REAL_OR_RETURN(cuMemAlloc_v2);
    struct linear_req r = {.kind = LIN_PLAIN, .bytes = bytesize};
    return linear_alloc(&r, dptr, "cuMemAlloc_v2");
}

VGPU_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    REAL_OR_RETURN(cuMemAllocManaged);
    struct linear_req r = {.kind = LIN_MANAGED, .bytes = bytesize, .flags = flags};
    return linear_alloc(&r, dptr, "cuMemAllocManaged");
}

VGPU_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    REAL_OR_RETURN(cuMemAllocAsync);
    struct linear_req r = {.kind = LIN_ASYNC, .bytes = bytesize, .stream = hStream};
    return linear_alloc(&r, dptr, "cuMemAllocAsync");
}

VGPU_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    REAL_OR_RETURN(cuMemAllocAsync_ptsz);
    struct linear_req r = {.kind = LIN_ASYNC_PTSZ, .bytes = bytesize, .stream = hStream};
    return linear_alloc(&r, dptr, "cuMemAllocAsync_ptsz");
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                             CUmemoryPool pool, CUstream hStream) {
    REAL_OR_RETURN(cuMemAllocFromPoolAsync);
    struct linear_req r = {.kind = LIN_POOL, .bytes = bytesize, .pool = pool, .stream = hStream};
    return linear_alloc(&r, dptr, "cuMemAllocFromPoolAsync");
}

VGPU_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                  CUmemoryPool pool, CUstream hStream) {
    REAL_OR_RETURN(cuMemAllocFromPoolAsync_ptsz);
    struct linear_req r = {
        .kind = LIN_POOL_PTSZ, .bytes = bytesize, .pool = pool, .stream = hStream};
    return linear_alloc(&r, dptr, "cuMemAllocFromPoolAsync_ptsz");
}

/* The CUDA 1.x-3.1 ABI (32-bit sizes), still resolvable through cuGetProcAddress(.., 2000). */
VGPU_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize) {
    REAL_OR_RETURN(cuMemAlloc);
    struct vgpu_dev *d = vgpu_dev_current();
    if (d == NULL || dptr == NULL || bytesize == 0) return vgpu_cu.cuMemAlloc(dptr, bytesize);
    if (!charge(d, bytesize, "cuMemAlloc")) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = vgpu_cu.cuMemAlloc(dptr, bytesize);
    if (rc != CUDA_SUCCESS) {
        uncharge(d, bytesize, false);
        return rc;
    }
    remember(NS_PTR, *dptr, d, bytesize, false);
    return rc;
}

VGPU_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                        size_t Height, unsigned int ElementSizeBytes) {
    REAL_OR_RETURN(cuMemAllocPitch_v2);
    struct vgpu_dev *d = vgpu_dev_current();
    if (d == NULL || dptr == NULL || pPitch == NULL || WidthInBytes == 0 || Height == 0)
        return vgpu_cu.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (WidthInBytes > SIZE_MAX / Height) return CUDA_ERROR_INVALID_VALUE;
    uint64_t estimate = (uint64_t)WidthInBytes * Height;
    if (!charge(d, estimate, "cuMemAllocPitch_v2")) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = vgpu_cu.cuMemAllocPitch_v2(dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (rc != CUDA_SUCCESS) {
        uncharge(d, estimate, false);
        return rc;
    }
    /* The pitch (row padding) is only known now: charge the padding too, and undo the real
     * allocation if that pushes the claim over its cap. */
    uint64_t actual = (uint64_t)*pPitch * Height;
    if (actual > estimate) {
        if (!charge(d, actual - estimate, "cuMemAllocPitch_v2 (row padding)")) {
            if (vgpu_cu.cuMemFree_v2 != NULL) (void)vgpu_cu.cuMemFree_v2(*dptr);
            uncharge(d, estimate, false);
            *dptr = 0;
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
    } else {
        actual = estimate;
    }
    remember(NS_PTR, *dptr, d, actual, false);
    return rc;
}

VGPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    REAL_OR_RETURN(cuMemFree_v2);
    CUresult rc = vgpu_cu.cuMemFree_v2(dptr);
    if (rc == CUDA_SUCCESS && dptr != 0) refund(NS_PTR, dptr);
    return rc;
}

VGPU_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) {
    REAL_OR_RETURN(cuMemFree);
    CUresult rc = vgpu_cu.cuMemFree(dptr);
    if (rc == CUDA_SUCCESS && dptr != 0) refund(NS_PTR, dptr);
    return rc;
}

VGPU_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    REAL_OR_RETURN(cuMemFreeAsync);
    CUresult rc = vgpu_cu.cuMemFreeAsync(dptr, hStream);
    if (rc == CUDA_SUCCESS && dptr != 0) refund(NS_PTR, dptr);
    return rc;
}

VGPU_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream) {
    REAL_OR_RETURN(cuMemFreeAsync_ptsz);
    CUresult rc = vgpu_cu.cuMemFreeAsync_ptsz(dptr, hStream);
    if (rc == CUDA_SUCCESS && dptr != 0) refund(NS_PTR, dptr);
    return rc;
}

/* ---- virtual memory management ------------------------------------------------------------ */

VGPU_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                 const CUmemAllocationProp *prop, unsigned long long flags) {
    REAL_OR_RETURN(cuMemCreate);
    struct vgpu_dev *d = NULL;
    if (prop != NULL && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        d = vgpu_dev_for_ordinal(prop->location.id);
    if (d == NULL || handle == NULL || size == 0)
        return vgpu_cu.cuMemCreate(handle, size, prop, flags);
    if (!charge(d, size, "cuMemCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = vgpu_cu.cuMemCreate(handle, size, prop, flags);
    if (rc != CUDA_SUCCESS) {
        uncharge(d, size, false);
        return rc;
    }
    remember(NS_VMM, *handle, d, size, false);
    return rc;
}

VGPU_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    REAL_OR_RETURN(cuMemRelease);
    CUresult rc = vgpu_cu.cuMemRelease(handle);
    if (rc == CUDA_SUCCESS) refund(NS_VMM, handle);
    return rc;
}

/* ---- arrays ---------------------------------------------------------------------------------- */

static uint64_t format_bytes(CUarray_format f) {
    switch ((int)f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    default: return 4; /* 32-bit formats; newer packed formats are at most this per channel */
    }
}

static uint64_t mul_sat(uint64_t a, uint64_t b) {
    if (a != 0 && b > UINT64_MAX / a) return UINT64_MAX;
    return a * b;
}

static uint64_t array_bytes(size_t w, size_t h, size_t depth, unsigned channels,
                            CUarray_format f) {
    uint64_t n = mul_sat(w ? w : 1, h ? h : 1);
    n = mul_sat(n, depth ? depth : 1);
    n = mul_sat(n, channels ? channels : 1);
    return mul_sat(n, format_bytes(f));
}

VGPU_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    REAL_OR_RETURN(cuArrayCreate_v2);
    struct vgpu_dev *d = vgpu_dev_current();
    if (d == NULL || pHandle == NULL || desc == NULL)
        return vgpu_cu.cuArrayCreate_v2(pHandle, desc);
    uint64_t bytes = array_bytes(desc->Width, desc->Height, 1, desc->NumChannels, desc->Format);
    if (!charge(d, bytes, "cuArrayCreate_v2")) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = vgpu_cu.cuArrayCreate_v2(pHandle, desc);
    if (rc != CUDA_SUCCESS) {
        uncharge(d, bytes, false);
        return rc;
    }
    remember(NS_ARRAY, (uint64_t)(uintptr_t)*pHandle, d, bytes, false);
    return rc;
}

VGPU_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    REAL_OR_RETURN(cuArray3DCreate_v2);
    struct vgpu_dev *d = vgpu_dev_current();
    if (d == NULL || pHandle == NULL || desc == NULL)
        return vgpu_cu.cuArray3DCreate_v2(pHandle, desc);
    uint64_t bytes =
        array_bytes(desc->Width, desc->Height, desc->Depth, desc->NumChannels, desc->Format);
    if (!charge(d, bytes, "cuArray3DCreate_v2")) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = vgpu_cu.cuArray3DCreate_v2(pHandle, desc);
    if (rc != CUDA_SUCCESS) {
        uncharge(d, bytes, false);
        return rc;
    }
    remember(NS_ARRAY, (uint64_t)(uintptr_t)*pHandle, d, bytes, false);
    return rc;
}

VGPU_EXPORT CUresult cuArrayDestroy(CUarray hArray) {
    REAL_OR_RETURN(cuArrayDestroy);
    CUresult rc = vgpu_cu.cuArrayDestroy(hArray);
    if (rc == CUDA_SUCCESS) refund(NS_ARRAY, (uint64_t)(uintptr_t)hArray);
    return rc;
}

VGPU_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                            const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                            unsigned int numMipmapLevels) {
    REAL_OR_RETURN(cuMipmappedArrayCreate);
    struct vgpu_dev *d = vgpu_dev_current();
    if (d == NULL || pHandle == NULL || desc == NULL)
        return vgpu_cu.cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels);
    /* Sum of all levels, each half the previous in every used dimension. */
    uint64_t bytes = 0;
    size_t w = desc->Width, h = desc->Height, dep = desc->Depth;
    for (unsigned level = 0; level < (numMipmapLevels ? numMipmapLevels : 1); level++) {
        uint64_t lb = array_bytes(w, h, dep, desc->NumChannels, desc->Format);
        bytes = bytes + lb < bytes ? UINT64_MAX : bytes + lb;
        w = w > 1 ? w / 2 : w;
        h = h > 1 ? h / 2 : h;
        dep = dep > 1 ? dep / 2 : dep;
    }
    if (!charge(d, bytes, "cuMipmappedArrayCreate")) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = vgpu_cu.cuMipmappedArrayCreate(pHandle, desc, numMipmapLevels);
    if (rc != CUDA_SUCCESS) {
        uncharge(d, bytes, false);
        return rc;
    }
    remember(NS_MIPMAP, (uint64_t)(uintptr_t)*pHandle, d, bytes, false);
    return rc;
}

VGPU_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    REAL_OR_RETURN(cuMipmappedArrayDestroy);
    CUresult rc = vgpu_cu.cuMipmappedArrayDestroy(hMipmappedArray);
    if (rc == CUDA_SUCCESS) refund(NS_MIPMAP, (uint64_t)(uintptr_t)hMipmappedArray);
    return rc;
}
