/*
 * nvml_unsimulated.c - every nvml.h function the simulated NVML does not model.
 *
 * A monitoring tool linked against any public NVML function must load against the fake
 * libnvidia-ml.so.1, and an unmodelled query must answer as a driver answers for a feature the
 * GPU lacks: NVML_ERROR_NOT_SUPPORTED, touching none of its arguments (tools such as nvidia-smi
 * and nvitop skip a field on that answer). The list is generated from the official headers by
 * gen_unsimulated.py into nvml_unsimulated.def (committed; the build does not need the headers).
 *
 * Each stub is declared without parameters: on the platform ABI the caller sets up and cleans up
 * its own arguments, so a function that ignores them may be called with any. The ABI check
 * (`make abi-check`) therefore leaves this file out: it has no prototypes to compare.
 */
#include "nvml_internal.h"

#define NVML_STUB(sym)                                                                            \
    SIM_EXPORT nvmlReturn_t sym(void);                                                            \
    SIM_EXPORT nvmlReturn_t sym(void) { return NVML_ERROR_NOT_SUPPORTED; }
#include "nvml_unsimulated.def"
#undef NVML_STUB
