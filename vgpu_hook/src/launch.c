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
 * in-process controller below takes over: one process of the claim at a time (elected by CAS
 * on ctl_stamp_ns) samples NVML and runs the same controller as the governor (bucket.c).
 */

#include <math.h>
#include <string.h>
#include <time.h>

#include "vgpu.h"

#define CTL_PERIOD_NS 100000000ULL     /* controller step every 100 ms once settled */
/* While the controller has no gain yet, or skips a sample that straddles a big rate change, it
 * polls NVML this often: a fresh sample comes once per driver period (~1/6 s), and waiting up to
 * 100 ms to notice each one would add that to every step a new claim needs to settle. */
#define CTL_LEARNING_PERIOD_NS 10000000ULL
/* A window end placed between two polls this close is "aligned" (vgpu_ctl_sample.aligned). */
#define CTL_ALIGNED_BRACKET_NS 25000000ULL
/* The driver's sample period assumed for a claim's first sample, whose period began before the
 * first launch (NVML does not say when a period began; real drivers and the simulator: 1/6 s).
 * That sample is learnt from only if the claim launched for at least half of it: a shorter
 * stretch reads a fraction of a percent. Same rule as kubelet_plugin/governor.py. */
#define CTL_SAMPLE_PERIOD_NS 166667000ULL
#define CTL_FIRST_COVERAGE_MIN 0.5
/* Steps after the first learnt one that still poll fast: they correct the first gain (learnt
 * from a seed window that reads a few integer percent) within one sample period each. */
#define CTL_SETTLING_STEPS 2
#define GOVERNOR_STALE_NS 2000000000ULL /* governor considered gone after 2 s of silence */

static double bits_to_double(uint64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}
static uint64_t double_to_bits(double d) {
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return bits;
}

enum sample_result { SAMPLE_FAILED, SAMPLE_OK, SAMPLE_NOTHING_NEW };

/* Utilisation of the whole GPU and of this claim's processes, in points, over the window
 * since `window_ns` ago. SAMPLE_NOTHING_NEW: NVML has no per-process sample newer than the
 * window's start (real drivers publish one per sample period, ~1/6 s; the simulator's
 * realistic mode too), so the window is merged into the next one. */
static enum sample_result sample_util(struct vgpu_dev *d, uint64_t window_ns,
                                      double *device_util, double *claim_util) {
    static _Atomic int nvml_state; /* 0 untried, 1 ok, -1 failed */
    if (!vgpu_nvml_load()) return SAMPLE_FAILED;
    int st = atomic_load(&nvml_state);
    if (st == 0) {
        st = (vgpu_nvml.nvmlInit_v2_ && vgpu_nvml.nvmlInit_v2_() == NVML_SUCCESS) ? 1 : -1;
        atomic_store(&nvml_state, st);
    }
    if (st < 0) return SAMPLE_FAILED;
    nvmlDevice_t h = __atomic_load_n(&d->nvml, __ATOMIC_RELAXED);
    if (h == NULL) {
        if (vgpu_nvml.nvmlDeviceGetHandleByUUID_ == NULL ||
            vgpu_nvml.nvmlDeviceGetHandleByUUID_(d->conf.uuid, &h) != NVML_SUCCESS)
            return SAMPLE_FAILED;
        __atomic_store_n(&d->nvml, h, __ATOMIC_RELAXED);
    }
    nvmlUtilization_t u;
    if (vgpu_nvml.nvmlDeviceGetUtilizationRates_ == NULL ||
        vgpu_nvml.nvmlDeviceGetUtilizationRates_(h, &u) != NVML_SUCCESS)
        return SAMPLE_FAILED;
    *device_util = u.gpu;
    *claim_util = u.gpu; /* conservative default: all of it is ours */
    if (vgpu_nvml.nvmlDeviceGetProcessUtilization_ == NULL) return SAMPLE_OK;
    nvmlProcessUtilizationSample_t samples[64];
    unsigned int count = 64;
    /* Per-process samples since the window's start (NVML stamps are wall-clock us). */
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    unsigned long long now_us =
        (unsigned long long)wall.tv_sec * 1000000ULL + (unsigned long long)wall.tv_nsec / 1000;
    unsigned long long since = now_us - window_ns / 1000;
    nvmlReturn_t rc = vgpu_nvml.nvmlDeviceGetProcessUtilization_(h, samples, &count, since);
    if (rc == NVML_ERROR_NOT_FOUND) return SAMPLE_NOTHING_NEW;
    if (rc != NVML_SUCCESS) return SAMPLE_OK;
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
    return SAMPLE_OK;
}

static void maybe_step_controller(struct vgpu_dev *d, struct vgpu_region_device *rd,
                                  uint64_t now) {
    uint64_t gov = atomic_load_explicit(&rd->governor_stamp_ns, memory_order_relaxed);
    if (gov != 0 && now - gov < GOVERNOR_STALE_NS) return;
    uint64_t last = atomic_load_explicit(&rd->ctl_stamp_ns, memory_order_relaxed);
    uint64_t period = atomic_load_explicit(&rd->ctl_gain_bits, memory_order_relaxed) == 0 ||
                              atomic_load_explicit(&rd->ctl_hold, memory_order_relaxed) != 0 ||
                              atomic_load_explicit(&rd->ctl_moved, memory_order_relaxed) != 0 ||
                              atomic_load_explicit(&rd->ctl_steps, memory_order_relaxed) <=
                                  CTL_SETTLING_STEPS
                          ? CTL_LEARNING_PERIOD_NS
                          : CTL_PERIOD_NS;
    if (last != 0 && now - last < period) return;
    if (!atomic_compare_exchange_strong(&rd->ctl_stamp_ns, &last, now)) return;
    /* Elected for this period. The window runs from the last consumed sample. */
    uint64_t cost = atomic_load(&rd->launch_cost);
    uint64_t throttled = atomic_load(&rd->throttled_ns);
    uint64_t start = atomic_load(&rd->ctl_window_ns);
    bool learning = atomic_load(&rd->ctl_gain_bits) == 0;
    /* The previous poll (this one's launch cost is the next one's), and whether it found a
     * fresh sample; a poll that finds none leaves 0 there. */
    uint64_t poll_cost = atomic_exchange(&rd->ctl_poll_cost, cost);
    bool poll_fresh = atomic_exchange(&rd->ctl_poll_fresh, 0) != 0;
    if (start == 0 || now - start > 10 * CTL_PERIOD_NS) { /* (re)start of a window */
        atomic_store(&rd->ctl_cost_mark, cost);
        atomic_store(&rd->throttle_mark, throttled);
        atomic_store(&rd->ctl_window_ns, now);
        atomic_store(&rd->ctl_learning_anchor, learning ? 1 : 0);
        return;
    }
    double device_util = 0, claim_util = 0;
    enum sample_result got = sample_util(d, now - start, &device_util, &claim_util);
    if (got != SAMPLE_OK) return; /* nothing new yet: the window grows until a sample comes */
    atomic_store(&rd->ctl_poll_fresh, 1);
    /* Where the sample's period ended: between the previous poll and this one when that one
     * found nothing new (a real driver's sample period; midway, where the launch cost is
     * interpolated exactly, the rate being constant between two polls). Two fresh polls in a
     * row: NVML answered for our own interval (the simulator's exact mode) or we poll slower
     * than it publishes; the window then ends now, its end not bracketed. */
    uint64_t end = now, end_cost = cost, bracket = UINT64_MAX;
    if (!poll_fresh && last != 0 && last < now && poll_cost <= cost) {
        end = last + (now - last) / 2;
        end_cost = poll_cost + (cost - poll_cost) / 2;
        bracket = now - last;
    }
    uint64_t cost_mark = atomic_exchange(&rd->ctl_cost_mark, end_cost);
    uint64_t throttle_mark = atomic_exchange(&rd->throttle_mark, throttled);
    atomic_store(&rd->ctl_window_ns, end);
    bool first_sample = false;
    if (atomic_exchange(&rd->ctl_learning_anchor, 0) != 0 && learning) {
        /* The claim's first sample: its period began before the first launch (the seed), when
         * nothing had been launched. Measured over the (assumed) whole period it is learnt
         * from if the claim launched for most of it and it reads at least a point; otherwise
         * it only anchors the window (learning from a period that began before the launches
         * as if they filled it would underestimate the gain and overshoot the cap). */
        uint64_t first = atomic_load(&rd->rate_stamp_ns);
        if (atomic_load(&rd->rate_source) != VGPU_RATE_SEED || claim_util < 1 ||
            bracket > CTL_ALIGNED_BRACKET_NS || first == 0 || end <= first ||
            (double)(end - first) < CTL_FIRST_COVERAGE_MIN * (double)CTL_SAMPLE_PERIOD_NS)
            return;
        uint64_t span = end - first > CTL_SAMPLE_PERIOD_NS ? end - first : CTL_SAMPLE_PERIOD_NS;
        start = end - span;
        cost_mark = 0;
        first_sample = true;
    }
    atomic_store(&rd->util_milli, (uint64_t)(claim_util * 1000.0));
    struct vgpu_ctl_sample s = {
        .dt = (double)(end - start) / 1e9,
        /* A first sample over part of its period reads a few integer percent: the top of its
         * rounding interval, so the rounding can only leave the claim under its cap. */
        .util = first_sample ? claim_util + 0.5 : claim_util,
        .throttled = throttled > throttle_mark,
        .aligned = bracket <= CTL_ALIGNED_BRACKET_NS,
    };
    if (!(s.dt > 0)) return;
    s.cost_rate = (double)(end_cost - cost_mark) / s.dt;
    struct vgpu_ctl_state st = {
        .gain = bits_to_double(atomic_load(&rd->ctl_gain_bits)),
        .integral = bits_to_double(atomic_load(&rd->ctl_integral_bits)),
        .hold = atomic_load(&rd->ctl_hold) != 0,
        .weight = bits_to_double(atomic_load(&rd->ctl_weight_bits)),
    };
    /* `balance` borrows only once the gain is learnt and not being re-learnt: claims starting
     * together first reach their caps instead of all jumping at the idle GPU, overfilling it
     * and sorting the split out over many sample periods (governor.py may_borrow). */
    bool may_borrow = st.gain > 0 && !st.hold;
    s.target = d->conf.policy == VGPU_POLICY_BALANCE && may_borrow
                   ? vgpu_balance_target(d->conf.cores, device_util, claim_util)
                   : (double)d->conf.cores;
    double current = (double)atomic_load(&rd->rate);
    double rate = vgpu_ctl_step(&st, &s, current);
    atomic_fetch_add(&rd->ctl_steps, 1);
    atomic_store(&rd->ctl_moved, current > 0 && fabs(rate - current) > current / 3 ? 1 : 0);
    atomic_store(&rd->ctl_gain_bits, double_to_bits(st.gain));
    atomic_store(&rd->ctl_integral_bits, double_to_bits(st.integral));
    atomic_store(&rd->ctl_hold, st.hold ? 1 : 0);
    atomic_store(&rd->ctl_weight_bits, double_to_bits(st.weight));
    if (rate >= 1 && isfinite(rate)) {
        atomic_store(&rd->rate, (uint64_t)rate);
        atomic_store(&rd->rate_stamp_ns, now);
        atomic_store(&rd->rate_source, VGPU_RATE_HOOK);
    }
    LOG_DEBUG("ctl %s: util %.1f target %.1f cost/s %.0f gain %.3g rate %.0f", d->conf.uuid,
              claim_util, s.target, s.cost_rate, st.gain, rate);
}

/* A claim whose region has no rate yet (no governor or controller has measured it) is paced
 * from its cap over a seed gain at once: its first launches run at or under the cap, never
 * uncapped while the controller learns. The controller replaces the rate at its first step. */
static void seed_rate(struct vgpu_dev *d, struct vgpu_region_device *rd, uint64_t now) {
    /* The governor's seed (a gain learnt on this GPU) may only make the start stricter: a
     * new claim's kernels may be heavier per thread than its neighbours'. */
    double gain = bits_to_double(atomic_load(&rd->seed_gain_bits));
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
