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
#define SIM_LAYOUT_VERSION 1u

/* OFD lock byte ranges (locks may lie past EOF; they never touch data). */
#define SIM_LOCK_INIT_OFFSET 0
#define SIM_LOCK_GPU_OFFSET(phys) (16 + (phys))

/* One process's memory on one GPU. Free when pid == 0. A claimer writes bytes and start_time
 * first and the pid last, so a half-claimed slot is still free. */
struct sim_proc_slot {
    int32_t pid;
    uint32_t reserved;
    uint64_t start_time;      /* /proc/<pid>/stat field 22, to detect pid reuse */
    uint64_t bytes;
};

/* One busy interval of the SMs, [start, end) on the CLOCK_MONOTONIC ns clock. */
struct sim_busy {
    uint64_t start;
    uint64_t end;
    int32_t pid;
    uint32_t reserved;
};

#define SIM_TIMELINE_SLOTS SIM_TIMELINE /* ring of busy intervals per GPU */

struct sim_gpu_dyn {
    uint32_t flags;           /* SIM_GPU_* */
    uint32_t reserved;
    uint64_t busy_until;      /* end of the last submitted work */
    uint64_t tl_count;        /* intervals ever recorded; newest at (tl_count-1) % SLOTS */
    struct sim_busy tl[SIM_TIMELINE_SLOTS];
    uint64_t xid_seq;         /* seq of the newest XID event; event n lives at n % SIM_XID_QUEUE */
    struct sim_xid_event xids[SIM_XID_QUEUE];
    struct sim_proc_slot procs[SIM_MAX_PROCS];
};

struct sim_state_file {
    uint64_t magic;           /* SIM_MAGIC once initialised (stored last) */
    uint32_t layout_version;
    uint32_t reserved;
    uint64_t file_size;       /* sizeof(struct sim_state_file) */
    uint64_t profile_hash;    /* FNV-1a of the profile text it was built from */
    struct sim_node_info node;
    struct sim_gpu_info gpus[SIM_MAX_GPUS];
    struct sim_gpu_dyn dyn[SIM_MAX_GPUS];
};

/* Profile parsing (simstate_profile.c). Fills node and gpus from the key=value text; returns 0,
 * or -1 with a message naming the line/key in err. */
int sim_profile_parse(const char *text, struct sim_node_info *node, struct sim_gpu_info *gpus,
                      char *err, unsigned long errlen);
uint64_t sim_profile_hash(const char *text);

#endif
