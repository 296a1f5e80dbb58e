/*
 * nvml_core.c - fake NVML: initialisation, device enumeration and handles, error strings and the
 * system queries. The other nvml_*.c files implement device queries on the handles made here.
 *
 * nvmlInit attaches to the simulated node (simstate) and snapshots the visible GPUs, as the real
 * library enumerates devices at init. Without a node (VGPU_SIM_STATE unset or unusable) it fails
 * with NVML_ERROR_DRIVER_NOT_LOADED, which is what callers see on a machine without a driver.
 * Init/shutdown are reference-counted like the real library.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "nvml_internal.h"

static pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_refs;  /* nvmlInit calls not yet matched by nvmlShutdown */
static unsigned int g_count;
static struct nvmlDevice_st g_devs[SIM_MAX_GPUS];

nvmlReturn_t nv_initialised(void)
{
    return __atomic_load_n(&g_refs, __ATOMIC_ACQUIRE) > 0 ? NVML_SUCCESS
                                                          : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t nv_device(nvmlDevice_t device, int *phys, const struct sim_gpu_info **info)
{
    if (nv_initialised() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (nv_is_mig_handle(device)) {
        if (!nv_mig_handle_alive(device))
            return NVML_ERROR_INVALID_ARGUMENT;
    } else if (device < &g_devs[0] || device >= &g_devs[g_count]) {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (sim_gpu_flags(device->phys) & (SIM_GPU_LOST | SIM_GPU_REMOVED))
        return NVML_ERROR_GPU_IS_LOST;
    if (phys)
        *phys = device->phys;
    if (info)
        *info = sim_gpu(device->phys);
    return NVML_SUCCESS;
}

nvmlDevice_t nv_handle_of_phys(int phys)
{
    for (unsigned int i = 0; i < g_count; i++)
        if (g_devs[i].phys == phys)
            return &g_devs[i];
    return NULL;
}

nvmlReturn_t nv_copy_str(char *dst, unsigned int length, const char *src)
{
    if (!dst)
        return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(src);
    if (n + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, n + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t init_with_flags(unsigned int flags)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_init_mu);
    if (g_refs == 0) {
        if (sim_attach() != 0) {
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            int phys[SIM_MAX_GPUS];
            int n = sim_visible_gpus(phys, SIM_MAX_GPUS);
            for (int i = 0; i < n; i++) {
                g_devs[i].phys = phys[i];
                g_devs[i].index = (unsigned int)i;
            }
            g_count = (unsigned int)n;
            if (n == 0 && !(flags & NVML_INIT_FLAG_NO_GPUS))
                rc = NVML_ERROR_NOT_FOUND; /* real NVML refuses a GPU-less init without the flag */
        }
    }
    if (rc == NVML_SUCCESS)
        __atomic_store_n(&g_refs, g_refs + 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_init_mu);
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init_with_flags(flags); }
SIM_EXPORT nvmlReturn_t nvmlInit_v2(void) { return init_with_flags(0); }
SIM_EXPORT nvmlReturn_t nvmlInit(void) { return init_with_flags(0); }

SIM_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&g_init_mu);
    if (g_refs == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else
        __atomic_store_n(&g_refs, g_refs - 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_init_mu);
    return rc;
}

SIM_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch ((int)result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt request issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_OPERATING_SYSTEM: return "The operating system has blocked the request";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient resources";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    default: return "Unknown Error";
    }
}

/* ---- system ---------------------------------------------------------------------------- */

SIM_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    return nv_copy_str(version, length, sim_node()->driver_version);
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    /* Real format: "<CUDA major>.<driver version>", e.g. "13.580.95.05". */
    char buf[64];
    snprintf(buf, sizeof(buf), "%d.%s", sim_node()->cuda_driver_version / 1000,
             sim_node()->driver_version);
    return nv_copy_str(version, length, buf);
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    *cudaDriverVersion = sim_node()->cuda_driver_version;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

SIM_EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!name || length == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    char path[64], comm[256];
    snprintf(path, sizeof(path), "/proc/%u/comm", pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return NVML_ERROR_NOT_FOUND;
    if (!fgets(comm, sizeof(comm), f))
        comm[0] = '\0';
    fclose(f);
    comm[strcspn(comm, "\n")] = '\0';
    /* Truncates like the real call. */
    snprintf(name, length, "%s", comm);
    return NVML_SUCCESS;
}

/* ---- enumeration ------------------------------------------------------------------------ */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    *deviceCount = g_count;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sim_gpu_flags(g_devs[index].phys) & (SIM_GPU_LOST | SIM_GPU_REMOVED))
        return NVML_ERROR_GPU_IS_LOST;
    *device = &g_devs[index];
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static nvmlReturn_t handle_by_key(const char *key, nvmlDevice_t *device)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!key || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlDevice_t d = nv_handle_of_phys(sim_find_gpu(key));
    if (!d)
        return NVML_ERROR_NOT_FOUND;
    if (sim_gpu_flags(d->phys) & (SIM_GPU_LOST | SIM_GPU_REMOVED))
        return NVML_ERROR_GPU_IS_LOST;
    *device = d;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    if (uuid && device && strncasecmp(uuid, "MIG-", 4) == 0 && nv_initialised() == NVML_SUCCESS) {
        /* A MIG device: the handle of that compute instance under its (visible) parent. */
        struct sim_mig_ci_info ci;
        nvmlDevice_t parent = nv_handle_of_phys(sim_mig_find_uuid(uuid, &ci));
        if (!parent)
            return NVML_ERROR_NOT_FOUND;
        if (sim_gpu_flags(parent->phys) & (SIM_GPU_LOST | SIM_GPU_REMOVED))
            return NVML_ERROR_GPU_IS_LOST;
        *device = nv_mig_handle(parent, &ci);
        return NVML_SUCCESS;
    }
    if (uuid && strncasecmp(uuid, "GPU-", 4) != 0)
        return nv_initialised() ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    return handle_by_key(uuid, device);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    if (pciBusId && !strchr(pciBusId, ':'))
        return nv_initialised() ? NVML_ERROR_UNINITIALIZED : NVML_ERROR_INVALID_ARGUMENT;
    return handle_by_key(pciBusId, device);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}
