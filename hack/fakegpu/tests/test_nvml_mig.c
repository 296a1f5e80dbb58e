/*
 * test_nvml_mig.c - MIG on the simulated GPUs, through the fake libnvidia-ml.so.1's C ABI, with
 * the test process also acting as a CUDA process through its own copy of the state code.
 *
 * What it proves:
 *  1. Mode: MIG-capable boards start disabled; a change applies at once on an idle GPU; while a
 *     process (another one, in any state) is on the GPU or GPU instances exist, it stays pending
 *     (activationStatus IN_USE) and applies when retried on the idle GPU; boards without MIG
 *     answer NOT_SUPPORTED; a bad mode is INVALID_ARGUMENT.
 *  2. Profiles: NVIDIA's tables for A100 40 GB and H100 80 GB (ids, names, SMs, memory, counts),
 *     unversioned/v2/v3 forms, version check, profile indices past the end and absent ones.
 *  3. Placements: the valid starts of each profile; creating at every placement of a random
 *     sequence never overlaps memory slices nor exceeds 7 compute slices; remaining capacity
 *     matches what can still be created; 7x 1g.5gb fills the GPU; 4g+3g fills it.
 *  4. Compute instances inside a GPU instance, destroy order (GI with CIs is IN_USE), stale
 *     handles are INVALID_ARGUMENT.
 *  5. MIG device handles: by index, by MIG UUID, name, UUID, memory (the GI's), attributes,
 *     GI/CI ids, parent; max MIG device count.
 *  6. Persistence: instances created by one process are seen by the next.
 *  7. A process bound to a MIG device (as CUDA with CUDA_VISIBLE_DEVICES=MIG-...) is capped by
 *     its GI's memory, listed in the MIG device's memory, blocks destroying its instances, and
 *     its kernels run on the instance's own timeline (two instances do not time-slice).
 *  8. An XID scoped to an instance arrives with its GI/CI ids.
 *  9. SIGKILL in the middle of creating/destroying instances leaves a consistent state.
 */
#include <errno.h>
#include <time.h>

#include "nvml_abi.h"
#include "simstate.h"
#include "testutil.h"

#define MiB (1024ULL * 1024)

/* GPU 0: A100 40 GB, GPU 1: H100 80 GB, GPU 2: L4 (no MIG). */
static const char PROFILE[] =
    "node.name=test-mig\n"
    "node.driver_version=580.95.05\n"
    "node.cuda_driver_version=13000\n"
    "gpu.count=3\n"
    "gpu.0.name=NVIDIA A100-SXM4-40GB\n"
    "gpu.0.uuid=GPU-a0000000-1111-2222-3333-444444444444\n"
    "gpu.0.serial=1650000000001\n"
    "gpu.0.pci_bus_id=00000000:07:00.0\n"
    "gpu.0.pcie_root=pci0000:00\n"
    "gpu.0.brand=nvidia\n"
    "gpu.0.architecture=ampere\n"
    "gpu.0.compute_capability=8.0\n"
    "gpu.0.memory_bytes=42949672960\n"
    "gpu.0.sm_count=108\n"
    "gpu.0.cores_per_sm=64\n"
    "gpu.0.pci_device_id=0x20b010de\n"
    "gpu.0.minor=0\n"
    "gpu.0.numa_node=0\n"
    "gpu.0.mig_capable=1\n"
    "gpu.1.name=NVIDIA H100 80GB HBM3\n"
    "gpu.1.uuid=GPU-a0000001-1111-2222-3333-444444444444\n"
    "gpu.1.serial=1650000000002\n"
    "gpu.1.pci_bus_id=00000000:18:00.0\n"
    "gpu.1.pcie_root=pci0000:15\n"
    "gpu.1.brand=nvidia\n"
    "gpu.1.architecture=hopper\n"
    "gpu.1.compute_capability=9.0\n"
    "gpu.1.memory_bytes=85520809984\n"
    "gpu.1.sm_count=132\n"
    "gpu.1.cores_per_sm=128\n"
    "gpu.1.pci_device_id=0x233010de\n"
    "gpu.1.minor=1\n"
    "gpu.1.numa_node=0\n"
    "gpu.1.mig_capable=1\n"
    "gpu.2.name=NVIDIA L4\n"
    "gpu.2.uuid=GPU-a0000002-1111-2222-3333-444444444444\n"
    "gpu.2.serial=1650000000003\n"
    "gpu.2.pci_bus_id=00000000:3B:00.0\n"
    "gpu.2.pcie_root=pci0000:3a\n"
    "gpu.2.brand=nvidia\n"
    "gpu.2.architecture=ada\n"
    "gpu.2.compute_capability=8.9\n"
    "gpu.2.memory_bytes=24152899584\n"
    "gpu.2.sm_count=58\n"
    "gpu.2.cores_per_sm=128\n"
    "gpu.2.pci_device_id=0x27b810de\n"
    "gpu.2.minor=2\n"
    "gpu.2.numa_node=0\n"
    "gpu.2.mig_capable=0\n";

static nvmlDevice_t dev(unsigned int i)
{
    nvmlDevice_t d;
    CHECK(nvmlDeviceGetHandleByIndex_v2(i, &d) == NVML_SUCCESS);
    return d;
}

static void set_mode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t want_activation)
{
    nvmlReturn_t act = NVML_ERROR_UNKNOWN;
    CHECK(nvmlDeviceSetMigMode(d, mode, &act) == NVML_SUCCESS);
    CHECK(act == want_activation);
}

/* Destroy every CI and GI of the GPU. */
static void clear_gpu(nvmlDevice_t d)
{
    for (unsigned int p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT; p++) {
        nvmlGpuInstanceProfileInfo_t info;
        if (nvmlDeviceGetGpuInstanceProfileInfo(d, p, &info) != NVML_SUCCESS)
            continue;
        nvmlGpuInstance_t gis[8];
        unsigned int n = 0;
        CHECK(nvmlDeviceGetGpuInstances(d, info.id, gis, &n) == NVML_SUCCESS);
        for (unsigned int i = 0; i < n; i++) {
            for (unsigned int cp = 0; cp < NVML_COMPUTE_INSTANCE_PROFILE_COUNT; cp++) {
                nvmlComputeInstance_t cis[8];
                unsigned int m = 0;
                if (nvmlGpuInstanceGetComputeInstances(gis[i], cp, cis, &m) != NVML_SUCCESS)
                    continue;
                for (unsigned int j = 0; j < m; j++)
                    CHECK(nvmlComputeInstanceDestroy(cis[j]) == NVML_SUCCESS);
            }
            CHECK(nvmlGpuInstanceDestroy(gis[i]) == NVML_SUCCESS);
        }
    }
}

/* A child that takes a slot on GPU phys (as a CUDA process with a context) and waits until its
 * stdin pipe closes or it is killed. Returns its pid once it holds the slot. */
static pid_t hold_gpu(int phys, int *release_fd)
{
    int ready[2], release[2];
    CHECK(pipe(ready) == 0 && pipe(release) == 0);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(ready[0]);
        close(release[1]);
        if (sim_mem_reserve(phys, 64 * MiB) != 0)
            _exit(3);
        char c = 'r';
        if (write(ready[1], &c, 1) != 1)
            _exit(4);
        (void)read(release[0], &c, 1); /* until the parent closes it or kills us */
        _exit(0);
    }
    close(ready[1]);
    close(release[0]);
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    close(ready[0]);
    *release_fd = release[1];
    return pid;
}

static void case_mode(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t a100 = dev(0), l4 = dev(2);
    unsigned int cur = 9, pend = 9;
    nvmlReturn_t act;
    CHECK(nvmlDeviceGetMigMode(a100, &cur, &pend) == NVML_SUCCESS && cur == 0 && pend == 0);
    CHECK(nvmlDeviceGetMigMode(l4, &cur, &pend) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceSetMigMode(l4, 1, &act) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceSetMigMode(a100, 2, &act) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceSetMigMode(a100, 1, NULL) == NVML_ERROR_INVALID_ARGUMENT);

    /* Busy: another process is on the GPU -> pending only. */
    int release;
    pid_t holder = hold_gpu(0, &release);
    set_mode(a100, NVML_DEVICE_MIG_ENABLE, NVML_ERROR_IN_USE);
    CHECK(nvmlDeviceGetMigMode(a100, &cur, &pend) == NVML_SUCCESS && cur == 0 && pend == 1);
    /* MIG calls need the current mode. */
    nvmlGpuInstance_t gi;
    CHECK(nvmlDeviceCreateGpuInstance(a100, 19, &gi) == NVML_ERROR_NOT_SUPPORTED);
    /* The holder dies by SIGKILL: its slot is reaped by the next check, the retry applies. */
    CHECK(kill(holder, SIGKILL) == 0);
    CHECK(waitpid(holder, NULL, 0) == holder);
    close(release);
    set_mode(a100, NVML_DEVICE_MIG_ENABLE, NVML_SUCCESS);
    CHECK(nvmlDeviceGetMigMode(a100, &cur, &pend) == NVML_SUCCESS && cur == 1 && pend == 1);

    /* Disabling while a GPU instance exists stays pending; after destroying it, it applies. */
    CHECK(nvmlDeviceCreateGpuInstance(a100, 19, &gi) == NVML_SUCCESS);
    set_mode(a100, NVML_DEVICE_MIG_DISABLE, NVML_ERROR_IN_USE);
    CHECK(nvmlDeviceGetMigMode(a100, &cur, &pend) == NVML_SUCCESS && cur == 1 && pend == 0);
    CHECK(nvmlGpuInstanceDestroy(gi) == NVML_SUCCESS);
    set_mode(a100, NVML_DEVICE_MIG_DISABLE, NVML_SUCCESS);
    CHECK(nvmlDeviceGetMigMode(a100, &cur, &pend) == NVML_SUCCESS && cur == 0 && pend == 0);
    /* Setting the current mode again is a no-op success. */
    set_mode(a100, NVML_DEVICE_MIG_DISABLE, NVML_SUCCESS);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

static void case_profiles(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t a100 = dev(0), h100 = dev(1), l4 = dev(2);
    nvmlGpuInstanceProfileInfo_t info;
    CHECK(nvmlDeviceGetGpuInstanceProfileInfo(a100, NVML_GPU_INSTANCE_PROFILE_1_SLICE, &info) == 0);
    CHECK(info.id == 19 && info.sliceCount == 1 && info.instanceCount == 7 &&
          info.multiprocessorCount == 14 && info.memorySizeMB == 4864);
    CHECK(nvmlDeviceGetGpuInstanceProfileInfo(a100, NVML_GPU_INSTANCE_PROFILE_7_SLICE, &info) == 0);
    CHECK(info.id == 0 && info.sliceCount == 7 && info.multiprocessorCount == 98);
    CHECK(nvmlDeviceGetGpuInstanceProfileInfo(a100, NVML_GPU_INSTANCE_PROFILE_8_SLICE, &info) ==
          NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceGetGpuInstanceProfileInfo(a100, 0x40, &info) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetGpuInstanceProfileInfo(l4, 0, &info) == NVML_ERROR_NOT_SUPPORTED);

    nvmlGpuInstanceProfileInfo_v2_t v2 = {.version = nvmlGpuInstanceProfileInfo_v2};
    CHECK(nvmlDeviceGetGpuInstanceProfileInfoV(a100, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1, &v2) ==
          0);
    CHECK(v2.id == 20 && strcmp(v2.name, "MIG 1g.5gb+me") == 0 && v2.instanceCount == 1 &&
          v2.ofaCount == 1);
    nvmlGpuInstanceProfileInfo_v3_t v3 = {.version = nvmlGpuInstanceProfileInfo_v3};
    CHECK(nvmlDeviceGetGpuInstanceProfileInfoV(h100, NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2,
                                               (nvmlGpuInstanceProfileInfo_v2_t *)&v3) == 0);
    CHECK(v3.id == 15 && strcmp(v3.name, "MIG 1g.20gb") == 0 && v3.instanceCount == 4 &&
          v3.multiprocessorCount == 26 && v3.capabilities == 0);
    CHECK(nvmlDeviceGetGpuInstanceProfileInfoByIdV(h100, 0, &v2) == 0);
    CHECK(strcmp(v2.name, "MIG 7g.80gb") == 0 && v2.multiprocessorCount == 132);
    v2.version = 7;
    CHECK(nvmlDeviceGetGpuInstanceProfileInfoV(a100, 0, &v2) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

    /* Every H100 profile name, by index. */
    static const struct {
        unsigned int index;
        const char *name;
        unsigned int count;
    } h[] = {{0x0, "MIG 1g.10gb", 7}, {0x7, "MIG 1g.10gb+me", 1}, {0x9, "MIG 1g.20gb", 4},
             {0x1, "MIG 2g.20gb", 3}, {0x2, "MIG 3g.40gb", 2},    {0x3, "MIG 4g.40gb", 1},
             {0x4, "MIG 7g.80gb", 1}};
    for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++) {
        v2.version = nvmlGpuInstanceProfileInfo_v2;
        CHECK(nvmlDeviceGetGpuInstanceProfileInfoV(h100, h[i].index, &v2) == 0);
        CHECK(strcmp(v2.name, h[i].name) == 0 && v2.instanceCount == h[i].count);
        /* Placements: instanceCount of them except for +me and 1g, whose 7 starts overlap. */
        unsigned int n = 0;
        CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(h100, v2.id, NULL, &n) == 0);
        CHECK(n == (v2.sliceCount == 1 && v2.memorySizeMB < 12000 ? 7 : h[i].count));
    }
    nvmlGpuInstancePlacement_t pl[8];
    unsigned int n = 1;
    CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(a100, 15, pl, &n) ==
          NVML_ERROR_INSUFFICIENT_SIZE && n == 4);
    n = 8;
    CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(a100, 15, pl, &n) == 0 && n == 4);
    CHECK(pl[0].start == 0 && pl[1].start == 2 && pl[2].start == 4 && pl[3].start == 6 &&
          pl[3].size == 2);
    n = 8;
    CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(a100, 9, pl, &n) == 0 && n == 2);
    CHECK(pl[0].start == 0 && pl[1].start == 4 && pl[1].size == 4);
    n = 8;
    CHECK(nvmlDeviceGetGpuInstancePossiblePlacements(a100, 0, pl, &n) == 0 && n == 1);
    CHECK(pl[0].start == 0 && pl[0].size == 8);
    CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(a100, 77, pl, &n) ==
          NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

/* Check the GPU's GIs: memory slices never overlap, compute slices at most 7. */
static void check_invariants(nvmlDevice_t d)
{
    unsigned int mask = 0, compute = 0;
    for (unsigned int p = 0; p < NVML_GPU_INSTANCE_PROFILE_COUNT; p++) {
        nvmlGpuInstanceProfileInfo_t info;
        if (nvmlDeviceGetGpuInstanceProfileInfo(d, p, &info) != NVML_SUCCESS)
            continue;
        nvmlGpuInstance_t gis[8];
        unsigned int n = 0;
        CHECK(nvmlDeviceGetGpuInstances(d, info.id, gis, &n) == NVML_SUCCESS);
        CHECK(n <= info.instanceCount);
        for (unsigned int i = 0; i < n; i++) {
            nvmlGpuInstanceInfo_t gi;
            CHECK(nvmlGpuInstanceGetInfo(gis[i], &gi) == NVML_SUCCESS);
            CHECK(gi.profileId == info.id && gi.device == d);
            unsigned int m = ((1u << gi.placement.size) - 1u) << gi.placement.start;
            CHECK(gi.placement.start + gi.placement.size <= 8);
            CHECK((mask & m) == 0);
            mask |= m;
            compute += info.sliceCount;
        }
    }
    CHECK(compute <= 7);
}

static unsigned int rng_state = 12345;
static unsigned int rnd(unsigned int n)
{
    rng_state = rng_state * 1103515245u + 12345u;
    return (rng_state >> 16) % n;
}

static void case_placements(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t a100 = dev(0);
    set_mode(a100, NVML_DEVICE_MIG_ENABLE, NVML_SUCCESS);
    nvmlGpuInstance_t gi, gis[8];
    unsigned int n;

    /* 7x 1g.5gb fill the GPU; the 8th does not fit; remaining capacity follows. */
    CHECK(nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 19, &n) == 0 && n == 7);
    for (int i = 0; i < 7; i++)
        CHECK(nvmlDeviceCreateGpuInstance(a100, 19, &gis[i]) == NVML_SUCCESS);
    CHECK(nvmlDeviceCreateGpuInstance(a100, 19, &gi) == NVML_ERROR_INSUFFICIENT_RESOURCES);
    CHECK(nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 19, &n) == 0 && n == 0);
    CHECK(nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 0, &n) == 0 && n == 0);
    check_invariants(a100);
    clear_gpu(a100);

    /* 4g.20gb at 0 and 3g.20gb at 4 fill it too; overlap and bad placements refused. */
    nvmlGpuInstancePlacement_t p = {.start = 4, .size = 4};
    CHECK(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, &p, &gi) == NVML_SUCCESS);
    p.start = 0;
    nvmlGpuInstance_t gi4;
    CHECK(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 5, &p, &gi4) == NVML_SUCCESS);
    CHECK(nvmlDeviceCreateGpuInstance(a100, 19, &gis[0]) == NVML_ERROR_INSUFFICIENT_RESOURCES);
    CHECK(nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 19, &n) == 0 && n == 0);
    CHECK(nvmlGpuInstanceDestroy(gi4) == NVML_SUCCESS);
    CHECK(nvmlGpuInstanceDestroy(gi4) == NVML_ERROR_INVALID_ARGUMENT); /* stale handle */
    p.start = 2;
    CHECK(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, &p, &gi4) == NVML_ERROR_INVALID_ARGUMENT);
    p.start = 4;
    CHECK(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, &p, &gi4) ==
          NVML_ERROR_INSUFFICIENT_RESOURCES);
    p.start = 0;
    p.size = 2;
    CHECK(nvmlDeviceCreateGpuInstanceWithPlacement(a100, 9, &p, &gi4) == NVML_ERROR_INVALID_ARGUMENT);
    /* With 3g at 4: 1g.10gb has the two placements 0 and 2 left. */
    CHECK(nvmlDeviceGetGpuInstanceRemainingCapacity(a100, 15, &n) == 0 && n == 2);
    /* The default placement is the highest free one, keeping slice 0 for big profiles. */
    CHECK(nvmlDeviceCreateGpuInstance(a100, 19, &gi4) == NVML_SUCCESS);
    nvmlGpuInstanceInfo_t info;
    CHECK(nvmlGpuInstanceGetInfo(gi4, &info) == NVML_SUCCESS && info.placement.start == 3 &&
          info.placement.size == 1 && info.profileId == 19 && info.id >= 1);
    nvmlGpuInstance_t same;
    CHECK(nvmlDeviceGetGpuInstanceById(a100, info.id, &same) == NVML_SUCCESS && same == gi4);
    CHECK(nvmlDeviceGetGpuInstanceById(a100, 99, &same) == NVML_ERROR_NOT_FOUND);
    clear_gpu(a100);

    /* Random sequences of creations and destructions at every placement: the invariants hold
     * and remaining capacity is exactly what creation then achieves. */
    static const unsigned int ids[] = {19, 20, 15, 14, 9, 5, 0};
    for (int round = 0; round < 300; round++) {
        unsigned int id = ids[rnd(7)];
        if (rnd(3) == 0) {
            nvmlGpuInstance_t list[8];
            CHECK(nvmlDeviceGetGpuInstances(a100, id, list, &n) == NVML_SUCCESS);
            if (n)
                CHECK(nvmlGpuInstanceDestroy(list[rnd(n)]) == NVML_SUCCESS);
        } else {
            nvmlGpuInstancePlacement_t all[8];
            unsigned int np = 8, rem;
            CHECK(nvmlDeviceGetGpuInstancePossiblePlacements_v2(a100, id, all, &np) == 0);
            CHECK(nvmlDeviceGetGpuInstanceRemainingCapacity(a100, id, &rem) == 0);
            nvmlReturn_t rc = nvmlDeviceCreateGpuInstanceWithPlacement(a100, id, &all[rnd(np)], &gi);
            CHECK(rc == NVML_SUCCESS || rc == NVML_ERROR_INSUFFICIENT_RESOURCES);
            if (rem == 0)
                CHECK(rc == NVML_ERROR_INSUFFICIENT_RESOURCES);
            if (rc == NVML_SUCCESS)
                continue;
            /* Without a placement it succeeds exactly when capacity remains. */
            rc = nvmlDeviceCreateGpuInstance(a100, id, &gi);
            CHECK(rem > 0 ? rc == NVML_SUCCESS : rc == NVML_ERROR_INSUFFICIENT_RESOURCES);
        }
        check_invariants(a100);
    }
    clear_gpu(a100);
    /* A whole GPU (7g.40gb) after all that. */
    CHECK(nvmlDeviceCreateGpuInstance(a100, 0, &gi) == NVML_SUCCESS);
    CHECK(nvmlDeviceCreateGpuInstance(a100, 19, &gi4) == NVML_ERROR_INSUFFICIENT_RESOURCES);
    clear_gpu(a100);
    set_mode(a100, NVML_DEVICE_MIG_DISABLE, NVML_SUCCESS);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

/* Creates, for the next cases (other processes): on the H100, a 3g.40gb GI with CIs 1c and 2c,
 * and a 1g.10gb GI with one full CI. */
static void case_create_for_later(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t h100 = dev(1);
    set_mode(h100, NVML_DEVICE_MIG_ENABLE, NVML_SUCCESS);
    nvmlGpuInstance_t g3, g1;
    nvmlGpuInstancePlacement_t p = {.start = 0, .size = 4};
    CHECK(nvmlDeviceCreateGpuInstanceWithPlacement(h100, 9, &p, &g3) == NVML_SUCCESS);
    CHECK(nvmlDeviceCreateGpuInstance(h100, 19, &g1) == NVML_SUCCESS);

    nvmlComputeInstanceProfileInfo_t cinfo;
    CHECK(nvmlGpuInstanceGetComputeInstanceProfileInfo(g3, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
                                                       NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                                                       &cinfo) == NVML_SUCCESS);
    CHECK(cinfo.id == 0 && cinfo.sliceCount == 1 && cinfo.instanceCount == 3 &&
          cinfo.multiprocessorCount == 20);
    CHECK(nvmlGpuInstanceGetComputeInstanceProfileInfo(g3, NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE, 0,
                                                       &cinfo) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlGpuInstanceGetComputeInstanceProfileInfo(g3, 0, 1, &cinfo) ==
          NVML_ERROR_INVALID_ARGUMENT);
    nvmlComputeInstanceProfileInfo_v2_t cv2 = {.version = nvmlComputeInstanceProfileInfo_v2};
    CHECK(nvmlGpuInstanceGetComputeInstanceProfileInfoV(g3, NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE, 0,
                                                        &cv2) == NVML_SUCCESS);
    CHECK(strcmp(cv2.name, "MIG 3g.40gb") == 0 && cv2.multiprocessorCount == 60);
    CHECK(nvmlGpuInstanceGetComputeInstanceProfileInfoV(g3, NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE, 0,
                                                        &cv2) == NVML_SUCCESS);
    CHECK(strcmp(cv2.name, "MIG 1c.3g.40gb") == 0);

    nvmlComputeInstancePlacement_t cpl[8];
    unsigned int n = 8;
    CHECK(nvmlGpuInstanceGetComputeInstancePossiblePlacements(g3, 1, cpl, &n) == 0 && n == 1 &&
          cpl[0].start == 0 && cpl[0].size == 2);
    nvmlComputeInstance_t c2, c1, cx;
    nvmlComputeInstancePlacement_t at = {.start = 0, .size = 2};
    CHECK(nvmlGpuInstanceCreateComputeInstanceWithPlacement(g3, 1, &at, &c2) == NVML_SUCCESS);
    CHECK(nvmlGpuInstanceGetComputeInstanceRemainingCapacity(g3, 0, &n) == 0 && n == 1);
    CHECK(nvmlGpuInstanceCreateComputeInstance(g3, 0, &c1) == NVML_SUCCESS);
    CHECK(nvmlGpuInstanceCreateComputeInstance(g3, 0, &cx) == NVML_ERROR_INSUFFICIENT_RESOURCES);
    nvmlComputeInstanceInfo_t ci;
    CHECK(nvmlComputeInstanceGetInfo_v2(c1, &ci) == NVML_SUCCESS);
    CHECK(ci.device == h100 && ci.gpuInstance == g3 && ci.id == 1 && ci.profileId == 0 &&
          ci.placement.start == 2 && ci.placement.size == 1);
    CHECK(nvmlGpuInstanceDestroy(g3) == NVML_ERROR_IN_USE); /* it has compute instances */
    nvmlComputeInstance_t full;
    CHECK(nvmlGpuInstanceCreateComputeInstance(g1, 0, &full) == NVML_SUCCESS);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

static void case_see_from_another_process(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t h100 = dev(1), a100 = dev(0), mig, parent, by_uuid;
    unsigned int n, id, is_mig;
    CHECK(nvmlDeviceGetMaxMigDeviceCount(h100, &n) == NVML_SUCCESS && n == 7);
    CHECK(nvmlDeviceGetMaxMigDeviceCount(a100, &n) == NVML_SUCCESS && n == 0); /* disabled */
    CHECK(nvmlDeviceGetMigDeviceHandleByIndex(a100, 0, &mig) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceGetMigDeviceHandleByIndex(h100, 3, &mig) == NVML_ERROR_NOT_FOUND);
    CHECK(nvmlDeviceGetMigDeviceHandleByIndex(h100, 7, &mig) == NVML_ERROR_INVALID_ARGUMENT);
    char uuid[96], name[96], parent_uuid[96];
    /* Ordered by (GI id, CI id): GI 1 (3g.40gb) has CIs 0 (2c) and 1 (1c), GI 2 one (1g). */
    static const struct {
        unsigned int gi, ci, sms, slices, gi_slices;
        unsigned long long mib;
        const char *name;
    } want[] = {{1, 0, 40, 2, 3, 40448, "NVIDIA H100 80GB HBM3 MIG 3g.40gb"},
                {1, 1, 20, 1, 3, 40448, "NVIDIA H100 80GB HBM3 MIG 3g.40gb"},
                {2, 0, 16, 1, 1, 9984, "NVIDIA H100 80GB HBM3 MIG 1g.10gb"}};
    CHECK(nvmlDeviceGetUUID(h100, parent_uuid, sizeof(parent_uuid)) == NVML_SUCCESS);
    for (unsigned int i = 0; i < 3; i++) {
        CHECK(nvmlDeviceGetMigDeviceHandleByIndex(h100, i, &mig) == NVML_SUCCESS);
        CHECK(nvmlDeviceIsMigDeviceHandle(mig, &is_mig) == NVML_SUCCESS && is_mig == 1);
        CHECK(nvmlDeviceGetGpuInstanceId(mig, &id) == NVML_SUCCESS && id == want[i].gi);
        CHECK(nvmlDeviceGetComputeInstanceId(mig, &id) == NVML_SUCCESS && id == want[i].ci);
        CHECK(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig, &parent) == NVML_SUCCESS &&
              parent == h100);
        CHECK(nvmlDeviceGetUUID(mig, uuid, sizeof(uuid)) == NVML_SUCCESS);
        CHECK(strncmp(uuid, "MIG-", 4) == 0 && strlen(uuid) == 40);
        CHECK(nvmlDeviceGetName(mig, name, sizeof(name)) == NVML_SUCCESS);
        CHECK(strcmp(name, want[i].name) == 0);
        nvmlMemory_t mem;
        CHECK(nvmlDeviceGetMemoryInfo(mig, &mem) == NVML_SUCCESS);
        CHECK(mem.total == want[i].mib * MiB && mem.used == 0 && mem.free == mem.total);
        nvmlDeviceAttributes_t at;
        CHECK(nvmlDeviceGetAttributes_v2(mig, &at) == NVML_SUCCESS);
        CHECK(at.multiprocessorCount == want[i].sms && at.computeInstanceSliceCount ==
              want[i].slices && at.gpuInstanceSliceCount == want[i].gi_slices &&
              at.memorySizeMB == want[i].mib);
        CHECK(nvmlDeviceGetHandleByUUID(uuid, &by_uuid) == NVML_SUCCESS && by_uuid == mig);
        unsigned int cur, pend;
        CHECK(nvmlDeviceGetMigMode(mig, &cur, &pend) == NVML_ERROR_NOT_SUPPORTED);
        CHECK(nvmlDeviceGetMaxMigDeviceCount(mig, &n) == NVML_SUCCESS && n == 0);
    }
    CHECK(nvmlDeviceIsMigDeviceHandle(h100, &is_mig) == NVML_SUCCESS && is_mig == 0);
    CHECK(nvmlDeviceGetGpuInstanceId(h100, &id) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h100, &parent) ==
          NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetHandleByUUID("MIG-00000000-0000-0000-0000-000000000000", &by_uuid) ==
          NVML_ERROR_NOT_FOUND);
    nvmlUtilization_t u;
    CHECK(nvmlDeviceGetUtilizationRates(h100, &u) == NVML_ERROR_NOT_SUPPORTED); /* MIG mode */
    CHECK(nvmlDeviceGetUtilizationRates(a100, &u) == NVML_SUCCESS);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

/* As CUDA with CUDA_VISIBLE_DEVICES=MIG-...: this process binds to GI 2 (1g.10gb) of the H100. */
static void case_bound_process(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t h100 = dev(1), small, big;
    CHECK(nvmlDeviceGetMigDeviceHandleByIndex(h100, 2, &small) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetMigDeviceHandleByIndex(h100, 0, &big) == NVML_SUCCESS);
    char uuid[96], big_uuid[96];
    CHECK(nvmlDeviceGetUUID(small, uuid, sizeof(uuid)) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetUUID(big, big_uuid, sizeof(big_uuid)) == NVML_SUCCESS);
    CHECK(sim_mig_bind_uuid("MIG-00000000-0000-0000-0000-000000000000") == -1);
    CHECK(sim_mig_bind_uuid(uuid) == 1 && sim_mig_bound(1) && !sim_mig_bound(0));
    const struct sim_gpu_info *g = sim_gpu(1);
    CHECK(g->memory_total == 9984 * MiB && g->sm_count == 16 && strcmp(g->uuid + 4, uuid + 4) == 0);
    /* Capped by the GI's memory, visible in the MIG device's and the GPU's used memory. */
    CHECK(sim_mem_reserve(1, 10000 * MiB) == -1);
    CHECK(sim_mem_reserve(1, 9000 * MiB) == 0);
    CHECK(sim_mem_reserve(1, 1000 * MiB) == -1);
    CHECK(sim_mem_used(1) == 9000 * MiB);
    nvmlMemory_t mem;
    CHECK(nvmlDeviceGetMemoryInfo(small, &mem) == 0 && mem.used == 9000 * MiB);
    CHECK(nvmlDeviceGetMemoryInfo(big, &mem) == 0 && mem.used == 0);
    CHECK(nvmlDeviceGetMemoryInfo(h100, &mem) == 0 && mem.used == 9000 * MiB);
    /* Its instances cannot be destroyed under it. */
    nvmlGpuInstance_t gi;
    CHECK(nvmlDeviceGetGpuInstanceById(h100, 2, &gi) == NVML_SUCCESS);
    nvmlComputeInstance_t ci;
    CHECK(nvmlGpuInstanceGetComputeInstanceById(gi, 0, &ci) == NVML_SUCCESS);
    CHECK(nvmlComputeInstanceDestroy(ci) == NVML_ERROR_IN_USE);
    nvmlReturn_t act;
    CHECK(nvmlDeviceSetMigMode(h100, 0, &act) == NVML_SUCCESS && act == NVML_ERROR_IN_USE);
    CHECK(nvmlDeviceSetMigMode(h100, 1, &act) == NVML_SUCCESS && act == NVML_SUCCESS);

    /* Timing: work on this instance queues behind its own work only. A process on the other
     * instance submits 10 s of work; ours still starts now. */
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* A forked child keeps the binding: rebind to the other instance. */
        if (sim_mig_bind_uuid(big_uuid) != 1)
            _exit(2);
        unsigned long long now = sim_now_ns();
        unsigned long long end = sim_submit_work(1, 10000000000ULL);
        _exit(end >= now + 10000000000ULL ? 0 : 3);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unsigned long long now = sim_now_ns();
    unsigned long long end = sim_submit_work(1, 1000000ULL);
    CHECK(end < now + 1000000000ULL); /* not behind the other instance's 10 s */
    sim_mem_release_all();
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

static void case_scoped_xid(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t h100 = dev(1);
    nvmlEventSet_t set;
    CHECK(nvmlEventSetCreate(&set) == NVML_SUCCESS);
    CHECK(nvmlDeviceRegisterEvents(h100, nvmlEventTypeXidCriticalError, set) == NVML_SUCCESS);
    CHECK(vgpusim_inject_xid_scoped(1, 31, 2, 0) == 0);
    CHECK(vgpusim_inject_xid(1, 79) == 0);
    nvmlEventData_t ev;
    CHECK(nvmlEventSetWait_v2(set, &ev, 5000) == NVML_SUCCESS);
    CHECK(ev.device == h100 && ev.eventData == 31 && ev.gpuInstanceId == 2 &&
          ev.computeInstanceId == 0);
    CHECK(nvmlEventSetWait_v2(set, &ev, 5000) == NVML_SUCCESS);
    CHECK(ev.eventData == 79 && ev.gpuInstanceId == 0xFFFFFFFFu &&
          ev.computeInstanceId == 0xFFFFFFFFu);
    CHECK(nvmlEventSetFree(set) == NVML_SUCCESS);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

/* Children create and destroy instances in a loop and are SIGKILLed at arbitrary points; the
 * state stays consistent and fully usable. */
static void case_sigkill_midway(void)
{
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    nvmlDevice_t a100 = dev(0);
    set_mode(a100, NVML_DEVICE_MIG_ENABLE, NVML_SUCCESS);
    int rounds = getenv("VGPU_TEST_UNDER_VALGRIND") ? 3 : 20;
    for (int r = 0; r < rounds; r++) {
        int ready[2];
        CHECK(pipe(ready) == 0);
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            close(ready[0]);
            char c = 'r';
            if (write(ready[1], &c, 1) != 1)
                _exit(1);
            for (unsigned int k = 0;; k++) {
                nvmlGpuInstance_t gi;
                nvmlComputeInstance_t ci;
                if (nvmlDeviceCreateGpuInstance(a100, k % 2 ? 19 : 14, &gi) == NVML_SUCCESS) {
                    if (nvmlGpuInstanceCreateComputeInstance(gi, 0, &ci) == NVML_SUCCESS && k % 3)
                        (void)nvmlComputeInstanceDestroy(ci);
                } else {
                    clear_gpu(a100);
                }
            }
        }
        close(ready[1]);
        char c;
        CHECK(read(ready[0], &c, 1) == 1);
        close(ready[0]);
        /* Let it run a variable number of operations (no fixed sleep: spin on the clock). */
        unsigned long long until = sim_now_ns() + 1000000ULL * (1 + rnd(5));
        while (sim_now_ns() < until)
            ;
        CHECK(kill(pid, SIGKILL) == 0);
        CHECK(waitpid(pid, NULL, 0) == pid);
        check_invariants(a100);
    }
    clear_gpu(a100);
    nvmlGpuInstance_t gi;
    CHECK(nvmlDeviceCreateGpuInstance(a100, 0, &gi) == NVML_SUCCESS);
    CHECK(nvmlGpuInstanceDestroy(gi) == NVML_SUCCESS);
    set_mode(a100, NVML_DEVICE_MIG_DISABLE, NVML_SUCCESS);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
}

int main(void)
{
    tu_node(PROFILE);
    static const struct tu_case cases[] = {
        {"mode", case_mode},
        {"profiles", case_profiles},
        {"placements", case_placements},
        {"create_for_later", case_create_for_later},
        {"see_from_another_process", case_see_from_another_process},
        {"bound_process", case_bound_process},
        {"scoped_xid", case_scoped_xid},
        {"sigkill_midway", case_sigkill_midway},
    };
    return tu_report(__FILE__, TU_RUN_CASES(cases));
}
