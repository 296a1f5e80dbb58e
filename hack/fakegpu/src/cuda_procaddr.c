/*
 * cuda_procaddr.c - cuGetProcAddress (v1 and _v2) and cuGetExportTable.
 *
 * Modern clients (cuda-python, the CUDA runtime, vgpu_hook) dlsym only cuGetProcAddress_v2 and
 * resolve every other entry point through it by base name and the CUDA version whose ABI they
 * were built for. The answer comes from the tables cuda_entry_points.def (simulated) and
 * cuda_unsimulated.def (generated NOT_SUPPORTED stubs): among the rows of that base name, the one
 * with the highest version not above the requested version.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

struct entry_point {
    const char *base;
    int version;
    void *fn;          /* default-stream symbol */
    void *fn_per_thread; /* per-thread-default-stream symbol */
    int stub;            /* a generated NOT_SUPPORTED stub (cuda_unsimulated.def) */
};

#define CU_ENTRY(base, version, sym, ptsym) extern __typeof__(sym) ptsym;
#include "cuda_entry_points.def"
#undef CU_ENTRY

/* The unsimulated entry points (cuda_unsimulated.c): parameterless stubs that answer
 * CUDA_ERROR_NOT_SUPPORTED, served like any other so a caller sees that answer, not "not found". */
#define CU_STUB(sym) CU_API CUresult sym(void);
#define CU_ENTRY(base, version, sym, ptsym)
#include "cuda_unsimulated.def"
#undef CU_ENTRY
#undef CU_STUB

static const struct entry_point entry_points[] = {
#define CU_ENTRY(base, version, sym, ptsym) {#base, version, (void *)&sym, (void *)&ptsym, 0},
#include "cuda_entry_points.def"
#undef CU_ENTRY
#define CU_ENTRY(base, version, sym, ptsym) {#base, version, (void *)&sym, (void *)&ptsym, 1},
#define CU_STUB(sym)
#include "cuda_unsimulated.def"
#undef CU_STUB
#undef CU_ENTRY
};

static CUresult resolve(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status) {
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult rc = CUDA_ERROR_NOT_FOUND;
    if (symbol == NULL || pfn == NULL || cudaVersion <= 0 ||
        (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
                               CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM))) {
        if (status != NULL) *status = st;
        return CUDA_ERROR_INVALID_VALUE;
    }
    *pfn = NULL;
    const struct entry_point *best = NULL, *oldest = NULL;
    int known = 0;
    for (size_t i = 0; i < sizeof(entry_points) / sizeof(entry_points[0]); i++) {
        const struct entry_point *e = &entry_points[i];
        if (strcmp(e->base, symbol) != 0) continue;
        known = 1;
        if (e->version <= cudaVersion && (best == NULL || e->version > best->version)) best = e;
        if (oldest == NULL || e->version < oldest->version) oldest = e;
    }
    /* A stub ignores its arguments, so it serves any ABI of its name: a client that dates a
     * function earlier than the header's typedefs do (cuda-python asks for cuLogs* at 12080, the
     * headers say 12090) still gets NOT_SUPPORTED when it calls, not a failed lookup. */
    if (best == NULL && oldest != NULL && oldest->stub) best = oldest;
    if (best != NULL) {
        int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
        *pfn = per_thread ? best->fn_per_thread : best->fn;
        st = CU_GET_PROC_ADDRESS_SUCCESS;
        rc = CUDA_SUCCESS;
    } else if (known) {
        st = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    }
    if (rc != CUDA_SUCCESS && getenv("VGPU_SIM_CUDA_TRACE") != NULL)
        fprintf(stderr, "vgpu-sim: cuGetProcAddress(%s, %d): %s\n", symbol, cudaVersion,
                known ? "version not sufficient" : "not simulated");
    if (status != NULL) *status = st;
    return rc;
}

CU_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus) {
    return resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CU_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                 cuuint64_t flags) {
    return resolve(symbol, pfn, cudaVersion, flags, NULL);
}

/* Export tables are private NVIDIA interfaces (used by the CUDA runtime); the simulator has none,
 * and answering with a made-up table would crash the caller later instead of now. */
CU_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId) {
    if (ppExportTable != NULL) *ppExportTable = NULL;
    (void)pExportTableId;
    return CUDA_ERROR_NOT_SUPPORTED;
}
