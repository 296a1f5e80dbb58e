/*
 * cuda_memory.c - the unified address space: device, managed, pool and host allocations, copies,
 * sets, cuMemGetInfo and pointer queries.
 *
 * Device pointers are fake addresses in [CU_VA_START, CU_VA_END) = [0x6800'0000'0000,
 * 0x7000'0000'0000): above PIE executables and their brk heap (0x55../0x56..) and above the
 * AddressSanitizer allocator (up to 0x6400'0000'0000), below the top-down mmap area (0x7e..-0x7f..),
 * so in practice no host pointer falls inside and any unknown pointer outside the range can be
 * treated as host memory (unified addressing). Every allocation is a
 * record in one table sorted by base address (a range lookup is a binary search). Device memory
 * is charged to the node state per process (sim_mem_reserve), which is what NVML reports and what
 * bounds every allocation path by the profile's memory: a charge that does not fit fails with
 * CUDA_ERROR_OUT_OF_MEMORY before anything is recorded, so nothing leaks. Managed memory is
 * the exception: only its device-resident part is charged (see cu_alloc_managed).
 *
 * Contents: an allocation up to cfg.backing_max bytes gets real host memory on its first copy
 * or set, so small HtoD/DtoH round trips return the data. Larger allocations accept copies but
 * keep no data (reads return zeros) - enough for the simulator's purposes, and it keeps an
 * 80 GiB allocation from needing 80 GiB of RAM.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_internal.h"

#define CU_VA_START 0x680000000000ULL
#define CU_VA_END 0x700000000000ULL
#define SMALL_ALIGN 512ULL
#define LARGE_ALIGN (2ULL << 20)

static struct cu_alloc *table;
static size_t table_len, table_cap;
static CUdeviceptr va_cursor = CU_VA_START;

/* ---- The table (lock held) ------------------------------------------------------------------- */

/* Index of the first record whose end is above p. */
static size_t first_ending_after(CUdeviceptr p) {
    size_t lo = 0, hi = table_len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (table[mid].base + table[mid].size <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int cu_alloc_insert(const struct cu_alloc *a) {
    if (table_len == table_cap) {
        size_t ncap = table_cap ? table_cap * 2 : 64;
        struct cu_alloc *nt = realloc(table, ncap * sizeof(*nt));
        if (nt == NULL) return -1;
        table = nt;
        table_cap = ncap;
    }
    size_t i = first_ending_after(a->base);
    memmove(&table[i + 1], &table[i], (table_len - i) * sizeof(*table));
    table[i] = *a;
    table_len++;
    return 0;
}

struct cu_alloc *cu_alloc_find(CUdeviceptr p) {
    size_t i = first_ending_after(p);
    if (i < table_len && table[i].base <= p) return &table[i];
    return NULL;
}

void cu_alloc_remove(CUdeviceptr base) {
    size_t i = first_ending_after(base);
    if (i >= table_len || table[i].base != base) return;
    if (table[i].kind == CU_MEM_MANAGED) {
        unsigned long long host = table[i].size - table[i].charged;
        cu_drv.managed_host_bytes -=
            host < cu_drv.managed_host_bytes ? host : cu_drv.managed_host_bytes;
    }
    memmove(&table[i], &table[i + 1], (table_len - i - 1) * sizeof(*table));
    table_len--;
    if (table_len == 0) {
        /* Give the memory back so leak checkers see a clean process after a full teardown. */
        free(table);
        table = NULL;
        table_cap = 0;
    }
}

static CUdeviceptr align_up(CUdeviceptr x, size_t a) {
    return (x + a - 1) & ~((CUdeviceptr)a - 1);
}

CUdeviceptr cu_va_pick(size_t size, size_t align) {
    if (size == 0 || size > CU_VA_END - CU_VA_START) return 0;
    /* Next fit from the cursor, wrapping once, so freed ranges are not reused at once (a stale
     * pointer then fails cleanly instead of hitting a newer allocation). */
    for (int pass = 0; pass < 2; pass++) {
        CUdeviceptr cand = align_up(pass == 0 ? va_cursor : CU_VA_START, align);
        for (size_t i = first_ending_after(cand); i < table_len && cand + size <= CU_VA_END; i++) {
            if (table[i].base >= cand + size) break;
            cand = align_up(table[i].base + table[i].size, align);
        }
        if (cand + size <= CU_VA_END) {
            va_cursor = cand + size;
            return cand;
        }
    }
    return 0;
}

/* ---- Charging the node state ----------------------------------------------------------------- */

static CUresult reserve_result(int rc) {
    switch (rc) {
    case 0: return CUDA_SUCCESS;
    case -1:
    case -2: return CUDA_ERROR_OUT_OF_MEMORY;
    case -4: return CUDA_ERROR_DEVICE_UNAVAILABLE;
    default: return CUDA_ERROR_INVALID_DEVICE;
    }
}

CUresult cu_charge(int phys, unsigned long long bytes) {
    return reserve_result(sim_mem_reserve(phys, bytes));
}

void cu_uncharge(int phys, unsigned long long bytes, int owner_pid) {
    /* After fork, the child's copy of an inherited record was charged to the parent. */
    if (bytes > 0 && phys >= 0 && owner_pid == getpid()) sim_mem_release(phys, bytes);
}

/* Record an allocation of `size` bytes of which `charged` are already reserved on the context's
 * GPU; on failure the reservation is given back. Managed allocations also take their
 * host-resident part (size - charged) from the process's host budget (cfg.host_memory). */
static CUresult record_alloc(struct CUctx_st *ctx, size_t size, unsigned long long charged,
                             enum cu_mem_kind kind, struct CUmemPoolHandle_st *pool,
                             CUdeviceptr *out) {
    unsigned long long host = kind == CU_MEM_MANAGED ? size - charged : 0;
    int rc = -1;
    CUdeviceptr base = 0;
    pthread_mutex_lock(&cu_drv.lock);
    if (host == 0 || (cu_drv.managed_host_bytes <= cu_drv.cfg.host_memory &&
                      host <= cu_drv.cfg.host_memory - cu_drv.managed_host_bytes))
        base = cu_va_pick(size, size >= LARGE_ALIGN ? LARGE_ALIGN : SMALL_ALIGN);
    struct cu_alloc a = {
        .base = base,
        .size = size,
        .kind = kind,
        .phys = ctx->phys,
        .charged = charged,
        .ctx = ctx,
        .pool = pool,
        .owner_pid = getpid(),
        .backing = NULL,
    };
    if (base != 0) rc = cu_alloc_insert(&a);
    if (rc == 0) cu_drv.managed_host_bytes += host;
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) {
        cu_uncharge(ctx->phys, charged, getpid());
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *out = base;
    return CUDA_SUCCESS;
}

CUresult cu_alloc_device(struct CUctx_st *ctx, size_t size, enum cu_mem_kind kind,
                         struct CUmemPoolHandle_st *pool, CUdeviceptr *out) {
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_charge(ctx->phys, size));
    return record_alloc(ctx, size, size, kind, pool, out);
}

/* Managed memory may exceed the GPU, as on Pascal and later GPUs under Linux, where its pages
 * migrate on demand and are evicted to host memory. The simulator fixes residency once, at
 * allocation: the part that fits in the GPU's free memory at that moment is device-resident and
 * charged like device memory (NVML, cuMemGetInfo and other processes see it); the rest is
 * host-resident, is not charged to the GPU, and is bounded per process by cfg.host_memory.
 * Nothing migrates afterwards, so device allocations by anyone still fail when the GPU is full. */
static CUresult cu_alloc_managed(struct CUctx_st *ctx, size_t size, CUdeviceptr *out) {
    if (size == 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned long long resident = 0;
    CU_TRY(reserve_result(sim_mem_reserve_upto(ctx->phys, size, &resident)));
    return record_alloc(ctx, size, resident, CU_MEM_MANAGED, NULL, out);
}

static int is_device_kind(enum cu_mem_kind k) {
    return k == CU_MEM_DEVICE || k == CU_MEM_MANAGED || k == CU_MEM_POOL;
}

CUresult cu_free_device(CUdeviceptr base, enum cu_mem_kind expect) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *a = cu_alloc_find(base);
    if (a == NULL || a->base != base || !is_device_kind(a->kind) ||
        (expect != 0 && a->kind != expect)) {
        pthread_mutex_unlock(&cu_drv.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct cu_alloc copy = *a;
    cu_alloc_remove(base);
    pthread_mutex_unlock(&cu_drv.lock);
    free(copy.backing);
    cu_uncharge(copy.phys, copy.charged, copy.owner_pid);
    return CUDA_SUCCESS;
}

/* Free (and uncharge) every record for which match() holds, one at a time so that no lock is
 * held while the state is updated. VA ranges are left to cuda_vmm.c. */
static void release_matching(int (*match)(const struct cu_alloc *, const void *), const void *arg) {
    for (;;) {
        pthread_mutex_lock(&cu_drv.lock);
        struct cu_alloc victim;
        int found = 0;
        for (size_t i = 0; i < table_len && !found; i++) {
            if (table[i].kind == CU_MEM_VA_RANGE || !match(&table[i], arg)) continue;
            victim = table[i];
            cu_alloc_remove(victim.base);
            found = 1;
        }
        pthread_mutex_unlock(&cu_drv.lock);
        if (!found) return;
        if (victim.kind == CU_MEM_HOST)
            free((void *)(uintptr_t)victim.base);
        else if (victim.kind != CU_MEM_HOST_REGISTERED)
            free(victim.backing);
        cu_uncharge(victim.phys, victim.charged, victim.owner_pid);
    }
}

static int owned_by_ctx(const struct cu_alloc *a, const void *ctx) {
    return a->ctx == ctx;
}

static int from_pool(const struct cu_alloc *a, const void *pool) {
    return a->kind == CU_MEM_POOL && a->pool == pool;
}

void cu_mem_release_ctx(struct CUctx_st *ctx) {
    release_matching(owned_by_ctx, ctx);
}

void cu_mem_release_pool(const struct CUmemPoolHandle_st *pool) {
    release_matching(from_pool, pool);
}

unsigned long long cu_alloc_charged_by_pool(const struct CUmemPoolHandle_st *pool) {
    unsigned long long sum = 0;
    for (size_t i = 0; i < table_len; i++)
        if (table[i].kind == CU_MEM_POOL && table[i].pool == pool) sum += table[i].charged;
    return sum;
}

/* ---- Device allocation entry points ---------------------------------------------------------- */

CU_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    if (dptr == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    return cu_alloc_device(ctx, bytesize, CU_MEM_DEVICE, NULL, dptr);
}

CU_API CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                   size_t Height, unsigned int ElementSizeBytes) {
    if (dptr == NULL || pPitch == NULL || WidthInBytes == 0 || Height == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16)
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    size_t pitch = (size_t)align_up(WidthInBytes, SMALL_ALIGN);
    if (Height > (size_t)-1 / pitch) return CUDA_ERROR_OUT_OF_MEMORY;
    CU_TRY(cu_alloc_device(ctx, pitch * Height, CU_MEM_DEVICE, NULL, dptr));
    *pPitch = pitch;
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    if (dptr == NULL || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    return cu_alloc_managed(ctx, bytesize, dptr);
}

CU_API CUresult cuMemFree_v2(CUdeviceptr dptr) {
    if (dptr == 0) return CUDA_SUCCESS; /* freeing NULL is a no-op */
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *a = cu_alloc_find(dptr);
    int pooled = a != NULL && a->kind == CU_MEM_POOL;
    pthread_mutex_unlock(&cu_drv.lock);
    /* cuMemFree of a stream-ordered allocation is allowed and frees it at once. */
    return cu_free_device(dptr, pooled ? CU_MEM_POOL : 0);
}

CU_API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (free_bytes == NULL && total == NULL) return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    const struct sim_gpu_info *g = sim_gpu(ctx->phys);
    if (g == NULL) return CUDA_ERROR_INVALID_DEVICE;
    unsigned long long used = sim_mem_used(ctx->phys);
    if (free_bytes != NULL)
        *free_bytes = used >= g->memory_total ? 0 : (size_t)(g->memory_total - used);
    if (total != NULL) *total = (size_t)g->memory_total;
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *a = cu_alloc_find(dptr);
    int ok = a != NULL && is_device_kind(a->kind);
    if (ok && pbase != NULL) *pbase = a->base;
    if (ok && psize != NULL) *psize = a->size;
    pthread_mutex_unlock(&cu_drv.lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CU_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
    if (data == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *found = cu_alloc_find(ptr);
    struct cu_alloc a;
    int ok = found != NULL && found->kind != CU_MEM_VA_RANGE;
    if (ok) a = *found;
    pthread_mutex_unlock(&cu_drv.lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    int host = a.kind == CU_MEM_HOST || a.kind == CU_MEM_HOST_REGISTERED;
    switch ((int)attribute) {
    case CU_POINTER_ATTRIBUTE_CONTEXT: *(CUcontext *)data = a.ctx; break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
        *(unsigned int *)data = host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
        break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *(CUdeviceptr *)data = ptr; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
        if (!host && a.kind != CU_MEM_MANAGED) return CUDA_ERROR_INVALID_VALUE;
        *(void **)data = (void *)(uintptr_t)ptr;
        break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *(unsigned long long *)data = a.base; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *(int *)data = a.kind == CU_MEM_MANAGED; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data = a.ctx ? a.ctx->ordinal : -1; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *(CUdeviceptr *)data = a.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data = a.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *(int *)data = 1; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *(CUmemoryPool *)data = a.pool; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ---- Host memory ----------------------------------------------------------------------------- */

CU_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags) {
    if (pp == NULL || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    if (Flags & ~(unsigned int)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
                                CU_MEMHOSTALLOC_WRITECOMBINED))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    void *p = NULL;
    if (posix_memalign(&p, 4096, bytesize) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    struct cu_alloc a = {
        .base = (CUdeviceptr)(uintptr_t)p,
        .size = bytesize,
        .kind = CU_MEM_HOST,
        .phys = -1,
        .ctx = ctx,
        .owner_pid = getpid(),
        .backing = p,
    };
    pthread_mutex_lock(&cu_drv.lock);
    int rc = cu_alloc_insert(&a);
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) {
        free(p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize) {
    return cuMemHostAlloc(pp, bytesize, 0);
}

CU_API CUresult cuMemFreeHost(void *p) {
    CU_TRY(cu_check_init());
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)p;
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *a = cu_alloc_find(base);
    int ok = a != NULL && a->base == base && a->kind == CU_MEM_HOST;
    if (ok) cu_alloc_remove(base);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    free(p);
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags) {
    if (p == NULL || bytesize == 0 ||
        (Flags & ~(unsigned int)(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                 CU_MEMHOSTREGISTER_IOMEMORY | CU_MEMHOSTREGISTER_READ_ONLY)))
        return CUDA_ERROR_INVALID_VALUE;
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)p;
    if (base + bytesize < base || (base < CU_VA_END && base + bytesize > CU_VA_START))
        return CUDA_ERROR_INVALID_VALUE; /* wraps, or names simulated device memory */
    struct cu_alloc a = {
        .base = base,
        .size = bytesize,
        .kind = CU_MEM_HOST_REGISTERED,
        .phys = -1,
        .ctx = ctx,
        .owner_pid = getpid(),
        .backing = p,
    };
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&cu_drv.lock);
    /* Any overlap with a range the driver already knows is an error. */
    size_t i = first_ending_after(base);
    if (i < table_len && table[i].base < base + bytesize)
        rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (cu_alloc_insert(&a) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&cu_drv.lock);
    return rc;
}

CU_API CUresult cuMemHostUnregister(void *p) {
    CU_TRY(cu_check_init());
    CUdeviceptr base = (CUdeviceptr)(uintptr_t)p;
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *a = cu_alloc_find(base);
    int ok = a != NULL && a->base == base && a->kind == CU_MEM_HOST_REGISTERED;
    if (ok) cu_alloc_remove(base);
    pthread_mutex_unlock(&cu_drv.lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
}

/* With unified addressing a pinned host pointer is also its device pointer. */
CU_API CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags) {
    if (pdptr == NULL || Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *a = cu_alloc_find((CUdeviceptr)(uintptr_t)p);
    int ok = a != NULL && (a->kind == CU_MEM_HOST || a->kind == CU_MEM_HOST_REGISTERED);
    pthread_mutex_unlock(&cu_drv.lock);
    if (!ok) return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

/* ---- Copies and sets ------------------------------------------------------------------------- */

/* Where `n` bytes at unified address p live in this process:
 *   *host set to the bytes (NULL when the allocation keeps no contents), CUDA_SUCCESS;
 *   CUDA_ERROR_INVALID_VALUE for a fake device address that is not (wholly) allocated.
 * Any address outside the fake range is ordinary host memory (unified addressing). */
static CUresult locate(CUdeviceptr p, size_t n, unsigned char **host) {
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *a = cu_alloc_find(p);
    if (a == NULL) {
        pthread_mutex_unlock(&cu_drv.lock);
        if (p >= CU_VA_START && p < CU_VA_END) return CUDA_ERROR_INVALID_VALUE;
        *host = (unsigned char *)(uintptr_t)p;
        return CUDA_SUCCESS;
    }
    if (n > a->size - (size_t)(p - a->base)) {
        pthread_mutex_unlock(&cu_drv.lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (a->kind == CU_MEM_VA_RANGE) {
        /* A VMM range: the contents of the physical memory mapped there (cuda_vmm.c). */
        *host = cu_vmm_contents_locked(p, n);
        pthread_mutex_unlock(&cu_drv.lock);
        return CUDA_SUCCESS;
    }
    if (is_device_kind(a->kind) && a->backing == NULL && a->size <= cu_drv.cfg.backing_max)
        a->backing = calloc(1, a->size);
    unsigned char *b = a->backing;
    *host = b != NULL ? b + (p - a->base) : NULL;
    pthread_mutex_unlock(&cu_drv.lock);
    return CUDA_SUCCESS;
}

static CUresult copy_bytes(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    if (n == 0) return CUDA_SUCCESS;
    unsigned char *d, *s;
    CU_TRY(locate(dst, n, &d));
    CU_TRY(locate(src, n, &s));
    if (d != NULL && s != NULL)
        memmove(d, s, n);
    else if (d != NULL)
        memset(d, 0, n); /* the source keeps no contents: it reads as zeros */
    return CUDA_SUCCESS;
}

/* Synchronous copies are ordered after the context's prior work, like the legacy stream. */
static CUresult copy_sync(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    pthread_mutex_lock(&cu_drv.lock);
    unsigned long long until = ctx->done_ns; /* >= every stream's done time */
    pthread_mutex_unlock(&cu_drv.lock);
    cu_sleep_until(until);
    return copy_bytes(dst, src, n);
}

static CUresult copy_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(h, &s));
    return copy_bytes(dst, src, n);
}

#define HOSTPTR(p) ((CUdeviceptr)(uintptr_t)(p))

CU_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    return copy_sync(dst, src, ByteCount);
}
CU_ALIAS(cuMemcpy, cuMemcpy_ptds);

CU_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                              CUstream hStream) {
    return copy_async(dst, src, ByteCount, hStream);
}
CU_ALIAS(cuMemcpyAsync, cuMemcpyAsync_ptsz);

CU_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    if (srcHost == NULL && ByteCount > 0) return CUDA_ERROR_INVALID_VALUE;
    return copy_sync(dstDevice, HOSTPTR(srcHost), ByteCount);
}
CU_ALIAS(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds);

CU_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    if (dstHost == NULL && ByteCount > 0) return CUDA_ERROR_INVALID_VALUE;
    return copy_sync(HOSTPTR(dstHost), srcDevice, ByteCount);
}
CU_ALIAS(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds);

CU_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    return copy_sync(dstDevice, srcDevice, ByteCount);
}
CU_ALIAS(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds);

CU_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                     CUstream hStream) {
    if (srcHost == NULL && ByteCount > 0) return CUDA_ERROR_INVALID_VALUE;
    return copy_async(dstDevice, HOSTPTR(srcHost), ByteCount, hStream);
}
CU_ALIAS(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz);

CU_API CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                     CUstream hStream) {
    if (dstHost == NULL && ByteCount > 0) return CUDA_ERROR_INVALID_VALUE;
    return copy_async(HOSTPTR(dstHost), srcDevice, ByteCount, hStream);
}
CU_ALIAS(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz);

CU_API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                     size_t ByteCount, CUstream hStream) {
    return copy_async(dstDevice, srcDevice, ByteCount, hStream);
}
CU_ALIAS(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz);

/* Fill N elements of `width` bytes (1, 2 or 4) with `value`. */
static CUresult fill(CUdeviceptr dst, unsigned int value, size_t width, size_t N) {
    if (N == 0) return CUDA_SUCCESS;
    if (N > (size_t)-1 / width || dst % width != 0) return CUDA_ERROR_INVALID_VALUE;
    unsigned char *d;
    CU_TRY(locate(dst, N * width, &d));
    if (d == NULL) return CUDA_SUCCESS;
    if (width == 1) {
        memset(d, (int)(value & 0xff), N);
        return CUDA_SUCCESS;
    }
    for (size_t i = 0; i < N; i++) memcpy(d + i * width, &value, width); /* little-endian */
    return CUDA_SUCCESS;
}

static CUresult fill_sync(CUdeviceptr dst, unsigned int value, size_t width, size_t N) {
    struct CUctx_st *ctx;
    CU_TRY(cu_ctx_require(&ctx));
    return fill(dst, value, width, N);
}

static CUresult fill_async(CUdeviceptr dst, unsigned int value, size_t width, size_t N,
                           CUstream h) {
    struct CUstream_st *s;
    CU_TRY(cu_stream_resolve(h, &s));
    return fill(dst, value, width, N);
}

CU_API CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    return fill_sync(dstDevice, uc, 1, N);
}
CU_ALIAS(cuMemsetD8_v2, cuMemsetD8_v2_ptds);

CU_API CUresult cuMemsetD16_v2(CUdeviceptr dstDevice, unsigned short us, size_t N) {
    return fill_sync(dstDevice, us, 2, N);
}
CU_ALIAS(cuMemsetD16_v2, cuMemsetD16_v2_ptds);

CU_API CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N) {
    return fill_sync(dstDevice, ui, 4, N);
}
CU_ALIAS(cuMemsetD32_v2, cuMemsetD32_v2_ptds);

CU_API CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N,
                                CUstream hStream) {
    return fill_async(dstDevice, uc, 1, N, hStream);
}
CU_ALIAS(cuMemsetD8Async, cuMemsetD8Async_ptsz);

CU_API CUresult cuMemsetD16Async(CUdeviceptr dstDevice, unsigned short us, size_t N,
                                 CUstream hStream) {
    return fill_async(dstDevice, us, 2, N, hStream);
}
CU_ALIAS(cuMemsetD16Async, cuMemsetD16Async_ptsz);

CU_API CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N,
                                 CUstream hStream) {
    return fill_async(dstDevice, ui, 4, N, hStream);
}
CU_ALIAS(cuMemsetD32Async, cuMemsetD32Async_ptsz);
