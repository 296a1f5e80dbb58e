/*
 * test_cudart_runtime.c - the simulated CUDA runtime (libcudart.so.12 / .13, built and run once
 * per major version) on the simulated driver: everything but kernels (test_cudart_launch.c).
 *
 * What it proves:
 *  1. Versions: cudaRuntimeGetVersion is the CUDART_VERSION of the major version's header,
 *     cudaDriverGetVersion the profile's driver version; without a node the runtime reports no
 *     device (cudaErrorNoDevice, count 0) and records it as the last error, which
 *     cudaGetLastError returns once and cudaPeekAtLastError does not clear.
 *  2. Devices: count, properties and attributes come from the profile through the driver (name,
 *     memory, SMs, compute capability, PCI ids, UUID); cudaSetDevice/cudaGetDevice are per
 *     thread; bad ordinals are cudaErrorInvalidDevice; peer access follows the profile's NVLinks.
 *  3. Memory: cudaMalloc/Free/MemGetInfo charge the node's GPU (the free memory drops by exactly
 *     the allocation); an allocation past the GPU is cudaErrorMemoryAllocation; copies and sets
 *     (sync and async) round-trip data; host, managed, pitched, 3-D and stream-ordered
 *     allocations and the default pool work; pointer attributes tell device, host, managed and
 *     unregistered memory apart.
 *  4. Streams and events: create, record, query, synchronise, elapsed time, priorities, flags,
 *     stream device; capture queries answer "not capturing"; the capture mode is exchanged per
 *     thread; callbacks and host functions run after the stream's work.
 *  5. Errors and entry points: names and strings; cudaGetDriverEntryPoint(ByVersion) returns the
 *     driver's functions (NULL with a status for unknown names); unsimulated functions answer
 *     cudaErrorNotSupported.
 */
#include "testutil.h"

#include <pthread.h>
#include <stdint.h>

#include "cudart_abi.h"

#define MIB (1ULL << 20)
#define GIB (1ULL << 30)

#if VGPU_CUDART_MAJOR == 12
#define EXPECTED_RUNTIME_VERSION 12090
#else
#define EXPECTED_RUNTIME_VERSION 13050
#endif

/* Unsimulated functions, declared without parameters like the stubs (any arguments will do). */
cudaError_t cudaMemcpy2D(void);
cudaError_t cudaGetExportTable(void);
cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode);

static void case_versions_and_no_device(void)
{
    int v = -1;
    CHECK(cudaRuntimeGetVersion(&v) == cudaSuccess && v == EXPECTED_RUNTIME_VERSION);
    /* No VGPU_SIM_STATE: a machine without GPUs. */
    unsetenv("VGPU_SIM_STATE");
    int n = 7;
    CHECK(cudaGetDeviceCount(&n) == cudaErrorNoDevice && n == 0);
    CHECK(cudaPeekAtLastError() == cudaErrorNoDevice);
    CHECK(cudaGetLastError() == cudaErrorNoDevice);
    CHECK(cudaGetLastError() == cudaSuccess);
    void *p = NULL;
    CHECK(cudaMalloc(&p, 16) == cudaErrorNoDevice);
    CHECK(cudaDriverGetVersion(&v) == cudaSuccess && v == 13000);
    CHECK(strcmp(cudaGetErrorName(cudaErrorNoDevice), "cudaErrorNoDevice") == 0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorNoDevice), "no CUDA-capable device is detected") == 0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory") == 0);
    CHECK(strcmp(cudaGetErrorName((cudaError_t)123456), "unrecognized error code") == 0);
}

static void case_devices(void)
{
    tu_node(NULL);
    int n = 0, v = 0;
    CHECK(cudaDriverGetVersion(&v) == cudaSuccess && v == 13000);
    CHECK(cudaGetDeviceCount(&n) == cudaSuccess && n == 2);
    struct cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0) == cudaSuccess);
    CHECK(strcmp(p.name, "NVIDIA Test GPU A") == 0);
    CHECK_EQ_U(p.totalGlobalMem, GIB);
    CHECK(p.multiProcessorCount == 132 && p.major == 9 && p.minor == 0);
    CHECK(p.pciBusID == 0x18 && p.pciDomainID == 0 && p.warpSize == 32);
    CHECK(p.maxThreadsPerBlock == 1024 && p.maxThreadsDim[2] == 64 && p.maxGridSize[0] > 65535);
    CHECK(p.unifiedAddressing == 1 && p.managedMemory == 1 && p.memoryPoolsSupported == 1);
    CHECK((unsigned char)p.uuid.bytes[0] == 0x00 && (unsigned char)p.uuid.bytes[4] == 0x11);
#if VGPU_CUDART_MAJOR == 12
    struct cudaDeviceProp p2;
    CHECK(cudaGetDeviceProperties_v2(&p2, 0) == cudaSuccess && memcmp(&p, &p2, sizeof(p)) == 0);
#else
    CHECK(p.gpuPciDeviceID == 0x233010de);
#endif
    CHECK(cudaGetDeviceProperties(&p, 1) == cudaSuccess);
    CHECK(strcmp(p.name, "NVIDIA Test GPU B") == 0);
    CHECK_EQ_U(p.totalGlobalMem, 2 * GIB);
    CHECK(p.multiProcessorCount == 108 && p.major == 8);
    CHECK(cudaGetDeviceProperties(&p, 2) == cudaErrorInvalidDevice);
    CHECK(cudaGetLastError() == cudaErrorInvalidDevice);

    int a = 0;
    CHECK(cudaDeviceGetAttribute(&a, cudaDevAttrMultiProcessorCount, 1) == cudaSuccess && a == 108);
    CHECK(cudaDeviceGetAttribute(&a, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess && a == 9);
    CHECK(cudaDeviceGetAttribute(&a, cudaDevAttrPciBusId, 1) == cudaSuccess && a == 0x2a);
    char bus[32];
    CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), 1) == cudaSuccess);
    CHECK(strcmp(bus, "0000:2A:00.0") == 0);
    int dev = -1;
    CHECK(cudaDeviceGetByPCIBusId(&dev, "0000:2A:00.0") == cudaSuccess && dev == 1);

    /* The current device: 0 until set, per thread. */
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 0);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 1);
    CHECK(cudaSetDevice(5) == cudaErrorInvalidDevice);
    CHECK(cudaGetDevice(&dev) == cudaSuccess && dev == 1);
    size_t free_b = 0, total = 0;
    CHECK(cudaMemGetInfo(&free_b, &total) == cudaSuccess && total == 2 * GIB);

    /* Flags, limits, priorities, cache config. */
    unsigned int flags = 0;
    CHECK(cudaSetDeviceFlags(cudaDeviceScheduleBlockingSync) == cudaSuccess);
    CHECK(cudaGetDeviceFlags(&flags) == cudaSuccess);
    CHECK((flags & cudaDeviceScheduleMask) == cudaDeviceScheduleBlockingSync);
    CHECK(flags & cudaDeviceMapHost);
    size_t limit = 0;
    CHECK(cudaDeviceSetLimit(cudaLimitMallocHeapSize, 16 * MIB) == cudaSuccess);
    CHECK(cudaDeviceGetLimit(&limit, cudaLimitMallocHeapSize) == cudaSuccess && limit == 16 * MIB);
    int least = 1, greatest = 1;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
    CHECK(least >= greatest);
    enum cudaFuncCache cache;
    CHECK(cudaDeviceSetCacheConfig(cudaFuncCachePreferL1) == cudaSuccess);
    CHECK(cudaDeviceGetCacheConfig(&cache) == cudaSuccess && cache == cudaFuncCachePreferL1);

    /* Peers: the two GPUs share NVLinks in the test profile. */
    int can = -1;
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 1) == cudaSuccess && can == 1);
    CHECK(cudaDeviceCanAccessPeer(&can, 0, 0) == cudaSuccess && can == 0);
    CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaSuccess); /* current device is 1 */
    CHECK(cudaDeviceEnablePeerAccess(0, 0) == cudaErrorPeerAccessAlreadyEnabled);
    CHECK(cudaDeviceDisablePeerAccess(0) == cudaSuccess);
    CHECK(cudaDeviceDisablePeerAccess(0) == cudaErrorPeerAccessNotEnabled);
    CHECK(cudaDeviceEnablePeerAccess(1, 0) == cudaErrorInvalidDevice);

    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(cudaDeviceReset() == cudaSuccess);
    CHECK(cudaMemGetInfo(&free_b, &total) == cudaSuccess && total == 2 * GIB);
}

static void *other_thread(void *arg)
{
    int *dev = arg;
    CHECK(cudaGetDevice(dev) == cudaSuccess);
    return NULL;
}

static void case_device_is_per_thread(void)
{
    tu_node(NULL);
    CHECK(cudaSetDevice(1) == cudaSuccess);
    pthread_t t;
    int dev = -1;
    CHECK(pthread_create(&t, NULL, other_thread, &dev) == 0 && pthread_join(t, NULL) == 0);
    CHECK(dev == 0);
}

static void case_memory(void)
{
    tu_node(NULL);
    size_t free0 = 0, total = 0, free1 = 0;
    CHECK(cudaFree(NULL) == cudaSuccess); /* creates the context */
    CHECK(cudaMemGetInfo(&free0, &total) == cudaSuccess && total == GIB);
    void *d = NULL;
    CHECK(cudaMalloc(&d, 256 * MIB) == cudaSuccess && d != NULL);
    CHECK(cudaMemGetInfo(&free1, &total) == cudaSuccess);
    CHECK_EQ_U(free0 - free1, 256 * MIB);
    void *big = NULL;
    CHECK(cudaMalloc(&big, 2 * GIB) == cudaErrorMemoryAllocation && big == NULL);
    CHECK(cudaGetLastError() == cudaErrorMemoryAllocation);
    CHECK(cudaMalloc(&big, 0) == cudaSuccess && big == NULL);

    /* Copies and sets round-trip (small allocations keep their contents). */
    void *small = NULL;
    CHECK(cudaMalloc(&small, 4096) == cudaSuccess);
    char host[4096], back[4096];
    for (int i = 0; i < 4096; i++) host[i] = (char)(i * 7);
    CHECK(cudaMemcpy(small, host, sizeof(host), cudaMemcpyHostToDevice) == cudaSuccess);
    memset(back, 0, sizeof(back));
    CHECK(cudaMemcpy(back, small, sizeof(back), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(memcmp(host, back, sizeof(host)) == 0);
    CHECK(cudaMemset(small, 0x5a, 100) == cudaSuccess);
    CHECK(cudaMemcpy(back, small, 100, cudaMemcpyDefault) == cudaSuccess);
    CHECK(back[0] == 0x5a && back[99] == 0x5a);
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s) == cudaSuccess);
    CHECK(cudaMemsetAsync(small, 1, 4096, s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(back, small, 4096, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(back[0] == 1 && back[4095] == 1);
    CHECK(cudaMemcpy(back, small, 16, (enum cudaMemcpyKind)9) == cudaErrorInvalidMemcpyDirection);
    CHECK(cudaMemcpyPeer(back, 0, small, 0, 16) == cudaSuccess);
    CHECK(cudaMemcpyPeer(back, 0, small, 7, 16) == cudaErrorInvalidDevice);
    CHECK(cudaGetLastError() == cudaErrorInvalidDevice); /* the latest error */

    /* Host, managed, pitched and 3-D allocations. */
    void *pinned = NULL, *mapped = NULL, *dev_view = NULL, *managed = NULL, *pitched = NULL;
    CHECK(cudaMallocHost(&pinned, 1 * MIB) == cudaSuccess && pinned != NULL);
    CHECK(cudaHostAlloc(&mapped, 1 * MIB, cudaHostAllocMapped) == cudaSuccess);
    CHECK(cudaHostGetDevicePointer(&dev_view, mapped, 0) == cudaSuccess && dev_view != NULL);
    CHECK(cudaMallocManaged(&managed, 64 * MIB, cudaMemAttachGlobal) == cudaSuccess);
    size_t pitch = 0;
    CHECK(cudaMallocPitch(&pitched, &pitch, 1000, 10) == cudaSuccess && pitch >= 1000);
    struct cudaPitchedPtr p3;
    struct cudaExtent ext = {100, 4, 3};
    CHECK(cudaMalloc3D(&p3, ext) == cudaSuccess && p3.ptr != NULL && p3.pitch >= 100);
    CHECK(p3.xsize == 100 && p3.ysize == 4);
    static char registered[8192];
    CHECK(cudaHostRegister(registered, sizeof(registered), cudaHostRegisterDefault) == cudaSuccess);

    /* Pointer attributes. */
    struct cudaPointerAttributes at;
    CHECK(cudaPointerGetAttributes(&at, d) == cudaSuccess);
    CHECK(at.type == cudaMemoryTypeDevice && at.device == 0 && at.devicePointer == d);
    CHECK(cudaPointerGetAttributes(&at, (char *)d + 1000) == cudaSuccess);
    CHECK(at.type == cudaMemoryTypeDevice && at.devicePointer == (char *)d + 1000);
    CHECK(cudaPointerGetAttributes(&at, pinned) == cudaSuccess);
    CHECK(at.type == cudaMemoryTypeHost && at.hostPointer == pinned);
    CHECK(cudaPointerGetAttributes(&at, managed) == cudaSuccess && at.type == cudaMemoryTypeManaged);
    CHECK(cudaPointerGetAttributes(&at, host) == cudaSuccess);
    CHECK(at.type == cudaMemoryTypeUnregistered && at.hostPointer == host);
    CHECK(cudaPeekAtLastError() == cudaSuccess); /* unregistered memory is not an error */

    CHECK(cudaHostUnregister(registered) == cudaSuccess);
    CHECK(cudaFree(p3.ptr) == cudaSuccess && cudaFree(pitched) == cudaSuccess);
    CHECK(cudaFree(managed) == cudaSuccess);
    CHECK(cudaFreeHost(mapped) == cudaSuccess && cudaFreeHost(pinned) == cudaSuccess);
    CHECK(cudaFree(small) == cudaSuccess && cudaFree(d) == cudaSuccess);
    CHECK(cudaFree(d) == cudaErrorInvalidValue);
    CHECK(cudaMemGetInfo(&free1, &total) == cudaSuccess);
    CHECK_EQ_U(free1, free0);

    /* Stream-ordered allocation and the default pool. */
    void *a = NULL;
    CHECK(cudaMallocAsync(&a, 8 * MIB, s) == cudaSuccess && a != NULL);
    CHECK(cudaMemGetInfo(&free1, &total) == cudaSuccess);
    CHECK_EQ_U(free0 - free1, 8 * MIB);
    CHECK(cudaFreeAsync(a, s) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    cudaMemPool_t pool = NULL, pool2 = NULL;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess && pool != NULL);
    CHECK(cudaDeviceGetMemPool(&pool2, 0) == cudaSuccess && pool2 == pool);
    CHECK(cudaMallocFromPoolAsync(&a, 4 * MIB, pool, s) == cudaSuccess);
    unsigned long long used = 0;
    CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used) == cudaSuccess);
    CHECK_EQ_U(used, 4 * MIB);
    CHECK(cudaFreeAsync(a, s) == cudaSuccess);
    struct cudaMemPoolProps props;
    memset(&props, 0, sizeof(props));
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = 0;
    cudaMemPool_t mine = NULL;
    CHECK(cudaMemPoolCreate(&mine, &props) == cudaSuccess && mine != NULL);
    CHECK(cudaMallocFromPoolAsync(&a, 1 * MIB, mine, s) == cudaSuccess);
    CHECK(cudaFreeAsync(a, s) == cudaSuccess);
    CHECK(cudaMemPoolTrimTo(mine, 0) == cudaSuccess);
    CHECK(cudaMemPoolDestroy(mine) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK(cudaMemGetInfo(&free1, &total) == cudaSuccess);
    CHECK_EQ_U(free1, free0);
}

static int callback_ran;

static void stream_callback(cudaStream_t stream, cudaError_t status, void *user)
{
    (void)stream;
    CHECK(status == cudaSuccess);
    callback_ran += *(int *)user;
}

static void host_fn(void *user) { callback_ran += *(int *)user; }

static void case_streams_and_events(void)
{
    tu_node(NULL);
    cudaStream_t s, hi;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    int least = 0, greatest = 0, prio = 1;
    CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest) == cudaSuccess);
    CHECK(cudaStreamCreateWithPriority(&hi, cudaStreamDefault, greatest) == cudaSuccess);
    CHECK(cudaStreamGetPriority(hi, &prio) == cudaSuccess && prio == greatest);
    unsigned int flags = 9;
    CHECK(cudaStreamGetFlags(s, &flags) == cudaSuccess && flags == cudaStreamNonBlocking);
    int dev = -1;
    CHECK(cudaStreamGetDevice(s, &dev) == cudaSuccess && dev == 0);
    CHECK(cudaStreamQuery(s) == cudaSuccess && cudaStreamQuery(NULL) == cudaSuccess);
    CHECK(cudaStreamQuery(cudaStreamPerThread) == cudaSuccess);

    cudaEvent_t a, b, untimed;
    CHECK(cudaEventCreate(&a) == cudaSuccess && cudaEventCreate(&b) == cudaSuccess);
    CHECK(cudaEventCreateWithFlags(&untimed, cudaEventDisableTiming) == cudaSuccess);
    CHECK(cudaEventRecord(a, s) == cudaSuccess && cudaEventRecord(b, s) == cudaSuccess);
    CHECK(cudaEventSynchronize(b) == cudaSuccess && cudaEventQuery(b) == cudaSuccess);
    float ms = -1;
    CHECK(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0);
    CHECK(cudaEventRecord(untimed, s) == cudaSuccess);
    CHECK(cudaEventElapsedTime(&ms, a, untimed) != cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaStreamWaitEvent(hi, b, 0) == cudaSuccess);

    /* No stream is ever capturing; the capture mode is exchanged per thread. */
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(s, &st) == cudaSuccess && st == cudaStreamCaptureStatusNone);
    unsigned long long id = 99;
    st = cudaStreamCaptureStatusActive;
#if VGPU_CUDART_MAJOR == 12
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id) == cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusNone);
    cudaGraph_t g = (cudaGraph_t)1;
    size_t ndeps = 5;
    CHECK(cudaStreamGetCaptureInfo_v2(s, &st, &id, &g, NULL, &ndeps) == cudaSuccess);
    CHECK(g == NULL && ndeps == 0);
#else
    CHECK(cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL) == cudaSuccess);
    CHECK(st == cudaStreamCaptureStatusNone);
#endif
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(mode == cudaStreamCaptureModeGlobal);
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    CHECK(mode == cudaStreamCaptureModeRelaxed);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorNotSupported);
    CHECK(cudaGetLastError() == cudaErrorNotSupported);

    int one = 1, ten = 10;
    CHECK(cudaStreamAddCallback(s, stream_callback, &one, 0) == cudaSuccess);
    CHECK(cudaLaunchHostFunc(s, host_fn, &ten) == cudaSuccess);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(callback_ran == 11);

    CHECK(cudaEventDestroy(a) == cudaSuccess && cudaEventDestroy(b) == cudaSuccess);
    CHECK(cudaEventDestroy(untimed) == cudaSuccess);
    CHECK(cudaEventDestroy(a) == cudaErrorInvalidResourceHandle);
    CHECK(cudaStreamDestroy(s) == cudaSuccess && cudaStreamDestroy(hi) == cudaSuccess);
    CHECK(cudaStreamDestroy(NULL) == cudaErrorInvalidResourceHandle);
}

typedef int (*mem_alloc_fn)(unsigned long long *dptr, size_t bytes);

static void case_entry_points_and_stubs(void)
{
    tu_node(NULL);
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
    CHECK(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &status) == cudaSuccess);
    CHECK(fn != NULL && status == cudaDriverEntryPointSuccess);
    CHECK(cudaFree(NULL) == cudaSuccess); /* a current context for the driver call */
    unsigned long long dptr = 0;
    CHECK(((mem_alloc_fn)fn)(&dptr, 4096) == 0 && dptr != 0);
    CHECK(cudaFree((void *)(uintptr_t)dptr) == cudaSuccess);
    fn = (void *)1;
    CHECK(cudaGetDriverEntryPoint("cuNoSuchThing", &fn, 0, &status) == cudaSuccess);
    CHECK(fn == NULL && status == cudaDriverEntryPointSymbolNotFound);
    CHECK(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 12000, 0, &status) == cudaSuccess);
    CHECK(fn != NULL && status == cudaDriverEntryPointSuccess);
    CHECK(cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 9000, 0, &status) == cudaSuccess);
    CHECK(fn == NULL && status == cudaDriverEntryPointVersionNotSufficent);
    CHECK(cudaGetDriverEntryPoint(NULL, &fn, 0, NULL) == cudaErrorInvalidValue);

    CHECK(cudaMemcpy2D() == cudaErrorNotSupported);
    CHECK(cudaGetExportTable() == cudaErrorNotSupported); /* never a made-up private table */
    CHECK(cudaGetLastError() == cudaErrorNotSupported);
    CHECK(cudaProfilerStart() == cudaSuccess && cudaProfilerStop() == cudaSuccess);
    struct cudaChannelFormatDesc desc = cudaCreateChannelDesc(32, 0, 0, 0, cudaChannelFormatKindFloat);
    CHECK(desc.x == 32 && desc.y == 0 && desc.f == cudaChannelFormatKindFloat);
}

static const struct tu_case CASES[] = {
    {"versions and no device", case_versions_and_no_device},
    {"devices", case_devices},
    {"current device is per thread", case_device_is_per_thread},
    {"memory", case_memory},
    {"streams and events", case_streams_and_events},
    {"entry points and stubs", case_entry_points_and_stubs},
};

int main(void)
{
    return tu_report(__FILE__, TU_RUN_CASES(CASES));
}
