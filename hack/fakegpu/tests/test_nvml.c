/*
 * test_nvml.c - the fake libnvidia-ml.so.1 through its C ABI, with the test process also writing
 * the shared state through its own copy of the state code (as the fake CUDA driver would).
 *
 * What it proves:
 *  1. Without a node, nvmlInit fails like a driver-less machine (DRIVER_NOT_LOADED) and calls
 *     before init return UNINITIALIZED; init/shutdown are reference-counted.
 *  2. Static attributes: count, names, UUIDs, PCI info (both bus-id forms), lookup by UUID and
 *     bus id, short buffers -> INSUFFICIENT_SIZE, memory v1/v2 (version checked), brand, arch,
 *     compute capability, cores, NUMA, MIG mode.
 *  3. NVIDIA_VISIBLE_DEVICES reindexes the container's view.
 *  4. Memory reserved through the state shows as used memory and as a running compute process
 *     (v1/v2/v3 layouts, size-query protocol); graphics processes are empty.
 *  5. Submitted work shows as GPU utilisation and per-process utilisation samples.
 *  6. Topology: NVLink states/versions/remote PCI, P2P, common ancestor, nearest GPUs, affinity.
 *  7. XIDs injected through the control API arrive through an event set; wait times out
 *     otherwise; unsupported event types are refused.
 *  8. A lost GPU returns GPU_IS_LOST everywhere and raises XID 79; a removed GPU disappears for
 *     processes initialising later.
 *  9. The status JSON describes the node.
 */
#include <errno.h>
#include <time.h>

#include "nvml_abi.h"
#include "simstate.h"
#include "testutil.h"

#define MiB (1024ULL * 1024)

static void case_no_node(void)
{
    unsigned int n;
    unsetenv("VGPU_SIM_STATE");
    CHECK(nvmlDeviceGetCount_v2(&n) == NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlInit_v2() == NVML_ERROR_DRIVER_NOT_LOADED);
    CHECK(nvmlShutdown() == NVML_ERROR_UNINITIALIZED);
    CHECK(strcmp(nvmlErrorString(NVML_ERROR_GPU_IS_LOST), "GPU is lost") == 0);
    CHECK(vgpusim_status_json(NULL, 0) == -1);
}

static void case_static(void)
{
    nvmlDevice_t d0, d1, d;
    unsigned int n, u;
    char buf[128];
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CHECK(nvmlInitWithFlags(0) == NVML_SUCCESS); /* refcount 2 */
    CHECK(nvmlDeviceGetCount_v2(&n) == NVML_SUCCESS && n == 2);
    CHECK(nvmlDeviceGetHandleByIndex_v2(2, &d) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d0) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetHandleByIndex(1, &d1) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetName(d1, buf, sizeof(buf)) == NVML_SUCCESS);
    CHECK(strcmp(buf, "NVIDIA Test GPU B") == 0);
    CHECK(nvmlDeviceGetName(d1, buf, 5) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(nvmlSystemGetDriverVersion(buf, sizeof(buf)) == NVML_SUCCESS);
    CHECK(strcmp(buf, "580.95.05") == 0);
    CHECK(nvmlSystemGetNVMLVersion(buf, sizeof(buf)) == NVML_SUCCESS);
    CHECK(strcmp(buf, "13.580.95.05") == 0);
    int cuda;
    CHECK(nvmlSystemGetCudaDriverVersion_v2(&cuda) == NVML_SUCCESS && cuda == 13000);
    CHECK(nvmlDeviceGetUUID(d0, buf, sizeof(buf)) == NVML_SUCCESS);
    CHECK(strcmp(buf, "GPU-00000000-1111-2222-3333-444444444444") == 0);
    CHECK(nvmlDeviceGetHandleByUUID("GPU-00000001-1111-2222-3333-444444444444", &d) == 0 &&
          d == d1);
    CHECK(nvmlDeviceGetHandleByUUID("GPU-99999999-1111-2222-3333-444444444444", &d) ==
          NVML_ERROR_NOT_FOUND);
    CHECK(nvmlDeviceGetHandleByPciBusId_v2("0000:2A:00.0", &d) == 0 && d == d1);
    CHECK(nvmlDeviceGetHandleByPciBusId("00000000:18:00.0", &d) == 0 && d == d0);
    nvmlPciInfo_t pci;
    CHECK(nvmlDeviceGetPciInfo_v3(d1, &pci) == NVML_SUCCESS);
    CHECK(strcmp(pci.busId, "00000000:2A:00.0") == 0 && strcmp(pci.busIdLegacy, "0000:2A:00.0") == 0);
    CHECK(pci.bus == 0x2a && pci.device == 0 && pci.pciDeviceId == 0x20b010de);
    nvmlMemory_t m;
    CHECK(nvmlDeviceGetMemoryInfo(d1, &m) == NVML_SUCCESS && m.total == 2048 * MiB);
    CHECK(m.free == m.total && m.used == 0);
    nvmlMemory_v2_t m2 = {0};
    CHECK(nvmlDeviceGetMemoryInfo_v2(d1, &m2) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    m2.version = nvmlMemory_v2;
    CHECK(nvmlDeviceGetMemoryInfo_v2(d1, &m2) == NVML_SUCCESS && m2.total == 2048 * MiB);
    nvmlBrandType_t brand;
    CHECK(nvmlDeviceGetBrand(d0, &brand) == 0 && brand == NVML_BRAND_NVIDIA);
    CHECK(nvmlDeviceGetBrand(d1, &brand) == 0 && brand == NVML_BRAND_TESLA);
    nvmlDeviceArchitecture_t arch;
    CHECK(nvmlDeviceGetArchitecture(d0, &arch) == 0 && arch == NVML_DEVICE_ARCH_HOPPER);
    int maj, min;
    CHECK(nvmlDeviceGetCudaComputeCapability(d1, &maj, &min) == 0 && maj == 8 && min == 0);
    CHECK(nvmlDeviceGetNumGpuCores(d1, &u) == 0 && u == 108 * 64);
    CHECK(nvmlDeviceGetNumaNodeId(d1, &u) == 0 && u == 1);
    CHECK(nvmlDeviceGetIndex(d1, &u) == 0 && u == 1);
    CHECK(nvmlDeviceGetMinorNumber(d1, &u) == 0 && u == 1);
    nvmlDeviceAttributes_t attrs;
    CHECK(nvmlDeviceGetAttributes_v2(d1, &attrs) == 0 && attrs.multiprocessorCount == 108);
    CHECK(attrs.memorySizeMB == 2048 && attrs.gpuInstanceSliceCount == 0);
    unsigned int cur, pend;
    CHECK(nvmlDeviceGetMigMode(d0, &cur, &pend) == 0 && cur == 0);
    CHECK(nvmlDeviceGetMigMode(d1, &cur, &pend) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceGetFanSpeed(d0, &u) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceGetName((nvmlDevice_t)&n, buf, sizeof(buf)) == NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlShutdown() == NVML_SUCCESS);
    CHECK(nvmlDeviceGetCount_v2(&n) == NVML_SUCCESS); /* still one reference */
    CHECK(nvmlShutdown() == NVML_SUCCESS);
    CHECK(nvmlDeviceGetName(d0, buf, sizeof(buf)) == NVML_ERROR_UNINITIALIZED);
}

static void case_visible(void)
{
    setenv("NVIDIA_VISIBLE_DEVICES", "GPU-00000001-1111-2222-3333-444444444444", 1);
    nvmlDevice_t d;
    unsigned int n;
    char buf[96];
    CHECK(nvmlInit_v2() == NVML_SUCCESS);
    CHECK(nvmlDeviceGetCount_v2(&n) == 0 && n == 1);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == 0);
    CHECK(nvmlDeviceGetName(d, buf, sizeof(buf)) == 0 && strcmp(buf, "NVIDIA Test GPU B") == 0);
    CHECK(nvmlDeviceGetIndex(d, &n) == 0 && n == 0);
    CHECK(nvmlDeviceGetHandleByUUID("GPU-00000000-1111-2222-3333-444444444444", &d) ==
          NVML_ERROR_NOT_FOUND); /* not in this container */
    setenv("NVIDIA_VISIBLE_DEVICES", "none", 1);
    /* A second init keeps the device list of the first... */
    CHECK(nvmlInit_v2() == NVML_SUCCESS && nvmlDeviceGetCount_v2(&n) == 0 && n == 1);
    nvmlShutdown();
    nvmlShutdown();
    /* ...a re-init after the last shutdown enumerates again: no GPU is an error unless allowed. */
    CHECK(nvmlInit_v2() == NVML_ERROR_NOT_FOUND);
    CHECK(nvmlInitWithFlags(NVML_INIT_FLAG_NO_GPUS) == NVML_SUCCESS);
    CHECK(nvmlDeviceGetCount_v2(&n) == 0 && n == 0);
}

static void case_memory_processes(void)
{
    nvmlDevice_t d;
    CHECK(nvmlInit_v2() == 0 && nvmlDeviceGetHandleByIndex_v2(0, &d) == 0);
    CHECK(sim_mem_reserve(0, 300 * MiB) == 0);
    nvmlMemory_t m;
    CHECK(nvmlDeviceGetMemoryInfo(d, &m) == 0);
    CHECK_EQ_U(m.used, 300 * MiB);
    CHECK_EQ_U(m.free, 724 * MiB);

    unsigned int count = 0;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &count, NULL) ==
          NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(count == 1);
    nvmlProcessInfo_t p3[4];
    count = 4;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &count, p3) == 0 && count == 1);
    CHECK(p3[0].pid == (unsigned)getpid() && p3[0].usedGpuMemory == 300 * MiB);
    CHECK(p3[0].gpuInstanceId == 0xFFFFFFFFu);
    nvmlProcessInfo_v1_t p1[2];
    count = 2;
    CHECK(nvmlDeviceGetComputeRunningProcesses(d, &count, p1) == 0 && count == 1);
    CHECK(p1[0].usedGpuMemory == 300 * MiB);
    nvmlProcessInfo_v2_t p2[2];
    count = 2;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v2(d, &count, p2) == 0 && count == 1);
    count = 0;
    CHECK(nvmlDeviceGetGraphicsRunningProcesses_v3(d, &count, NULL) == 0 && count == 0);
    nvmlProcessDetail_v1_t det[2];
    nvmlProcessDetailList_t list = {0};
    CHECK(nvmlDeviceGetRunningProcessDetailList(d, &list) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    list.version = nvmlProcessDetailList_v1;
    CHECK(nvmlDeviceGetRunningProcessDetailList(d, &list) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(list.numProcArrayEntries == 1);
    list.procArray = det;
    CHECK(nvmlDeviceGetRunningProcessDetailList(d, &list) == 0 && list.numProcArrayEntries == 1);
    CHECK(det[0].pid == (unsigned)getpid() && det[0].usedGpuMemory == 300 * MiB);
    list.mode = 1; /* graphics */
    CHECK(nvmlDeviceGetRunningProcessDetailList(d, &list) == 0 && list.numProcArrayEntries == 0);

    /* Another process's memory, then its death. */
    pid_t kid = fork();
    if (kid == 0) {
        CHECK(sim_mem_reserve(0, 100 * MiB) == 0);
        pause();
    }
    for (int i = 0; i < 200; i++) {
        count = 4;
        CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &count, p3) == 0);
        if (count == 2)
            break;
        usleep(10000);
    }
    CHECK(count == 2);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    count = 4;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(d, &count, p3) == 0 && count == 1);
    CHECK(nvmlDeviceGetMemoryInfo(d, &m) == 0 && m.used == 300 * MiB);
    sim_mem_release(0, 300 * MiB);
    CHECK(nvmlDeviceGetMemoryInfo(d, &m) == 0 && m.used == 0);
}

static void case_utilisation(void)
{
    nvmlDevice_t d;
    CHECK(nvmlInit_v2() == 0 && nvmlDeviceGetHandleByIndex_v2(1, &d) == 0);
    nvmlUtilization_t u;
    CHECK(nvmlDeviceGetUtilizationRates(d, &u) == 0 && u.gpu == 0);
    unsigned int count = 0;
    CHECK(nvmlDeviceGetProcessUtilization(d, NULL, &count, 0) == NVML_ERROR_NOT_FOUND);
    unsigned long long end = sim_submit_work(1, 400000000ULL); /* 400 ms */
    struct timespec ts = {0, 250000000};
    nanosleep(&ts, NULL);
    CHECK(nvmlDeviceGetUtilizationRates(d, &u) == 0);
    CHECK(u.gpu >= 95);
    CHECK(nvmlDeviceGetProcessUtilization(d, NULL, &count, 0) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(count == 1);
    nvmlProcessUtilizationSample_t s[2];
    count = 2;
    CHECK(nvmlDeviceGetProcessUtilization(d, s, &count, 0) == 0 && count == 1);
    CHECK(s[0].pid == (unsigned)getpid() && s[0].smUtil >= 20);
    /* Timestamps are CLOCK_REALTIME microseconds, like the real library. */
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    unsigned long long now_us = (unsigned long long)rt.tv_sec * 1000000ULL + rt.tv_nsec / 1000;
    CHECK(s[0].timeStamp <= now_us + 1000 && s[0].timeStamp + 2000000 > now_us);
    /* Nothing newer than a timestamp in the future. */
    count = 2;
    CHECK(nvmlDeviceGetProcessUtilization(d, s, &count, now_us + 10000000ULL) ==
          NVML_ERROR_NOT_FOUND);
    unsigned int temp, power;
    CHECK(nvmlDeviceGetTemperature(d, NVML_TEMPERATURE_GPU, &temp) == 0 && temp > 60);
    CHECK(nvmlDeviceGetPowerUsage(d, &power) == 0 && power > 200000);
    while (sim_now_ns() < end + 200000000ULL)
        nanosleep(&ts, NULL);
    CHECK(nvmlDeviceGetUtilizationRates(d, &u) == 0 && u.gpu == 0);
}

static void case_topology(void)
{
    nvmlDevice_t d0, d1;
    CHECK(nvmlInit_v2() == 0);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d0) == 0 && nvmlDeviceGetHandleByIndex_v2(1, &d1) == 0);
    nvmlEnableState_t st;
    CHECK(nvmlDeviceGetNvLinkState(d0, 0, &st) == 0 && st == NVML_FEATURE_ENABLED);
    CHECK(nvmlDeviceGetNvLinkState(d0, 1, &st) == 0 && st == NVML_FEATURE_ENABLED);
    CHECK(nvmlDeviceGetNvLinkState(d0, 2, &st) == 0 && st == NVML_FEATURE_DISABLED);
    CHECK(nvmlDeviceGetNvLinkState(d0, 18, &st) == NVML_ERROR_INVALID_ARGUMENT); /* Hopper: 18 */
    CHECK(nvmlDeviceGetNvLinkState(d1, 12, &st) == NVML_ERROR_INVALID_ARGUMENT); /* Ampere: 12 */
    unsigned int v;
    CHECK(nvmlDeviceGetNvLinkVersion(d0, 0, &v) == 0 && v == 4);
    CHECK(nvmlDeviceGetNvLinkCapability(d0, 1, NVML_NVLINK_CAP_P2P_SUPPORTED, &v) == 0 && v == 1);
    nvmlPciInfo_t pci;
    CHECK(nvmlDeviceGetNvLinkRemotePciInfo_v2(d0, 1, &pci) == 0);
    CHECK(strcmp(pci.busId, "00000000:2A:00.0") == 0);
    CHECK(nvmlDeviceGetNvLinkRemotePciInfo_v2(d0, 5, &pci) == NVML_ERROR_NOT_SUPPORTED);
    nvmlIntNvLinkDeviceType_t type;
    CHECK(nvmlDeviceGetNvLinkRemoteDeviceType(d0, 0, &type) == 0 &&
          type == NVML_NVLINK_DEVICE_TYPE_GPU);
    nvmlGpuP2PStatus_t p2p;
    CHECK(nvmlDeviceGetP2PStatus(d0, d1, NVML_P2P_CAPS_INDEX_NVLINK, &p2p) == 0 &&
          p2p == NVML_P2P_STATUS_OK);
    CHECK(nvmlDeviceGetP2PStatus(d0, d1, NVML_P2P_CAPS_INDEX_PCI, &p2p) == 0 &&
          p2p == NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED); /* different NUMA nodes */
    nvmlGpuTopologyLevel_t lvl;
    CHECK(nvmlDeviceGetTopologyCommonAncestor(d0, d1, &lvl) == 0 && lvl == NVML_TOPOLOGY_SYSTEM);
    CHECK(nvmlDeviceGetTopologyCommonAncestor(d0, d0, &lvl) == 0 && lvl == NVML_TOPOLOGY_INTERNAL);
    unsigned int count = 0;
    nvmlDevice_t near[4];
    CHECK(nvmlDeviceGetTopologyNearestGpus(d0, NVML_TOPOLOGY_NODE, &count, NULL) == 0 &&
          count == 0);
    count = 4;
    CHECK(nvmlDeviceGetTopologyNearestGpus(d0, NVML_TOPOLOGY_SYSTEM, &count, near) == 0 &&
          count == 1 && near[0] == d1);
    unsigned long cpus[4] = {0}, nodes[1] = {0};
    CHECK(nvmlDeviceGetCpuAffinity(d1, 4, cpus) == 0 && (cpus[0] | cpus[1]) != 0);
    CHECK(nvmlDeviceGetMemoryAffinity(d1, 1, nodes, NVML_AFFINITY_SCOPE_NODE) == 0 &&
          nodes[0] == 2UL);
}

static void case_events(void)
{
    nvmlDevice_t d0, d1;
    nvmlEventSet_t set;
    nvmlEventData_t ev;
    CHECK(nvmlInit_v2() == 0);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d0) == 0 && nvmlDeviceGetHandleByIndex_v2(1, &d1) == 0);
    unsigned long long types;
    CHECK(nvmlDeviceGetSupportedEventTypes(d0, &types) == 0 &&
          types == (unsigned long long)nvmlEventTypeXidCriticalError);
    CHECK(nvmlEventSetCreate(&set) == 0);
    CHECK(nvmlDeviceRegisterEvents(d0, nvmlEventTypePState, set) == NVML_ERROR_NOT_SUPPORTED);
    CHECK(vgpusim_inject_xid(0, 31) == 0); /* before registration: not seen */
    CHECK(nvmlDeviceRegisterEvents(d0, nvmlEventTypeXidCriticalError, set) == 0);
    CHECK(nvmlDeviceRegisterEvents(d1, nvmlEventTypeXidCriticalError, set) == 0);
    unsigned long long t0 = sim_now_ns();
    CHECK(nvmlEventSetWait_v2(set, &ev, 50) == NVML_ERROR_TIMEOUT);
    CHECK(sim_now_ns() - t0 >= 50000000ULL);
    pid_t kid = fork();
    if (kid == 0) { /* another process raises the XID */
        usleep(30000);
        _exit(vgpusim_inject_xid(1, 48) == 0 ? 0 : 1);
    }
    CHECK(nvmlEventSetWait_v2(set, &ev, 5000) == 0);
    CHECK(ev.device == d1 && ev.eventType == nvmlEventTypeXidCriticalError && ev.eventData == 48);
    waitpid(kid, NULL, 0);
    CHECK(vgpusim_inject_xid(0, 94) == 0 && vgpusim_inject_xid(0, 95) == 0);
    CHECK(nvmlEventSetWait(set, &ev, 1000) == 0 && ev.device == d0 && ev.eventData == 94);
    CHECK(nvmlEventSetWait_v2(set, &ev, 1000) == 0 && ev.eventData == 95);
    CHECK(nvmlEventSetWait_v2(set, &ev, 0) == NVML_ERROR_TIMEOUT);
    CHECK(vgpusim_inject_xid(7, 1) == -1);
    CHECK(nvmlEventSetFree(set) == 0);
}

static void case_lost_removed(void)
{
    nvmlDevice_t d0, d1;
    nvmlEventSet_t set;
    nvmlEventData_t ev;
    char buf[96];
    CHECK(nvmlInit_v2() == 0);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d0) == 0 && nvmlDeviceGetHandleByIndex_v2(1, &d1) == 0);
    CHECK(nvmlEventSetCreate(&set) == 0);
    CHECK(nvmlDeviceRegisterEvents(d1, nvmlEventTypeXidCriticalError, set) == 0);
    CHECK(vgpusim_set_lost(1, 1) == 0);
    CHECK(nvmlEventSetWait_v2(set, &ev, 1000) == 0 && ev.eventData == 79);
    nvmlMemory_t m;
    CHECK(nvmlDeviceGetMemoryInfo(d1, &m) == NVML_ERROR_GPU_IS_LOST);
    CHECK(nvmlDeviceGetName(d1, buf, sizeof(buf)) == NVML_ERROR_GPU_IS_LOST);
    CHECK(nvmlDeviceGetHandleByIndex_v2(1, &d1) == NVML_ERROR_GPU_IS_LOST);
    CHECK(nvmlDeviceGetName(d0, buf, sizeof(buf)) == NVML_SUCCESS); /* others unaffected */
    CHECK(vgpusim_set_lost(1, 0) == 0);
    CHECK(nvmlDeviceGetMemoryInfo(d1, &m) == NVML_SUCCESS);
    nvmlEventSetFree(set);

    CHECK(vgpusim_set_removed(0, 1) == 0);
    CHECK(nvmlDeviceGetName(d0, buf, sizeof(buf)) == NVML_ERROR_GPU_IS_LOST);
    CHECK(vgpusim_set_removed(0, 0) == 0);
    CHECK(vgpusim_set_lost(5, 1) == -1);
}

static void case_removed_fresh_process(void)
{
    /* Fresh process (no nvmlInit yet) while GPU 0 is removed. */
    unsigned int n;
    nvmlDevice_t d;
    char buf[96];
    CHECK(vgpusim_set_removed(0, 1) == 0);
    CHECK(nvmlInit_v2() == 0 && nvmlDeviceGetCount_v2(&n) == 0 && n == 1);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d) == 0);
    CHECK(nvmlDeviceGetName(d, buf, sizeof(buf)) == 0 && strcmp(buf, "NVIDIA Test GPU B") == 0);
    CHECK(vgpusim_set_removed(0, 0) == 0);
}

static void case_status(void)
{
    char small[16];
    int n = vgpusim_status_json(small, sizeof(small));
    CHECK(n > (int)sizeof(small) && strlen(small) == sizeof(small) - 1);
    char *buf = malloc((size_t)n + 1);
    CHECK(buf && vgpusim_status_json(buf, n + 1) == n);
    CHECK(strstr(buf, "\"node\":\"test-2gpu\"") != NULL);
    CHECK(strstr(buf, "\"memory_total\":2147483648") != NULL);
    free(buf);
}

static const struct tu_case WITHOUT_NODE[] = {
    {"no node: driver not loaded", case_no_node},
};

static const struct tu_case WITH_NODE[] = {
    {"static attributes and lookups", case_static},
    {"NVIDIA_VISIBLE_DEVICES", case_visible},
    {"memory and running processes", case_memory_processes},
    {"utilisation", case_utilisation},
    {"topology, NVLink, P2P, affinity", case_topology},
    {"XID events", case_events},
    {"lost and removed GPUs", case_lost_removed},
    {"removed GPU hidden from a new process", case_removed_fresh_process},
    {"status JSON", case_status},
};

int main(void)
{
    int failures = TU_RUN_CASES(WITHOUT_NODE);
    tu_node(NULL);
    failures += TU_RUN_CASES(WITH_NODE);
    return tu_report(__FILE__, failures);
}
