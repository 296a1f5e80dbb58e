/*
 * simstate.h - the shared state of one simulated GPU node.
 *
 * Why it exists: the fake NVML (libnvidia-ml.so.1, src/nvml*.c) and the fake CUDA driver
 * (libcuda.so.1, src/cuda*.c) must agree on what the node's GPUs are and on what every process is
 * doing with them, so that NVML reports what CUDA did (memory per process, SM utilisation, faults).
 * Both libraries link their own private copy of src/simstate*.c (hidden symbols); the copies meet
 * in one memory-mapped file.
 *
 * Configuration (environment, read on the first call of any sim_* function):
 *   VGPU_SIM_STATE    path of the node's state file (created 0600 if absent). Unset or empty:
 *                     no simulated node; sim_attach() fails and the libraries act as "no GPU".
 *   VGPU_SIM_PROFILE  path of the text profile (key=value lines, written by
 *                     vgpu_testbed/fakegpu/simulator.py). Needed only by the process that creates
 *                     the state file; later processes read the GPUs from the state file itself. If
 *                     it is set and its content differs from the profile the state was built from,
 *                     attach fails (-ESTALE) rather than mixing two machines.
 *   NVIDIA_VISIBLE_DEVICES  the container's view (see sim_visible_gpus()), with the device nodes
 *                     /dev/nvidia<minor> (VGPU_SIM_DEV_DIR) when it is "void" or "none".
 *
 * State file design (details in src/simstate_layout.h):
 *   - A fixed-size file: header (magic, layout version, profile hash, node attributes), one
 *     static `struct sim_gpu_info` per GPU, then one dynamic block per GPU (flags, process memory
 *     table, busy timeline, XID queue).
 *   - Creation: the first process takes an OFD write lock on the init byte range, parses the
 *     profile, fills the file, publishes the magic last, and unlocks. Others wait on the same lock
 *     and then only map the file.
 *   - Mutation of a GPU's dynamic block happens under that GPU's OFD byte-range lock (fcntl
 *     F_OFD_SETLKW) plus a process-local mutex (OFD locks do not exclude threads sharing one open
 *     file description). The kernel drops an OFD lock when its holder dies, so a SIGKILLed process
 *     never blocks the others; every update is ordered so that a write torn by SIGKILL leaves a
 *     valid state (single aligned 8-byte stores publish each change).
 *   - Fork: a pthread_atfork child handler reopens the file, giving the child its own open file
 *     description and therefore its own locks, and re-initialises the process-local mutex (no
 *     prepare handler: holding our mutex across fork() would order it against callers' locks).
 *   - Process table: per GPU, SIM_MAX_PROCS slots of {owner identity, bytes}. Processes may live
 *     in different PID namespaces (a container's tenant, the node's plugin, a test runner above
 *     the node), so a slot records its owner's identity (pid namespace, pid there, start time,
 *     exec nonce) and the owner holds a classic POSIX lock on the slot's byte while it owns it:
 *     the kernel drops the lock when the process exits, is killed or execs, and F_GETLK names the
 *     holder by its pid in the *caller's* namespace. So every reader sees each process under the
 *     pid it has there (node pids on the node, the container's own pids inside the container),
 *     does not list processes it cannot see (and never frees them), and frees the slot of a
 *     process that is really gone, whoever looks first (details: the top of src/simstate.c).
 *     A process releases its own slots at normal exit (atexit).
 *   - Busy timeline: per GPU, the time until which its SMs are busy plus a ring of the recent busy
 *     intervals tagged by process slot; utilisation is measured from it (see sim_utilization()).
 *   - No constructors: everything attaches lazily through pthread_once.
 *
 * Thread-safe, fork-safe, and safe against any process dying at any moment.
 * All functions are hidden (not exported) in both libraries.
 */
#ifndef VGPU_SIMSTATE_H
#define VGPU_SIMSTATE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a function the library exports (nvml*, cu*, vgpusim_*); everything else is hidden by
 * -fvisibility=hidden. */
#define SIM_EXPORT __attribute__((visibility("default")))

/* Capacities of the state file (changing one changes SIM_LAYOUT_VERSION). */
#define SIM_MAX_GPUS 16
#define SIM_NVIDIA_MAJOR 195 /* character major of /dev/nvidia<minor> */
#define SIM_MAX_PROCS 64    /* process slots per GPU */
#define SIM_MAX_LINKS 18    /* NVLink links per GPU (H100 has 18) */
#define SIM_TIMELINE 4096   /* busy intervals kept per GPU (>= 1 s of 250 us kernels) */
#define SIM_XID_QUEUE 64    /* XID events kept per GPU */

/* Utilisation sampling window used by NVML-style queries: 1/6 s, like NVML's GPU sample period. */
#define SIM_UTIL_WINDOW_NS (1000000000ULL / 6)

/* sim_gpu_flags() bits. */
#define SIM_GPU_LOST 0x1u    /* "fallen off the bus": every call returns a GPU-is-lost error */
#define SIM_GPU_REMOVED 0x2u /* hot-removed: no longer enumerated by processes that start later */

/* Architecture codes; the values equal NVML's nvmlDeviceArchitecture_t. */
enum sim_arch {
    SIM_ARCH_KEPLER = 2,
    SIM_ARCH_MAXWELL = 3,
    SIM_ARCH_PASCAL = 4,
    SIM_ARCH_VOLTA = 5,
    SIM_ARCH_TURING = 6,
    SIM_ARCH_AMPERE = 7,
    SIM_ARCH_ADA = 8,
    SIM_ARCH_HOPPER = 9,
    SIM_ARCH_BLACKWELL = 10,
};

/* One NVLink connection group: `count` links to GPU `peer` (physical index). */
struct sim_link {
    int32_t peer;
    int32_t count;
};

/* Static attributes of one physical GPU, as the profile describes it. Strings are NUL-terminated. */
struct sim_gpu_info {
    char name[96];            /* product name, e.g. "NVIDIA H100 80GB HBM3" */
    char uuid[80];            /* "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
    char serial[32];          /* board serial number */
    char pci_bus_id[32];      /* "00000000:18:00.0" (NVML's 8-digit domain form) */
    char pcie_root[32];       /* root complex, e.g. "pci0000:15" */
    char brand[32];           /* profile's brand name, e.g. "nvidia", "tesla" */
    int32_t brand_code;       /* NVML nvmlBrandType_t value */
    int32_t arch;             /* enum sim_arch */
    int32_t cc_major;         /* CUDA compute capability */
    int32_t cc_minor;
    uint64_t memory_total;    /* bytes */
    uint32_t sm_count;        /* streaming multiprocessors */
    uint32_t cores_per_sm;    /* CUDA cores per SM (NVML GetNumGpuCores = sm_count * this) */
    uint32_t pci_device_id;   /* (device << 16) | vendor, e.g. 0x233010DE */
    uint32_t pci_subsystem_id;
    int32_t minor;            /* /dev/nvidia<minor> */
    int32_t numa_node;        /* -1 if none */
    int32_t mig_capable;      /* 0/1 */
    uint32_t power_limit_mw;  /* default/enforced power limit */
    uint32_t max_sm_clock_mhz;
    uint32_t max_mem_clock_mhz;
    uint32_t memory_bus_width; /* bits */
    int32_t nlinks;           /* entries used in links[] */
    struct sim_link links[SIM_MAX_LINKS];
};

/* Node-wide attributes. */
struct sim_node_info {
    char name[64];            /* profile name */
    char driver_version[32];  /* e.g. "580.95.05" */
    int32_t cuda_driver_version; /* e.g. 13000 for CUDA 13.0 */
    int32_t gpu_count;
};

/* One row of a GPU's process table, as returned by sim_processes(). */
struct sim_proc_usage {
    int32_t pid;              /* in the caller's pid namespace */
    uint64_t bytes;           /* device memory reserved by this process on the GPU */
};

/* One XID event. `seq` starts at 1 and grows by one per event on that GPU. */
struct sim_xid_event {
    uint64_t seq;
    uint64_t xid;
    uint64_t time_ns;         /* sim_now_ns() when injected */
    uint32_t gpu_instance_id; /* SIM_MIG_NO_ID unless scoped to a MIG instance */
    uint32_t compute_instance_id;
};

/* Attach to the node state (idempotent, thread-safe, cheap after the first call).
 * 0 on success; a negative errno when no state is configured (-ENOENT: VGPU_SIM_STATE unset) or it
 * cannot be used (-EINVAL bad profile, -ESTALE profile mismatch, -EPROTO layout mismatch, other
 * errno from open/mmap). The reason is printed once to stderr with the "vgpu-sim:" prefix unless
 * VGPU_SIM_STATE is simply unset. Every function below attaches implicitly and behaves as for an
 * empty node when attaching fails. */
int sim_attach(void);

/* Human-readable reason for the last attach failure ("" if attached). */
const char *sim_attach_error(void);

const struct sim_node_info *sim_node(void);  /* NULL when not attached */

/* Physical GPUs on the node, including lost and removed ones. */
int sim_gpu_count(void);

/* Static attributes of physical GPU `phys` (0-based), NULL if out of range or not attached. */
const struct sim_gpu_info *sim_gpu(int phys);

/* Physical index of the GPU with this UUID or PCI bus id (case-insensitive; the bus id may use a
 * 4- or 8-digit domain); -1 if none. */
int sim_find_gpu(const char *uuid_or_bus_id);

/* The GPUs this process may see, in the container's order, as physical indices written to
 * phys_out (at most `max`); returns how many. Follows NVIDIA_VISIBLE_DEVICES as the NVIDIA
 * container stack does: unset, empty or "all" -> every GPU (a host process); "none" or "void" ->
 * the toolkit injected no GPU, so the container has the GPUs whose device nodes its runtime gave
 * it (CDI mode, as with `nvidia-ctk cdi generate` specs and this project's claim specs): those
 * with a character device /dev/nvidia<minor> of major 195 and the GPU's minor (VGPU_SIM_DEV_DIR
 * replaces /dev, for tests), in physical order; else a comma-separated list of indices and/or
 * UUIDs (legacy mode; unknown entries are skipped with a stderr warning, duplicates dropped).
 * GPUs flagged SIM_GPU_REMOVED are left out. CUDA applies CUDA_VISIBLE_DEVICES on top of this
 * list itself. */
int sim_visible_gpus(int *phys_out, int max);

/* Reserve `bytes` of device memory on GPU `phys` for the calling process.
 * 0 on success; -1 if the GPU does not have that much free memory; -2 if the process table is
 * full; -3 if phys is invalid or the state is not attached; -4 if the GPU is lost. */
int sim_mem_reserve(int phys, unsigned long long bytes);

/* Reserve as much of `bytes` as is free on GPU `phys` right now (possibly 0) for the calling
 * process, in one step under the GPU's lock; *got is set to what was reserved. For managed
 * memory, whose pages beyond free device memory live in host memory. 0, or -2/-3/-4 as
 * sim_mem_reserve() (never -1). */
int sim_mem_reserve_upto(int phys, unsigned long long bytes, unsigned long long *got);

/* Return `bytes` previously reserved by the calling process (clamped at what it holds). */
void sim_mem_release(int phys, unsigned long long bytes);

/* Release everything the calling process holds on every GPU (also done at normal exit). */
void sim_mem_release_all(void);

/* Bytes in use on GPU `phys` by all live processes, in every pid namespace (reaps dead ones
 * first). */
unsigned long long sim_mem_used(int phys);

/* Bytes held on GPU `phys` by the live process that has pid `pid` in the caller's namespace. */
unsigned long long sim_mem_used_by(int phys, int pid);

/* Live processes holding memory on GPU `phys` that the caller's pid namespace can see (its own
 * and its descendants': a container's caller sees its own processes, the node sees every
 * container's), each with its pid in the caller's namespace; reaps dead ones first. Writes up to
 * `max` rows and returns the total number of such processes (may exceed max). Rows with 0 bytes
 * are processes that attached a context but hold no memory (see sim_proc_register()).
 * Processes outside the caller's view still count in sim_mem_used(). */
int sim_processes(int phys, struct sim_proc_usage *out, int max);

/* Make the calling process appear in GPU `phys`'s process list even with no memory reserved
 * (a CUDA context exists). 0, or a negative code as sim_mem_reserve(). */
int sim_proc_register(int phys);

/* Submit a kernel that occupies GPU `phys`'s SMs for duration_ns. It starts when all work already
 * submitted to that GPU (by any process) has finished, or now if the GPU is idle, so processes
 * are time-sliced FIFO. The process is registered on the GPU (sim_proc_register()) if it is not. Returns its completion time on the sim_now_ns() clock, so the caller can
 * model stream/context synchronisation by sleeping until then; 0 if phys is invalid or lost. */
unsigned long long sim_submit_work(int phys, unsigned long long duration_ns);

/* The time until which GPU `phys` is busy with submitted work (<= now when idle). */
unsigned long long sim_busy_until(int phys);

/* CLOCK_MONOTONIC in nanoseconds (the clock of the busy timeline). */
unsigned long long sim_now_ns(void);

/* SM utilisation of GPU `phys`, 0..100: the busy fraction of [now - window_ns, now]
 * (window_ns 0 = SIM_UTIL_WINDOW_NS). If pid > 0, only the busy time of the process with that
 * pid in the caller's namespace counts. */
unsigned int sim_utilization(int phys, int pid, unsigned long long window_ns);

/* Busy nanoseconds of GPU `phys` (every process's) within [from_ns, to_ns) (sim_now_ns() clock). */
unsigned long long sim_busy_total(int phys, unsigned long long from_ns, unsigned long long to_ns);

/* Per-process utilisation samples: for each process with busy time on GPU `phys` that ended
 * after since_ns, writes {pid, busy percent over [max(since_ns, now - 1 s), now]}; returns the
 * number written (at most max). Pids are in the caller's namespace: processes it cannot see are
 * left out, and so is a process that exited before any reader of the caller's namespace learnt
 * its pid there (its busy time still counts in sim_utilization(phys, 0, ...)). */
struct sim_proc_util {
    int32_t pid;
    uint32_t sm_util;        /* percent */
    uint64_t last_ns;        /* end of the process's latest busy interval in the window */
};
int sim_process_utilization(int phys, unsigned long long since_ns, struct sim_proc_util *out,
                            int max);

/* Busy nanoseconds per process on GPU `phys` within [from_ns, to_ns) (sim_now_ns() clock):
 * writes {pid, busy_ns} for each process with busy time there, named as by
 * sim_process_utilization(); returns the number written (at most max). Used by the fake NVML's
 * sample-period model (nvml_usage.c). */
struct sim_proc_busy {
    int32_t pid;
    uint64_t busy_ns;
};
int sim_process_busy(int phys, unsigned long long from_ns, unsigned long long to_ns,
                     struct sim_proc_busy *out, int max);

/* SIM_GPU_* bits of GPU `phys` (0 if invalid). */
unsigned int sim_gpu_flags(int phys);
int sim_set_flag(int phys, unsigned int flag, int on); /* 0, or -1 if phys is invalid */

/* XID events. sim_xid_inject() appends an event (the oldest is overwritten when the queue is
 * full) and returns its seq, or 0 if phys is invalid. sim_xid_seq() is the latest seq (0 if none):
 * a reader remembers it as its cursor and calls sim_xid_next() to get the first event with
 * seq > *cursor (advancing the cursor); returns 1 if an event was written, 0 if none. Events
 * overwritten before a slow reader got them are skipped. */
uint64_t sim_xid_inject(int phys, uint64_t xid);
uint64_t sim_xid_seq(int phys);
int sim_xid_next(int phys, uint64_t *cursor, struct sim_xid_event *out);

/* ---- MIG (Multi-Instance GPU) -------------------------------------------------------------
 *
 * A MIG-capable board (mig_capable in the profile; A100 40/80 GB and H100 80 GB have tables,
 * src/simstate.c, "MIG profile tables") has 8 memory slices and 7 compute slices. MIG mode is per GPU, with a
 * current and a pending value; GPU instances (GIs) occupy a placement {start, size} of memory
 * slices and a number of compute slices; compute instances (CIs) split a GI's compute slices; a
 * "MIG device" is one CI. All of it lives in the GPU's dynamic block of the state file, so every
 * process sees what any process created; it is changed under the GPU's lock and each change is
 * published by one aligned store (an entry's in_use), so a writer killed half-way leaves the old
 * or the new state. Details and the profile tables: docs/mig.md. */

#define SIM_MIG_MEM_SLICES 8
#define SIM_MIG_COMPUTE_SLICES 7
#define SIM_MIG_MAX_GI 7       /* GPU instances per GPU */
#define SIM_MIG_MAX_CI 7       /* compute instances per GPU instance */
#define SIM_MIG_NO_ID 0xFFFFFFFFu /* "no instance" (NVML's value in nvmlEventData_t) */

/* One GPU instance profile of a board (static table). */
struct sim_mig_profile {
    unsigned int nvml_profile;   /* NVML_GPU_INSTANCE_PROFILE_* index it answers to */
    unsigned int id;             /* profile id (nvidia-smi mig -lgip "ID") */
    const char *name;            /* "1g.5gb", "1g.5gb+me", ... */
    unsigned int compute_slices; /* 1, 2, 3, 4 or 7 */
    unsigned int mem_slices;     /* placement size: 1, 2, 4 or 8 */
    unsigned int instance_count; /* at most this many at once */
    unsigned int sm_count;
    unsigned long long memory_mib;
    unsigned int copy_engines, decoders, encoders, jpegs, ofas;
    unsigned int nplacements;
    unsigned int starts[SIM_MIG_MEM_SLICES]; /* valid placement starts (size = mem_slices) */
};

/* The GPU instance profiles of GPU `phys` (NULL, *count 0 when it has no MIG table). */
const struct sim_mig_profile *sim_mig_profiles(int phys, int *count);
const struct sim_mig_profile *sim_mig_profile_by_id(int phys, unsigned int id);
const struct sim_mig_profile *sim_mig_profile_by_nvml(int phys, unsigned int nvml_profile);

/* Compute instance profiles are NVML_COMPUTE_INSTANCE_PROFILE_{1,2,3,4,7}_SLICE (0..4); the id
 * equals the index. Slices of CI profile `profile` (0 if unknown). */
unsigned int sim_mig_ci_slices(unsigned int profile);
/* Valid CI placement starts of `slices` slices in a GI of gi_slices compute slices; returns the
 * number written (at most SIM_MIG_COMPUTE_SLICES). */
int sim_mig_ci_starts(unsigned int slices, unsigned int gi_slices, unsigned int *starts);

struct sim_mig_gi_info {
    int slot;                    /* entry index in the state (stable while the GI exists) */
    unsigned int id;             /* GPU instance id (>= 1) */
    unsigned int profile_id;
    unsigned int start, size;    /* memory slice placement */
    unsigned int compute_slices;
    unsigned int sm_count;
    unsigned long long memory_bytes;
    unsigned long long serial;   /* node-wide creation number: tells a re-created GI apart */
};

struct sim_mig_ci_info {
    int gi_slot, slot;
    unsigned int gi_id, id;      /* compute instance id (>= 0) within its GI */
    unsigned int profile;        /* NVML_COMPUTE_INSTANCE_PROFILE_* */
    unsigned int start, size;    /* compute slice placement within the GI */
    unsigned int sm_count;
    unsigned long long memory_bytes; /* the GI's (CIs share their GI's memory) */
    unsigned long long serial;
    char uuid[48];               /* "MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" */
};

/* Negative results of the MIG calls. */
#define SIM_MIG_ENOTSUP (-1)     /* not MIG-capable, MIG disabled, or unknown profile */
#define SIM_MIG_EINVAL (-2)      /* invalid placement / argument */
#define SIM_MIG_ENOSPC (-3)      /* no room: overlap, slices, instance count */
#define SIM_MIG_ENOENT (-4)      /* no such instance (destroyed, re-created) */
#define SIM_MIG_EBUSY (-5)       /* processes or compute instances use it */

/* MIG mode: 0 with the current and pending modes (NVML_DEVICE_MIG_*), or SIM_MIG_ENOTSUP. */
int sim_mig_mode(int phys, unsigned int *current, unsigned int *pending);
/* Request MIG mode `mode` (0/1): the pending mode becomes `mode`; the change is applied at once
 * when the GPU is idle (no process holds a slot on it, no GPU instance exists). Returns 0 if
 * applied (or already current), SIM_MIG_EBUSY if it stays pending, SIM_MIG_ENOTSUP. */
int sim_mig_set_mode(int phys, unsigned int mode);

/* Create a GI of profile `profile_id` at memory slice `start` (-1: the simulator picks the
 * valid free placement with the highest start, which keeps the low slices free for large
 * profiles). 0 and *out, or SIM_MIG_ENOTSUP / EINVAL / ENOSPC. */
int sim_mig_gi_create(int phys, unsigned int profile_id, int start, struct sim_mig_gi_info *out);
/* Destroy GI `id` (serial 0: any serial). 0, ENOENT, EBUSY (CIs or processes on it). */
int sim_mig_gi_destroy(int phys, unsigned int id, unsigned long long serial);
/* GIs of GPU phys ordered by id (profile_id ~0u: all); returns the number (may exceed max). */
int sim_mig_gi_list(int phys, unsigned int profile_id, struct sim_mig_gi_info *out, int max);
/* GI `id` (serial 0: any): 0 and *out, or SIM_MIG_ENOENT. */
int sim_mig_gi_get(int phys, unsigned int id, unsigned long long serial, struct sim_mig_gi_info *out);
/* How many more GIs of the profile fit now (0 when MIG is disabled); SIM_MIG_ENOTSUP. */
int sim_mig_gi_remaining(int phys, unsigned int profile_id);

int sim_mig_ci_create(int phys, unsigned int gi_id, unsigned long long gi_serial,
                      unsigned int profile, int start, struct sim_mig_ci_info *out);
int sim_mig_ci_destroy(int phys, unsigned int gi_id, unsigned int ci_id, unsigned long long serial);
/* CIs of GI gi_id ordered by id (profile ~0u: all); the number (may exceed max) or ENOENT. */
int sim_mig_ci_list(int phys, unsigned int gi_id, unsigned int profile, struct sim_mig_ci_info *out,
                    int max);
int sim_mig_ci_get(int phys, unsigned int gi_id, unsigned int ci_id, unsigned long long serial,
                   struct sim_mig_ci_info *out);
int sim_mig_ci_remaining(int phys, unsigned int gi_id, unsigned int profile);
/* Every MIG device (CI) of GPU phys, ordered by (GI id, CI id): the number (may exceed max). */
int sim_mig_devices(int phys, struct sim_mig_ci_info *out, int max);
/* The MIG device with this "MIG-..." UUID (case-insensitive): its GPU's physical index and
 * *out, or -1. */
int sim_mig_find_uuid(const char *uuid, struct sim_mig_ci_info *out);
/* Bytes in use on GI gi_id of GPU phys by live processes (reaps dead ones first). */
unsigned long long sim_mig_mem_used(int phys, unsigned int gi_id);

/* Confine this process's use of GPU `phys` to the MIG device with this UUID (CUDA with
 * CUDA_VISIBLE_DEVICES=MIG-...): from then on, in this library copy, sim_gpu(phys) describes
 * the instance (memory, SMs, name, UUID - its hex digits under "GPU-", the form the CUDA driver
 * parses into the 16 UUID bytes), memory is charged to and capped by the GI, and work
 * runs on the instance's own timeline (instances do not time-slice with each other). Returns
 * phys, or -1 if no such MIG device exists. */
int sim_mig_bind_uuid(const char *uuid);
/* 1 if this process's library copy is bound to a MIG device on phys. */
int sim_mig_bound(int phys);

/* XID scoped to a GPU/compute instance (SIM_MIG_NO_ID: not scoped). Returns the seq or 0. */
uint64_t sim_xid_inject_scoped(int phys, uint64_t xid, unsigned int gi_id, unsigned int ci_id);

#ifdef __cplusplus
}
#endif
#endif /* VGPU_SIMSTATE_H */
