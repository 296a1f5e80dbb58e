/*
 * test_cuda_memory.c - contexts and every memory path of the fake CUDA driver.
 *
 * What it proves:
 *  1. Primary contexts are reference counted (retain/release/reset/state/flags); created
 *     contexts become current; push/pop/set work per thread; a destroyed context is rejected.
 *  2. cuMemAlloc is bounded by the profile's memory: filling the GPU works, one byte more fails
 *     with CUDA_ERROR_OUT_OF_MEMORY and changes nothing; cuMemGetInfo tracks every step; frees
 *     return the memory; bad frees are errors.
 *  3. Small allocations keep their contents: HtoD/DtoH/DtoD/memset round-trip; out-of-range and
 *     freed pointers are rejected; pointer attributes and address ranges describe allocations.
 *  4. Pitch, managed, stream-ordered and pool allocations are charged; host allocations are
 *     real memory and not charged; destroying a pool or a context frees what it still holds.
 *  4b. Managed memory oversubscribes: only the part that fits in free device memory is
 *     charged, the rest is host-resident within VGPU_SIM_HOST_MEMORY; device allocations still
 *     fail on a full GPU; frees and context teardown return both parts.
 *  5. VMM: physical memory is charged at cuMemCreate and released only when released and
 *     unmapped; reservations cost nothing; mapping rules are enforced.
 *  6. Arrays and mipmapped arrays are charged from format x channels x extent.
 *  7. Process lifetime: a forked child can initialise and allocate on its own; a child's memory
 *     goes back on normal exit and after SIGKILL.
 */
#include "testutil.h"

#include <pthread.h>

#include "cuda_abi.h"

#define GiB (1024ULL * 1024 * 1024)
#define MiB (1024ULL * 1024)

static size_t free_now(void)
{
    size_t f = 0, t = 0;
    CHECK(cuMemGetInfo_v2(&f, &t) == CUDA_SUCCESS);
    return f;
}

static CUcontext setup(CUdevice dev)
{
    tu_node(NULL);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUcontext ctx;
    CHECK(cuCtxCreate_v2(&ctx, 0, dev) == CUDA_SUCCESS);
    return ctx;
}

/* ---- Contexts -------------------------------------------------------------------------------- */

static void *thread_sees_no_context(void *arg)
{
    (void)arg;
    CUcontext c = (CUcontext)1;
    CHECK(cuCtxGetCurrent(&c) == CUDA_SUCCESS && c == NULL);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, 16) == CUDA_ERROR_INVALID_CONTEXT);
    return NULL;
}

static void case_contexts(void)
{
    tu_node(NULL);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    size_t f, t;
    CHECK(cuMemGetInfo_v2(&f, &t) == CUDA_ERROR_INVALID_CONTEXT); /* no context yet */

    unsigned int flags = 99;
    int active = 99;
    CHECK(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS);
    CHECK(flags == 0 && active == 0);
    CHECK(cuDevicePrimaryCtxSetFlags_v2(1, CU_CTX_SCHED_BLOCKING_SYNC) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxSetFlags_v2(1, 0x10000) == CUDA_ERROR_INVALID_VALUE);
    CUcontext p1, p2;
    CHECK(cuDevicePrimaryCtxRetain(&p1, 1) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&p2, 1) == CUDA_SUCCESS);
    CHECK(p1 == p2);
    CHECK(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS);
    CHECK(flags == CU_CTX_SCHED_BLOCKING_SYNC && active == 1);
    CHECK(cuCtxSetCurrent(p1) == CUDA_SUCCESS);
    CUdevice d = -1;
    CHECK(cuCtxGetDevice(&d) == CUDA_SUCCESS && d == 1);
    CHECK(cuCtxGetFlags(&flags) == CUDA_SUCCESS && flags == CU_CTX_SCHED_BLOCKING_SYNC);
    CHECK(cuCtxDestroy_v2(p1) == CUDA_ERROR_INVALID_CONTEXT); /* primary: release, not destroy */
    CUdeviceptr held;
    CHECK(cuMemAlloc_v2(&held, 256 * MiB) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease_v2(1) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS && active == 1);
    CHECK(cuDevicePrimaryCtxRelease_v2(1) == CUDA_SUCCESS); /* last reference: memory freed */
    CHECK(cuDevicePrimaryCtxGetState(1, &flags, &active) == CUDA_SUCCESS && active == 0);
    CHECK(cuDevicePrimaryCtxRelease_v2(1) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuMemAlloc_v2(&held, 16) == CUDA_ERROR_INVALID_CONTEXT); /* it is gone */

    CUcontext c0, c1, got;
    CHECK(cuCtxCreate_v2(&c0, 0, 0) == CUDA_SUCCESS);
    CHECK(cuCtxGetCurrent(&got) == CUDA_SUCCESS && got == c0);
    CHECK(cuCtxCreate_v4(&c1, NULL, 0, 1) == CUDA_SUCCESS);
    CHECK(cuCtxGetCurrent(&got) == CUDA_SUCCESS && got == c1);
    CHECK(cuCtxGetDevice(&d) == CUDA_SUCCESS && d == 1);
    CHECK(cuCtxPopCurrent_v2(&got) == CUDA_SUCCESS && got == c1);
    CHECK(cuCtxGetDevice(&d) == CUDA_SUCCESS && d == 0);
    CHECK(cuCtxPushCurrent_v2(c1) == CUDA_SUCCESS);
    unsigned int ver = 0;
    CHECK(cuCtxGetApiVersion(c0, &ver) == CUDA_SUCCESS && ver >= 3020);
    unsigned long long id0 = 0, id1 = 0;
    CHECK(cuCtxGetId(c0, &id0) == CUDA_SUCCESS && cuCtxGetId(c1, &id1) == CUDA_SUCCESS);
    CHECK(id0 != id1);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, thread_sees_no_context, NULL) == 0);
    CHECK(pthread_join(th, NULL) == 0);
    size_t limit = 0;
    CHECK(cuCtxGetLimit(&limit, CU_LIMIT_MALLOC_HEAP_SIZE) == CUDA_SUCCESS && limit == 8 << 20);
    CHECK(cuCtxSetLimit(CU_LIMIT_STACK_SIZE, 4096) == CUDA_SUCCESS);
    CHECK(cuCtxGetLimit(&limit, CU_LIMIT_STACK_SIZE) == CUDA_SUCCESS && limit == 4096);
    CHECK(cuCtxGetLimit(&limit, (CUlimit)99) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuCtxDestroy_v2(c1) == CUDA_SUCCESS);
    CHECK(cuCtxDestroy_v2(c1) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxGetLimit(&limit, CU_LIMIT_STACK_SIZE) == CUDA_SUCCESS && limit == 1024); /* c0 */
    CHECK(cuCtxPushCurrent_v2(c1) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxGetCurrent(&got) == CUDA_SUCCESS && got == c0);
    CUexecAffinityParam aff = {.type = CU_EXEC_AFFINITY_TYPE_SM_COUNT};
    aff.param.smCount.val = 8;
    CHECK(cuCtxCreate_v3(&c1, &aff, 1, 0, 0) == CUDA_SUCCESS);
    CHECK(cuCtxDestroy_v2(c1) == CUDA_SUCCESS);
    CHECK(cuCtxDestroy_v2(c0) == CUDA_SUCCESS);
    CHECK(cuCtxGetCurrent(&got) == CUDA_SUCCESS && got == NULL);
}

/* ---- Device memory --------------------------------------------------------------------------- */

static void case_alloc_bounded(void)
{
    setup(0); /* GPU A: 1 GiB */
    size_t f, t;
    CHECK(cuMemGetInfo_v2(&f, &t) == CUDA_SUCCESS);
    CHECK_EQ_U(t, 1 * GiB);
    CHECK_EQ_U(f, 1 * GiB);
    CHECK(cuMemGetInfo_v2(NULL, &t) == CUDA_SUCCESS); /* one NULL output is fine */
    CUdeviceptr a, b, c;
    CHECK(cuMemAlloc_v2(&a, 512 * MiB) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 512 * MiB);
    CHECK(cuMemAlloc_v2(&b, 512 * MiB) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 0);
    CHECK(a != b && a != 0 && b != 0);
    CHECK(cuMemAlloc_v2(&c, 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemAllocAsync(&c, 1, NULL) == CUDA_ERROR_OUT_OF_MEMORY);
    size_t pitch;
    CHECK(cuMemAllocPitch_v2(&c, &pitch, 100, 1, 4) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_U(free_now(), 0); /* failures leaked nothing */
    CHECK(cuMemFree_v2(a) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 512 * MiB);
    CHECK(cuMemFree_v2(a) == CUDA_ERROR_INVALID_VALUE);     /* double free */
    CHECK(cuMemFree_v2(b + 16) == CUDA_ERROR_INVALID_VALUE); /* not a base address */
    CHECK(cuMemFree_v2(0) == CUDA_SUCCESS);
    CHECK(cuMemAlloc_v2(&c, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemAlloc_v2(NULL, 16) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemAlloc_v2(&c, 2 * GiB) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemFree_v2(b) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB);
}

static void case_managed_oversubscribes(void)
{
    setenv("VGPU_SIM_HOST_MEMORY", "4294967296", 1); /* 4 GiB of host memory to spill into */
    CUcontext ctx = setup(0);                         /* GPU A: 1 GiB */
    CUdeviceptr d, m1, m2, m3, c;
    CHECK(cuMemAlloc_v2(&d, 768 * MiB) == CUDA_SUCCESS);
    /* Twice the GPU: 256 MiB device-resident (all that is free), 1.75 GiB host-resident. */
    CHECK(cuMemAllocManaged(&m1, 2 * GiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 0);
    size_t range = 0;
    CHECK(cuPointerGetAttribute(&range, CU_POINTER_ATTRIBUTE_RANGE_SIZE, m1 + GiB) == 0);
    CHECK_EQ_U(range, 2 * GiB);
    int managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m1) == 0 && managed);
    /* The GPU is full: device memory is still refused, by every device path. */
    CHECK(cuMemAlloc_v2(&c, 1) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK(cuMemAllocAsync(&c, 1, NULL) == CUDA_ERROR_OUT_OF_MEMORY);
    /* Managed memory now lives wholly in host memory: 1.75 + 2 = 3.75 GiB of the 4 GiB. */
    CHECK(cuMemAllocManaged(&m2, 2 * GiB, CU_MEM_ATTACH_HOST) == CUDA_SUCCESS);
    CHECK(cuMemAllocManaged(&c, 512 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_U(free_now(), 0); /* the refusal leaked nothing */
    /* Freeing m1 returns its device-resident part to the GPU and its host part to the budget. */
    CHECK(cuMemFree_v2(m1) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 256 * MiB);
    CHECK(cuMemAllocManaged(&m3, 2 * GiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 0);
    CHECK(cuMemFree_v2(d) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 768 * MiB);
    /* A managed allocation that fits is wholly device-resident. */
    CHECK(cuMemAllocManaged(&c, 512 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 256 * MiB);
    /* Context teardown frees what is left (m2, m3, c) and restores both budgets. */
    CHECK(cuCtxDestroy_v2(ctx) == CUDA_SUCCESS);
    CHECK(cuCtxCreate_v2(&ctx, 0, 0) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB);
    CHECK(cuMemAllocManaged(&m1, 4 * GiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 0);
    CHECK(cuMemFree_v2(m1) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB);
}

static void case_managed_without_host_memory(void)
{
    setenv("VGPU_SIM_HOST_MEMORY", "0", 1); /* nothing to spill into: bounded by the GPU */
    setup(0);
    CUdeviceptr m, c;
    CHECK(cuMemAllocManaged(&m, 1 * GiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK(cuMemAllocManaged(&c, 1, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_U(free_now(), 0);
    CHECK(cuMemFree_v2(m) == CUDA_SUCCESS);
    CHECK(cuMemAllocManaged(&c, 1 * GiB + 1, CU_MEM_ATTACH_GLOBAL) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_U(free_now(), 1 * GiB);
}

static void case_contents(void)
{
    setup(1);
    CUdeviceptr d, e;
    CHECK(cuMemAlloc_v2(&d, 4096) == CUDA_SUCCESS);
    CHECK(cuMemAlloc_v2(&e, 4096) == CUDA_SUCCESS);
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++) in[i] = (unsigned char)(i * 7);
    CHECK(cuMemcpyHtoD_v2(d, in, sizeof(in)) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoD_v2(e, d, sizeof(in)) == CUDA_SUCCESS);
    memset(out, 0, sizeof(out));
    CHECK(cuMemcpyDtoH_v2(out, e, sizeof(out)) == CUDA_SUCCESS);
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    CHECK(cuMemcpy(e + 100, d, 10) == CUDA_SUCCESS); /* unified addressing copy */
    /* Host memory of every origin works as a copy source/target: heap, static, stack. */
    static unsigned char in_bss[64];
    unsigned char *in_heap = malloc(64);
    CHECK(in_heap != NULL);
    memset(in_bss, 0x42, sizeof(in_bss));
    CHECK(cuMemcpyHtoD_v2(d + 1000, in_bss, 64) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(in_heap, d + 1000, 64) == CUDA_SUCCESS);
    CHECK(in_heap[0] == 0x42 && in_heap[63] == 0x42);
    CHECK(cuMemcpy((CUdeviceptr)in_bss, (CUdeviceptr)(in + 64), 64) == CUDA_SUCCESS);
    CHECK(memcmp(in_bss, in + 64, 64) == 0);
    free(in_heap);
    CHECK(cuMemcpyHtoD_v2(d + 1000, in + 1000, 64) == CUDA_SUCCESS); /* restore */
    CHECK(cuMemcpyDtoH_v2(out, e + 100, 10) == CUDA_SUCCESS && memcmp(out, in, 10) == 0);
    CHECK(cuMemsetD32_v2(d, 0xdeadbeef, 4) == CUDA_SUCCESS);
    CHECK(cuMemsetD8_v2(d + 16, 0xab, 3) == CUDA_SUCCESS);
    CHECK(cuMemsetD16_v2(d + 20, 0x1234, 1) == CUDA_SUCCESS);
    unsigned int words[6];
    CHECK(cuMemcpyDtoH_v2(words, d, sizeof(words)) == CUDA_SUCCESS);
    CHECK(words[0] == 0xdeadbeef && words[3] == 0xdeadbeef);
    CHECK(words[4] == (0xabababu | ((unsigned)in[19] << 24)));
    CHECK((words[5] & 0xffff) == 0x1234);
    CHECK(cuMemsetD32_v2(d + 2, 0, 1) == CUDA_ERROR_INVALID_VALUE); /* misaligned */
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
    CHECK(cuMemcpyHtoDAsync_v2(d, in + 1, 8, s) == CUDA_SUCCESS);
    CHECK(cuMemsetD8Async(d + 8, 0, 8, s) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoHAsync_v2(out, d, 16, s) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(memcmp(out, in + 1, 8) == 0 && out[8] == 0 && out[15] == 0);
    /* Out of range and freed pointers. */
    CHECK(cuMemcpyHtoD_v2(d + 4000, in, 200) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree_v2(e) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(out, e, 16) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemcpyHtoD_v2(d, NULL, 16) == CUDA_ERROR_INVALID_VALUE);

    /* Address ranges and pointer attributes. */
    CUdeviceptr base = 0;
    size_t size = 0;
    CHECK(cuMemGetAddressRange_v2(&base, &size, d + 123) == CUDA_SUCCESS);
    CHECK(base == d && size == 4096);
    CHECK(cuMemGetAddressRange_v2(&base, &size, e) == CUDA_ERROR_NOT_FOUND);
    unsigned int mtype = 0;
    CHECK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, d + 5) == 0);
    CHECK(mtype == CU_MEMORYTYPE_DEVICE);
    int ordinal = -1;
    CHECK(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d) == 0);
    CHECK(ordinal == 1);
    CUcontext owner = NULL, cur = NULL;
    CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_CONTEXT, d) == 0);
    CHECK(cuCtxGetCurrent(&cur) == 0 && owner == cur);
    CHECK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, e) ==
          CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree_v2(d) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy_v2(s) == CUDA_SUCCESS);
}

static void case_large_contents_not_kept(void)
{
    setenv("VGPU_SIM_BACKING_MAX", "4096", 1);
    setup(1);
    CUdeviceptr big;
    CHECK(cuMemAlloc_v2(&big, 1 * MiB) == CUDA_SUCCESS);
    unsigned char in[64], out[64];
    memset(in, 0x77, sizeof(in));
    memset(out, 0x11, sizeof(out));
    CHECK(cuMemcpyHtoD_v2(big, in, sizeof(in)) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(out, big, sizeof(out)) == CUDA_SUCCESS);
    CHECK(out[0] == 0 && out[63] == 0); /* no contents kept: reads as zeros */
    CHECK(cuMemFree_v2(big) == CUDA_SUCCESS);
}

static void case_other_kinds(void)
{
    setup(1); /* 2 GiB */
    CUdeviceptr p, m;
    size_t pitch = 0;
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 1024, 4) == CUDA_SUCCESS);
    CHECK(pitch == 1024);
    CHECK_EQ_U(free_now(), 2 * GiB - 1 * MiB);
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 3) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemAllocManaged(&m, 64 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 2 * GiB - 65 * MiB);
    int managed = 0;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, m) == 0 && managed);
    CHECK(cuMemAllocManaged(&m, 16, 0) == CUDA_ERROR_INVALID_VALUE);

    /* Host memory is real and not charged to the GPU. */
    void *h = NULL, *h2 = NULL;
    CHECK(cuMemAllocHost_v2(&h, 256 * MiB) == CUDA_SUCCESS);
    CHECK(cuMemHostAlloc(&h2, 4096, CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS);
    memset(h, 0x5a, 4096);
    CHECK_EQ_U(free_now(), 2 * GiB - 65 * MiB);
    unsigned int mtype = 0;
    CHECK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)h) == 0);
    CHECK(mtype == CU_MEMORYTYPE_HOST);
    CUdeviceptr d;
    CHECK(cuMemAlloc_v2(&d, 4096) == CUDA_SUCCESS);
    CHECK(cuMemcpyHtoD_v2(d, h, 4096) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(h2, d, 4096) == CUDA_SUCCESS);
    CHECK(((unsigned char *)h2)[4095] == 0x5a);
    CHECK(cuMemFreeHost(h2) == CUDA_SUCCESS);
    CHECK(cuMemFreeHost(h2) == CUDA_ERROR_INVALID_VALUE);
    CUdeviceptr hd = 0;
    CHECK(cuMemHostGetDevicePointer_v2(&hd, (char *)h + 64, 0) == CUDA_SUCCESS);
    CHECK(hd == (CUdeviceptr)h + 64); /* unified addressing: the same address */
    CHECK(cuMemFreeHost(h) == CUDA_SUCCESS);

    /* Registered (pinned) application memory: usable in copies, never freed by the driver. */
    static unsigned char pinned[8192];
    CHECK(cuMemHostRegister_v2(pinned, sizeof(pinned), CU_MEMHOSTREGISTER_PORTABLE) == 0);
    CHECK(cuMemHostRegister_v2(pinned + 4096, 16, 0) == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
    CHECK(cuMemHostRegister_v2(pinned, 16, 0x100) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                (CUdeviceptr)(pinned + 10)) == 0);
    CHECK(mtype == CU_MEMORYTYPE_HOST);
    memset(pinned, 0x3c, 16);
    CHECK(cuMemcpyHtoD_v2(d, pinned, 16) == CUDA_SUCCESS);
    CHECK(cuMemsetD16Async(d, 0x0102, 1, NULL) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(pinned + 100, d, 16) == CUDA_SUCCESS);
    CHECK(pinned[100] == 0x02 && pinned[101] == 0x01 && pinned[102] == 0x3c);
    CHECK(cuMemHostUnregister(pinned + 1) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CHECK(cuMemHostUnregister(pinned) == CUDA_SUCCESS);
    CHECK(cuMemHostUnregister(pinned) == CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    CHECK(cuMemHostRegister_v2(pinned, sizeof(pinned), 0) == 0); /* left for ctx teardown */

    /* Stream-ordered allocation from the default pool. */
    CUstream s;
    CHECK(cuStreamCreate(&s, 0) == CUDA_SUCCESS);
    CUdeviceptr a;
    CHECK(cuMemAllocAsync(&a, 100 * MiB, s) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 2 * GiB - 165 * MiB - 4096);
    CUmemoryPool defpool, curpool;
    CHECK(cuDeviceGetDefaultMemPool(&defpool, 1) == CUDA_SUCCESS);
    CHECK(cuDeviceGetMemPool(&curpool, 1) == CUDA_SUCCESS && curpool == defpool);
    CUmemoryPool owner = NULL;
    CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, a) == 0);
    CHECK(owner == defpool);
    cuuint64_t used = 0;
    CHECK(cuMemPoolGetAttribute(defpool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) == 0);
    CHECK_EQ_U(used, 100 * MiB);
    CHECK(cuMemFreeAsync(a, s) == CUDA_SUCCESS);
    CHECK(cuMemPoolTrimTo(defpool, 0) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 2 * GiB - 65 * MiB - 4096);
    CHECK(cuMemPoolGetAttribute(defpool, CU_MEMPOOL_ATTR_USED_MEM_HIGH, &used) == 0);
    CHECK_EQ_U(used, 100 * MiB);
    CHECK(cuMemPoolDestroy(defpool) == CUDA_ERROR_INVALID_VALUE); /* default pools stay */

    /* An explicit pool; destroying it frees what it still holds. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = 1;
    CUmemoryPool pool;
    CHECK(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS);
    cuuint64_t threshold = 1ULL << 30;
    CHECK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &threshold) == 0);
    CHECK(cuMemPoolGetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &used) == 0);
    CHECK_EQ_U(used, 1ULL << 30);
    CHECK(cuMemAllocFromPoolAsync(&a, 300 * MiB, pool, s) == CUDA_SUCCESS);
    CHECK(cuMemAllocFromPoolAsync(&a, 3 * GiB, pool, s) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_U(free_now(), 2 * GiB - 365 * MiB - 4096);
    CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 2 * GiB - 65 * MiB - 4096);
    CHECK(cuMemPoolDestroy(pool) == CUDA_ERROR_INVALID_VALUE);
    props.location.id = 0; /* a pool on another GPU than the stream's */
    CHECK(cuMemPoolCreate(&pool, &props) == CUDA_SUCCESS);
    CHECK(cuMemAllocFromPoolAsync(&a, 1 * MiB, pool, s) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemPoolDestroy(pool) == CUDA_SUCCESS);
    props.location.id = 9;
    CHECK(cuMemPoolCreate(&pool, &props) == CUDA_ERROR_INVALID_DEVICE);

    /* Destroying the context frees everything it still holds. */
    CUcontext ctx;
    CHECK(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
    void *leak_host;
    CHECK(cuMemAllocHost_v2(&leak_host, 1024) == CUDA_SUCCESS);
    CHECK(cuCtxDestroy_v2(ctx) == CUDA_SUCCESS);
    CUcontext fresh;
    CHECK(cuCtxCreate_v2(&fresh, 0, 1) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 2 * GiB);
    CHECK(cuStreamSynchronize(s) == CUDA_ERROR_INVALID_HANDLE); /* died with its context */
}

static void case_vmm(void)
{
    setup(0); /* 1 GiB */
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == 0);
    CHECK_EQ_U(gran, 2 * MiB);
    CUmemGenericAllocationHandle h1, h2;
    CHECK(cuMemCreate(&h1, 1000, &prop, 0) == CUDA_ERROR_INVALID_VALUE); /* not granular */
    CHECK(cuMemCreate(&h1, 256 * MiB, &prop, 0) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 768 * MiB);
    CHECK(cuMemCreate(&h2, 1 * GiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ_U(free_now(), 768 * MiB);
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 8 * GiB, 0, 0, 0) == CUDA_SUCCESS); /* address space only */
    CHECK_EQ_U(free_now(), 768 * MiB);
    CHECK(cuMemMap(va, 256 * MiB, 0, h1, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va, 256 * MiB, 0, h1, 0) == CUDA_ERROR_ALREADY_MAPPED);
    CHECK(cuMemMap(va + 256 * MiB, 512 * MiB, 0, h1, 0) == CUDA_ERROR_INVALID_VALUE); /* > size */
    CHECK(cuMemMap(va + 256 * MiB, 256 * MiB, 0, h1, 0) == CUDA_SUCCESS);  /* aliasing is ok */
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(va, 512 * MiB, &acc, 1) == CUDA_SUCCESS);
    CHECK(cuMemSetAccess(va, 1 * GiB, &acc, 1) == CUDA_ERROR_INVALID_VALUE); /* not all mapped */
    CHECK(cuMemsetD8_v2(va, 1, 4096) == CUDA_SUCCESS); /* mapped ranges accept writes */
    CHECK(cuMemRelease(h1) == CUDA_SUCCESS);
    CHECK(cuMemRelease(h1) == CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ_U(free_now(), 768 * MiB); /* still mapped twice */
    CHECK(cuMemUnmap(va, 256 * MiB) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 768 * MiB);
    CHECK(cuMemUnmap(va + 256 * MiB, 256 * MiB) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB); /* last mapping gone: memory returned */
    CHECK(cuMemAddressFree(va, 4 * GiB) == CUDA_ERROR_INVALID_VALUE); /* wrong size */
    CHECK(cuMemAddressFree(va, 8 * GiB) == CUDA_SUCCESS);
    CHECK(cuMemAddressFree(va, 8 * GiB) == CUDA_ERROR_INVALID_VALUE);
    /* A reservation freed with a mapping inside drops the mapping (lenient). */
    CHECK(cuMemCreate(&h2, 64 * MiB, &prop, 0) == CUDA_SUCCESS);
    CHECK(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va, 64 * MiB, 0, h2, 0) == CUDA_SUCCESS);
    CHECK(cuMemRelease(h2) == CUDA_SUCCESS);
    CHECK(cuMemAddressFree(va, 64 * MiB) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB);
    /* Contents: small physical memory keeps bytes, seen through every mapping of it (PyTorch's
     * expandable segments copy tensors in and out of mapped pages). */
    CUmemGenericAllocationHandle h3;
    CHECK(cuMemCreate(&h3, 20 * MiB, &prop, 0) == CUDA_SUCCESS);
    CHECK(cuMemAddressReserve(&va, 64 * MiB, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va, 20 * MiB, 0, h3, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va + 20 * MiB, 20 * MiB, 0, h3, 0) == CUDA_SUCCESS); /* a second view */
    unsigned char in[4096], out[4096];
    for (size_t i = 0; i < sizeof(in); i++) in[i] = (unsigned char)(i * 7 + 1);
    CHECK(cuMemcpyHtoD_v2(va + 5 * MiB, in, sizeof(in)) == CUDA_SUCCESS);
    memset(out, 0, sizeof(out));
    CHECK(cuMemcpyDtoH_v2(out, va + 25 * MiB, sizeof(out)) == CUDA_SUCCESS); /* other view */
    CHECK(memcmp(in, out, sizeof(in)) == 0);
    CHECK(cuMemsetD8_v2(va + 5 * MiB, 0xab, 16) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(out, va + 5 * MiB, 32) == CUDA_SUCCESS);
    CHECK(out[0] == 0xab && out[15] == 0xab && out[16] == in[16]);
    /* Across the two mappings: accepted, no contents (reads zeros); unmapped part: the same. */
    CHECK(cuMemcpyHtoD_v2(va + 20 * MiB - 8, in, 16) == CUDA_SUCCESS);
    memset(out, 1, 16);
    CHECK(cuMemcpyDtoH_v2(out, va + 20 * MiB - 8, 16) == CUDA_SUCCESS);
    CHECK(out[0] == 0 && out[15] == 0);
    CHECK(cuMemcpyDtoH_v2(out, va + 50 * MiB, 16) == CUDA_SUCCESS);
    CHECK(out[0] == 0);
    CHECK(cuMemRelease(h3) == CUDA_SUCCESS);
    CHECK(cuMemUnmap(va, 20 * MiB) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(out, va + 25 * MiB, 32) == CUDA_SUCCESS); /* still mapped once */
    CHECK(out[15] == 0xab && memcmp(in + 16, out + 16, 16) == 0);
    CHECK(cuMemAddressFree(va, 64 * MiB) == CUDA_SUCCESS); /* drops the last mapping */
    CHECK_EQ_U(free_now(), 1 * GiB);
    prop.location.id = 5;
    CHECK(cuMemCreate(&h2, 2 * MiB, &prop, 0) == CUDA_ERROR_INVALID_DEVICE);
}

static void case_arrays(void)
{
    setup(0);
    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 1024, .Height = 1024, .Format = CU_AD_FORMAT_FLOAT,
                                .NumChannels = 4};
    CUarray a2, a3;
    CHECK(cuArrayCreate_v2(&a2, &d2) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB - 16 * MiB);
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = 256, .Height = 256, .Depth = 64,
                                  .Format = CU_AD_FORMAT_UNSIGNED_INT16, .NumChannels = 2};
    CHECK(cuArray3DCreate_v2(&a3, &d3) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB - 32 * MiB);
    CUmipmappedArray mm;
    CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 1024, .Height = 1024, .Depth = 0,
                                  .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    CHECK(cuMipmappedArrayCreate(&mm, &dm, 3) == CUDA_SUCCESS); /* 1 MiB + 256 KiB + 64 KiB */
    CHECK_EQ_U(free_now(), 1 * GiB - 32 * MiB - (1024 + 256 + 64) * 1024);
    CUDA_ARRAY3D_DESCRIPTOR huge = {.Width = 65536, .Height = 65536, .Depth = 1,
                                    .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    CUarray ah;
    CHECK(cuArray3DCreate_v2(&ah, &huge) == CUDA_ERROR_OUT_OF_MEMORY);
    CUDA_ARRAY_DESCRIPTOR bad = {.Width = 16, .Height = 16, .Format = (CUarray_format)0x77,
                                 .NumChannels = 1};
    CHECK(cuArrayCreate_v2(&ah, &bad) == CUDA_ERROR_INVALID_VALUE);
    bad.Format = CU_AD_FORMAT_FLOAT;
    bad.NumChannels = 3;
    CHECK(cuArrayCreate_v2(&ah, &bad) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMipmappedArrayDestroy(mm) == CUDA_SUCCESS);
    CHECK(cuArrayDestroy(a2) == CUDA_SUCCESS);
    CHECK(cuArrayDestroy(a2) == CUDA_ERROR_INVALID_HANDLE);
    CHECK(cuMipmappedArrayDestroy((CUmipmappedArray)(void *)a3) == CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ_U(free_now(), 1 * GiB - 16 * MiB);
    CUcontext ctx;
    CHECK(cuCtxGetCurrent(&ctx) == CUDA_SUCCESS);
    CHECK(cuCtxDestroy_v2(ctx) == CUDA_SUCCESS); /* frees a3 */
    CHECK(cuCtxCreate_v2(&ctx, 0, 0) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 1 * GiB);
}

/* ---- Process lifetime ------------------------------------------------------------------------ */

/* In a forked child: initialise, make a context on GPU 1 and allocate `bytes`, never freed. */
static void child_allocates(size_t bytes)
{
    CUcontext c;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuCtxCreate_v2(&c, 0, 1) == CUDA_SUCCESS);
    CUdeviceptr p;
    CHECK(cuMemAlloc_v2(&p, bytes) == CUDA_SUCCESS);
}

static void case_fork_and_exit(void)
{
    setup(1); /* 2 GiB */
    CUdeviceptr mine;
    CHECK(cuMemAlloc_v2(&mine, 512 * MiB) == CUDA_SUCCESS);

    /* A forked child initialises and allocates on its own; its normal exit returns its memory. */
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    pid_t child = fork();
    if (child == 0) {
        child_allocates(256 * MiB);
        CHECK(write(ready[1], "r", 1) == 1);
        char b;
        CHECK(read(go[0], &b, 1) == 1);
        exit(0); /* no cuMemFree: the exit handler must release it */
    }
    char b;
    CHECK(read(ready[0], &b, 1) == 1);
    CHECK_EQ_U(free_now(), 2 * GiB - 768 * MiB);
    CHECK(write(go[1], "g", 1) == 1);
    int status;
    CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    CHECK_EQ_U(free_now(), 2 * GiB - 512 * MiB);

    /* SIGKILL while holding memory: reaped on the next query. */
    child = fork();
    if (child == 0) {
        child_allocates(1 * GiB);
        CHECK(write(ready[1], "r", 1) == 1);
        for (;;) pause();
    }
    CHECK(read(ready[0], &b, 1) == 1);
    CHECK_EQ_U(free_now(), 2 * GiB - 1536 * MiB);
    CHECK(kill(child, SIGKILL) == 0);
    CHECK(waitpid(child, &status, 0) == child && WIFSIGNALED(status));
    CHECK_EQ_U(free_now(), 2 * GiB - 512 * MiB);
    CHECK(cuMemFree_v2(mine) == CUDA_SUCCESS);
    CHECK_EQ_U(free_now(), 2 * GiB);
}

static volatile int churn_stop;

static void *churn(void *ctx)
{
    CHECK(cuCtxSetCurrent((CUcontext)ctx) == CUDA_SUCCESS);
    while (!churn_stop) {
        CUdeviceptr p;
        CHECK(cuMemAlloc_v2(&p, 4096) == CUDA_SUCCESS);
        CHECK(cuMemFree_v2(p) == CUDA_SUCCESS);
    }
    return NULL;
}

/* fork() while another thread is inside the driver: the child never inherits a held lock. */
static void case_fork_while_busy(void)
{
    alarm(tu_slow() ? 300 : 30); /* a child deadlocked on an inherited lock fails the case */
    CUcontext ctx = setup(0);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, churn, ctx) == 0);
    for (int i = 0; i < 20; i++) {
        pid_t child = fork();
        if (child == 0) {
            CUdeviceptr p;
            CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
            CHECK(cuMemAlloc_v2(&p, 1 * MiB) == CUDA_SUCCESS);
            CHECK(cuMemFree_v2(p) == CUDA_SUCCESS);
            _exit(0);
        }
        int status;
        CHECK(waitpid(child, &status, 0) == child && WIFEXITED(status) &&
              WEXITSTATUS(status) == 0);
    }
    churn_stop = 1;
    CHECK(pthread_join(th, NULL) == 0);
    CHECK_EQ_U(free_now(), 1 * GiB);
}

static const struct tu_case CASES[] = {
    {"contexts", case_contexts},
    {"allocation bounded by the profile", case_alloc_bounded},
    {"managed memory oversubscribes", case_managed_oversubscribes},
    {"managed memory, no host memory", case_managed_without_host_memory},
    {"contents round-trip", case_contents},
    {"large allocations keep no contents", case_large_contents_not_kept},
    {"pitch, managed, host, async, pools", case_other_kinds},
    {"virtual memory management", case_vmm},
    {"arrays", case_arrays},
    {"fork, exit and SIGKILL", case_fork_and_exit},
    {"fork while another thread is in the driver", case_fork_while_busy},
};

int main(void)
{
    return tu_report(__FILE__, TU_RUN_CASES(CASES));
}
