/*
 * nvml_events.c - fake NVML event sets: XID critical errors injected into the node state
 * (vgpusim_inject_xid, `vgpu-dra fakegpu inject xid`) are delivered to every event set that
 * registered for nvmlEventTypeXidCriticalError on that GPU, once per set, in order. An XID
 * scoped to a MIG instance (vgpusim_inject_xid_scoped) carries its GPU and compute instance ids
 * in gpuInstanceId/computeInstanceId (0xFFFFFFFF otherwise), as the real library reports it.
 *
 * A set remembers, per registered GPU, the XID sequence number it has consumed (starting at the
 * GPU's latest event at registration time, so only later events are seen). nvmlEventSetWait
 * polls the shared queue every millisecond until an event arrives or the timeout passes; the
 * state has no cross-process wakeup and a millisecond is well below anything callers measure.
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "nvml_internal.h"

#define SUPPORTED_EVENTS ((unsigned long long)nvmlEventTypeXidCriticalError)

struct nvmlEventSet_st {
    pthread_mutex_t mu;
    int n;
    struct {
        nvmlDevice_t device;
        int phys;
        unsigned long long types;
        uint64_t cursor;
    } reg[SIM_MAX_GPUS];
};

SIM_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof(*s));
    if (!s)
        return NVML_ERROR_MEMORY;
    pthread_mutex_init(&s->mu, NULL);
    *set = s;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    pthread_mutex_destroy(&set->mu);
    free(set);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                         unsigned long long *eventTypes)
{
    int phys;
    nvmlReturn_t rc = nv_device(device, &phys, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!eventTypes)
        return NVML_ERROR_INVALID_ARGUMENT;
    *eventTypes = SUPPORTED_EVENTS;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes,
                                                 nvmlEventSet_t set)
{
    int phys;
    nvmlReturn_t rc = nv_device(device, &phys, NULL);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (eventTypes & ~SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    pthread_mutex_lock(&set->mu);
    int i;
    for (i = 0; i < set->n; i++)
        if (set->reg[i].phys == phys)
            break;
    if (i == set->n) {
        set->reg[i].device = device;
        set->reg[i].phys = phys;
        set->reg[i].cursor = sim_xid_seq(phys);
        set->n++;
    }
    set->reg[i].types |= eventTypes;
    pthread_mutex_unlock(&set->mu);
    return NVML_SUCCESS;
}

static int poll_once(nvmlEventSet_t set, nvmlEventData_t *data)
{
    int found = 0;
    pthread_mutex_lock(&set->mu);
    for (int i = 0; i < set->n && !found; i++) {
        struct sim_xid_event e;
        if (!(set->reg[i].types & nvmlEventTypeXidCriticalError))
            continue;
        if (sim_xid_next(set->reg[i].phys, &set->reg[i].cursor, &e)) {
            data->device = set->reg[i].device;
            data->eventType = nvmlEventTypeXidCriticalError;
            data->eventData = e.xid;
            data->gpuInstanceId = e.gpu_instance_id; /* SIM_MIG_NO_ID unless scoped */
            data->computeInstanceId = e.compute_instance_id;
            found = 1;
        }
    }
    pthread_mutex_unlock(&set->mu);
    return found;
}

SIM_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                            unsigned int timeoutms)
{
    if (nv_initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long deadline = sim_now_ns() + (unsigned long long)timeoutms * 1000000ULL;
    for (;;) {
        if (poll_once(set, data))
            return NVML_SUCCESS;
        if (sim_now_ns() >= deadline)
            return NVML_ERROR_TIMEOUT;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
}

/* The original entry point's callers pass the older, smaller event record (device, type, data):
 * fill only those fields. */
SIM_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                         unsigned int timeoutms)
{
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlEventData_t full;
    nvmlReturn_t rc = nvmlEventSetWait_v2(set, &full, timeoutms);
    if (rc == NVML_SUCCESS) {
        data->device = full.device;
        data->eventType = full.eventType;
        data->eventData = full.eventData;
    }
    return rc;
}
