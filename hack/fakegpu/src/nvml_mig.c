/*
 * nvml_mig.c - fake NVML: Multi-Instance GPU. Mode (current/pending, changed only on an idle
 * GPU), GPU instance profiles and placements, GPU and compute instances, MIG device handles.
 *
 * The instances live in the node state (simstate.c, "MIG"), so what one process creates every
 * other process sees (the kubelet plugin, nvidia-smi-like tools, CUDA with MIG-<uuid>). Handles
 * are pointers into static tables here, one entry per (visible GPU, GI entry[, CI entry]) of the
 * state, refreshed when handed out; a handle whose instance was destroyed (or destroyed and
 * re-created: its serial differs) is rejected with NVML_ERROR_INVALID_ARGUMENT, as NVML does
 * for an invalid handle. Return codes follow nvml.h's documentation of each function.
 *
 * Simplifications (docs/mig.md): no permission checks (the real calls need root); a MIG
 * device's handle answers the parent's queries where it has no value of its own (PCI, clocks,
 * temperature); GPU instance ids are the lowest free from 1 (the driver numbers them by
 * placement).
 */
#include <stdio.h>
#include <string.h>

#include "nvml_internal.h"

#define MAX_DEVS (SIM_MIG_MAX_GI * SIM_MIG_MAX_CI)

struct nvmlGpuInstance_st {
    nvmlDevice_t device;     /* parent */
    unsigned int id;
    unsigned long long serial;
};

struct nvmlComputeInstance_st {
    nvmlGpuInstance_t gi;
    unsigned int id;
    unsigned long long serial;
};

static struct nvmlDevice_st g_mig_devs[SIM_MAX_GPUS][MAX_DEVS];
static struct nvmlGpuInstance_st g_gis[SIM_MAX_GPUS][SIM_MIG_MAX_GI];
static struct nvmlComputeInstance_st g_cis[SIM_MAX_GPUS][SIM_MIG_MAX_GI][SIM_MIG_MAX_CI];

int nv_is_mig_handle(nvmlDevice_t device)
{
    const struct nvmlDevice_st *first = &g_mig_devs[0][0];
    return device >= first && device < first + SIM_MAX_GPUS * MAX_DEVS;
}

int nv_mig_handle_alive(nvmlDevice_t device)
{
    return nv_is_mig_handle(device) && device->mig &&
           sim_mig_ci_get(device->phys, device->gi_id, device->ci_id, device->serial, NULL) == 0;
}

nvmlDevice_t nv_mig_handle(nvmlDevice_t parent, const struct sim_mig_ci_info *ci)
{
    struct nvmlDevice_st *d = &g_mig_devs[parent->index][ci->gi_slot * SIM_MIG_MAX_CI + ci->slot];
    d->phys = parent->phys;
    d->index = parent->index;
    d->gi_id = ci->gi_id;
    d->ci_id = ci->id;
    d->serial = ci->serial;
    d->parent = parent;
    d->mig = 1;
    return d;
}

nvmlReturn_t nv_mig_info(nvmlDevice_t device, struct sim_mig_ci_info *ci,
                         const struct sim_mig_profile **profile)
{
    struct sim_mig_ci_info c;
    if (!nv_is_mig_handle(device) || !device->mig ||
        sim_mig_ci_get(device->phys, device->gi_id, device->ci_id, device->serial, &c) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (ci)
        *ci = c;
    if (profile) {
        struct sim_mig_gi_info g;
        *profile = sim_mig_gi_get(device->phys, c.gi_id, 0, &g) == 0
                       ? sim_mig_profile_by_id(device->phys, g.profile_id)
                       : NULL;
    }
    return NVML_SUCCESS;
}

/* A full-GPU handle (not a MIG device) that is MIG-capable: NVML_SUCCESS and *phys. */
static nvmlReturn_t mig_parent(nvmlDevice_t device, int *phys)
{
    DEVICE_OR_RETURN(device, phys, NULL);
    if (device->mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    int n;
    if (!sim_mig_profiles(*phys, &n))
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static nvmlReturn_t mig_code(int rc)
{
    switch (rc) {
    case 0: return NVML_SUCCESS;
    case SIM_MIG_ENOTSUP: return NVML_ERROR_NOT_SUPPORTED;
    case SIM_MIG_EINVAL: return NVML_ERROR_INVALID_ARGUMENT;
    case SIM_MIG_ENOSPC: return NVML_ERROR_INSUFFICIENT_RESOURCES;
    case SIM_MIG_ENOENT: return NVML_ERROR_INVALID_ARGUMENT; /* the handle is stale */
    case SIM_MIG_EBUSY: return NVML_ERROR_IN_USE;
    default: return NVML_ERROR_UNKNOWN;
    }
}

static int mig_is_enabled(int phys)
{
    unsigned int cur, pend;
    return sim_mig_mode(phys, &cur, &pend) == 0 && cur == NVML_DEVICE_MIG_ENABLE;
}

/* ---- mode ------------------------------------------------------------------------------ */

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                             unsigned int *pendingMode)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, currentMode && pendingMode);
    if (device->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    if (sim_mig_mode(phys, currentMode, pendingMode) != 0)
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* The pending mode is set; it becomes current at once when the GPU is idle (no process, no GPU
 * instance), else *activationStatus is NVML_ERROR_IN_USE and it stays pending: the caller idles
 * the GPU and calls again, as nvml.h documents. */
SIM_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                             nvmlReturn_t *activationStatus)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL,
                         activationStatus && (mode == NVML_DEVICE_MIG_DISABLE ||
                                              mode == NVML_DEVICE_MIG_ENABLE));
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    int r = sim_mig_set_mode(phys, mode);
    if (r == SIM_MIG_ENOTSUP)
        return NVML_ERROR_NOT_SUPPORTED;
    *activationStatus = r == 0 ? NVML_SUCCESS : NVML_ERROR_IN_USE;
    return NVML_SUCCESS;
}

/* ---- GPU instance profiles and placements ------------------------------------------------ */

/* The profile a NVML_GPU_INSTANCE_PROFILE_* index names: NVML_SUCCESS and *p, INVALID_ARGUMENT
 * past the last index, NOT_SUPPORTED for a profile the board lacks. */
static nvmlReturn_t profile_of_index(int phys, unsigned int profile,
                                     const struct sim_mig_profile **p)
{
    if (profile >= NVML_GPU_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *p = sim_mig_profile_by_nvml(phys, profile);
    return *p ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static void fill_gi_profile_v3(const struct sim_mig_profile *p, nvmlGpuInstanceProfileInfo_v3_t *o)
{
    o->id = p->id;
    o->sliceCount = p->compute_slices;
    o->instanceCount = p->instance_count;
    o->multiprocessorCount = p->sm_count;
    o->copyEngineCount = p->copy_engines;
    o->decoderCount = p->decoders;
    o->encoderCount = p->encoders;
    o->jpegCount = p->jpegs;
    o->ofaCount = p->ofas;
    o->memorySizeMB = p->memory_mib;
    snprintf(o->name, sizeof(o->name), "MIG %s", p->name);
    o->capabilities = 0; /* no P2P, no graphics */
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device,
                                                            unsigned int profile,
                                                            nvmlGpuInstanceProfileInfo_t *info)
{
    int phys;
    const struct sim_mig_profile *p;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, info);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc == NVML_SUCCESS)
        rc = profile_of_index(phys, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    nvmlGpuInstanceProfileInfo_v3_t v3;
    fill_gi_profile_v3(p, &v3);
    memset(info, 0, sizeof(*info));
    info->id = v3.id;
    info->isP2pSupported = 0;
    info->sliceCount = v3.sliceCount;
    info->instanceCount = v3.instanceCount;
    info->multiprocessorCount = v3.multiprocessorCount;
    info->copyEngineCount = v3.copyEngineCount;
    info->decoderCount = v3.decoderCount;
    info->encoderCount = v3.encoderCount;
    info->jpegCount = v3.jpegCount;
    info->ofaCount = v3.ofaCount;
    info->memorySizeMB = v3.memorySizeMB;
    return NVML_SUCCESS;
}

/* The versioned forms: v2 (with isP2pSupported) or v3 (with capabilities), by info->version. */
static nvmlReturn_t fill_gi_profile_versioned(const struct sim_mig_profile *p,
                                              nvmlGpuInstanceProfileInfo_v2_t *info)
{
    nvmlGpuInstanceProfileInfo_v3_t v3;
    fill_gi_profile_v3(p, &v3);
    if (info->version == nvmlGpuInstanceProfileInfo_v3) {
        v3.version = info->version;
        memcpy(info, &v3, sizeof(v3)); /* the caller's buffer is a v3 struct */
        return NVML_SUCCESS;
    }
    if (info->version != nvmlGpuInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    info->id = v3.id;
    info->isP2pSupported = 0;
    info->sliceCount = v3.sliceCount;
    info->instanceCount = v3.instanceCount;
    info->multiprocessorCount = v3.multiprocessorCount;
    info->copyEngineCount = v3.copyEngineCount;
    info->decoderCount = v3.decoderCount;
    info->encoderCount = v3.encoderCount;
    info->jpegCount = v3.jpegCount;
    info->ofaCount = v3.ofaCount;
    info->memorySizeMB = v3.memorySizeMB;
    memcpy(info->name, v3.name, sizeof(info->name));
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t device,
                                                             unsigned int profile,
                                                             nvmlGpuInstanceProfileInfo_v2_t *info)
{
    int phys;
    const struct sim_mig_profile *p;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, info);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc == NVML_SUCCESS)
        rc = profile_of_index(phys, profile, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    return fill_gi_profile_versioned(p, info);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, info);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_mig_profile *p = sim_mig_profile_by_id(phys, profileId);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    return fill_gi_profile_versioned(p, info);
}

/* Possible placements regardless of the mode and of what exists (nvml.h); with placements NULL
 * only the count. */
SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, count);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_mig_profile *p = sim_mig_profile_by_id(phys, profileId);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (placements) {
        if (*count < p->nplacements) {
            *count = p->nplacements;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned int i = 0; i < p->nplacements; i++) {
            placements[i].start = p->starts[i];
            placements[i].size = p->mem_slices;
        }
    }
    *count = p->nplacements;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                                  unsigned int profileId,
                                                                  unsigned int *count)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, count);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mig_is_enabled(phys))
        return NVML_ERROR_NOT_SUPPORTED;
    int n = sim_mig_gi_remaining(phys, profileId);
    if (n < 0)
        return n == SIM_MIG_EINVAL ? NVML_ERROR_INVALID_ARGUMENT : mig_code(n);
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

/* ---- GPU instances ----------------------------------------------------------------------- */

static nvmlGpuInstance_t gi_handle(nvmlDevice_t parent, const struct sim_mig_gi_info *g)
{
    struct nvmlGpuInstance_st *h = &g_gis[parent->index][g->slot];
    h->device = parent;
    h->id = g->id;
    h->serial = g->serial;
    return h;
}

/* Resolve a GI handle: NVML_SUCCESS with *phys and *info, or its error. */
static nvmlReturn_t gi_resolve(nvmlGpuInstance_t gi, int *phys, struct sim_mig_gi_info *info)
{
    if (nv_initialised() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    const struct nvmlGpuInstance_st *first = &g_gis[0][0];
    if (!gi || gi < first || gi >= first + SIM_MAX_GPUS * SIM_MIG_MAX_GI || !gi->device)
        return NVML_ERROR_INVALID_ARGUMENT;
    DEVICE_OR_RETURN(gi->device, phys, NULL);
    if (sim_mig_gi_get(*phys, gi->id, gi->serial, info) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned int profileId, int start,
                              nvmlGpuInstance_t *gpuInstance)
{
    int phys;
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mig_is_enabled(phys))
        return NVML_ERROR_NOT_SUPPORTED;
    struct sim_mig_gi_info g;
    rc = mig_code(sim_mig_gi_create(phys, profileId, start, &g));
    if (rc == NVML_SUCCESS)
        *gpuInstance = gi_handle(device, &g);
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                    nvmlGpuInstance_t *gpuInstance)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, gpuInstance);
    return create_gi(device, profileId, -1, gpuInstance);
}

SIM_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, gpuInstance && placement);
    const struct sim_mig_profile *p = sim_mig_profile_by_id(phys, profileId);
    if (p && (placement->size != p->mem_slices || placement->start >= SIM_MIG_MEM_SLICES))
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, profileId, (int)placement->start, gpuInstance);
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    int phys;
    struct sim_mig_gi_info g;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    return mig_code(sim_mig_gi_destroy(phys, g.id, g.serial));
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                                  nvmlGpuInstance_t *gpuInstances,
                                                  unsigned int *count)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, gpuInstances && count);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mig_is_enabled(phys))
        return NVML_ERROR_NOT_SUPPORTED;
    const struct sim_mig_profile *p = sim_mig_profile_by_id(phys, profileId);
    if (!p)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_mig_gi_info gis[SIM_MIG_MAX_GI];
    int n = sim_mig_gi_list(phys, profileId, gis, SIM_MIG_MAX_GI);
    /* The buffer holds instanceCount entries, as nvml.h asks of the caller. */
    for (int i = 0; i < n && i < SIM_MIG_MAX_GI; i++)
        gpuInstances[i] = gi_handle(device, &gis[i]);
    *count = (unsigned int)(n > 0 ? n : 0);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                     nvmlGpuInstance_t *gpuInstance)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, gpuInstance);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mig_is_enabled(phys))
        return NVML_ERROR_NOT_SUPPORTED;
    struct sim_mig_gi_info g;
    if (sim_mig_gi_get(phys, id, 0, &g) != 0)
        return NVML_ERROR_NOT_FOUND;
    *gpuInstance = gi_handle(device, &g);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                               nvmlGpuInstanceInfo_t *info)
{
    int phys;
    struct sim_mig_gi_info g;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(info);
    info->device = gpuInstance->device;
    info->id = g.id;
    info->profileId = g.profile_id;
    info->placement.start = g.start;
    info->placement.size = g.size;
    return NVML_SUCCESS;
}

/* ---- compute instances -------------------------------------------------------------------- */

/* Profile `profile` inside GI g: NVML_SUCCESS and its slice count, INVALID_ARGUMENT past the
 * last index, NOT_SUPPORTED for one the GI cannot hold. */
static nvmlReturn_t ci_profile_slices(const struct sim_mig_gi_info *g, unsigned int profile,
                                      unsigned int *slices)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *slices = sim_mig_ci_slices(profile);
    if (*slices == 0 || *slices > g->compute_slices)
        return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

static void fill_ci_profile_v3(int phys, const struct sim_mig_gi_info *g, unsigned int profile,
                               unsigned int slices, nvmlComputeInstanceProfileInfo_v3_t *o)
{
    const struct sim_mig_profile *p = sim_mig_profile_by_id(phys, g->profile_id);
    o->id = profile;
    o->sliceCount = slices;
    o->instanceCount = g->compute_slices / slices;
    o->multiprocessorCount = g->sm_count * slices / g->compute_slices;
    o->sharedCopyEngineCount = p ? p->copy_engines : 0;
    o->sharedDecoderCount = p ? p->decoders : 0;
    o->sharedEncoderCount = p ? p->encoders : 0;
    o->sharedJpegCount = p ? p->jpegs : 0;
    o->sharedOfaCount = p ? p->ofas : 0;
    /* nvidia-smi's names: "MIG 1g.5gb" for a CI that fills its GI, else "MIG 1c.3g.20gb". */
    if (slices == g->compute_slices)
        snprintf(o->name, sizeof(o->name), "MIG %s", p ? p->name : "?");
    else
        snprintf(o->name, sizeof(o->name), "MIG %uc.%s", slices, p ? p->name : "?");
    o->capabilities = 0;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info)
{
    int phys;
    struct sim_mig_gi_info g;
    unsigned int slices;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(info && engProfile < NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT);
    rc = ci_profile_slices(&g, profile, &slices);
    if (rc != NVML_SUCCESS)
        return rc;
    nvmlComputeInstanceProfileInfo_v3_t v3;
    fill_ci_profile_v3(phys, &g, profile, slices, &v3);
    info->id = v3.id;
    info->sliceCount = v3.sliceCount;
    info->instanceCount = v3.instanceCount;
    info->multiprocessorCount = v3.multiprocessorCount;
    info->sharedCopyEngineCount = v3.sharedCopyEngineCount;
    info->sharedDecoderCount = v3.sharedDecoderCount;
    info->sharedEncoderCount = v3.sharedEncoderCount;
    info->sharedJpegCount = v3.sharedJpegCount;
    info->sharedOfaCount = v3.sharedOfaCount;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info)
{
    int phys;
    struct sim_mig_gi_info g;
    unsigned int slices;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(info && engProfile < NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT);
    rc = ci_profile_slices(&g, profile, &slices);
    if (rc != NVML_SUCCESS)
        return rc;
    nvmlComputeInstanceProfileInfo_v3_t v3;
    fill_ci_profile_v3(phys, &g, profile, slices, &v3);
    if (info->version == nvmlComputeInstanceProfileInfo_v3) {
        v3.version = info->version;
        memcpy(info, &v3, sizeof(v3)); /* the caller's buffer is a v3 struct */
        return NVML_SUCCESS;
    }
    if (info->version != nvmlComputeInstanceProfileInfo_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memcpy(info, &v3, sizeof(*info)); /* v2 is v3 without the trailing capabilities */
    info->version = nvmlComputeInstanceProfileInfo_v2;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, unsigned int *count)
{
    int phys;
    struct sim_mig_gi_info g;
    unsigned int slices;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(count);
    rc = ci_profile_slices(&g, profileId, &slices);
    if (rc != NVML_SUCCESS)
        return rc;
    int n = sim_mig_ci_remaining(phys, g.id, profileId);
    if (n < 0)
        return mig_code(n);
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstancePossiblePlacements(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstancePlacement_t *placements, unsigned int *count)
{
    int phys;
    struct sim_mig_gi_info g;
    unsigned int slices;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(count);
    rc = ci_profile_slices(&g, profileId, &slices);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned int starts[SIM_MIG_COMPUTE_SLICES];
    unsigned int n = (unsigned int)sim_mig_ci_starts(slices, g.compute_slices, starts);
    if (placements) {
        if (*count < n) {
            *count = n;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (unsigned int i = 0; i < n; i++) {
            placements[i].start = starts[i];
            placements[i].size = slices;
        }
    }
    *count = n;
    return NVML_SUCCESS;
}

static nvmlComputeInstance_t ci_handle(nvmlGpuInstance_t gi, const struct sim_mig_ci_info *c)
{
    struct nvmlComputeInstance_st *h = &g_cis[gi->device->index][c->gi_slot][c->slot];
    h->gi = gi;
    h->id = c->id;
    h->serial = c->serial;
    return h;
}

static nvmlReturn_t ci_resolve(nvmlComputeInstance_t ci, int *phys, struct sim_mig_ci_info *info)
{
    if (nv_initialised() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    const struct nvmlComputeInstance_st *first = &g_cis[0][0][0];
    if (!ci || ci < first || ci >= first + SIM_MAX_GPUS * SIM_MIG_MAX_GI * SIM_MIG_MAX_CI ||
        !ci->gi)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_mig_gi_info g;
    nvmlReturn_t rc = gi_resolve(ci->gi, phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    if (sim_mig_ci_get(*phys, g.id, ci->id, ci->serial, info) != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

static nvmlReturn_t create_ci(nvmlGpuInstance_t gpuInstance, unsigned int profileId, int start,
                              nvmlComputeInstance_t *computeInstance)
{
    int phys;
    struct sim_mig_gi_info g;
    unsigned int slices;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(computeInstance);
    rc = ci_profile_slices(&g, profileId, &slices);
    if (rc != NVML_SUCCESS)
        return rc;
    struct sim_mig_ci_info c;
    rc = mig_code(sim_mig_ci_create(phys, g.id, g.serial, profileId, start, &c));
    if (rc == NVML_SUCCESS)
        *computeInstance = ci_handle(gpuInstance, &c);
    return rc;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(nvmlGpuInstance_t gpuInstance,
                                                             unsigned int profileId,
                                                             nvmlComputeInstance_t *computeInstance)
{
    return create_ci(gpuInstance, profileId, -1, computeInstance);
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstanceWithPlacement(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    const nvmlComputeInstancePlacement_t *placement, nvmlComputeInstance_t *computeInstance)
{
    if (nv_initialised() != NVML_SUCCESS)
        return NVML_ERROR_UNINITIALIZED;
    ARG_OR_RETURN(placement && placement->size == sim_mig_ci_slices(profileId) &&
                  placement->start < SIM_MIG_COMPUTE_SLICES);
    return create_ci(gpuInstance, profileId, (int)placement->start, computeInstance);
}

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    int phys;
    struct sim_mig_ci_info c;
    nvmlReturn_t rc = ci_resolve(computeInstance, &phys, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    return mig_code(sim_mig_ci_destroy(phys, c.gi_id, c.id, c.serial));
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(nvmlGpuInstance_t gpuInstance,
                                                           unsigned int profileId,
                                                           nvmlComputeInstance_t *computeInstances,
                                                           unsigned int *count)
{
    int phys;
    struct sim_mig_gi_info g;
    unsigned int slices;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(computeInstances && count);
    rc = ci_profile_slices(&g, profileId, &slices);
    if (rc != NVML_SUCCESS)
        return rc;
    struct sim_mig_ci_info cis[SIM_MIG_MAX_CI];
    int n = sim_mig_ci_list(phys, g.id, profileId, cis, SIM_MIG_MAX_CI);
    if (n < 0)
        return mig_code(n);
    for (int i = 0; i < n && i < SIM_MIG_MAX_CI; i++)
        computeInstances[i] = ci_handle(gpuInstance, &cis[i]);
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(nvmlGpuInstance_t gpuInstance,
                                                              unsigned int id,
                                                              nvmlComputeInstance_t *computeInstance)
{
    int phys;
    struct sim_mig_gi_info g;
    nvmlReturn_t rc = gi_resolve(gpuInstance, &phys, &g);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(computeInstance);
    struct sim_mig_ci_info c;
    if (sim_mig_ci_get(phys, g.id, id, 0, &c) != 0)
        return NVML_ERROR_NOT_FOUND;
    *computeInstance = ci_handle(gpuInstance, &c);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                      nvmlComputeInstanceInfo_t *info)
{
    int phys;
    struct sim_mig_ci_info c;
    nvmlReturn_t rc = ci_resolve(computeInstance, &phys, &c);
    if (rc != NVML_SUCCESS)
        return rc;
    ARG_OR_RETURN(info);
    info->device = computeInstance->gi->device;
    info->gpuInstance = computeInstance->gi;
    info->id = c.id;
    info->profileId = c.profile;
    info->placement.start = c.start;
    info->placement.size = c.size;
    return NVML_SUCCESS;
}

/* The original entry point predates placements: it fills the other fields only. */
SIM_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                                   nvmlComputeInstanceInfo_t *info)
{
    nvmlComputeInstanceInfo_t full;
    ARG_OR_RETURN(info);
    nvmlReturn_t rc = nvmlComputeInstanceGetInfo_v2(computeInstance, &full);
    if (rc == NVML_SUCCESS) {
        info->device = full.device;
        info->gpuInstance = full.gpuInstance;
        info->id = full.id;
        info->profileId = full.profileId;
    }
    return rc;
}

/* ---- MIG device handles ------------------------------------------------------------------ */

SIM_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device, unsigned int *isMigDevice)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, isMigDevice);
    *isMigDevice = device->mig ? 1 : 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, id);
    if (!device->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = device->gi_id;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    DEVICE_ARG_OR_RETURN(device, NULL, NULL, id);
    if (!device->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *id = device->ci_id;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, count);
    int n;
    *count = !device->mig && sim_mig_profiles(phys, &n) && mig_is_enabled(phys)
                 ? SIM_MIG_COMPUTE_SLICES
                 : 0;
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device, unsigned int index,
                                                            nvmlDevice_t *migDevice)
{
    int phys;
    DEVICE_ARG_OR_RETURN(device, &phys, NULL, migDevice);
    nvmlReturn_t rc = mig_parent(device, &phys);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!mig_is_enabled(phys))
        return NVML_ERROR_NOT_SUPPORTED;
    ARG_OR_RETURN(index < SIM_MIG_COMPUTE_SLICES);
    struct sim_mig_ci_info devs[MAX_DEVS];
    int n = sim_mig_devices(phys, devs, MAX_DEVS);
    if ((int)index >= n)
        return NVML_ERROR_NOT_FOUND;
    *migDevice = nv_mig_handle(device, &devs[index]);
    return NVML_SUCCESS;
}

SIM_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                     nvmlDevice_t *device)
{
    DEVICE_ARG_OR_RETURN(migDevice, NULL, NULL, device);
    if (!migDevice->mig)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = migDevice->parent;
    return NVML_SUCCESS;
}
