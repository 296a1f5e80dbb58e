/*
 * cuda_device.c - device queries: count, handles, names, UUIDs, memory, attributes, PCI ids.
 *
 * Values come from the machine profile through the state's static GPU info (sim_gpu()); the
 * attributes a profile does not describe are fixed per compute-capability generation with the
 * real hardware's values, so code that sizes launches from them behaves plausibly.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

CU_API CUresult cuDeviceGetCount(int *count) {
    if (count == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    *count = cu_drv.count;
    return CUDA_SUCCESS;
}

CU_API CUresult cuDeviceGet(CUdevice *device, int ordinal) {
    if (device == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    if (ordinal < 0 || ordinal >= cu_drv.count) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

/* Static info of a validated device. */
static CUresult device_info(CUdevice dev, const struct sim_gpu_info **out) {
    int phys;
    CU_TRY(cu_device_phys(dev, &phys));
    *out = sim_gpu(phys);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CU_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (name == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g;
    CU_TRY(device_info(dev, &g));
    snprintf(name, (size_t)len, "%s", g->name);
    return CUDA_SUCCESS;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* "GPU-xxxxxxxx-xxxx-..." -> 16 raw bytes (hyphens skipped). */
static CUresult parse_uuid(const char *text, CUuuid *out) {
    const char *p = strncmp(text, "GPU-", 4) == 0 ? text + 4 : text;
    int n = 0;
    memset(out, 0, sizeof(*out));
    while (*p != '\0' && n < 32) {
        if (*p == '-') {
            p++;
            continue;
        }
        int v = hex_value(*p++);
        if (v < 0) return CUDA_ERROR_UNKNOWN;
        out->bytes[n / 2] = (char)(out->bytes[n / 2] | (v << ((n % 2) ? 0 : 4)));
        n++;
    }
    return n == 32 ? CUDA_SUCCESS : CUDA_ERROR_UNKNOWN;
}

CU_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    if (uuid == NULL) return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g;
    CU_TRY(device_info(dev, &g));
    return parse_uuid(g->uuid, uuid);
}

/* The _v2 differs from v1 only for MIG instances, which the simulator does not model. */
CU_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev) {
    return cuDeviceGetUuid(uuid, dev);
}

CU_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev) {
    if (bytes == NULL) return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g;
    CU_TRY(device_info(dev, &g));
    *bytes = (size_t)g->memory_total;
    return CUDA_SUCCESS;
}

/* PCI location parsed from "dddddddd:bb:dd.f" (4- or 8-digit domain). */
struct pci_loc {
    unsigned int domain, bus, device, function;
};

static int parse_bus_id(const char *s, struct pci_loc *out) {
    return sscanf(s, "%x:%x:%x.%x", &out->domain, &out->bus, &out->device, &out->function) == 4
               ? 0
               : -1;
}

/* Per-generation constants the profile does not carry (values of the real parts). */
struct arch_limits {
    int threads_per_sm;
    int blocks_per_sm;
    int smem_per_block_optin;
    int smem_per_sm;
    int l2_bytes;
};

static struct arch_limits limits_for(const struct sim_gpu_info *g) {
    int cc = g->cc_major * 10 + g->cc_minor;
    if (cc >= 100) return (struct arch_limits){2048, 32, 232448, 233472, 128 << 20};
    if (cc >= 90) return (struct arch_limits){2048, 32, 232448, 233472, 50 << 20};
    if (cc == 89) return (struct arch_limits){1536, 24, 101376, 102400, 48 << 20};
    if (cc == 86 || cc == 87) return (struct arch_limits){1536, 16, 101376, 102400, 6 << 20};
    if (cc >= 80) return (struct arch_limits){2048, 32, 166912, 167936, 40 << 20};
    if (cc == 75) return (struct arch_limits){1024, 16, 65536, 65536, 4 << 20};
    return (struct arch_limits){2048, 32, 98304, 98304, 6 << 20};
}

CU_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    if (pi == NULL) return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g;
    CU_TRY(device_info(dev, &g));
    struct pci_loc pci = {0, 0, 0, 0};
    (void)parse_bus_id(g->pci_bus_id, &pci);
    struct arch_limits lim = limits_for(g);
    int v;
    switch ((int)attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = (int)g->max_sm_clock_mhz * 1000; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = (int)g->sm_count; break;
    case CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = 0; break; /* default (shared) */
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = (int)pci.bus; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = (int)pci.device; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = (int)pci.domain; break;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = (int)g->max_mem_clock_mhz * 1000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = (int)g->memory_bus_width; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = lim.l2_bytes; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = lim.threads_per_sm; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = g->cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = g->cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: v = lim.smem_per_sm; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: v = dev; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = lim.smem_per_block_optin; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: v = lim.blocks_per_sm; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH: v = g->cc_major >= 9; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_CONFIG: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: v = -1; break;
    case CU_DEVICE_ATTRIBUTE_MPS_ENABLED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: v = g->numa_node; break;
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID: v = (int)g->pci_device_id; break;
    case CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID: v = (int)g->pci_subsystem_id; break;
    default:
        /* Any other attribute of the real enum: report "not supported" as 0, as the driver does
         * for features the device lacks; values outside the enum are invalid. */
        if ((int)attrib <= 0 || (int)attrib > 161) return CUDA_ERROR_INVALID_VALUE;
        v = 0;
        break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

CU_API CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    if (pciBusId == NULL || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    const struct sim_gpu_info *g;
    CU_TRY(device_info(dev, &g));
    struct pci_loc pci;
    if (parse_bus_id(g->pci_bus_id, &pci) != 0) return CUDA_ERROR_UNKNOWN;
    /* CUDA's form has a 4-digit domain and upper-case hex: "0000:18:00.0". */
    snprintf(pciBusId, (size_t)len, "%04X:%02X:%02X.%X", pci.domain, pci.bus, pci.device,
             pci.function);
    return CUDA_SUCCESS;
}

CU_API CUresult cuDeviceGetByPCIBusId(CUdevice *dev, const char *pciBusId) {
    if (dev == NULL || pciBusId == NULL) return CUDA_ERROR_INVALID_VALUE;
    CU_TRY(cu_check_init());
    struct pci_loc want;
    /* Accepted forms: domain:bus:device.function, or bus:device.function (domain 0). */
    if (parse_bus_id(pciBusId, &want) != 0) {
        want.domain = 0;
        if (sscanf(pciBusId, "%x:%x.%x", &want.bus, &want.device, &want.function) != 3)
            return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; i < cu_drv.count; i++) {
        const struct sim_gpu_info *g = sim_gpu(cu_drv.phys[i]);
        struct pci_loc have;
        if (g == NULL || parse_bus_id(g->pci_bus_id, &have) != 0) continue;
        if (have.domain == want.domain && have.bus == want.bus && have.device == want.device &&
            have.function == want.function) {
            *dev = i;
            return CUDA_SUCCESS;
        }
    }
    return CUDA_ERROR_INVALID_DEVICE;
}

CU_API CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    if (canAccessPeer == NULL) return CUDA_ERROR_INVALID_VALUE;
    int a, b;
    CU_TRY(cu_device_phys(dev, &a));
    CU_TRY(cu_device_phys(peerDev, &b));
    if (a == b) return CUDA_ERROR_INVALID_DEVICE;
    /* Peers are reachable when the profile links them over NVLink. */
    const struct sim_gpu_info *g = sim_gpu(a);
    int linked = 0;
    for (int i = 0; g != NULL && i < g->nlinks; i++) linked |= g->links[i].peer == b;
    *canAccessPeer = linked;
    return CUDA_SUCCESS;
}
