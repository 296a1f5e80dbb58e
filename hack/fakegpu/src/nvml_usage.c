/*
 * nvml_usage.c - fake NVML: what the GPUs are being used for, read from the shared node state
 * that the fake CUDA driver writes: memory (per GPU and per process), the running compute
 * processes, and SM utilisation.
 *
 * Utilisation has two models, chosen by VGPU_SIM_UTIL_SAMPLING (read once per process):
 *
 *   exact (default): `gpu` is the busy fraction of the last SIM_UTIL_WINDOW_NS (1/6 s);
 *     per-process samples are each process's share of busy time from the caller's
 *     lastSeenTimeStamp to now (at most the last second). A controller polling with its
 *     previous call time gets exact figures for its own interval.
 *
 *   realistic: what real drivers do. The driver samples each GPU once per sample period
 *     (VGPU_SIM_UTIL_PERIOD_US, default 166667 = 1/6 s; boundaries on a fixed grid, each moved
 *     later by up to VGPU_SIM_UTIL_JITTER_US, default 0, pseudo-randomly per period) and keeps
 *     the last second of samples. `gpu` is the busy percentage of the latest *completed*
 *     period. nvmlDeviceGetProcessUtilization(lastSeen) averages, per process, the integer
 *     percentages of the completed periods that ended after lastSeen, stamped with the end of
 *     the latest period in which the process ran; no completed period since lastSeen =
 *     NVML_ERROR_NOT_FOUND. So a poller gets nothing new between period ends, and figures
 *     that lag by up to one period.
 *
 * Timestamps are CLOCK_REALTIME microseconds like the real library's. `memory` (bandwidth
 * utilisation, not capacity) is reported as half of `gpu`. Reserved memory is 0, so
 * free = total - used exactly.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nvml_internal.h"

/* Total and used memory of a GPU, or of a MIG device: its GPU instance's memory and what the
 * processes on that GPU instance hold. */
static void memory_of(nvmlDevice_t device, int phys, const struct sim_gpu_info *g,
                      unsigned long long *total, unsigned long long *used)
{
    struct sim_mig_ci_info ci;
    if (device->mig && nv_mig_info(device, &ci, NULL) == NVML_SUCCESS) {
        *total = ci.memory_bytes;
        *used = sim_mig_mem_used(phys, ci.gi_id);
        return;
    }
    *total = g->memory_total;
    *used = sim_mem_used(phys);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, &phys, &g, memory);
    unsigned long long total, used;
    memory_of(device, phys, g, &total, &used);
    memory->total = total;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    int phys;
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, &phys, &g, memory);
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total, used;
    memory_of(device, phys, g, &total, &used);
    memory->total = total;
    memory->reserved = 0;
    memory->used = used;
    memory->free = used < total ? total - used : 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t device, nvmlBAR1Memory_t *bar1)
{
    const struct sim_gpu_info *g;
    DEVICE_ARG_OR_RETURN(device, NULL, &g, bar1);
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
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, infoCount);
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

/* The seven running-process exports differ only in the element type of `infos`, its layout and
 * whether they list compute processes: X(name, element type, layout, compute). */
#define RUNNING_PROCESS_CALLS(X)                                                        \
    X(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t, PROC_V1, 1)           \
    X(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_v2_t, PROC_V2, 1)        \
    X(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t, PROC_V2, 1)           \
    X(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t, PROC_V1, 0)          \
    X(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_v2_t, PROC_V2, 0)       \
    X(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t, PROC_V2, 0)          \
    X(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t, PROC_V2, 0)

#define DEFINE_RUNNING_PROCESS_CALL(name, info_t, layout, compute)                      \
    SIM_EXPORT nvmlReturn_t name(nvmlDevice_t device, unsigned int *infoCount, info_t *infos) \
    {                                                                                   \
        return running_processes(device, infoCount, infos, layout, compute);            \
    }
RUNNING_PROCESS_CALLS(DEFINE_RUNNING_PROCESS_CALL)
#undef DEFINE_RUNNING_PROCESS_CALL

/* Process modes of nvmlProcessDetailList_t (named only in CUDA 13's header). */
#define PROC_MODE_COMPUTE 0u
#define PROC_MODE_ALL 3u

SIM_EXPORT nvmlReturn_t nvmlDeviceGetRunningProcessDetailList(nvmlDevice_t device,
                                                              nvmlProcessDetailList_t *plist)
{
    int phys;
    DEVICE_OR_RETURN(device, &phys, NULL);
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

/* ---- the sampling model ------------------------------------------------------------------ */

#define SAMPLE_BUFFER_NS 1000000000ULL /* the driver keeps about a second of samples */
#define MAX_PERIODS 64

struct sampling {
    int realistic;
    unsigned long long period_ns, jitter_ns;
};

static struct sampling sampling_config(void)
{
    static struct sampling cfg;
    static int loaded; /* racy but idempotent: every thread computes the same values */
    if (__atomic_load_n(&loaded, __ATOMIC_ACQUIRE))
        return cfg;
    struct sampling c = {0, SIM_UTIL_WINDOW_NS, 0};
    const char *mode = getenv("VGPU_SIM_UTIL_SAMPLING");
    c.realistic = mode != NULL && strcmp(mode, "realistic") == 0;
    const char *period = getenv("VGPU_SIM_UTIL_PERIOD_US");
    if (period != NULL && strtoull(period, NULL, 10) >= 1000)
        c.period_ns = strtoull(period, NULL, 10) * 1000ULL;
    const char *jitter = getenv("VGPU_SIM_UTIL_JITTER_US");
    if (jitter != NULL)
        c.jitter_ns = strtoull(jitter, NULL, 10) * 1000ULL;
    if (c.jitter_ns >= c.period_ns)
        c.jitter_ns = c.period_ns / 2; /* boundaries must stay in order */
    cfg = c;
    __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
    return cfg;
}

/* End of sample period k on the sim_now_ns() clock: the grid point plus a per-period jitter
 * (a hash of k and the GPU, so every process sees the same boundaries). */
static unsigned long long period_end(const struct sampling *c, int phys, unsigned long long k)
{
    unsigned long long j = 0;
    if (c->jitter_ns > 0) {
        unsigned long long h = (k + 1) * 0x9E3779B97F4A7C15ULL ^ (unsigned long long)phys << 32;
        h ^= h >> 29;
        h *= 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 32;
        j = h % (c->jitter_ns + 1);
    }
    return (k + 1) * c->period_ns + j;
}

/* Index of the latest period completed at `now`. */
static unsigned long long last_completed(const struct sampling *c, int phys,
                                         unsigned long long now)
{
    unsigned long long k = now / c->period_ns;
    while (k > 0 && period_end(c, phys, k) > now)
        k--;
    return k;
}

/* CLOCK_REALTIME minus CLOCK_MONOTONIC, in ns, to convert NVML timestamps. */
static long long realtime_offset_ns(void)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    long long real = (long long)rt.tv_sec * 1000000000LL + rt.tv_nsec;
    return real - (long long)sim_now_ns();
}

static unsigned int percent(unsigned long long busy, unsigned long long span)
{
    unsigned int pct = span ? (unsigned int)((busy * 100 + span / 2) / span) : 0;
    return pct > 100 ? 100 : pct;
}

/* Realistic per-process samples: the completed periods ending after `since` (sim clock). */
static int period_samples(int phys, unsigned long long since, struct sim_proc_util *out)
{
    struct sampling c = sampling_config();
    unsigned long long now = sim_now_ns();
    unsigned long long oldest = now > SAMPLE_BUFFER_NS ? now - SAMPLE_BUFFER_NS : 0;
    if (since < oldest)
        since = oldest;
    unsigned long long k = last_completed(&c, phys, now);
    unsigned long long first = k;
    int periods = 0;
    while (periods < MAX_PERIODS && first > 0 && period_end(&c, phys, first) > since) {
        first--;
        periods++;
    }
    if (periods == 0)
        return 0;
    /* Periods first+1 .. k; period i spans [end(i-1), end(i)). */
    unsigned int sum[SIM_MAX_PROCS] = {0};
    int n = 0;
    for (unsigned long long i = first + 1; i <= k; i++) {
        unsigned long long lo = period_end(&c, phys, i - 1), hi = period_end(&c, phys, i);
        struct sim_proc_busy busy[SIM_MAX_PROCS];
        int m = sim_process_busy(phys, lo, hi, busy, SIM_MAX_PROCS);
        for (int b = 0; b < m; b++) {
            int j;
            for (j = 0; j < n; j++)
                if (out[j].pid == busy[b].pid)
                    break;
            if (j == n) {
                if (n == SIM_MAX_PROCS)
                    continue;
                out[n].pid = busy[b].pid;
                n++;
            }
            sum[j] += percent(busy[b].busy_ns, hi - lo);
            out[j].last_ns = hi;
        }
    }
    for (int j = 0; j < n; j++)
        out[j].sm_util = (sum[j] + (unsigned)periods / 2) / (unsigned)periods;
    return n;
}

/* Samples newer than lastSeen (CLOCK_REALTIME us); returns how many, timestamps converted. */
static int process_samples(int phys, unsigned long long lastSeen, struct sim_proc_util *out,
                           unsigned long long *stamps_us)
{
    long long off = realtime_offset_ns();
    long long since = lastSeen ? (long long)(lastSeen * 1000ULL) - off : 0;
    unsigned long long since_ns = since > 0 ? (unsigned long long)since : 0;
    struct sampling c = sampling_config();
    if (c.realistic && lastSeen) {
        /* A sample is new when its microsecond stamp is later than lastSeen. */
        long long first_new = (long long)((lastSeen + 1) * 1000ULL) - off - 1;
        since_ns = first_new > 0 ? (unsigned long long)first_new : 0;
    }
    int n = c.realistic ? period_samples(phys, since_ns, out)
                        : sim_process_utilization(phys, since_ns, out, SIM_MAX_PROCS);
    for (int i = 0; i < n; i++)
        stamps_us[i] = (unsigned long long)(((long long)out[i].last_ns + off) / 1000);
    return n;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                      nvmlUtilization_t *utilization)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, utilization);
    unsigned int mig_current, mig_pending;
    if (device->mig || (sim_mig_mode(phys, &mig_current, &mig_pending) == 0 && mig_current))
        return NVML_ERROR_NOT_SUPPORTED; /* as real NVML in MIG mode (DCGM measures instances) */
    struct sampling c = sampling_config();
    if (c.realistic) {
        /* The latest completed sample period. */
        unsigned long long k = last_completed(&c, phys, sim_now_ns());
        unsigned long long lo = k > 0 ? period_end(&c, phys, k - 1) : 0, hi = period_end(&c, phys, k);
        /* Every process's work, also those the caller cannot see or name (another container's). */
        unsigned long long total = k > 0 ? sim_busy_total(phys, lo, hi) : 0;
        utilization->gpu = percent(total, hi - lo);
    } else {
        utilization->gpu = sim_utilization(phys, 0, 0);
    }
    utilization->memory = utilization->gpu / 2;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t *utilization,
                                                        unsigned int *processSamplesCount,
                                                        unsigned long long lastSeenTimeStamp)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, processSamplesCount);
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
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, info);
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
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, util && period);
    *util = 0; /* no simulated video engines work */
    *period = (unsigned int)(sampling_config().period_ns / 1000);
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
