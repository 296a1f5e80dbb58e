/*
 * test_cuda_device.c - the fake CUDA driver's initialisation, devices and entry points.
 *
 * What it proves:
 *  1. Nothing works before cuInit (CUDA_ERROR_NOT_INITIALIZED); cuInit rejects flags; without a
 *     node state cuInit reports CUDA_ERROR_NO_DEVICE; cuDriverGetVersion comes from the profile.
 *  2. Device queries (name, UUID bytes, total memory, attributes, PCI bus id both ways) match the
 *     profile; bad ordinals and bad arguments are errors, not crashes.
 *  3. CUDA_VISIBLE_DEVICES selects and reorders by index and (abbreviated) GPU- UUID, an invalid,
 *     ambiguous or repeated entry truncates the list, an empty value hides every GPU, and it
 *     applies on top of NVIDIA_VISIBLE_DEVICES.
 *  4. cuGetProcAddress(_v2) serves every row of cuda_entry_points.def with the same pointer as
 *     dlsym of its symbol, picks the newest ABI not above the requested version, maps the
 *     per-thread flag to _ptds/_ptsz, and reports NOT_FOUND / VERSION_NOT_SUFFICIENT.
 *  5. cuGetExportTable refuses; error names and strings exist for the codes the driver returns.
 *  6. Peer access follows the profile's NVLinks (enable, already enabled, disable, not enabled,
 *     itself, unlinked peers); the stream-capture mode is exchanged per thread; the GPU's PCI
 *     device and subsystem ids come from the profile.
 */
#include "testutil.h"

#include <dlfcn.h>

#include "cuda_abi.h"

#define GiB (1024ULL * 1024 * 1024)

static void case_before_init(void)
{
    tu_node(NULL);
    int n = -1;
    CHECK(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
    CUcontext ctx;
    CHECK(cuCtxGetCurrent(&ctx) == CUDA_ERROR_NOT_INITIALIZED);
    CHECK(cuInit(1) == CUDA_ERROR_INVALID_VALUE);
    int v = 0;
    CHECK(cuDriverGetVersion(&v) == CUDA_SUCCESS); /* allowed before cuInit */
    CHECK_EQ_U(v, 13000);
    CHECK(cuDriverGetVersion(NULL) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuInit(0) == CUDA_SUCCESS); /* idempotent */
    CHECK(cuDeviceGetCount(&n) == CUDA_SUCCESS);
    CHECK_EQ_U(n, 2);
}

static void case_no_state(void)
{
    unsetenv("VGPU_SIM_STATE");
    CHECK(cuInit(0) == CUDA_ERROR_NO_DEVICE);
    int n;
    CHECK(cuDeviceGetCount(&n) == CUDA_ERROR_NOT_INITIALIZED);
}

static void case_device_queries(void)
{
    tu_node(NULL);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUdevice d0, d1, bad;
    CHECK(cuDeviceGet(&d0, 0) == CUDA_SUCCESS);
    CHECK(cuDeviceGet(&d1, 1) == CUDA_SUCCESS);
    CHECK(cuDeviceGet(&bad, 2) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cuDeviceGet(&bad, -1) == CUDA_ERROR_INVALID_DEVICE);

    char name[64];
    CHECK(cuDeviceGetName(name, sizeof(name), d0) == CUDA_SUCCESS);
    CHECK(strcmp(name, "NVIDIA Test GPU A") == 0);
    CHECK(cuDeviceGetName(name, 7, d1) == CUDA_SUCCESS); /* truncated, still terminated */
    CHECK(strcmp(name, "NVIDIA") == 0);
    CHECK(cuDeviceGetName(NULL, 10, d0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuDeviceGetName(name, sizeof(name), 5) == CUDA_ERROR_INVALID_DEVICE);

    CUuuid u;
    CHECK(cuDeviceGetUuid_v2(&u, d1) == CUDA_SUCCESS);
    const unsigned char want[16] = {0x00, 0x00, 0x00, 0x01, 0x11, 0x11, 0x22, 0x22,
                                    0x33, 0x33, 0x44, 0x44, 0x44, 0x44, 0x44, 0x44};
    CHECK(memcmp(u.bytes, want, 16) == 0);
    CHECK(cuDeviceGetUuid(&u, d0) == CUDA_SUCCESS);
    CHECK(u.bytes[3] == 0x00 && (unsigned char)u.bytes[4] == 0x11);

    size_t total = 0;
    CHECK(cuDeviceTotalMem_v2(&total, d0) == CUDA_SUCCESS);
    CHECK_EQ_U(total, 1 * GiB);
    CHECK(cuDeviceTotalMem_v2(&total, d1) == CUDA_SUCCESS);
    CHECK_EQ_U(total, 2 * GiB);

    int a;
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d0) == CUDA_SUCCESS);
    CHECK_EQ_U(a, 132);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d1) == CUDA_SUCCESS);
    CHECK_EQ_U(a, 108);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d0) == 0 && a == 9);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d0) == 0 && a == 0);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d1) == 0 && a == 8);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d1) == 0 && a == 0x2a);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d1) == 0 && a == 0);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d1) == 0 && a == 0);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d0) == 0 && a == 32);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, d0) == 0 &&
          a == 1024);
    CHECK(cuDeviceGetAttribute(&a, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, d0) == 0 && a == 1);
    CHECK(cuDeviceGetAttribute(&a, (CUdevice_attribute)100000, d0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, d0) ==
          CUDA_ERROR_INVALID_VALUE);

    char bus[32];
    CHECK(cuDeviceGetPCIBusId(bus, sizeof(bus), d1) == CUDA_SUCCESS);
    CHECK(strcmp(bus, "0000:2A:00.0") == 0);
    CUdevice found = -1;
    CHECK(cuDeviceGetByPCIBusId(&found, "0000:2a:00.0") == CUDA_SUCCESS && found == 1);
    CHECK(cuDeviceGetByPCIBusId(&found, "00000000:18:00.0") == CUDA_SUCCESS && found == 0);
    CHECK(cuDeviceGetByPCIBusId(&found, "18:00.0") == CUDA_SUCCESS && found == 0);
    CHECK(cuDeviceGetByPCIBusId(&found, "0000:99:00.0") == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cuDeviceGetByPCIBusId(&found, "garbage") == CUDA_ERROR_INVALID_VALUE);

    int peer = -1;
    CHECK(cuDeviceCanAccessPeer(&peer, d0, d1) == CUDA_SUCCESS && peer == 1);
}

/* ---- CUDA_VISIBLE_DEVICES -------------------------------------------------------------------- */

static const char *vis_cuda, *vis_nvidia;
static int vis_count;
static const char *vis_first_name; /* name of ordinal 0 when vis_count > 0 */

static void case_visible(void)
{
    tu_node(NULL);
    if (vis_cuda)
        setenv("CUDA_VISIBLE_DEVICES", vis_cuda, 1);
    else
        unsetenv("CUDA_VISIBLE_DEVICES");
    if (vis_nvidia)
        setenv("NVIDIA_VISIBLE_DEVICES", vis_nvidia, 1);
    else
        unsetenv("NVIDIA_VISIBLE_DEVICES");
    CUresult rc = cuInit(0);
    if (vis_count == 0) {
        CHECK(rc == CUDA_ERROR_NO_DEVICE);
        return;
    }
    CHECK(rc == CUDA_SUCCESS);
    int n;
    CHECK(cuDeviceGetCount(&n) == CUDA_SUCCESS);
    CHECK_EQ_U(n, vis_count);
    char name[64];
    CHECK(cuDeviceGetName(name, sizeof(name), 0) == CUDA_SUCCESS);
    if (strcmp(name, vis_first_name) != 0) {
        fprintf(stderr, "CUDA_VISIBLE_DEVICES=%s: first device %s, want %s\n", vis_cuda, name,
                vis_first_name);
        exit(1);
    }
}

static int run_visible(const char *cuda, const char *nvidia, int count, const char *first)
{
    vis_cuda = cuda;
    vis_nvidia = nvidia;
    vis_count = count;
    vis_first_name = first;
    char label[160];
    snprintf(label, sizeof(label), "visible CUDA=%s NVIDIA=%s", cuda ? cuda : "(unset)",
             nvidia ? nvidia : "(unset)");
    return tu_fork_case(label, case_visible);
}

static int visible_cases(void)
{
    const char *A = "NVIDIA Test GPU A", *B = "NVIDIA Test GPU B";
    int f = 0;
    f += run_visible(NULL, NULL, 2, A);
    f += run_visible("1", NULL, 1, B);
    f += run_visible("1,0", NULL, 2, B);
    f += run_visible(" 1 , 0 ", NULL, 2, B);
    f += run_visible("GPU-00000001-1111-2222-3333-444444444444", NULL, 1, B);
    f += run_visible("GPU-00000001", NULL, 1, B);     /* unique prefix */
    f += run_visible("gpu-00000000,1", NULL, 2, A);   /* case-insensitive */
    f += run_visible("0,7,1", NULL, 1, A);            /* invalid index truncates */
    f += run_visible("0,0,1", NULL, 1, A);            /* repeated entry truncates */
    f += run_visible("GPU-0000000", NULL, 0, A);      /* ambiguous prefix: nothing visible */
    f += run_visible("x,0", NULL, 0, A);              /* invalid first entry: nothing */
    f += run_visible("", NULL, 0, A);                 /* empty hides everything */
    f += run_visible("-1", NULL, 0, A);
    f += run_visible(NULL, "1", 1, B);                /* container view alone */
    f += run_visible("0", "1", 1, B);                 /* index into the container view */
    f += run_visible("1", "1", 0, A);                 /* beyond the container view */
    f += run_visible("GPU-00000000", "1", 0, A);      /* UUID outside the container view */
    f += run_visible(NULL, "none", 0, A);
    return f;
}

/* ---- cuGetProcAddress ------------------------------------------------------------------------ */

static const struct tu_cu_entry rows[] = {
#define CU_ENTRY TU_CU_ENTRY_ROW
#include "cuda_entry_points.def"
#undef CU_ENTRY
};
#define NROWS (sizeof(rows) / sizeof(rows[0]))

/* The row a request (base, version) should get: highest version <= requested. */
static const struct tu_cu_entry *expected_row(const char *base, int version)
{
    const struct tu_cu_entry *best = NULL;
    for (size_t i = 0; i < NROWS; i++)
        if (strcmp(rows[i].base, base) == 0 && rows[i].version <= version &&
            (best == NULL || rows[i].version > best->version))
            best = &rows[i];
    return best;
}

static void case_proc_address(void)
{
    tu_node(NULL);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL);
    /* Resolution works before cuInit, as cuda-python needs it to. */
    for (size_t i = 0; i < NROWS; i++) {
        void *fn = NULL, *want = dlsym(lib, rows[i].sym);
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CHECK(want != NULL);
        CHECK(cuGetProcAddress_v2(rows[i].base, &fn, rows[i].version, 0, &st) == CUDA_SUCCESS);
        CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS);
        if (fn != want) {
            fprintf(stderr, "%s@%d resolved to the wrong symbol (want %s)\n", rows[i].base,
                    rows[i].version, rows[i].sym);
            exit(1);
        }
        CHECK(expected_row(rows[i].base, rows[i].version) == &rows[i]);
        /* Per-thread default stream variant. */
        void *pt = NULL, *want_pt = dlsym(lib, rows[i].ptsym);
        CHECK(want_pt != NULL);
        CHECK(cuGetProcAddress_v2(rows[i].base, &pt, rows[i].version,
                                  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
                                  &st) == CUDA_SUCCESS);
        CHECK(pt == want_pt);
        /* The v1 entry point agrees. */
        void *v1 = NULL;
        CHECK(cuGetProcAddress(rows[i].base, &v1, rows[i].version, 0) == CUDA_SUCCESS);
        CHECK(v1 == want);
    }
    /* The real clients' requests (see FACTS.md). */
    struct {
        const char *base;
        int version;
        const char *sym;
    } asks[] = {
        {"cuInit", 2000, "cuInit"},
        {"cuMemAlloc", 3020, "cuMemAlloc_v2"},
        {"cuMemAlloc", 13000, "cuMemAlloc_v2"},
        {"cuMemGetInfo", 3020, "cuMemGetInfo_v2"},
        {"cuCtxCreate", 3020, "cuCtxCreate_v2"},
        {"cuCtxCreate", 11040, "cuCtxCreate_v3"},
        {"cuCtxCreate", 13000, "cuCtxCreate_v4"},
        {"cuStreamDestroy", 4000, "cuStreamDestroy_v2"},
        {"cuMemAllocAsync", 11020, "cuMemAllocAsync"},
        {"cuLaunchKernel", 4000, "cuLaunchKernel"},
        {"cuMemAllocManaged", 6000, "cuMemAllocManaged"},
        {"cuGetProcAddress", 12000, "cuGetProcAddress_v2"},
        {"cuGetProcAddress", 11030, "cuGetProcAddress"},
        {"cuEventElapsedTime", 12000, "cuEventElapsedTime"},
        {"cuEventElapsedTime", 12080, "cuEventElapsedTime_v2"},
        {"cuGraphInstantiate", 12000, "cuGraphInstantiateWithFlags"},
        {"cuGraphInstantiate", 11000, "cuGraphInstantiate"},
        {"cuDevicePrimaryCtxRelease", 7000, "cuDevicePrimaryCtxRelease"},
        {"cuDevicePrimaryCtxRelease", 12000, "cuDevicePrimaryCtxRelease_v2"},
    };
    for (size_t i = 0; i < sizeof(asks) / sizeof(asks[0]); i++) {
        void *fn = NULL;
        CUdriverProcAddressQueryResult st;
        CHECK(cuGetProcAddress_v2(asks[i].base, &fn, asks[i].version, 0, &st) == CUDA_SUCCESS);
        if (fn != dlsym(lib, asks[i].sym)) {
            fprintf(stderr, "(%s, %d) did not resolve to %s\n", asks[i].base, asks[i].version,
                    asks[i].sym);
            exit(1);
        }
    }
    void *fn = (void *)1;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SUCCESS;
    /* The legacy 32-bit cuMemAlloc ABI exists, as an unsimulated stub (cuda_unsimulated.def). */
    CHECK(cuGetProcAddress_v2("cuMemAlloc", &fn, 2000, 0, &st) == CUDA_SUCCESS);
    CHECK(st == CU_GET_PROC_ADDRESS_SUCCESS && fn == dlsym(lib, "cuMemAlloc"));
    CHECK(((CUresult(*)(void))fn)() == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11010, 0, &st) == CUDA_ERROR_NOT_FOUND);
    CHECK(st == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT && fn == NULL);
    CHECK(cuGetProcAddress_v2("cuNoSuchThing", &fn, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND);
    CHECK(st == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND && fn == NULL);
    CHECK(cuGetProcAddress_v2("cuMemAlloc_v2", &fn, 13000, 0, &st) == CUDA_ERROR_NOT_FOUND);
    CHECK(cuGetProcAddress_v2(NULL, &fn, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGetProcAddress_v2("cuInit", NULL, 13000, 0, &st) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGetProcAddress_v2("cuInit", &fn, 13000, 0x100, &st) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuGetProcAddress_v2("cuInit", &fn, 13000, 0, NULL) == CUDA_SUCCESS);
    dlclose(lib);
}

static void case_export_table_and_errors(void)
{
    tu_node(NULL);
    const void *table = (const void *)1;
    CUuuid id;
    memset(&id, 0x5a, sizeof(id));
    CHECK(cuGetExportTable(&table, &id) == CUDA_ERROR_NOT_SUPPORTED);
    CHECK(table == NULL);
    const char *s = NULL;
    CHECK(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s) == CUDA_SUCCESS);
    CHECK(strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY") == 0);
    CHECK(cuGetErrorString(CUDA_ERROR_NOT_FOUND, &s) == CUDA_SUCCESS && s && *s);
    CHECK(cuGetErrorName((CUresult)12345, &s) == CUDA_ERROR_INVALID_VALUE && s == NULL);
    const CUresult used[] = {CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE, CUDA_ERROR_OUT_OF_MEMORY,
                             CUDA_ERROR_NOT_INITIALIZED, CUDA_ERROR_NO_DEVICE,
                             CUDA_ERROR_INVALID_DEVICE, CUDA_ERROR_INVALID_CONTEXT,
                             CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_NOT_FOUND, CUDA_ERROR_NOT_READY,
                             CUDA_ERROR_DEVICE_UNAVAILABLE, CUDA_ERROR_NOT_SUPPORTED,
                             CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, CUDA_ERROR_ALREADY_MAPPED,
                             CUDA_ERROR_FILE_NOT_FOUND, CUDA_ERROR_LAUNCH_FAILED};
    for (size_t i = 0; i < sizeof(used) / sizeof(used[0]); i++) {
        CHECK(cuGetErrorName(used[i], &s) == CUDA_SUCCESS && strncmp(s, "CUDA_", 5) == 0);
        CHECK(cuGetErrorString(used[i], &s) == CUDA_SUCCESS && s && *s);
    }
}

static void case_peers_capture_mode_pci_ids(void)
{
    /* GPU 0 and 1 share NVLinks; GPU 2 (a copy of GPU 1 without links) shares none. */
    char profile[sizeof(TU_PROFILE_2GPU) + 1024];
    snprintf(profile, sizeof(profile), "%s", TU_PROFILE_2GPU);
    char *count = strstr(profile, "gpu.count=2");
    CHECK(count != NULL);
    count[10] = '3';
    strcat(profile, "gpu.2.name=NVIDIA Test GPU C\n"
                    "gpu.2.uuid=GPU-00000002-1111-2222-3333-444444444444\n"
                    "gpu.2.serial=1650000000003\ngpu.2.pci_bus_id=00000000:3B:00.0\n"
                    "gpu.2.pcie_root=pci0000:3a\ngpu.2.brand=tesla\ngpu.2.architecture=ampere\n"
                    "gpu.2.compute_capability=8.0\ngpu.2.memory_bytes=1073741824\n"
                    "gpu.2.sm_count=108\ngpu.2.cores_per_sm=64\ngpu.2.pci_device_id=0x20b010de\n"
                    "gpu.2.minor=2\ngpu.2.numa_node=1\n");
    tu_node(profile);
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CUcontext c0, c1, c2;
    CHECK(cuDevicePrimaryCtxRetain(&c0, 0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&c1, 1) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&c2, 2) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(c0) == CUDA_SUCCESS);
    CHECK(cuCtxEnablePeerAccess(c1, 1) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuCtxEnablePeerAccess(c1, 0) == CUDA_SUCCESS);
    CHECK(cuCtxEnablePeerAccess(c1, 0) == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
    CHECK(cuCtxEnablePeerAccess(c0, 0) == CUDA_ERROR_INVALID_DEVICE);
    CHECK(cuCtxEnablePeerAccess(c2, 0) == CUDA_ERROR_PEER_ACCESS_UNSUPPORTED);
    CHECK(cuCtxDisablePeerAccess(c1) == CUDA_SUCCESS);
    CHECK(cuCtxDisablePeerAccess(c1) == CUDA_ERROR_PEER_ACCESS_NOT_ENABLED);
    CHECK(cuCtxEnablePeerAccess((CUcontext)&profile, 0) == CUDA_ERROR_INVALID_CONTEXT);

    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
    CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);
    mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
    CHECK(mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    mode = (CUstreamCaptureMode)7;
    CHECK(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_ERROR_INVALID_VALUE);

    int v = 0;
    CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID, 0) == CUDA_SUCCESS);
    CHECK((unsigned int)v == 0x233010deu);
    CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID, 0) == CUDA_SUCCESS);
}

int main(void)
{
    int failures = 0;
    (void)tu_slow; /* shared helper, unused here */
    failures += tu_fork_case("before init", case_before_init);
    failures += tu_fork_case("no state", case_no_state);
    failures += tu_fork_case("device queries", case_device_queries);
    failures += visible_cases();
    failures += tu_fork_case("cuGetProcAddress", case_proc_address);
    failures += tu_fork_case("export table and errors", case_export_table_and_errors);
    failures += tu_fork_case("peers, capture mode, PCI ids", case_peers_capture_mode_pci_ids);
    printf("%s: %d failure(s)\n", __FILE__, failures);
    return failures != 0;
}
