/*
 * cuda_pool.c - stream-ordered allocation (cuMemAllocAsync / cuMemFreeAsync) and memory pools.
 *
 * Simulation model: a pool caches nothing. Every pool allocation is charged to the GPU when it is
 * made and uncharged when it is freed, so NVML and the memory caps always see the true footprint
 * (a real pool may keep freed memory reserved up to its release threshold; reporting less than
 * the real driver would is the safe side for a cap). Each device has a default pool, which is
 * also its current pool; cuMemPoolCreate makes explicit pools on a device.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

struct CUmemPoolHandle_st {
    int ordinal;
    int phys;
    int is_default;
    unsigned long long release_threshold;
    unsigned long long used_high;
    int reuse_flags[3]; /* the three REUSE_* attributes, stored and reported back */
};

static struct CUmemPoolHandle_st default_pools[SIM_MAX_GPUS];

/* The default pool of a device, registered on first use (lock NOT held). */
static CUresult default_pool(CUdevice dev, struct CUmemPoolHandle_st **out) {
    int phys;
    CU_TRY(cu_device_phys(dev, &phys));
    struct CUmemPoolHandle_st *p = &default_pools[dev];
    pthread_mutex_lock(&cu_drv.lock);
    int rc = 0;
    if (!cu_handle_is(p, CU_KIND_POOL)) {
        memset(p, 0, sizeof(*p));
        p->ordinal = dev;
        p->phys = phys;
        p->is_default = 1;
        for (int i = 0; i < 3; i++) p->reuse_flags[i] = 1;
        rc = cu_handle_add(p, CU_KIND_POOL);
    }
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *out = p;
    return CUDA_SUCCESS;
}

static CUresult pool_get(CUmemoryPool h, struct CUmemPoolHandle_st **out) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int live = cu_handle_is(h, CU_KIND_POOL);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!live) return CUDA_ERROR_INVALID_VALUE;
    *out = h;
    return cu_phys_alive(h->phys);
}

CU_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev) {
    if (pool_out == NULL) return CUDA_ERROR_INVALID_VALUE;
    return default_pool(dev, pool_out);
}

CU_API CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (pool == NULL) return CUDA_ERROR_INVALID_VALUE;
    return default_pool(dev, pool); /* no cuDeviceSetMemPool: the current pool is the default */
}

static CUresult alloc_from(struct CUmemPoolHandle_st *pool, CUdeviceptr *dptr, size_t size,
                           CUstream hStream) {
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(hStream, &s));
    /* The allocation is charged to the pool's GPU, which must be the stream's. */
    if (s->ctx->phys != pool->phys) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_alloc_device(s->ctx, size, CU_MEM_POOL, pool, dptr));
    pthread_mutex_lock(&cu_drv.lock);
    unsigned long long used = cu_alloc_charged_by_pool(pool);
    if (used > pool->used_high) pool->used_high = used;
    pthread_mutex_unlock(&cu_drv.lock);
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream) {
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(hStream, &s));
    struct CUmemPoolHandle_st *pool;
    CU_TRY(default_pool(s->ctx->ordinal, &pool));
    return alloc_from(pool, dptr, bytesize, hStream);
}
CU_ALIAS(cuMemAllocAsync, cuMemAllocAsync_ptsz);

CU_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                        CUstream hStream) {
    struct CUmemPoolHandle_st *p;
    CU_TRY(pool_get(pool, &p));
    return alloc_from(p, dptr, bytesize, hStream);
}
CU_ALIAS(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz);

CU_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream) {
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(hStream, &s));
    /* Any device allocation may be freed stream-ordered; it is released at once here. */
    return cu_free_device(dptr, 0);
}
CU_ALIAS(cuMemFreeAsync, cuMemFreeAsync_ptsz);

CU_API CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps) {
    if (pool == NULL || poolProps == NULL || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    int phys;
    CU_TRY(cu_device_phys(poolProps->location.id, &phys));
    struct CUmemPoolHandle_st *p = calloc(1, sizeof(*p));
    if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    p->ordinal = poolProps->location.id;
    p->phys = phys;
    for (int i = 0; i < 3; i++) p->reuse_flags[i] = 1;
    pthread_mutex_lock(&cu_drv.lock);
    int rc = cu_handle_add(p, CU_KIND_POOL);
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pool = p;
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    int ok = cu_handle_is(pool, CU_KIND_POOL) && !pool->is_default;
    if (ok) cu_handle_remove(pool);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    /* Allocations still outstanding from the pool are freed with it. */
    cu_mem_release_pool(pool);
    free(pool);
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    (void)minBytesToKeep; /* nothing is cached, so there is nothing to trim */
    struct CUmemPoolHandle_st *p;
    return pool_get(pool, &p);
}

/* The attributes a pool stores as given: where each one lives and its size (the REUSE_* flags are
 * ints, the release threshold a cuuint64_t); NULL for the others. */
static void *stored_attr(struct CUmemPoolHandle_st *p, int attr, size_t *size) {
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        *size = sizeof(int);
        return &p->reuse_flags[attr - 1];
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        *size = sizeof(cuuint64_t);
        return &p->release_threshold;
    default: return NULL;
    }
}

/* Resolve `pool` for an attribute call and take the driver lock (held only on success). */
static CUresult pool_attr_lock(CUmemoryPool pool, const void *value,
                               struct CUmemPoolHandle_st **p) {
    if (value == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(pool_get(pool, p));
    pthread_mutex_lock(&cu_drv.lock);
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    struct CUmemPoolHandle_st *p;
    CU_TRY(pool_attr_lock(pool, value, &p));
    CUresult rc = CUDA_SUCCESS;
    size_t size;
    void *field = stored_attr(p, (int)attr, &size);
    if (field != NULL) {
        memcpy(field, value, size);
    } else if ((int)attr == CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH ||
               (int)attr == CU_MEMPOOL_ATTR_USED_MEM_HIGH) {
        /* Only resetting to zero is allowed; the mark restarts from current use. */
        if (*(cuuint64_t *)value != 0)
            rc = CUDA_ERROR_INVALID_VALUE;
        else
            p->used_high = cu_alloc_charged_by_pool(p);
    } else {
        rc = CUDA_ERROR_INVALID_VALUE;
    }
    pthread_mutex_unlock(&cu_drv.lock);
    return rc;
}

CU_API CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    struct CUmemPoolHandle_st *p;
    CU_TRY(pool_attr_lock(pool, value, &p));
    CUresult rc = CUDA_SUCCESS;
    size_t size;
    const void *field = stored_attr(p, (int)attr, &size);
    if (field != NULL) {
        memcpy(value, field, size);
    } else {
        switch ((int)attr) {
        case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
        case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
            *(cuuint64_t *)value = cu_alloc_charged_by_pool(p);
            break;
        case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = p->used_high; break;
        default: rc = CUDA_ERROR_INVALID_VALUE; break;
        }
    }
    pthread_mutex_unlock(&cu_drv.lock);
    return rc;
}

/* Pool allocations belong to their context and are freed by cu_mem_release_ctx; pools themselves
 * belong to the device. */
void cu_pool_release_ctx(struct CUctx_st *ctx) {
    (void)ctx;
}
