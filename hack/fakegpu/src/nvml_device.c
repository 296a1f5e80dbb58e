/*
 * nvml_device.c - fake NVML: a device's identity and static attributes (from the machine
 * profile), its modes, and the thermal/power/clock readings.
 *
 * Readings that a real GPU measures are derived from the simulated SM utilisation so that they
 * move plausibly under load: temperature 32 C idle -> 72 C at 100 %, power from 20 % of the
 * limit idle to 90 % at 100 %, SM/graphics clocks at the profile's maximum while busy and at
 * 30 % of it when idle, P0 while busy, P8 when idle. No fans (data-centre boards).
 */
#include <stdio.h>
#include <string.h>

#include "nvml_internal.h"

SIM_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, NULL, &g);
    const struct sim_mig_profile *p;
    if (device->mig && nv_mig_info(device, NULL, &p) == NVML_SUCCESS) {
        /* A MIG device: "<board> MIG <profile>", as the real library names it. */
        char buf[160];
        snprintf(buf, sizeof(buf), "%s MIG %s", g->name, p ? p->name : "?");
        return nv_copy_str(name, length, buf);
    }
    return nv_copy_str(name, length, g->name);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t device, nvmlBrandType_t *type)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, type);
    *type = (nvmlBrandType_t)g->brand_code;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t device,
                                                  nvmlDeviceArchitecture_t *arch)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, arch);
    *arch = (nvmlDeviceArchitecture_t)g->arch;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, index);
    *index = device->index;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t device, char *serial, unsigned int length)
{
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, NULL, &g);
    return nv_copy_str(serial, length, g->serial);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, NULL, &g);
    struct sim_mig_ci_info ci;
    if (device->mig && nv_mig_info(device, &ci, NULL) == NVML_SUCCESS)
        return nv_copy_str(uuid, length, ci.uuid); /* "MIG-..." */
    return nv_copy_str(uuid, length, g->uuid);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, minorNumber);
    *minorNumber = (unsigned int)g->minor;
    return NVML_SUCCESS;
}

void nv_fill_pci(int phys, nvmlPciInfo_t *pci)
{
    const struct sim_gpu_info *g = sim_gpu(phys);
    unsigned int domain = 0, bus = 0, dev = 0, fn = 0;
    sscanf(g->pci_bus_id, "%x:%x:%x.%x", &domain, &bus, &dev, &fn);
    memset(pci, 0, sizeof(*pci));
    /* Legacy field: 4-digit domain; current field: 8-digit domain (both upper-case hex). */
    snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%X", domain & 0xffff,
             bus, dev, fn);
    snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%X", domain, bus, dev, fn);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = dev;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = g->pci_subsystem_id;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, pci);
    nv_fill_pci(phys, pci);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetPciInfo_v3(device, pci);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t device, int *major,
                                                           int *minor)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, major && minor);
    *major = g->cc_major;
    *minor = g->cc_minor;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNumGpuCores(nvmlDevice_t device, unsigned int *numCores)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, numCores);
    *numCores = g->sm_count * g->cores_per_sm;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, node);
    if (g->numa_node < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned int)g->numa_node;
    return NVML_SUCCESS;
}

/* Whole-GPU attributes (current drivers answer for full GPUs, not only MIG handles). Engine
 * counts are typical of the architecture; nothing in the simulation uses them. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                   nvmlDeviceAttributes_t *attributes)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, attributes);
    memset(attributes, 0, sizeof(*attributes));
    attributes->multiprocessorCount = g->sm_count;
    attributes->sharedCopyEngineCount = g->arch >= SIM_ARCH_HOPPER ? 8 : 7;
    attributes->sharedDecoderCount = g->arch >= SIM_ARCH_HOPPER ? 7 : 5;
    attributes->sharedEncoderCount = g->arch == SIM_ARCH_ADA ? 2 : 0;
    attributes->sharedJpegCount = g->arch >= SIM_ARCH_HOPPER ? 7 : 1;
    attributes->sharedOfaCount = 1;
    attributes->gpuInstanceSliceCount = g->mig_capable ? 7 : 0;
    attributes->computeInstanceSliceCount = g->mig_capable ? 7 : 0;
    attributes->memorySizeMB = g->memory_total >> 20;
    struct sim_mig_ci_info ci;
    const struct sim_mig_profile *p;
    if (device->mig && nv_mig_info(device, &ci, &p) == NVML_SUCCESS && p) {
        /* A MIG device: its compute instance's SMs, its GPU instance's slices and memory. */
        attributes->multiprocessorCount = ci.sm_count;
        attributes->sharedCopyEngineCount = p->copy_engines;
        attributes->sharedDecoderCount = p->decoders;
        attributes->sharedEncoderCount = p->encoders;
        attributes->sharedJpegCount = p->jpegs;
        attributes->sharedOfaCount = p->ofas;
        attributes->gpuInstanceSliceCount = p->compute_slices;
        attributes->computeInstanceSliceCount = ci.size;
        attributes->memorySizeMB = ci.memory_bytes >> 20;
    }
    return NVML_SUCCESS;
}

static nvmlReturn_t enable_state(nvmlDevice_t device, nvmlEnableState_t *out,
                                 nvmlEnableState_t value)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, out);
    *out = value;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
    return enable_state(device, mode, NVML_FEATURE_ENABLED);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t device, nvmlEnableState_t *display)
{
    return enable_state(device, display, NVML_FEATURE_DISABLED);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t device,
                                                   nvmlEnableState_t *isActive)
{
    return enable_state(device, isActive, NVML_FEATURE_DISABLED);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current,
                                             nvmlEnableState_t *pending)
{
    ARG_OR_RETURN(pending);
    nvmlReturn_t rc = enable_state(device, current, NVML_FEATURE_ENABLED);
    if (rc == NVML_SUCCESS)
        *pending = NVML_FEATURE_ENABLED;
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device,
                                                    nvmlMemoryErrorType_t errorType,
                                                    nvmlEccCounterType_t counterType,
                                                    unsigned long long *eccCounts)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL,
                         eccCounts && (unsigned)errorType < 2 && (unsigned)counterType < 2);
    *eccCounts = 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t device, nvmlComputeMode_t *mode)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, mode);
    *mode = NVML_COMPUTEMODE_DEFAULT;
    return NVML_SUCCESS;
}

/* Windows driver models: not applicable on Linux, where the real call is NOT_SUPPORTED too. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t device, nvmlDriverModel_t *current,
                                                    nvmlDriverModel_t *pending)
{
    DEVICE_OR_RETURN(device, NULL, NULL);
    (void)current;
    (void)pending;
    return NVML_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t device, nvmlDriverModel_t *current,
                                                 nvmlDriverModel_t *pending)
{
    return nvmlDeviceGetDriverModel_v2(device, current, pending);
}

/* Confidential computing is off on simulated GPUs. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetConfComputeMemSizeInfo(nvmlDevice_t device,
                                                            nvmlConfComputeMemSizeInfo_t *memInfo)
{
    DEVICE_OR_RETURN(device, NULL, NULL);
    (void)memInfo;
    return NVML_ERROR_NOT_SUPPORTED;
}

/* ---- readings derived from utilisation ---------------------------------------------------- */

static unsigned int util_now(int phys) { return sim_utilization(phys, 0, 0); }

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                 nvmlTemperatureSensors_t sensorType,
                                                 unsigned int *temp)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, temp && sensorType == NVML_TEMPERATURE_GPU);
    *temp = 32 + util_now(phys) * 40 / 100;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_t *temperature)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, temperature);
    if (temperature->version != nvmlTemperature_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    ARG_OR_RETURN(temperature->sensorType == NVML_TEMPERATURE_GPU);
    temperature->temperature = (int)(32 + util_now(phys) * 40 / 100);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device,
                                                          nvmlTemperatureThresholds_t thresholdType,
                                                          unsigned int *temp)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, temp);
    switch (thresholdType) {
    case NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: *temp = 92; break;
    case NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: *temp = 89; break;
    case NVML_TEMPERATURE_THRESHOLD_MEM_MAX: *temp = 95; break;
    case NVML_TEMPERATURE_THRESHOLD_GPU_MAX: *temp = 87; break;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, &phys, &g, power);
    unsigned long long limit = g->power_limit_mw;
    *power = (unsigned int)(limit * (20 + util_now(phys) * 70 / 100) / 100);
    return NVML_SUCCESS;
}

static nvmlReturn_t power_limit(nvmlDevice_t device, unsigned int *limit)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, limit);
    *limit = g->power_limit_mw;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_limit(device, limit);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
    return power_limit(device, limit);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t device,
                                                                 unsigned int *defaultLimit)
{
    return power_limit(device, defaultLimit);
}

static nvmlReturn_t clock_of(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock,
                             int current)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, &phys, &g, clock);
    unsigned int max;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: max = g->max_sm_clock_mhz; break;
    case NVML_CLOCK_MEM: max = g->max_mem_clock_mhz; break;
    case NVML_CLOCK_VIDEO: max = g->max_sm_clock_mhz * 9 / 10; break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (current && type != NVML_CLOCK_MEM && util_now(phys) == 0)
        max = max * 3 / 10;
    *clock = max;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                               unsigned int *clock)
{
    return clock_of(device, type, clock, 1);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type,
                                                  unsigned int *clock)
{
    return clock_of(device, type, clock, 0);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t device, unsigned int *speed)
{
    DEVICE_OR_RETURN(device, NULL, NULL);
    (void)speed;
    return NVML_ERROR_NOT_SUPPORTED;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t device, unsigned int *numFans)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, numFans);
    *numFans = 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, pState);
    *pState = util_now(phys) > 0 ? NVML_PSTATE_0 : NVML_PSTATE_8;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t device, nvmlPstates_t *pState)
{
    return nvmlDeviceGetPerformanceState(device, pState);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                               unsigned long long *reasons)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, reasons);
    *reasons = util_now(phys) == 0 ? 0x1ULL /* GPU idle */ : 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                                  unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

/* PCIe link: Gen5 x16 on Hopper, Gen4 x16 otherwise; no simulated PCIe traffic. */
static nvmlReturn_t pcie_link(nvmlDevice_t device, unsigned int *out, int want_gen)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, out);
    *out = want_gen ? (g->arch >= SIM_ARCH_HOPPER ? 5 : 4) : 16;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *g)
{
    return pcie_link(device, g, 1);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *g)
{
    return pcie_link(device, g, 1);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *w)
{
    return pcie_link(device, w, 0);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *w)
{
    return pcie_link(device, w, 0);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device,
                                                    nvmlPcieUtilCounter_t counter,
                                                    unsigned int *value)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, value && (unsigned)counter < 2);
    *value = 0;
    return NVML_SUCCESS;
}
