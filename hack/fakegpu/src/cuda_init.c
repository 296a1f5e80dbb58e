/*
 * cuda_init.c - driver initialisation, device enumeration, version and error strings.
 *
 * cuInit attaches to the simulated node (simstate), takes the container's GPU view
 * (NVIDIA_VISIBLE_DEVICES, applied by the state) and applies CUDA_VISIBLE_DEVICES on top of it
 * with the real driver's rules, which fixes the CUDA ordinal -> physical GPU map for the life of
 * the process. Everything else in the library checks cu_check_init() first, as the real driver
 * returns CUDA_ERROR_NOT_INITIALIZED before cuInit.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "cuda_internal.h"

struct cu_driver cu_drv = {
    .init_result = CUDA_ERROR_NOT_INITIALIZED,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

static pthread_once_t cu_init_once = PTHREAD_ONCE_INIT;

static unsigned long long env_ull(const char *name, unsigned long long dflt) {
    const char *v = getenv(name);
    if (v == NULL || *v == '\0') return dflt;
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0') {
        fprintf(stderr, "vgpu-sim: ignoring %s=%s (expected a non-negative integer)\n", name, v);
        return dflt;
    }
    return x;
}

static void read_config(struct cu_config *cfg) {
    cfg->kernel_wave_ns = env_ull("VGPU_SIM_KERNEL_NS", 20000);
    cfg->launch_ns = env_ull("VGPU_SIM_LAUNCH_NS", 2000);
    cfg->max_queue_ns = env_ull("VGPU_SIM_MAX_QUEUE_NS", 20000000);
    cfg->backing_max = env_ull("VGPU_SIM_BACKING_MAX", 64ULL << 20);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    unsigned long long ram =
        pages > 0 && page > 0 ? (unsigned long long)pages * (unsigned long long)page : 0;
    cfg->host_memory = env_ull("VGPU_SIM_HOST_MEMORY", ram);
    cfg->trace = (int)env_ull("VGPU_SIM_CUDA_TRACE", 0);
    /* CUDA_MODULE_LOADING=EAGER|LAZY|DEFAULT, read once at cuInit as the driver does. */
    const char *loading = getenv("CUDA_MODULE_LOADING");
    cfg->module_loading = 0;
    if (loading != NULL && strcasecmp(loading, "EAGER") == 0)
        cfg->module_loading = CU_MODULE_EAGER_LOADING;
    else if (loading != NULL && strcasecmp(loading, "LAZY") == 0)
        cfg->module_loading = CU_MODULE_LAZY_LOADING;
    else if (loading != NULL && *loading != '\0' && strcasecmp(loading, "DEFAULT") != 0)
        fprintf(stderr, "vgpu-sim: ignoring CUDA_MODULE_LOADING=%s (expected EAGER, LAZY or "
                        "DEFAULT)\n", loading);
}

/* Case-insensitive "does `s` start with `prefix`". */
static int has_prefix_ci(const char *s, const char *prefix) {
    return strncasecmp(s, prefix, strlen(prefix)) == 0;
}

/* One CUDA_VISIBLE_DEVICES entry -> index into `visible`, or -1 if it names no single GPU. */
static int match_entry(const char *entry, const int *visible, int nvisible) {
    if (*entry == '\0') return -1;
    if (entry[0] >= '0' && entry[0] <= '9') {
        char *end = NULL;
        long idx = strtol(entry, &end, 10);
        if (*end != '\0' || idx < 0 || idx >= nvisible) return -1;
        return (int)idx;
    }
    /* A MIG device: its parent GPU, with this process confined to the instance (simstate.h). */
    if (has_prefix_ci(entry, "MIG-")) {
        int parent = sim_mig_find_uuid(entry, NULL);
        for (int i = 0; parent >= 0 && i < nvisible; i++)
            if (visible[i] == parent) return sim_mig_bind_uuid(entry) == parent ? i : -1;
        return -1;
    }
    /* A UUID, "GPU-" prefixed, possibly abbreviated to any unique prefix. */
    if (!has_prefix_ci(entry, "GPU-")) return -1;
    int found = -1;
    for (int i = 0; i < nvisible; i++) {
        const struct sim_gpu_info *g = sim_gpu(visible[i]);
        if (g == NULL || !has_prefix_ci(g->uuid, entry)) continue;
        if (found >= 0) return -1; /* ambiguous */
        found = i;
    }
    return found;
}

int cu_parse_visible_devices(const char *spec, const int *visible, int nvisible, int *out,
                             int max) {
    if (spec == NULL) { /* unset: every GPU of the container view */
        int n = nvisible < max ? nvisible : max;
        memcpy(out, visible, (size_t)n * sizeof(int));
        return n;
    }
    int n = 0;
    const char *p = spec;
    while (*p != '\0' && n < max) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char entry[128];
        /* Trim blanks; an over-long entry cannot be valid and ends the list. */
        while (len > 0 && (*p == ' ' || *p == '\t')) p++, len--;
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len >= sizeof(entry)) break;
        memcpy(entry, p, len);
        entry[len] = '\0';
        int idx = match_entry(entry, visible, nvisible);
        if (idx < 0) break;
        int dup = 0;
        for (int i = 0; i < n; i++) dup |= out[i] == visible[idx];
        if (dup) break; /* a repeated device is invalid too */
        out[n++] = visible[idx];
        if (comma == NULL) break;
        p = comma + 1;
    }
    return n;
}

/* Fork safety: no thread may hold the driver lock across fork(), or the child would inherit it
 * locked forever. The child then keeps the parent's view (devices, contexts, allocations), and
 * may cuInit and allocate on its own; see cu_uncharge() for inherited allocations. */
static void before_fork(void) { pthread_mutex_lock(&cu_drv.lock); }
static void after_fork(void) { pthread_mutex_unlock(&cu_drv.lock); }

static void do_init(void) {
    pthread_atfork(before_fork, after_fork, after_fork);
    read_config(&cu_drv.cfg);
    if (sim_attach() != 0) {
        cu_drv.init_result = CUDA_ERROR_NO_DEVICE;
        return;
    }
    int visible[SIM_MAX_GPUS];
    int nvisible = sim_visible_gpus(visible, SIM_MAX_GPUS);
    cu_drv.count = cu_parse_visible_devices(getenv("CUDA_VISIBLE_DEVICES"), visible, nvisible,
                                            cu_drv.phys, SIM_MAX_GPUS);
    cu_drv.initialized = 1;
    /* As the real driver: no usable device is an initialisation failure. */
    cu_drv.init_result = cu_drv.count > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

CU_API CUresult cuInit(unsigned int Flags) {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&cu_init_once, do_init);
    return cu_drv.init_result;
}

CUresult cu_check_init(void) {
    return cu_drv.init_result == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cu_phys_alive(int phys) {
    return (sim_gpu_flags(phys) & SIM_GPU_LOST) ? CUDA_ERROR_DEVICE_UNAVAILABLE : CUDA_SUCCESS;
}

CUresult cu_device_phys(CUdevice dev, int *phys_out) {
    CU_TRY(cu_check_init());
    if (dev < 0 || dev >= cu_drv.count) return CUDA_ERROR_INVALID_DEVICE;
    CU_TRY(cu_phys_alive(cu_drv.phys[dev]));
    *phys_out = cu_drv.phys[dev];
    return CUDA_SUCCESS;
}

/* Sleep until t_ns. A plain timed sleep overshoots by the thread's timer slack (50 us by
 * default) plus the wake-up latency, which would make every synchronisation far slower than a
 * real GPU's few microseconds. So the thread sleeps (with a 1 us timer slack, set once per
 * thread) until YIELD_NS before the deadline, then polls the clock, yielding the CPU between
 * polls - the real driver's "spin, then yield" behaviour, which stays cheap for the other
 * simulated processes on a busy machine. */
#define YIELD_NS 50000ULL

static __thread int slack_set;

void cu_sleep_until(unsigned long long t_ns) {
    unsigned long long now = sim_now_ns();
    if (t_ns <= now) return;
    if (t_ns - now > YIELD_NS) {
        if (!slack_set) {
            (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);
            slack_set = 1;
        }
        unsigned long long wake = t_ns - YIELD_NS;
        struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000ULL),
                              .tv_nsec = (long)(wake % 1000000000ULL)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
        }
    }
    while (sim_now_ns() < t_ns) sched_yield();
}

CU_API CUresult cuDriverGetVersion(int *driverVersion) {
    if (driverVersion == NULL) return CUDA_ERROR_INVALID_VALUE;
    /* Works before cuInit, as the real one does; needs the state only for the number. */
    const struct sim_node_info *node = sim_attach() == 0 ? sim_node() : NULL;
    *driverVersion = node != NULL && node->cuda_driver_version > 0 ? node->cuda_driver_version
                                                                   : 13000;
    return CUDA_SUCCESS;
}

/* ---- Error names and strings ----------------------------------------------------------------- */

struct cu_error_text {
    CUresult code;
    const char *name;
    const char *text;
};

static const struct cu_error_text cu_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_STUB_LIBRARY, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA_ERROR_DEVICE_UNAVAILABLE",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
     "peer access is not supported between these two devices"},
    {CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
     "peer access is already enabled"},
    {CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "CUDA_ERROR_PEER_ACCESS_NOT_ENABLED",
     "peer access has not been enabled"},
    {CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "CUDA_ERROR_CONTEXT_ALREADY_CURRENT",
     "context already current"},
    {CUDA_ERROR_MAP_FAILED, "CUDA_ERROR_MAP_FAILED", "mapping of buffer object failed"},
    {CUDA_ERROR_UNMAP_FAILED, "CUDA_ERROR_UNMAP_FAILED", "unmapping of buffer object failed"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_INVALID_SOURCE, "CUDA_ERROR_INVALID_SOURCE", "device kernel image is invalid"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_OPERATING_SYSTEM, "CUDA_ERROR_OPERATING_SYSTEM", "OS call failed"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed "
                                                           "in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
     "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
     "too many blocks in cooperative launch"},
    {CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE",
     "cannot set while device is active in this process"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED",
     "context is destroyed"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const struct cu_error_text *find_error(CUresult error) {
    for (size_t i = 0; i < sizeof(cu_errors) / sizeof(cu_errors[0]); i++)
        if (cu_errors[i].code == error) return &cu_errors[i];
    return NULL;
}

CU_API CUresult cuGetErrorName(CUresult error, const char **pStr) {
    if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
    const struct cu_error_text *e = find_error(error);
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CU_API CUresult cuGetErrorString(CUresult error, const char **pStr) {
    if (pStr == NULL) return CUDA_ERROR_INVALID_VALUE;
    const struct cu_error_text *e = find_error(error);
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
