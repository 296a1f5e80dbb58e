/*
 * nvml_control.c - the simulator's test-only control API, exported from libnvidia-ml.so.1 next to
 * the NVML functions so that tests and `vgpu-dra fakegpu inject|status` can drive a node through
 * ctypes with the same library every client loads. Not NVML: no nvmlInit needed, physical
 * GPU indices (the node's view, not a container's). Processes are listed as NVML lists them
 * for the caller: with their pids in its pid namespace, and only those it can see there;
 * memory_used is every process's.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "nvml_internal.h"

#define XID_FALLEN_OFF_THE_BUS 79

SIM_EXPORT int vgpusim_inject_xid(int phys, unsigned long long xid)
{
    return sim_xid_inject(phys, xid) ? 0 : -1;
}

/* An XID on one MIG instance of GPU phys (gi_id/ci_id: the instance's ids; ~0u: not scoped). */
SIM_EXPORT int vgpusim_inject_xid_scoped(int phys, unsigned long long xid, unsigned int gi_id,
                                         unsigned int ci_id)
{
    return sim_xid_inject_scoped(phys, xid, gi_id, ci_id) ? 0 : -1;
}

SIM_EXPORT int vgpusim_set_lost(int phys, int on)
{
    int was = (sim_gpu_flags(phys) & SIM_GPU_LOST) != 0;
    if (sim_set_flag(phys, SIM_GPU_LOST, on) != 0)
        return -1;
    if (on && !was)
        sim_xid_inject(phys, XID_FALLEN_OFF_THE_BUS);
    return 0;
}

SIM_EXPORT int vgpusim_set_removed(int phys, int on)
{
    return sim_set_flag(phys, SIM_GPU_REMOVED, on);
}

SIM_EXPORT const char *vgpusim_attach_error(void) { return sim_attach_error(); }

/* A bounded appender: keeps counting past the end so the caller learns the full length. */
struct out {
    char *buf;
    size_t cap, len;
};

static void put(struct out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *dst = o->len < o->cap ? o->buf + o->len : NULL;
    size_t room = o->len < o->cap ? o->cap - o->len : 0;
    int n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

static void put_str(struct out *o, const char *s)
{
    put(o, "\"");
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            put(o, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            put(o, "\\u%04x", (unsigned char)*s);
        else
            put(o, "%c", *s);
    }
    put(o, "\"");
}

SIM_EXPORT int vgpusim_status_json(char *buf, int cap)
{
    if (sim_attach() != 0)
        return -1;
    struct out o = {buf, cap > 0 ? (size_t)cap : 0, 0};
    if (o.cap)
        buf[0] = '\0';
    const struct sim_node_info *node = sim_node();
    put(&o, "{\"node\":");
    put_str(&o, node->name);
    put(&o, ",\"driver_version\":");
    put_str(&o, node->driver_version);
    put(&o, ",\"cuda_driver_version\":%d,\"gpus\":[", node->cuda_driver_version);
    for (int i = 0; i < sim_gpu_count(); i++) {
        const struct sim_gpu_info *g = sim_gpu(i);
        unsigned int flags = sim_gpu_flags(i);
        struct sim_proc_usage procs[SIM_MAX_PROCS];
        int n = sim_processes(i, procs, SIM_MAX_PROCS); /* those this caller's namespace sees */
        unsigned long long used = sim_mem_used(i);        /* everyone's */
        put(&o, "%s{\"index\":%d,\"uuid\":", i ? "," : "", i);
        put_str(&o, g->uuid);
        put(&o, ",\"name\":");
        put_str(&o, g->name);
        put(&o, ",\"pci_bus_id\":");
        put_str(&o, g->pci_bus_id);
        put(&o,
            ",\"lost\":%s,\"removed\":%s,\"memory_total\":%llu,\"memory_used\":%llu,"
            "\"utilization\":%u,\"xid_seq\":%llu,\"processes\":[",
            (flags & SIM_GPU_LOST) ? "true" : "false", (flags & SIM_GPU_REMOVED) ? "true" : "false",
            (unsigned long long)g->memory_total, used, sim_utilization(i, 0, 0),
            (unsigned long long)sim_xid_seq(i));
        for (int p = 0; p < n && p < SIM_MAX_PROCS; p++)
            put(&o, "%s{\"pid\":%d,\"memory_used\":%llu,\"utilization\":%u}", p ? "," : "",
                procs[p].pid, (unsigned long long)procs[p].bytes,
                sim_utilization(i, procs[p].pid, 0));
        put(&o, "]}");
    }
    put(&o, "]}");
    if (o.cap && o.len >= o.cap)
        buf[o.cap - 1] = '\0';
    return (int)o.len;
}
