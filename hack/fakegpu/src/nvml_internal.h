/*
 * nvml_internal.h - shared by the fake NVML's source files (src/nvml*.c), nothing else.
 *
 * NVML's device handles are pointers to `struct nvmlDevice_st`; ours live in one static array,
 * one per GPU visible at nvmlInit (the container's view after NVIDIA_VISIBLE_DEVICES), in index
 * order. They stay valid memory forever, so a stale handle is detected, never dereferenced wild.
 */
#ifndef VGPU_NVML_INTERNAL_H
#define VGPU_NVML_INTERNAL_H

#include "nvml_abi.h"
#include "simstate.h"

struct nvmlDevice_st {
    int phys;            /* physical GPU index in the node state */
    unsigned int index;  /* NVML index in this process's view (a MIG device: its parent's) */
    /* MIG device handles only (nvml_mig.c): the compute instance the handle names. */
    int mig;             /* 1 for a MIG device handle */
    unsigned int gi_id, ci_id;
    unsigned long long serial; /* the compute instance's: a re-created one is another device */
    nvmlDevice_t parent;
};

/* Resolve a handle for a device call: checks initialisation, handle validity and the GPU's
 * lost/removed flags. On NVML_SUCCESS *phys and *info are set (each only if non-NULL). */
nvmlReturn_t nv_device(nvmlDevice_t device, int *phys, const struct sim_gpu_info **info);

/* Resolve `dev` into *phys_out / *info_out (see nv_device; either may be NULL when the caller
 * does not need it) or return its error from the calling function. One statement: the caller
 * declares the variables, e.g.
 *     int phys; const struct sim_gpu_info *g;
 *     DEVICE_OR_RETURN(device, &phys, &g); */
#define DEVICE_OR_RETURN(dev, phys_out, info_out)                       \
    do {                                                                \
        nvmlReturn_t dor_rc_ = nv_device((dev), (phys_out), (info_out)); \
        if (dor_rc_ != NVML_SUCCESS)                                    \
            return dor_rc_;                                             \
    } while (0)

/* Return NVML_ERROR_INVALID_ARGUMENT from the calling function unless `cond` holds. */
#define ARG_OR_RETURN(cond)                                             \
    do {                                                                \
        if (!(cond))                                                    \
            return NVML_ERROR_INVALID_ARGUMENT;                         \
    } while (0)

/* The prologue of a device getter: DEVICE_OR_RETURN, then ARG_OR_RETURN(args_ok) (the caller's
 * output arguments are checked only once the handle is known good, as NVML does). */
#define DEVICE_ARG_OR_RETURN(dev, phys_out, info_out, args_ok)         \
    do {                                                                \
        DEVICE_OR_RETURN((dev), (phys_out), (info_out));                \
        ARG_OR_RETURN(args_ok);                                         \
    } while (0)

/* MIG (nvml_mig.c). Whether `device` points into the MIG handle table, and if so whether the
 * compute instance it names still exists. */
int nv_is_mig_handle(nvmlDevice_t device);
int nv_mig_handle_alive(nvmlDevice_t device);
/* The MIG device handle of compute instance `ci` on the GPU of visible handle `parent`. */
nvmlDevice_t nv_mig_handle(nvmlDevice_t parent, const struct sim_mig_ci_info *ci);
/* For a live MIG handle: its compute instance and its GPU instance profile (either may be
 * NULL). NVML_SUCCESS, or INVALID_ARGUMENT if it is not a (live) MIG handle. */
nvmlReturn_t nv_mig_info(nvmlDevice_t device, struct sim_mig_ci_info *ci,
                         const struct sim_mig_profile **profile);

/* Check that NVML is initialised. */
nvmlReturn_t nv_initialised(void);

/* Handle of the visible GPU with physical index phys, or NULL if it is not visible. */
nvmlDevice_t nv_handle_of_phys(int phys);

/* Copy a string into a caller buffer of `length` bytes: INSUFFICIENT_SIZE if it does not fit. */
nvmlReturn_t nv_copy_str(char *dst, unsigned int length, const char *src);

/* Fill an nvmlPciInfo_t for physical GPU phys. */
void nv_fill_pci(int phys, nvmlPciInfo_t *pci);

#endif
