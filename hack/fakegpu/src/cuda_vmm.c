/*
 * cuda_vmm.c - the virtual memory management API (cuMemCreate / cuMemMap and friends).
 *
 * Physical allocations (cuMemCreate) are charged to their GPU in the node state at creation,
 * because that is when a real GPU commits the memory. Address reservations are plain records in
 * the unified address table (kind CU_MEM_VA_RANGE) and cost no device memory. A physical
 * allocation lives until it is released AND unmapped everywhere (the real driver's rule), which
 * is counted by `refs` = (not yet released) + (number of mappings).
 *
 * Contents: a physical allocation up to cfg.backing_max bytes gets real host memory on the first
 * copy or set through one of its mappings, shared by every mapping of it (so two views of the
 * same memory see the same bytes, as PyTorch's expandable segments rely on). A copy that spans
 * two mappings, or a larger allocation, accepts the bytes but keeps no contents (reads zeros).
 */
#include <stdlib.h>
#include <unistd.h>

#include "cuda_internal.h"

#define VMM_GRANULARITY (2ULL << 20)

struct vmm_phys {
    int phys;
    size_t size;
    int refs;
    int owner_pid;
    unsigned char *backing; /* lazily allocated contents, or NULL */
};

struct vmm_mapping {
    CUdeviceptr va;
    size_t size;
    struct vmm_phys *mem;
    struct vmm_mapping *next;
};

static struct vmm_mapping *mappings; /* guarded by cu_drv.lock */

static struct vmm_phys *handle_to_mem(CUmemGenericAllocationHandle h) {
    void *p = (void *)(uintptr_t)h;
    return cu_handle_is(p, CU_KIND_MEM_HANDLE) ? p : NULL;
}

/* Drop one reference (lock held); returns the allocation to free and uncharge, or NULL. */
static struct vmm_phys *unref(struct vmm_phys *m) {
    return --m->refs == 0 ? m : NULL;
}

static void destroy(struct vmm_phys *m) {
    if (m == NULL) return;
    cu_uncharge(m->phys, m->size, m->owner_pid);
    free(m->backing);
    free(m);
}

static CUresult check_prop(const CUmemAllocationProp *prop, int *phys) {
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = cu_device_phys(prop->location.id, phys);
    return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_DEVICE : rc;
}

CU_API CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags option) {
    if (granularity == NULL || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                                option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    int phys;
    CU_TRY(check_prop(prop, &phys));
    *granularity = VMM_GRANULARITY;
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
    if (handle == NULL || flags != 0 || size == 0 || size % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    int phys;
    CU_TRY(check_prop(prop, &phys));
    struct vmm_phys *m = calloc(1, sizeof(*m));
    if (m == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = cu_charge(phys, size);
    if (rc != CUDA_SUCCESS) {
        free(m);
        return rc;
    }
    m->phys = phys;
    m->size = size;
    m->refs = 1;
    m->owner_pid = getpid();
    pthread_mutex_lock(&cu_drv.lock);
    int added = cu_handle_add(m, CU_KIND_MEM_HANDLE);
    pthread_mutex_unlock(&cu_drv.lock);
    if (added != 0) {
        destroy(m);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)m;
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    CU_TRY(cu_check_init());
    pthread_mutex_lock(&cu_drv.lock);
    struct vmm_phys *m = handle_to_mem(handle);
    struct vmm_phys *dead = NULL;
    if (m != NULL) {
        cu_handle_remove(m); /* the handle value is no longer valid; mappings keep it alive */
        dead = unref(m);
    }
    pthread_mutex_unlock(&cu_drv.lock);
    if (m == NULL) return CUDA_ERROR_INVALID_VALUE;
    destroy(dead);
    return CUDA_SUCCESS;
}

CU_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags) {
    if (ptr == NULL || size == 0 || flags != 0 || size % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (alignment != 0 && (alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    size_t align = alignment > VMM_GRANULARITY ? alignment : VMM_GRANULARITY;
    pthread_mutex_lock(&cu_drv.lock);
    CUdeviceptr base = 0;
    /* Honour the requested address when it is aligned and free; otherwise pick one. */
    if (addr != 0 && addr % align == 0 && cu_alloc_find(addr) == NULL &&
        cu_alloc_find(addr + size - 1) == NULL)
        base = addr;
    if (base == 0) base = cu_va_pick(size, align);
    struct cu_alloc a = {
        .base = base, .size = size, .kind = CU_MEM_VA_RANGE, .phys = -1, .owner_pid = getpid()};
    int rc = base != 0 ? cu_alloc_insert(&a) : -1;
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = base;
    return CUDA_SUCCESS;
}

/* Unlink every mapping inside [va, va+size) (lock held); collects allocations to destroy. */
static int unmap_range(CUdeviceptr va, size_t size, struct vmm_phys **dead, int max_dead) {
    int ndead = 0;
    struct vmm_mapping **pp = &mappings;
    while (*pp != NULL) {
        struct vmm_mapping *m = *pp;
        if (m->va >= va && m->va + m->size <= va + size) {
            *pp = m->next;
            struct vmm_phys *d = unref(m->mem);
            if (d != NULL && ndead < max_dead) dead[ndead++] = d;
            free(m);
        } else {
            pp = &m->next;
        }
    }
    return ndead;
}

/* A mapping that straddles the edge of [va, va+size) (lock held). */
static int straddles(CUdeviceptr va, size_t size) {
    for (struct vmm_mapping *m = mappings; m != NULL; m = m->next) {
        int overlaps = m->va < va + size && va < m->va + m->size;
        int inside = m->va >= va && m->va + m->size <= va + size;
        if (overlaps && !inside) return 1;
    }
    return 0;
}

#define MAX_DEAD 256

static CUresult unmap_and_destroy(CUdeviceptr va, size_t size, int free_reservation) {
    struct vmm_phys *dead[MAX_DEAD];
    pthread_mutex_lock(&cu_drv.lock);
    struct cu_alloc *r = cu_alloc_find(va);
    int ok = r != NULL && r->kind == CU_MEM_VA_RANGE && va + size <= r->base + r->size &&
             !straddles(va, size);
    if (free_reservation) ok = ok && r->base == va && r->size == size;
    int ndead = ok ? unmap_range(va, size, dead, MAX_DEAD) : 0;
    if (ok && free_reservation) cu_alloc_remove(va);
    pthread_mutex_unlock(&cu_drv.lock);
    for (int i = 0; i < ndead; i++) destroy(dead[i]);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CU_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    CU_TRY(cu_check_init());
    /* Mappings still inside the range are dropped with it (the real driver requires an unmap
     * first; being lenient keeps a sloppy program from leaking simulated memory). */
    return unmap_and_destroy(ptr, size, 1);
}

CU_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
    if (flags != 0 || size == 0 || size % VMM_GRANULARITY != 0 || offset % VMM_GRANULARITY != 0 ||
        ptr % VMM_GRANULARITY != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    struct vmm_mapping *map = calloc(1, sizeof(*map));
    if (map == NULL) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&cu_drv.lock);
    struct vmm_phys *m = handle_to_mem(handle);
    struct cu_alloc *r = cu_alloc_find(ptr);
    if (m == NULL)
        rc = CUDA_ERROR_INVALID_HANDLE;
    else if (r == NULL || r->kind != CU_MEM_VA_RANGE || ptr + size > r->base + r->size ||
             offset > m->size || size > m->size - offset)
        rc = CUDA_ERROR_INVALID_VALUE;
    for (struct vmm_mapping *o = mappings; rc == CUDA_SUCCESS && o != NULL; o = o->next)
        if (o->va < ptr + size && ptr < o->va + o->size) rc = CUDA_ERROR_ALREADY_MAPPED;
    if (rc == CUDA_SUCCESS) {
        map->va = ptr;
        map->size = size;
        map->mem = m;
        map->next = mappings;
        mappings = map;
        m->refs++;
    }
    pthread_mutex_unlock(&cu_drv.lock);
    if (rc != CUDA_SUCCESS) free(map);
    return rc;
}

CU_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    CU_TRY(cu_check_init());
    return unmap_and_destroy(ptr, size, 0);
}

CU_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count) {
    if (desc == NULL || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    for (size_t i = 0; i < count; i++) {
        int phys;
        if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE) return CUDA_ERROR_INVALID_VALUE;
        CU_TRY(cu_device_phys(desc[i].location.id, &phys));
    }
    /* The whole range must be mapped. */
    pthread_mutex_lock(&cu_drv.lock);
    size_t covered = 0;
    for (struct vmm_mapping *m = mappings; m != NULL; m = m->next)
        if (m->va >= ptr && m->va + m->size <= ptr + size) covered += m->size;
    pthread_mutex_unlock(&cu_drv.lock);
    return covered == size ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

unsigned char *cu_vmm_contents_locked(CUdeviceptr p, size_t n) {
    for (struct vmm_mapping *m = mappings; m != NULL; m = m->next) {
        if (p < m->va || p - m->va >= m->size) continue;
        if (n > m->size - (size_t)(p - m->va)) return NULL; /* spans mappings */
        struct vmm_phys *mem = m->mem;
        if (mem->backing == NULL && mem->size <= cu_drv.cfg.backing_max)
            mem->backing = calloc(1, mem->size);
        return mem->backing != NULL ? mem->backing + (p - m->va) : NULL;
    }
    return NULL; /* reserved but not mapped */
}

/* VMM objects belong to the process, not to a context. */
void cu_vmm_release_ctx(struct CUctx_st *ctx) {
    (void)ctx;
}
