/*
 * region.h - layout of the per-claim shared accounting region (`<claim dir>/region`).
 *
 * Who uses it: every hooked process of a claim maps this file MAP_SHARED; the node governor
 * (kubelet_plugin/governor.py, mirrored in kubelet_plugin/region.py) maps it too and writes the
 * compute budget. The layout is an ABI between C and Python: bump VGPU_REGION_VERSION on any
 * change, and keep tests/unit/kubelet_plugin/test_region.py (which compares offsets printed by
 * build/region_layout) passing.
 *
 * Concurrency model (no process-shared mutex anywhere, so a SIGKILLed process never blocks
 * others):
 *   - counters are C11 atomics (Python writes whole aligned 8-byte words);
 *   - each process owns one slot, and proves it is alive by holding an OFD write lock on that
 *     slot's lock byte (VGPU_LOCK_SLOT). The kernel drops the lock when the process dies, so a
 *     slot whose lock can be taken belongs to a dead process and its usage is reclaimed;
 *   - check-and-add of memory on a device is serialised by an OFD lock on VGPU_LOCK_DEVICE(d);
 *   - initialisation of a new file is serialised by an OFD lock on VGPU_LOCK_INIT.
 * Lock bytes live beyond the end of the mapped file (locks need no backing bytes).
 */
#ifndef VGPU_REGION_H
#define VGPU_REGION_H

#include <stdatomic.h>
#include <stdint.h>

#define VGPU_REGION_MAGIC 0x55504756u /* "VGPU" little-endian */
#define VGPU_REGION_VERSION 2u
#define VGPU_MAX_DEVICES 16
#define VGPU_MAX_SLOTS 1024
#define VGPU_UUID_LEN 96
#define VGPU_CLAIM_LEN 64

#define VGPU_LOCK_BASE (1LL << 40)
#define VGPU_LOCK_INIT (VGPU_LOCK_BASE)
#define VGPU_LOCK_DEVICE(d) (VGPU_LOCK_BASE + 16 + (d))
#define VGPU_LOCK_SAMPLER(d) (VGPU_LOCK_BASE + 64 + (d))
#define VGPU_LOCK_SLOT(s) (VGPU_LOCK_BASE + 4096 + (s))

enum vgpu_policy {
    VGPU_POLICY_NONE = 0,
    VGPU_POLICY_FIXED = 1,
    VGPU_POLICY_BALANCE = 2,
};

enum vgpu_rate_source {
    VGPU_RATE_UNSET = 0,
    VGPU_RATE_GOVERNOR = 1,
    VGPU_RATE_HOOK = 2,
    VGPU_RATE_SEED = 3, /* provisional rate from the claim's cap, before any measurement */
};

/* One per device line of vgpu.conf, in file order. 512 bytes. */
struct vgpu_region_device {
    char uuid[VGPU_UUID_LEN];            /* written once at region initialisation */
    uint64_t memory_limit;               /* bytes, from vgpu.conf */
    uint32_t cores;                      /* SM percent, 0 = no cap */
    uint32_t policy;                     /* enum vgpu_policy */
    /* Compute budget: launch-cost units per second the claim may spend on this device. */
    _Atomic uint64_t rate;               /* 0 = not yet known (launches pass) */
    _Atomic uint64_t rate_stamp_ns;      /* CLOCK_MONOTONIC of the last rate write */
    _Atomic uint32_t rate_source;        /* enum vgpu_rate_source */
    uint32_t reserved0;
    _Atomic uint64_t governor_stamp_ns;  /* last time the node governor wrote this device */
    /* Shared token bucket (lock-free): tokens = credit - launch_cost (negative = debt). A
     * launch adds its cost to launch_cost (one atomic add); credit grows with time at `rate`,
     * added only when a launch finds the bucket short, at most a burst beyond launch_cost. */
    _Atomic uint64_t credit;
    _Atomic uint64_t refill_stamp_ns;
    /* Monotonic counters, read by the controllers and by tests. */
    _Atomic uint64_t launches;
    _Atomic uint64_t launch_cost;
    _Atomic uint64_t throttled_ns;
    _Atomic uint64_t oversub_allocs;
    /* In-process controller state (used only when no governor writes). */
    _Atomic uint64_t ctl_stamp_ns;       /* last controller step; CAS elects the stepping process */
    _Atomic uint64_t ctl_cost_mark;      /* launch_cost at the last step */
    _Atomic uint64_t ctl_gain_bits;      /* double: utilisation points per (cost unit / s) */
    _Atomic uint64_t ctl_integral_bits;  /* double: integral term, utilisation points */
    _Atomic uint64_t util_milli;         /* last measured claim utilisation, 1/1000 points */
    _Atomic uint64_t throttle_mark;      /* throttled_ns at the last step */
    /* double: a gain (util points per cost unit/s) to pace a claim's first launches with,
     * written by the governor from what it learnt on this GPU; 0 = use the hook's default. */
    _Atomic uint64_t seed_gain_bits;
    /* End of the last window the in-process controller consumed a fresh NVML sample for (the
     * marks above belong to it); windows without a new sample are merged into the next. */
    _Atomic uint64_t ctl_window_ns;
    /* 1 while the controller has no gain yet and its first fresh sample is still to come: that
     * sample's period may reach back before the first launch, so it only starts the window. */
    _Atomic uint64_t ctl_learning_anchor;
    _Atomic uint64_t ctl_hold;           /* struct vgpu_ctl_state.hold of the fallback */
    _Atomic uint64_t ctl_weight_bits;    /* double: struct vgpu_ctl_state.weight of the fallback */
    /* The fallback's previous NVML poll: launch_cost then, and how many polls in a row up to it
     * found a fresh sample, 0-2 (a sample period that ends between a poll without one and the
     * next poll is placed midway, where the launch cost is interpolated; two in a row: the
     * sampler answers for our own interval and fast polls gain nothing). */
    _Atomic uint64_t ctl_poll_cost;
    _Atomic uint64_t ctl_poll_fresh;
    _Atomic uint64_t ctl_steps;          /* controller steps taken (the first ones poll fast) */
    _Atomic uint64_t ctl_moved;          /* the last step moved the rate by over a third */
    _Atomic uint64_t ctl_seen_ns;        /* poll that took the last fresh sample (NVML lastSeen) */
    _Atomic uint64_t ctl_spent_bits;     /* double: struct vgpu_ctl_state.spent of the fallback */
    uint8_t reserved1[512 - 96 - 8 - 4 - 4 - 8 * 2 - 4 - 4 - 8 * 24];
};

/* One per live process. 264 bytes. */
struct vgpu_region_slot {
    _Atomic int32_t pid;                 /* pid as seen by the owner; 0 = free */
    _Atomic uint32_t generation;         /* bumped on each claim of the slot */
    _Atomic uint64_t used[VGPU_MAX_DEVICES];     /* bytes charged to the cap (incl. managed) */
    _Atomic uint64_t managed[VGPU_MAX_DEVICES];  /* of which oversubscription fallback bytes */
};

struct vgpu_region {
    uint32_t magic;
    uint32_t version;
    uint32_t size;                       /* sizeof(struct vgpu_region) */
    uint32_t device_count;
    _Atomic uint32_t ready;              /* 1 once the header and devices are written */
    _Atomic uint32_t slot_hwm;           /* slots [0, slot_hwm) may be in use (readers scan
                                            only those; slots are taken lowest-first) */
    uint64_t created_ns;
    char claim[VGPU_CLAIM_LEN];
    struct vgpu_region_device devices[VGPU_MAX_DEVICES];
    struct vgpu_region_slot slots[VGPU_MAX_SLOTS];
};

_Static_assert(sizeof(struct vgpu_region_device) == 512, "region device record must stay 512 B");
_Static_assert(sizeof(struct vgpu_region_slot) == 264, "region slot must stay 264 B");

#endif /* VGPU_REGION_H */
