/*
 * vgpu.h - internal interfaces between the hook's source files (one file per concern).
 *
 * Nothing here is exported from libvgpu.so (-fvisibility=hidden plus the version script); the
 * only public symbols are the cu* and nvml* wrappers and dlsym (see vgpu.map).
 */
#ifndef VGPU_H
#define VGPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda_abi.h"
#include "nvml_abi.h"
#include "region.h"

#define VGPU_EXPORT __attribute__((visibility("default")))
#define VGPU_MAX_CLAIMS 8

/* ---- log.c ------------------------------------------------------------------------------ */
enum vgpu_log_level { VGPU_LOG_ERROR = 0, VGPU_LOG_WARN = 1, VGPU_LOG_INFO = 2, VGPU_LOG_DEBUG = 3 };
int vgpu_log_level(void);
void vgpu_log_write(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define VGPU_LOG(level, ...)                                                                   \
    do {                                                                                       \
        if ((level) <= vgpu_log_level()) vgpu_log_write((level), __FILE__, __LINE__, __VA_ARGS__); \
    } while (0)
#define LOG_ERROR(...) VGPU_LOG(VGPU_LOG_ERROR, __VA_ARGS__)
#define LOG_WARN(...) VGPU_LOG(VGPU_LOG_WARN, __VA_ARGS__)
#define LOG_INFO(...) VGPU_LOG(VGPU_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) VGPU_LOG(VGPU_LOG_DEBUG, __VA_ARGS__)

/* ---- config.c: vgpu.conf parsing (pure: text in, struct out) ----------------------------- */
struct vgpu_device_conf {
    char uuid[VGPU_UUID_LEN];
    uint64_t memory;       /* bytes; 0 together with memory_invalid = deny all allocations */
    uint32_t cores;        /* 0..100, 0 = no compute cap */
    uint32_t policy;       /* enum vgpu_policy */
    bool oversubscribe;
    bool memory_invalid;   /* the memory token was missing/unparsable: fail closed */
};
struct vgpu_claim_conf {
    char claim[VGPU_CLAIM_LEN];
    int version;
    int device_count;
    struct vgpu_device_conf devices[VGPU_MAX_DEVICES];
    int errors;            /* lines rejected (each logged with its line number) */
    int warnings;          /* unknown keys/directives ignored */
};
/* Parse a whole file's text. Returns 0 when usable (possibly with warnings), -1 when the file
 * cannot be used at all (then the claim is treated as pass-through and an error is logged). */
int vgpu_config_parse(const char *text, const char *source, struct vgpu_claim_conf *out);
int vgpu_config_parse_size(const char *token, uint64_t *out);

/* ---- region.c: the shared accounting region --------------------------------------------- */
struct vgpu_region_handle {
    struct vgpu_region *map;
    int fd;                /* OFD locks live on this open file description */
    int slot;              /* our slot, -1 when none */
    bool shared;           /* false = private anonymous fallback (caps per process only) */
    uint64_t last_reclaim_ns; /* process-local: when reporting paths last reclaimed dead slots */
};
int vgpu_region_open(struct vgpu_region_handle *h, const char *path,
                     const struct vgpu_claim_conf *conf);
void vgpu_region_open_private(struct vgpu_region_handle *h, const struct vgpu_claim_conf *conf);
int vgpu_region_claim_slot(struct vgpu_region_handle *h, int pid);
void vgpu_region_close(struct vgpu_region_handle *h);
/* Atomically (w.r.t. other processes) charge `bytes` on device `dev` if the claim's total stays
 * within `limit`. Reclaims slots of dead processes when needed. Returns 0 or -1 (over cap). */
int vgpu_region_charge(struct vgpu_region_handle *h, int dev, uint64_t bytes, uint64_t limit,
                       bool managed);
void vgpu_region_uncharge(struct vgpu_region_handle *h, int dev, uint64_t bytes, bool managed);
/* Record that `bytes` already charged fell back to managed memory (oversubscription). */
void vgpu_region_mark_managed(struct vgpu_region_handle *h, int dev, uint64_t bytes);
uint64_t vgpu_region_used(struct vgpu_region_handle *h, int dev);
int vgpu_region_reclaim_dead(struct vgpu_region_handle *h);
/* Reporting paths (cuMemGetInfo, NVML memory info): reclaim at most every 200 ms. */
void vgpu_region_reclaim_if_due(struct vgpu_region_handle *h, uint64_t now_ns);
/* Release this process's slot (normal exit: the driver frees its memory with it). */
void vgpu_region_release_slot(struct vgpu_region_handle *h);
int vgpu_lock_ofd(int fd, long long offset, bool exclusive, bool wait);
void vgpu_unlock_ofd(int fd, long long offset);

/* ---- bucket.c: token bucket and utilisation controller (pure, no I/O) -------------------- */
/* Launch cost: proportional to the threads launched (never 0, saturating at 2^48); the
 * controller learns how that maps to GPU time. Inline: it runs on every capped launch. */
static inline uint64_t vgpu_launch_cost(unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                        unsigned by, unsigned bz) {
    uint64_t blocks = (uint64_t)(gx + !gx) * (gy + !gy), threads = (uint64_t)(bx + !bx) * (by + !by);
    if (__builtin_mul_overflow(blocks, (uint64_t)(gz + !gz), &blocks) || blocks > (1ULL << 32))
        return 1ULL << 48;
    threads *= (uint64_t)(bz + !bz);
    if (threads > (1ULL << 16)) return 1ULL << 48;
    return blocks * threads;
}
/* Charge a launch of `cost` (no clock needed). Returns the claim's spending including it;
 * *covered = true when it may launch at once (credit covers it, or no rate is known yet).
 * Inline: this is the whole limiter on most capped launches. */
static inline uint64_t vgpu_bucket_charge(struct vgpu_region_device *d, uint64_t cost,
                                          bool *covered) {
    atomic_fetch_add_explicit(&d->launches, 1, memory_order_relaxed);
    uint64_t spent = atomic_fetch_add_explicit(&d->launch_cost, cost, memory_order_relaxed) + cost;
    *covered = atomic_load_explicit(&d->rate, memory_order_relaxed) == 0 ||
               (int64_t)(spent - atomic_load_explicit(&d->credit, memory_order_relaxed)) <= 0;
    return spent;
}
/* For a launch charge() did not cover: refill for the time elapsed, then return the ns the
 * caller must wait (0 = go). */
uint64_t vgpu_bucket_settle(struct vgpu_region_device *d, uint64_t spent, uint64_t cost,
                            uint64_t now_ns);
/* charge + settle in one (tests). */
uint64_t vgpu_bucket_take(struct vgpu_region_device *d, uint64_t cost, uint64_t now_ns);
/* Default gain for pacing a claim's first launches before anything is measured: util points
 * per (thread launched / s). Conservative (a thread costing ~2 ms of one SM slot on a
 * ~200k-thread GPU): most kernels are lighter, so first launches run under the cap, not over. */
#define VGPU_SEED_GAIN_DEFAULT 1e-6
struct vgpu_ctl_sample {
    double target;        /* utilisation points the claim may use now */
    double util;          /* measured claim utilisation over the window, points */
    double cost_rate;     /* launch cost units per second over the window */
    double dt;            /* window length, seconds */
    bool throttled;       /* the bucket made someone wait during the window */
    bool aligned;         /* the window ends within a learning poll of the sample period's
                             end: the next period, straddling this step's rate change, is
                             measured as it was and need not be skipped (no hold) */
};
struct vgpu_ctl_state {
    double gain;          /* util points per (cost unit / s); 0 = unknown */
    double integral;      /* accumulated error correction, points */
    bool hold;            /* the last step changed the rate by more than a third: the next
                             sample's period may straddle the change, so it is skipped */
    double weight;        /* what `gain` rests on: squared utilisation of the windows it was
                             learnt from, decayed per step (VGPU_GAIN_MEMORY) */
    double spent;         /* the last window's cost rate over the rate in force (at least
                             VGPU_SPENT_FLOOR); 0 = not comparable (first step, or that step
                             moved the rate by over a third or replaced the gain) */
};
/* A window whose spent share of the budget (cost rate / rate) moved by more than
 * VGPU_SPENT_CHANGE of the last window's, the rate standing (nearly) still, is one in which
 * the claim paused or resumed launching: NVML's sample period need not cover the same
 * launches, so neither it nor the next sample teaches the gain or the integral
 * (vgpu_ctl_step). */
#define VGPU_SPENT_CHANGE 0.15
#define VGPU_SPENT_FLOOR 0.001
/* Share of the gain estimate's weight kept per step; in steady state the estimate is an EMA
 * that moves 1 - VGPU_GAIN_MEMORY (0.4) of the way to each new observation. */
#define VGPU_GAIN_MEMORY 0.6
/* Readings (integer percent) from here up resolve the claim's utilisation within a third;
 * lower ones may only lower a learnt gain (vgpu_ctl_step). */
#define VGPU_UTIL_RESOLVED 1.5
/* Shortest window a learnt gain is re-learnt from (vgpu_ctl_step), seconds. */
#define VGPU_GAIN_WINDOW_MIN_S 0.05
/* ... and lower it only over a window in which the claim launched at least this share of its
 * budget (rate): a starved claim does, one back from an idle moment does not. */
#define VGPU_BUDGET_SPENT 0.5
/* Points of error one step may add to the integral: larger errors come from a moved target or
 * a gain being re-learnt, not from the model's bias the integral is there to remove. */
#define VGPU_INTEGRAL_ERROR_MAX 5.0
/* One controller step; returns the new refill rate (cost units / s), 0 = no limit yet. */
double vgpu_ctl_step(struct vgpu_ctl_state *st, const struct vgpu_ctl_sample *s,
                     double current_rate);
/* `balance`: points the claim may use, from the GPU's and its own utilisation of one window. */
#define VGPU_BALANCE_HEADROOM 5.0
#define VGPU_FULL_GPU (100.0 - VGPU_BALANCE_HEADROOM / 2) /* borrowing yields from here on */
#define VGPU_BORROW_STEP 10.0 /* points a borrower may grow per step */
double vgpu_balance_target(uint32_t cores, double device_util, double own_util);
/* The in-process fallback controller (used while no governor writes the region): */
enum vgpu_sample_result { VGPU_SAMPLE_FAILED, VGPU_SAMPLE_OK, VGPU_SAMPLE_NOTHING_NEW };
/* Utilisation (points) of the GPU and of the claim from NVML samples newer than `age_ns` ago. */
typedef enum vgpu_sample_result (*vgpu_sampler)(void *ctx, uint64_t age_ns, double *device_util,
                                                double *claim_util);
/* One poll at `now` (CLOCK_MONOTONIC ns): if no other process of the claim polled within the
 * poll period, sample through `sample` and, on a fresh sample, step the controller and write
 * the device's rate. True if it stepped. The caller checks that the governor is silent. */
bool vgpu_ctl_poll(struct vgpu_region_device *rd, uint32_t cores, uint32_t policy, uint64_t now,
                   vgpu_sampler sample, void *ctx);
static inline double vgpu_bits_to_double(uint64_t bits) {
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}
static inline uint64_t vgpu_double_to_bits(double d) {
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    return bits;
}

/* ---- loader.c: real entry points --------------------------------------------------------- */
struct vgpu_real_cuda {
#define HOOK_CU(name) __typeof__(name) *name;
#define HOOK_NVML(name)
#include "hooks.def"
#undef HOOK_CU
#undef HOOK_NVML
    __typeof__(cuDeviceGet) *cuDeviceGet_;
    __typeof__(cuDeviceGetCount) *cuDeviceGetCount_;
    __typeof__(cuDeviceGetUuid_v2) *cuDeviceGetUuid_v2_;
    __typeof__(cuCtxGetDevice) *cuCtxGetDevice_;
};
struct vgpu_real_nvml {
#define HOOK_CU(name)
#define HOOK_NVML(name) __typeof__(name) *name;
#include "hooks.def"
#undef HOOK_CU
#undef HOOK_NVML
    __typeof__(nvmlInit_v2) *nvmlInit_v2_;
    __typeof__(nvmlDeviceGetHandleByUUID) *nvmlDeviceGetHandleByUUID_;
    __typeof__(nvmlDeviceGetUUID) *nvmlDeviceGetUUID_;
    __typeof__(nvmlDeviceGetUtilizationRates) *nvmlDeviceGetUtilizationRates_;
    __typeof__(nvmlDeviceGetProcessUtilization) *nvmlDeviceGetProcessUtilization_;
};
extern struct vgpu_real_cuda vgpu_cu;     /* valid after vgpu_cuda_load() */
extern struct vgpu_real_nvml vgpu_nvml;   /* valid after vgpu_nvml_load() */
bool vgpu_cuda_load(void);                /* idempotent, thread-safe; false = no libcuda */
bool vgpu_nvml_load(void);
void *vgpu_real_dlsym(void *handle, const char *name);
/* Map a real driver/NVML function pointer to the hook's wrapper (NULL when not hooked). */
void *vgpu_wrapper_for_real(void *real_fn);

/* ---- state.c: configuration, regions, device mapping, fork handling ---------------------- */
struct vgpu_dev {          /* one configured device, matched by UUID */
    struct vgpu_device_conf conf;
    struct vgpu_region_handle *region;
    int region_dev;        /* index in region->devices */
    int cuda_ordinal;      /* -1 until matched */
    nvmlDevice_t nvml;     /* NULL until matched */
};
struct vgpu_state {
    bool configured;       /* at least one device line: enforcement on */
    bool compute_capped;   /* any device with a compute cap (fast path for launches) */
    bool deny_all;         /* claims moved away: one catch-all device without memory */
    int dev_count;
    struct vgpu_dev devs[VGPU_MAX_DEVICES];
    int region_count;
    struct vgpu_region_handle regions[VGPU_MAX_CLAIMS];
};
struct vgpu_state *vgpu_state(void);      /* lazily initialised, never NULL */
struct vgpu_dev *vgpu_dev_for_ordinal(CUdevice ordinal);   /* NULL = not capped */
struct vgpu_dev *vgpu_dev_current(void);  /* device of the calling thread's context */
/* ---- context.c: the same, cached per thread, invalidated by context changes ---------------- */
struct vgpu_dev *vgpu_dev_current_cached(void);
struct vgpu_dev *vgpu_dev_for_nvml(nvmlDevice_t device);
uint64_t vgpu_now_ns(void);

/* ---- alloc_table.c: what each live allocation was charged --------------------------------- */
enum vgpu_alloc_kind { VGPU_ALLOC_DEVICE = 0, VGPU_ALLOC_MANAGED_FALLBACK = 1 };
void vgpu_alloc_put(uint64_t key, int dev, uint64_t bytes, bool managed);
bool vgpu_alloc_take(uint64_t key, int *dev, uint64_t *bytes, bool *managed);
void vgpu_alloc_register_atfork(void); /* once, from state.c */

/* ---- launch.c ------------------------------------------------------------------------------ */
/* The launch limiter's slow path: a launch the bucket did not cover, or a periodic clock read. */
void vgpu_throttle_slow(struct vgpu_dev *d, uint64_t spent, uint64_t cost, bool covered);

#endif /* VGPU_H */
