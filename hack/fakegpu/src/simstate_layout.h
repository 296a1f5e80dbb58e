/*
 * simstate_layout.h - the byte layout of the node state file, private to src/simstate*.c.
 *
 * The file is one `struct sim_state_file`, mapped MAP_SHARED by every process using the node.
 * Static parts (node, gpus) are written once by the creator before the magic is published and
 * never change. Each GPU's dynamic block is mutated only under that GPU's OFD byte-range lock;
 * every change is published by one aligned 8-byte (or 4-byte) store, so a writer killed halfway
 * leaves either the old or the new value, never a torn one that other processes would trust.
 */
#ifndef VGPU_SIMSTATE_LAYOUT_H
#define VGPU_SIMSTATE_LAYOUT_H

#include <stdint.h>

#include "simstate.h"

#define SIM_MAGIC 0x314d495355504756ULL /* "VGPUSIM1" little-endian */
#define SIM_LAYOUT_VERSION 3u /* 2: process slots identify processes across PID namespaces;
                                3: MIG state per GPU, slots name their GPU instance, scoped XIDs */

/* Lock byte ranges (locks may lie past EOF; they never touch data). The init and GPU bytes take
 * OFD locks (mutual exclusion); each process slot's byte takes a classic POSIX lock, held by the
 * slot's owner for as long as it owns the slot: its liveness and its pid in every namespace (see
 * "Process identity" in simstate.c). The ranges never overlap, so the two kinds never meet. */
#define SIM_LOCK_INIT_OFFSET 0
#define SIM_LOCK_GPU_OFFSET(phys) (16 + (phys))
#define SIM_LOCK_SLOT_OFFSET(phys, slot) (4096 + (phys) * SIM_MAX_PROCS + (slot))

/* A pid of the slot's owner as seen from one pid namespace other than its own, cached by a
 * reader that resolved it while the owner lived (pid 0 = entry unused). Published by ns_ino. */
struct sim_pid_view {
    uint64_t ns_ino;
    int32_t pid;
    uint32_t reserved;
};

#define SIM_PID_VIEWS 2

/* One process's memory on one GPU. Free when in_use == 0. A claimer (holding the GPU lock)
 * takes the slot's POSIX lock, bumps gen, writes the identity and bytes, and stores in_use = 1
 * last, so a half-claimed slot is still free; freeing stores in_use = 0 first. The identity
 * stays after the slot is freed, until the next claim, so the busy intervals a dead process
 * left behind can still be named. */
struct sim_proc_slot {
    uint32_t in_use;
    uint32_t gen;             /* claims so far; busy intervals carry (slot, gen) */
    int32_t ns_pid;           /* the owner's getpid(), in its own pid namespace */
    uint32_t mig_tag;         /* SIM_MIG_TAG(gi, ci) of the MIG device it runs on, 0: whole GPU */
    uint64_t ns_ino;          /* inode of the owner's pid namespace (0 if /proc was missing) */
    uint64_t start_time;      /* the owner's /proc/self/stat field 22 (0 if unreadable) */
    uint64_t nonce;           /* the owner's AT_RANDOM: differs after exec, same in both libs */
    uint64_t bytes;
    uint64_t freed_at;        /* sim_now_ns() when freed; the longest-free slot is claimed first */
    struct sim_pid_view views[SIM_PID_VIEWS];
};

/* One busy interval of the SMs, [start, end) on the CLOCK_MONOTONIC ns clock, tagged with the
 * process slot that submitted it (owner = slot index + 1, 0 = unattributed) and that slot's gen
 * at the time (a slot claimed since by another process no longer names the interval). */
struct sim_busy {
    uint64_t start;
    uint64_t end;
    uint32_t owner;
    uint32_t owner_gen;
};

#define SIM_TIMELINE_SLOTS SIM_TIMELINE /* ring of busy intervals per GPU */

/* MIG state of one GPU (see "MIG" in include/simstate.h). An entry is free when in_use == 0;
 * a creator (holding the GPU lock) fills a free entry and stores in_use = 1 last, a destroyer
 * stores in_use = 0 first, so a half-written entry is never in use. The mode is published by
 * storing `pending` before `current`: a writer killed in between leaves a pending change. */
struct sim_mig_ci_entry {
    uint32_t in_use;
    uint32_t id;
    uint32_t profile;
    uint32_t start;
    uint32_t size;
    uint32_t sm_count;
    uint64_t serial;
    uint64_t busy_until;      /* end of the last work submitted to this MIG device */
    char uuid[48];
};

struct sim_mig_gi_entry {
    uint32_t in_use;
    uint32_t id;
    uint32_t profile_id;
    uint32_t start;
    uint32_t size;
    uint32_t compute_slices;
    uint32_t sm_count;
    uint32_t reserved;
    uint64_t memory_bytes;
    uint64_t serial;
    struct sim_mig_ci_entry ci[SIM_MIG_MAX_CI];
};

struct sim_mig_state {
    uint32_t current;         /* NVML_DEVICE_MIG_DISABLE / _ENABLE */
    uint32_t pending;
    uint64_t reserved;
    struct sim_mig_gi_entry gi[SIM_MIG_MAX_GI];
};

struct sim_gpu_dyn {
    uint32_t flags;           /* SIM_GPU_* */
    uint32_t reserved;
    uint64_t busy_until;      /* end of the last submitted work */
    uint64_t tl_count;        /* intervals ever recorded; newest at (tl_count-1) % SLOTS */
    struct sim_busy tl[SIM_TIMELINE_SLOTS];
    uint64_t xid_seq;         /* seq of the newest XID event; event n lives at n % SIM_XID_QUEUE */
    struct sim_xid_event xids[SIM_XID_QUEUE];
    struct sim_proc_slot procs[SIM_MAX_PROCS];
    struct sim_mig_state mig;
};

struct sim_state_file {
    uint64_t magic;           /* SIM_MAGIC once initialised (stored last) */
    uint32_t layout_version;
    uint32_t reserved;
    uint64_t file_size;       /* sizeof(struct sim_state_file) */
    uint64_t profile_hash;    /* FNV-1a of the profile text it was built from */
    uint64_t mig_serial;      /* MIG instances ever created on the node (serials, UUIDs) */
    struct sim_node_info node;
    struct sim_gpu_info gpus[SIM_MAX_GPUS];
    struct sim_gpu_dyn dyn[SIM_MAX_GPUS];
};

/* A process slot's MIG device: GPU instance id in the low 16 bits, compute instance id + 1 above. */
#define SIM_MIG_TAG(gi, ci) ((uint32_t)(gi) | ((uint32_t)(ci) + 1u) << 16)
#define SIM_MIG_TAG_GI(tag) ((tag) & 0xFFFFu)

/* The physical board's static attributes (sim_gpu() describes a MIG device to a process bound to
 * one); NULL if phys is invalid. */
const struct sim_gpu_info *sim_gpu_board(int phys);

/* Profile parsing (simstate_profile.c). Fills node and gpus from the key=value text; returns 0,
 * or -1 with a message naming the line/key in err. */
int sim_profile_parse(const char *text, struct sim_node_info *node, struct sim_gpu_info *gpus,
                      char *err, unsigned long errlen);
uint64_t sim_profile_hash(const char *text);

#endif
