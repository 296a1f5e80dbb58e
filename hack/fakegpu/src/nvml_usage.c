/*
 * nvml_usage.c - fake NVML: what the GPUs are being used for, read from the shared node state
 * that the fake CUDA driver writes: memory (per GPU and per process), the running compute
 * processes, and SM utilisation.
 *
 * Utilisation model: `gpu` is the fraction of the last SIM_UTIL_WINDOW_NS (1/6 s, NVML's
 * shortest sample period) during which simulated kernels occupied the SMs; `memory` (bandwidth
 * utilisation, not capacity) is reported as half of it. Per-process samples are each process's
 * share of busy time since the caller's lastSeenTimeStamp (at most the last second), with
 * CLOCK_REALTIME microsecond timestamps like the real library. Reserved memory is 0, so
 * free = total - used exactly.
 */
#include <string.h>
#include <time.h>

#include "nvml_internal.h"

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long used = sim_mem_used(phys);
    memory->total = g->memory_total;
    memory->used = used;
    memory->free = used < g->memory_total ? g->memory_total - used : 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    if (!memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long used = sim_mem_used(phys);
    memory->total = g->memory_total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = used < g->memory_total ? g->memory_total - used : 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    if (!bar1)
        return NVML_ERROR_INVALID_ARGUMENT;
    /* Data-centre GPUs map all of device memory through BAR1; nothing is mapped here. */
    bar1->bar1Total = g->memory_total;
    bar1->bar1Used = 0;
    bar1->bar1Free = g->memory_total;
    return NVML_SUCCESS;
}

/* ---- running processes ------------------------------------------------------------------- */

enum proc_layout { PROC_V1, PROC_V2 };

static nvmlReturn_t running_processes(nvmlDevice_t device, unsigned int *infoCount, void *infos,
                                      enum proc_layout layout, int compute)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    (void)g;
    if (!infoCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_proc_usage procs[SIM_MAX_PROCS];
    /* Every simulated process is a compute (CUDA) process; none draws graphics. */
    int n = compute ? sim_processes(phys, procs, SIM_MAX_PROCS) : 0;
    if (n > SIM_MAX_PROCS)
        n = SIM_MAX_PROCS;
    if (*infoCount < (unsigned int)n || (n > 0 && !infos)) {
        *infoCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        if (layout == PROC_V1) {
            nvmlProcessInfo_v1_t *p = (nvmlProcessInfo_v1_t *)infos + i;
            p->pid = (unsigned int)procs[i].pid;
            p->usedGpuMemory = procs[i].bytes;
        } else {
            nvmlProcessInfo_v2_t *p = (nvmlProcessInfo_v2_t *)infos + i;
            p->pid = (unsigned int)procs[i].pid;
            p->usedGpuMemory = procs[i].bytes;
            p->gpuInstanceId = 0xFFFFFFFFu; /* no MIG */
            p->computeInstanceId = 0xFFFFFFFFu;
        }
    }
    *infoCount = (unsigned int)n;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                             unsigned int *infoCount,
                                                             nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos, PROC_V1, 1);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, infoCount, infos, PROC_V2, 1);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                unsigned int *infoCount,
                                                                nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, PROC_V2, 1);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_v1_t *infos)
{
    return running_processes(device, infoCount, infos, PROC_V1, 0);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_v2_t *infos)
{
    return running_processes(device, infoCount, infos, PROC_V2, 0);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, PROC_V2, 0);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                   unsigned int *infoCount,
                                                                   nvmlProcessInfo_t *infos)
{
    return running_processes(device, infoCount, infos, PROC_V2, 0);
}

/* Process modes of nvmlProcessDetailList_t (named only in CUDA 13's header). */
#define PROC_MODE_COMPUTE 0u
#define PROC_MODE_ALL 3u

SIM_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                              nvmlProcessDetailList_t *plist)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    (void)g;
    if (!plist || plist->mode > PROC_MODE_ALL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (plist->version != nvmlProcessDetailList_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct sim_proc_usage procs[SIM_MAX_PROCS];
    int compute = plist->mode == PROC_MODE_COMPUTE || plist->mode == PROC_MODE_ALL;
    int n = compute ? sim_processes(phys, procs, SIM_MAX_PROCS) : 0;
    if (n > SIM_MAX_PROCS)
        n = SIM_MAX_PROCS;
    if (plist->numProcArrayEntries < (unsigned int)n || (n > 0 && !plist->procArray)) {
        plist->numProcArrayEntries = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        nvmlProcessDetail_v1_t *p = &plist->procArray[i];
        p->pid = (unsigned int)procs[i].pid;
        p->usedGpuMemory = procs[i].bytes;
        p->gpuInstanceId = 0xFFFFFFFFu;
        p->computeInstanceId = 0xFFFFFFFFu;
        p->usedGpuCcProtectedMemory = 0;
    }
    plist->numProcArrayEntries = (unsigned int)n;
    return NVML_SUCCESS;
}

/* ---- utilisation --------------------------------------------------------------------------- */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                      nvmlUtilization_t *utilization)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    (void)g;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    utilization->gpu = sim_utilization(phys, 0, 0);
    utilization->memory = utilization->gpu / 2;
    return NVML_SUCCESS;
}

/* CLOCK_REALTIME minus CLOCK_MONOTONIC, in ns, to convert NVML timestamps. */
static long long realtime_offset_ns(void)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    long long real = (long long)rt.tv_sec * 1000000000LL + rt.tv_nsec;
    return real - (long long)sim_now_ns();
}

/* Samples newer than lastSeen (CLOCK_REALTIME us); returns how many, timestamps converted. */
static int process_samples(int phys, unsigned long long lastSeen, struct sim_proc_util *out,
                           unsigned long long *stamps_us)
{
    long long off = realtime_offset_ns();
    long long since = lastSeen ? (long long)(lastSeen * 1000ULL) - off : 0;
    int n = sim_process_utilization(phys, since > 0 ? (unsigned long long)since : 0, out,
                                    SIM_MAX_PROCS);
    for (int i = 0; i < n; i++)
        stamps_us[i] = (unsigned long long)(((long long)out[i].last_ns + off) / 1000);
    return n;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t *utilization,
                                                        unsigned int *processSamplesCount,
                                                        unsigned long long lastSeenTimeStamp)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    (void)g;
    if (!processSamplesCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_proc_util s[SIM_MAX_PROCS];
    unsigned long long stamps[SIM_MAX_PROCS];
    int n = process_samples(phys, lastSeenTimeStamp, s, stamps);
    if (n == 0)
        return NVML_ERROR_NOT_FOUND; /* no samples since lastSeenTimeStamp */
    if (!utilization || *processSamplesCount < (unsigned int)n) {
        *processSamplesCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        memset(&utilization[i], 0, sizeof(utilization[i]));
        utilization[i].pid = (unsigned int)s[i].pid;
        utilization[i].timeStamp = stamps[i];
        utilization[i].smUtil = s[i].sm_util;
        utilization[i].memUtil = s[i].sm_util / 2;
    }
    *processSamplesCount = (unsigned int)n;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t device,
                                                              nvmlProcessesUtilizationInfo_t *info)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    (void)g;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct sim_proc_util s[SIM_MAX_PROCS];
    unsigned long long stamps[SIM_MAX_PROCS];
    int n = process_samples(phys, info->lastSeenTimeStamp, s, stamps);
    if (n == 0)
        return NVML_ERROR_NOT_FOUND;
    if (!info->procUtilArray || info->processSamplesCount < (unsigned int)n) {
        info->processSamplesCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        nvmlProcessUtilizationInfo_v1_t *u = &info->procUtilArray[i];
        memset(u, 0, sizeof(*u));
        u->pid = (unsigned int)s[i].pid;
        u->timeStamp = stamps[i];
        u->smUtil = s[i].sm_util;
        u->memUtil = s[i].sm_util / 2;
    }
    info->processSamplesCount = (unsigned int)n;
    return NVML_SUCCESS;
}

static nvmlReturn_t codec_util(nvmlDevice_t device, unsigned int *util, unsigned int *period)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_OR_RETURN(device, &phys, &g);
    (void)g;
    if (!util || !period)
        return NVML_ERROR_INVALID_ARGUMENT;
    *util = 0; /* no simulated video engines work */
    *period = (unsigned int)(SIM_UTIL_WINDOW_NS / 1000);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t device, unsigned int *u,
                                                        unsigned int *samplingPeriodUs)
{
    return codec_util(device, u, samplingPeriodUs);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t device, unsigned int *u,
                                                        unsigned int *samplingPeriodUs)
{
    return codec_util(device, u, samplingPeriodUs);
}
