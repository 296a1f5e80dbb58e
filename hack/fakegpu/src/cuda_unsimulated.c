/*
 * cuda_unsimulated.c - every cuda.h entry point the simulator does not model.
 *
 * A program linked against any public driver function must load against the fake libcuda.so.1,
 * and an unmodelled call must fail the way a driver without the feature fails: with
 * CUDA_ERROR_NOT_SUPPORTED, touching none of its arguments. The list is generated from the
 * official headers by gen_unsimulated.py into cuda_unsimulated.def (committed; the build does not
 * need the headers), and cuGetProcAddress serves the same stubs (cuda_procaddr.c).
 *
 * Each stub is declared without parameters: on the platform ABI the caller sets up and cleans up
 * its own arguments, so a function that ignores them may be called with any, and the stubs need
 * none of the official parameter types (several hundred structs the simulator never uses).
 * VGPU_SIM_CUDA_TRACE=1 names each unsimulated call on stderr.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cuda_internal.h"

static CUresult unsimulated(const char *symbol) {
    if (getenv("VGPU_SIM_CUDA_TRACE") != NULL)
        fprintf(stderr, "vgpu-sim: %s is not simulated: CUDA_ERROR_NOT_SUPPORTED\n", symbol);
    return CUDA_ERROR_NOT_SUPPORTED;
}

#define CU_STUB(sym)                                                                              \
    CU_API CUresult sym(void);                                                                    \
    CU_API CUresult sym(void) { return unsimulated(#sym); }
#define CU_ENTRY(base, version, sym, ptsym)
#include "cuda_unsimulated.def"
#undef CU_ENTRY
#undef CU_STUB
