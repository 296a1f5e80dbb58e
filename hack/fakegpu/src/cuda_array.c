/*
 * cuda_array.c - CUDA arrays and mipmapped arrays (texture memory).
 *
 * Arrays hold no contents in the simulator; what matters is that they consume device memory,
 * charged to the GPU at creation from their format, channel count and extent (a path peers'
 * interception libraries have been known to miss). Size of one level:
 *   bytes = width * max(height, 1) * max(depth, 1) * channels * element size, rounded up to 512.
 * A mipmapped array is the sum of its levels, each halving every dimension (minimum 1).
 */
#include <stdlib.h>
#include <unistd.h>

#include "cuda_internal.h"

struct cu_array_obj {
    struct CUctx_st *ctx;
    int phys;
    unsigned long long bytes;
    int owner_pid;
    enum cu_kind kind;
    struct cu_array_obj *next;
};

static struct cu_array_obj *arrays; /* all live arrays, guarded by cu_drv.lock */

static size_t element_bytes(CUarray_format f) {
    switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

/* Bytes of one level, 0 if the descriptor is invalid or the size overflows. */
static unsigned long long level_bytes(size_t w, size_t h, size_t d, CUarray_format f,
                                      unsigned int channels) {
    size_t e = element_bytes(f);
    if (e == 0 || w == 0 || (channels != 1 && channels != 2 && channels != 4)) return 0;
    unsigned long long n = (unsigned long long)e * channels;
    size_t dims[3] = {w, h ? h : 1, d ? d : 1};
    for (int i = 0; i < 3; i++) {
        if (dims[i] > (1ULL << 20)) return 0; /* beyond any real texture limit */
        n *= dims[i];
    }
    return (n + 511) & ~511ULL;
}

static CUresult create(enum cu_kind kind, unsigned long long bytes, void **out) {
    if (out == NULL || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    struct cu_array_obj *a = calloc(1, sizeof(*a));
    if (a == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = cu_charge(ctx->phys, bytes);
    if (rc != CUDA_SUCCESS) {
        free(a);
        return rc;
    }
    a->ctx = ctx;
    a->phys = ctx->phys;
    a->bytes = bytes;
    a->owner_pid = getpid();
    a->kind = kind;
    pthread_mutex_lock(&cu_drv.lock);
    int added = cu_handle_add(a, kind);
    if (added == 0) {
        a->next = arrays;
        arrays = a;
    }
    pthread_mutex_unlock(&cu_drv.lock);
    if (added != 0) {
        cu_uncharge(a->phys, bytes, a->owner_pid);
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = a;
    return CUDA_SUCCESS;
}

/* Unlink a live array of the given kind (lock held); NULL if it is not one. */
static struct cu_array_obj *unlink_array(const void *h, enum cu_kind kind) {
    if (!cu_handle_is(h, kind)) return NULL;
    cu_handle_remove(h);
    struct cu_array_obj **pp = &arrays;
    while (*pp != NULL && *pp != h) pp = &(*pp)->next;
    if (*pp != NULL) *pp = (*pp)->next;
    return (struct cu_array_obj *)h;
}

static CUresult destroy(const void *h, enum cu_kind kind) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_array_obj *a = unlink_array(h, kind);
    pthread_mutex_unlock(&cu_drv.lock);
    if (a == NULL) return CUDA_ERROR_INVALID_HANDLE;
    cu_uncharge(a->phys, a->bytes, a->owner_pid);
    free(a);
    return CUDA_SUCCESS;
}

CU_API CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray) {
    if (pHandle == NULL || pAllocateArray == NULL) return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    unsigned long long bytes = level_bytes(d->Width, d->Height, 0, d->Format, d->NumChannels);
    return create(CU_KIND_ARRAY, bytes, (void **)pHandle);
}

CU_API CUresult cuArray3DCreate_v2(CUarray *pHandle,
                                   const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray) {
    if (pHandle == NULL || pAllocateArray == NULL) return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    unsigned long long bytes =
        level_bytes(d->Width, d->Height, d->Depth, d->Format, d->NumChannels);
    return create(CU_KIND_ARRAY, bytes, (void **)pHandle);
}

CU_API CUresult cuArrayDestroy(CUarray hArray) {
    return destroy(hArray, CU_KIND_ARRAY);
}

CU_API CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                       const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                       unsigned int numMipmapLevels) {
    if (pHandle == NULL || pMipmappedArrayDesc == NULL || numMipmapLevels == 0 ||
        numMipmapLevels > 32)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    size_t w = d->Width, h = d->Height, dep = d->Depth;
    unsigned long long total = 0;
    for (unsigned int level = 0; level < numMipmapLevels; level++) {
        unsigned long long b = level_bytes(w, h, dep, d->Format, d->NumChannels);
        if (b == 0) return CUDA_ERROR_INVALID_VALUE;
        total += b;
        w = w > 1 ? w / 2 : 1;
        h = h > 1 ? h / 2 : h;
        dep = dep > 1 ? dep / 2 : dep;
    }
    return create(CU_KIND_MIPMAPPED_ARRAY, total, (void **)pHandle);
}

CU_API CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    return destroy(hMipmappedArray, CU_KIND_MIPMAPPED_ARRAY);
}

void cu_array_release_ctx(struct CUctx_st *ctx) {
    for (;;) {
        pthread_mutex_lock(&cu_drv.lock);
        struct cu_array_obj *a = arrays;
        while (a != NULL && a->ctx != ctx) a = a->next;
        if (a != NULL) unlink_array(a, a->kind);
        pthread_mutex_unlock(&cu_drv.lock);
        if (a == NULL) return;
        cu_uncharge(a->phys, a->bytes, a->owner_pid);
        free(a);
    }
}
