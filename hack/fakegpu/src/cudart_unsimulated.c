/*
 * cudart_unsimulated.c - every public runtime function the simulator does not model.
 *
 * A program or library linked against any function of NVIDIA's shared runtime must load against
 * the simulated libcudart.so.12 / .13, and an unmodelled call must fail cleanly with
 * cudaErrorNotSupported (recorded as the thread's last error, as every runtime error is),
 * touching none of its arguments. The list is generated from the official headers by
 * gen_cudart.py into cudart_exports.def (committed; the build does not need the headers): the
 * CUDART_STUB rows of this build's major version are defined here.
 *
 * Each stub is declared without parameters: on the platform ABI the caller sets up and cleans up
 * its own arguments, so a function that ignores them may be called with any (every stub returns
 * cudaError_t; gen_cudart.py refuses a function returning anything else, which must then be
 * simulated). VGPU_SIM_CUDA_TRACE=1 names each unsimulated call on stderr.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cudart_internal.h"

static cudaError_t unsimulated(const char *symbol) {
    if (getenv("VGPU_SIM_CUDA_TRACE") != NULL)
        fprintf(stderr, "vgpu-sim: %s is not simulated: cudaErrorNotSupported\n", symbol);
    return cudart_ret(cudaErrorNotSupported);
}

#define STUB_DEF(sym)                                                                             \
    CUDART_API cudaError_t sym(void);                                                             \
    CUDART_API cudaError_t sym(void) { return unsimulated(#sym); }
#define CUDART_STUB(sym, in12, in13) VGPU_CUDART_PICK(VGPU_CUDART_IN(in12, in13), STUB_DEF(sym))
#define CUDART_SIM(sym, in12, in13)
#define CUDART_ALIAS(sym, target, in12, in13)
#define CUDART_RUNTIME_VERSION(major, version)
#include "cudart_exports.def"
