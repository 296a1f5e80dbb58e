/*
 * nvml_topology.c - fake NVML: where a GPU sits (CPU/NUMA affinity, PCIe ancestry between GPUs)
 * and how GPUs connect (NVLink links, P2P capability), all from the machine profile.
 *
 * Model:
 *  - NVLink: the profile lists (peer, link count) groups; link indices are assigned in that
 *    order (peer A's links first, then B's...). Links up to the architecture's maximum (18 on
 *    Hopper, 12 on Ampere) that the profile does not use read as disabled. A GPU with no links
 *    at all has no NVLink (NOT_SUPPORTED), as on PCIe boards. NVSwitch fabrics are modelled as
 *    direct links between every pair of GPUs.
 *  - PCIe ancestry: same GPU -> INTERNAL; same `pcie_root` -> MULTIPLE (PCIe switches only);
 *    same NUMA node -> NODE; otherwise SYSTEM (across the CPU interconnect).
 *  - P2P: over NVLink when linked; otherwise read/write/atomics only within one NUMA node.
 *  - CPUs: the host's configured CPUs split evenly across the profile's NUMA nodes, so the
 *    masks are disjoint per node and stable on any machine.
 */
#include <string.h>
#include <unistd.h>

#include "nvml_internal.h"

static int max_links(const struct sim_gpu_info *g)
{
    int used = 0;
    for (int i = 0; i < g->nlinks; i++)
        used += g->links[i].count;
    int arch_max = g->arch >= SIM_ARCH_HOPPER ? 18 : g->arch == SIM_ARCH_AMPERE ? 12 : used;
    return used > arch_max ? used : arch_max;
}

/* Peer GPU (physical) at the far end of `link`, or -1 if the link is not in use. */
static int link_peer(const struct sim_gpu_info *g, unsigned int link)
{
    unsigned int base = 0;
    for (int i = 0; i < g->nlinks; i++) {
        if (link < base + (unsigned int)g->links[i].count)
            return g->links[i].peer;
        base += (unsigned int)g->links[i].count;
    }
    return -1;
}

static int linked(const struct sim_gpu_info *g, int peer)
{
    for (int i = 0; i < g->nlinks; i++)
        if (g->links[i].peer == peer)
            return 1;
    return 0;
}

/* Common checks of the per-link calls; returns the peer (or -1 for a disabled link). */
static nvmlReturn_t link_check(nvmlDevice_t device, unsigned int link, int *peer,
                               const struct sim_gpu_info **g)
{
    int phys;
    nvmlReturn_t rc = nv_device(device, &phys, g);
    if (rc != NVML_SUCCESS)
        return rc;
    if ((*g)->nlinks == 0)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= (unsigned int)max_links(*g))
        return NVML_ERROR_INVALID_ARGUMENT;
    *peer = link_peer(*g, link);
    return NVML_SUCCESS;
}

/* The prologue of a per-link call: the output arguments are checked first (args_ok), then
 * link_check; either's error is returned from the calling function. */
#define LINK_OR_RETURN(args_ok, device, link, peer_out, info_out)                      \
    do {                                                                                \
        ARG_OR_RETURN(args_ok);                                                         \
        nvmlReturn_t lor_rc_ = link_check((device), (link), (peer_out), (info_out));    \
        if (lor_rc_ != NVML_SUCCESS)                                                    \
            return lor_rc_;                                                             \
    } while (0)

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                 nvmlEnableState_t *isActive)
{
    int peer;
    const struct sim_gpu_info *g;
    LINK_OR_RETURN(isActive, device, link, &peer, &g);
    *isActive = peer >= 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t device, unsigned int link,
                                                   unsigned int *version)
{
    int peer;
    const struct sim_gpu_info *g;
    LINK_OR_RETURN(version, device, link, &peer, &g);
    *version = g->arch >= SIM_ARCH_BLACKWELL ? 5 : g->arch == SIM_ARCH_HOPPER ? 4 : 3;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t device, unsigned int link,
                                                      nvmlNvLinkCapability_t capability,
                                                      unsigned int *capResult)
{
    int peer;
    const struct sim_gpu_info *g;
    LINK_OR_RETURN(capResult && (unsigned)capability < NVML_NVLINK_CAP_COUNT, device, link, &peer,
                   &g);
    switch (capability) {
    case NVML_NVLINK_CAP_P2P_SUPPORTED:
    case NVML_NVLINK_CAP_P2P_ATOMICS:
    case NVML_NVLINK_CAP_VALID: *capResult = peer >= 0; break;
    default: *capResult = 0; break;
    }
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                            nvmlPciInfo_t *pci)
{
    int peer;
    const struct sim_gpu_info *g;
    LINK_OR_RETURN(pci, device, link, &peer, &g);
    if (peer < 0)
        return NVML_ERROR_NOT_SUPPORTED; /* link not in use */
    nv_fill_pci(peer, pci);
    return NVML_SUCCESS;
}

/* Every simulated link ends at a GPU (NVSwitch fabrics are modelled as direct links), so the
 * type is known exactly where the remote end's PCI info is. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                            nvmlIntNvLinkDeviceType_t *type)
{
    nvmlPciInfo_t remote;
    ARG_OR_RETURN(type);
    nvmlReturn_t rc = nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, &remote);
    if (rc == NVML_SUCCESS)
        *type = NVML_NVLINK_DEVICE_TYPE_GPU;
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                                         nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci);
}

static nvmlGpuTopologyLevel_t ancestor(int a, int b)
{
    const struct sim_gpu_info *ga = sim_gpu(a), *gb = sim_gpu(b);
    if (a == b)
        return NVML_TOPOLOGY_INTERNAL;
    if (strcmp(ga->pcie_root, gb->pcie_root) == 0)
        return NVML_TOPOLOGY_MULTIPLE;
    if (ga->numa_node == gb->numa_node)
        return NVML_TOPOLOGY_NODE;
    return NVML_TOPOLOGY_SYSTEM;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                            nvmlDevice_t device2,
                                                            nvmlGpuTopologyLevel_t *pathInfo)
{
    int a, b;
    DEVICE_OR_RETURN(device1, &a, NULL);
    DEVICE_OR_RETURN(device2, &b, NULL);
    ARG_OR_RETURN(pathInfo);
    *pathInfo = ancestor(a, b);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTopologyNearestGpus(nvmlDevice_t device,
                                                         nvmlGpuTopologyLevel_t level,
                                                         unsigned int *count,
                                                         nvmlDevice_t *deviceArray)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, count && (*count == 0 || deviceArray));
    nvmlDevice_t near[SIM_MAX_GPUS];
    unsigned int n = 0;
    for (int other = 0; other < sim_gpu_count(); other++) {
        nvmlDevice_t h = nv_handle_of_phys(other);
        if (other != phys && h && ancestor(phys, other) <= level)
            near[n++] = h;
    }
    if (*count == 0) {
        *count = n; /* size query */
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(deviceArray, near, n * sizeof(near[0]));
    *count = n;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t device1, nvmlDevice_t device2,
                                               nvmlGpuP2PCapsIndex_t p2pIndex,
                                               nvmlGpuP2PStatus_t *p2pStatus)
{
    int a, b;
    DEVICE_OR_RETURN(device1, &a, NULL);
    DEVICE_OR_RETURN(device2, &b, NULL);
    ARG_OR_RETURN(p2pStatus && (unsigned)p2pIndex < NVML_P2P_CAPS_INDEX_UNKNOWN);
    int nvlink = linked(sim_gpu(a), b);
    int same_node = sim_gpu(a)->numa_node == sim_gpu(b)->numa_node;
    int ok;
    switch (p2pIndex) {
    case NVML_P2P_CAPS_INDEX_NVLINK: ok = nvlink; break;
    case NVML_P2P_CAPS_INDEX_PCI: ok = same_node; break;
    default: ok = nvlink || same_node; break;
    }
    if (a == b)
        *p2pStatus = NVML_P2P_STATUS_NOT_SUPPORTED;
    else if (ok)
        *p2pStatus = NVML_P2P_STATUS_OK;
    else if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK)
        *p2pStatus = NVML_P2P_STATUS_NOT_SUPPORTED;
    else
        *p2pStatus = NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* ---- affinity ---------------------------------------------------------------------------- */

static int numa_nodes(void)
{
    int max = 0;
    for (int i = 0; i < sim_gpu_count(); i++)
        if (sim_gpu(i)->numa_node + 1 > max)
            max = sim_gpu(i)->numa_node + 1;
    return max > 0 ? max : 1;
}

static void set_bit(unsigned long *set, unsigned int size, unsigned int bit)
{
    unsigned int bits = (unsigned int)(8 * sizeof(unsigned long));
    if (bit / bits < size)
        set[bit / bits] |= 1UL << (bit % bits);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinityWithinScope(nvmlDevice_t device,
                                                            unsigned int cpuSetSize,
                                                            unsigned long *cpuSet,
                                                            nvmlAffinityScope_t scope)
{
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, NULL, &g);
    if (!cpuSet || cpuSetSize == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(cpuSet, 0, cpuSetSize * sizeof(unsigned long));
    long ncpu = sysconf(_SC_NPROCESSORS_CONF);
    if (ncpu < 1)
        ncpu = 1;
    int nodes = numa_nodes();
    int node = g->numa_node < 0 ? 0 : g->numa_node;
    long per = ncpu / nodes;
    if (per == 0) { /* fewer host CPUs than simulated nodes: share CPU (node mod ncpu) */
        set_bit(cpuSet, cpuSetSize, (unsigned int)(node % ncpu));
        return NVML_SUCCESS;
    }
    for (long c = node * per; c < (node + 1) * per; c++)
        set_bit(cpuSet, cpuSetSize, (unsigned int)c);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                                 unsigned long *cpuSet)
{
    return nvmlDeviceGetCpuAffinityWithinScope(device, cpuSetSize, cpuSet,
                                               NVML_AFFINITY_SCOPE_NODE);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryAffinity(nvmlDevice_t device, unsigned int nodeSetSize,
                                                    unsigned long *nodeSet,
                                                    nvmlAffinityScope_t scope)
{
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, NULL, &g);
    if (!nodeSet || nodeSetSize == 0 || scope > NVML_AFFINITY_SCOPE_SOCKET)
        return NVML_ERROR_INVALID_ARGUMENT;
    memset(nodeSet, 0, nodeSetSize * sizeof(unsigned long));
    set_bit(nodeSet, nodeSetSize, (unsigned int)(g->numa_node < 0 ? 0 : g->numa_node));
    return NVML_SUCCESS;
}
