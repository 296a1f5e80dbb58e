/*
 * launch.c - kernel launches draw from the claim's per-device token bucket (compute cap).
 *
 * Fast path: when no configured device has a compute cap, a launch costs one atomic load and
 * a predictable branch before the real call. Otherwise the device of the calling context comes
 * from a per-thread cache (context.c: no driver call), the launch is charged to the bucket with
 * one atomic add, and only a launch the bucket does not cover (or every 16th of a thread) reads
 * the clock, steps the fallback controller if due, and waits for its tokens.
 *
 * The refill rate normally comes from the node governor (kubelet_plugin/governor.py), which
 * samples NVML once per GPU. When the governor has not written for GOVERNOR_STALE_NS, the
 * in-process controller takes over: one process of the claim at a time (elected by CAS on
 * ctl_stamp_ns, bucket.c vgpu_ctl_poll) samples NVML through sample_util below and runs the
 * same controller as the governor.
 */

#include <math.h>
#include <string.h>
#include <time.h>

#include "vgpu.h"

#define GOVERNOR_STALE_NS 2000000000ULL /* governor considered gone after 2 s of silence */

/* The fallback controller's sampler (vgpu_sampler, bucket.c): utilisation of the whole GPU and
 * of this claim's processes, in points, from NVML samples newer than `age_ns` ago.
 * VGPU_SAMPLE_NOTHING_NEW: NVML has none (real drivers publish one per sample period, ~1/6 s;
 * the simulator's realistic mode too), so the window is merged into the next one. */
static enum vgpu_sample_result sample_util(void *ctx, uint64_t age_ns, double *device_util,
                                           double *claim_util) {
    struct vgpu_dev *d = ctx;
    static _Atomic int nvml_state; /* 0 untried, 1 ok, -1 failed */
    if (!vgpu_nvml_load()) return VGPU_SAMPLE_FAILED;
    int st = atomic_load(&nvml_state);
    if (st == 0) {
        st = (vgpu_nvml.nvmlInit_v2_ && vgpu_nvml.nvmlInit_v2_() == NVML_SUCCESS) ? 1 : -1;
        atomic_store(&nvml_state, st);
    }
    if (st < 0) return VGPU_SAMPLE_FAILED;
    nvmlDevice_t h = __atomic_load_n(&d->nvml, __ATOMIC_RELAXED);
    if (h == NULL) {
        if (vgpu_nvml.nvmlDeviceGetHandleByUUID_ == NULL ||
            vgpu_nvml.nvmlDeviceGetHandleByUUID_(d->conf.uuid, &h) != NVML_SUCCESS)
            return VGPU_SAMPLE_FAILED;
        __atomic_store_n(&d->nvml, h, __ATOMIC_RELAXED);
    }
    nvmlUtilization_t u;
    if (vgpu_nvml.nvmlDeviceGetUtilizationRates_ == NULL ||
        vgpu_nvml.nvmlDeviceGetUtilizationRates_(h, &u) != NVML_SUCCESS)
        return VGPU_SAMPLE_FAILED;
    *device_util = u.gpu;
    *claim_util = u.gpu; /* conservative default: all of it is ours */
    if (vgpu_nvml.nvmlDeviceGetProcessUtilization_ == NULL) return VGPU_SAMPLE_OK;
    nvmlProcessUtilizationSample_t samples[64];
    unsigned int count = 64;
    /* Per-process samples newer than the last one consumed (NVML stamps are wall-clock us). */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    unsigned long long now_us =
        (unsigned long long)wall.tv_sec * 1000000ULL + (unsigned long long)wall.tv_nsec / 1000;
    unsigned long long since = now_us - age_ns / 1000;
    nvmlReturn_t rc = vgpu_nvml.nvmlDeviceGetProcessUtilization_(h, samples, &count, since);
    if (rc == NVML_ERROR_NOT_FOUND) return VGPU_SAMPLE_NOTHING_NEW;
    if (rc != NVML_SUCCESS) return VGPU_SAMPLE_OK;
    struct vgpu_region *r = d->region->map;
    double ours = 0, all = 0;
    bool matched = false;
    for (unsigned i = 0; i < count && i < 64; i++) all += samples[i].smUtil;
    for (unsigned i = 0; i < count && i < 64; i++) {
        for (int s = 0; s < VGPU_MAX_SLOTS; s++) {
            if ((unsigned)atomic_load(&r->slots[s].pid) == samples[i].pid) {
                ours += samples[i].smUtil;
                matched = true;
                break;
            }
        }
    }
    /* Inside a pid namespace NVML reports host pids that never match ours; then keep the
     * conservative whole-GPU figure. Once a sample has matched, pids are comparable, and a
     * window without our pids means we did not run (counting others' work as ours would
     * starve a throttled claim further). */
    static _Atomic bool pids_comparable;
    if (matched) atomic_store(&pids_comparable, true);
    if (matched || (atomic_load(&pids_comparable) && count > 0)) {
        *claim_util = ours;
        /* Same window as ours: the balance policy compares the two. */
        *device_util = all < 100 ? all : 100;
    }
    return VGPU_SAMPLE_OK;
}

static void maybe_step_controller(struct vgpu_dev *d, struct vgpu_region_device *rd,
                                  uint64_t now) {
    uint64_t gov = atomic_load_explicit(&rd->governor_stamp_ns, memory_order_relaxed);
    if (gov != 0 && now - gov < GOVERNOR_STALE_NS) return;
    if (vgpu_ctl_poll(rd, d->conf.cores, d->conf.policy, now, sample_util, d))
        LOG_DEBUG("ctl %s: util %.1f rate %llu", d->conf.uuid,
                  (double)atomic_load(&rd->util_milli) / 1000.0,
                  (unsigned long long)atomic_load(&rd->rate));
}

/* A claim whose region has no rate yet (no governor or controller has measured it) is paced
 * from its cap over a seed gain at once: its first launches run at or under the cap, never
 * uncapped while the controller learns. The controller replaces the rate at its first step. */
static void seed_rate(struct vgpu_dev *d, struct vgpu_region_device *rd, uint64_t now) {
    /* The governor's seed (a gain learnt on this GPU) may only make the start stricter: a
     * new claim's kernels may be heavier per thread than its neighbours'. */
    double gain = vgpu_bits_to_double(atomic_load(&rd->seed_gain_bits));
    if (!(gain > VGPU_SEED_GAIN_DEFAULT) || !isfinite(gain)) gain = VGPU_SEED_GAIN_DEFAULT;
    double rate = (double)d->conf.cores / gain;
    if (!(rate >= 1) || !isfinite(rate) || rate > 1e18) return;
    uint64_t expected = 0;
    if (atomic_compare_exchange_strong(&rd->rate, &expected, (uint64_t)rate)) {
        atomic_store(&rd->rate_stamp_ns, now);
        atomic_store(&rd->rate_source, VGPU_RATE_SEED);
    }
}

void vgpu_throttle_slow(struct vgpu_dev *d, uint64_t spent, uint64_t cost, bool covered) {
    struct vgpu_region_device *rd = &d->region->map->devices[d->region_dev];
    uint64_t now = vgpu_now_ns();
    if (__builtin_expect(atomic_load_explicit(&rd->rate, memory_order_relaxed) == 0, 0)) {
        seed_rate(d, rd, now);
        covered = false; /* the first launch already draws from the seeded bucket */
    }
    maybe_step_controller(d, rd, now);
    if (covered) return;
    uint64_t wait = vgpu_bucket_settle(rd, spent, cost, now);
    if (wait == 0) return;
    struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000ULL),
                          .tv_nsec = (long)(wait % 1000000000ULL)};
    while (nanosleep(&ts, &ts) != 0) {
    }
    atomic_fetch_add_explicit(&rd->throttled_ns, wait, memory_order_relaxed);
}

/* Launches of one thread between two clock reads while the bucket covers them: the fallback
 * controller is stepped from the slow path, which every CLOCK_EVERY-th launch also takes. */
#define CLOCK_EVERY 16u
static __thread uint32_t t_launch_tick __attribute__((tls_model("initial-exec")));

static inline void throttle(struct vgpu_dev *d, uint64_t cost) {
    bool covered;
    uint64_t spent =
        vgpu_bucket_charge(&d->region->map->devices[d->region_dev], cost, &covered);
    if (__builtin_expect(covered && (t_launch_tick++ % CLOCK_EVERY) != 0, 1)) return;
    vgpu_throttle_slow(d, spent, cost, covered);
}

/* Returns the device to limit, or NULL when this launch is not capped. */
static inline struct vgpu_dev *capped_device(void) {
    struct vgpu_state *s = vgpu_state();
    if (__builtin_expect(!s->compute_capped, 1)) return NULL;
    struct vgpu_dev *d = vgpu_dev_current_cached();
    if (d == NULL || d->conf.cores == 0 || d->conf.cores >= 100 ||
        d->conf.policy == VGPU_POLICY_NONE || d->region->map == NULL)
        return NULL;
    return d;
}

#define REAL_OR_RETURN(fn)                                        \
    do {                                                          \
        if (!vgpu_cuda_load()) return CUDA_ERROR_NOT_INITIALIZED; \
        if (vgpu_cu.fn == NULL) return CUDA_ERROR_NOT_FOUND;      \
    } while (0)

#define LIMIT(gx, gy, gz, bx, by, bz)                                              \
    do {                                                                           \
        struct vgpu_dev *limited_ = capped_device();                               \
        if (limited_ != NULL) throttle(limited_, vgpu_launch_cost(gx, gy, gz, bx, by, bz));      \
    } while (0)

VGPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                    unsigned int gz, unsigned int bx, unsigned int by,
                                    unsigned int bz, unsigned int shmem, CUstream stream,
                                    void **params, void **extra) {
    REAL_OR_RETURN(cuLaunchKernel);
    LIMIT(gx, gy, gz, bx, by, bz);
    return vgpu_cu.cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
                                         unsigned int gz, unsigned int bx, unsigned int by,
                                         unsigned int bz, unsigned int shmem, CUstream stream,
                                         void **params, void **extra) {
    REAL_OR_RETURN(cuLaunchKernel_ptsz);
    LIMIT(gx, gy, gz, bx, by, bz);
    return vgpu_cu.cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **params,
                                      void **extra) {
    REAL_OR_RETURN(cuLaunchKernelEx);
    if (config != NULL)
        LIMIT(config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
              config->blockDimY, config->blockDimZ);
    return vgpu_cu.cuLaunchKernelEx(config, f, params, extra);
}

VGPU_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                           void **params, void **extra) {
    REAL_OR_RETURN(cuLaunchKernelEx_ptsz);
    if (config != NULL)
        LIMIT(config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
              config->blockDimY, config->blockDimZ);
    return vgpu_cu.cuLaunchKernelEx_ptsz(config, f, params, extra);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                               unsigned int gz, unsigned int bx,
                                               unsigned int by, unsigned int bz,
                                               unsigned int shmem, CUstream stream,
                                               void **params) {
    REAL_OR_RETURN(cuLaunchCooperativeKernel);
    LIMIT(gx, gy, gz, bx, by, bz);
    return vgpu_cu.cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
}

VGPU_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx,
                                                    unsigned int gy, unsigned int gz,
                                                    unsigned int bx, unsigned int by,
                                                    unsigned int bz, unsigned int shmem,
                                                    CUstream stream, void **params) {
    REAL_OR_RETURN(cuLaunchCooperativeKernel_ptsz);
    LIMIT(gx, gy, gz, bx, by, bz);
    return vgpu_cu.cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream,
                                                  params);
}

/* A graph launch's work is unknown here; it is charged as one 256-thread block (the
 * controller's gain estimate absorbs the real cost per unit). */
VGPU_EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
    REAL_OR_RETURN(cuGraphLaunch);
    LIMIT(1, 1, 1, 256, 1, 1);
    return vgpu_cu.cuGraphLaunch(exec, stream);
}

VGPU_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
    REAL_OR_RETURN(cuGraphLaunch_ptsz);
    LIMIT(1, 1, 1, 256, 1, 1);
    return vgpu_cu.cuGraphLaunch_ptsz(exec, stream);
}
