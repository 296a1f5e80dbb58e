/*
 * test_cuda_unsimulated.c - the generated stubs for every cuda.h function the simulator does not
 * model (src/cuda_unsimulated.def).
 *
 * What it proves:
 *  1. Every stub is exported and, called with null arguments (as a careless program might) before
 *     and after cuInit, returns CUDA_ERROR_NOT_SUPPORTED without crashing (this test also runs
 *     under ASan and valgrind); simulated calls still work next to them.
 *  2. cuGetProcAddress_v2 serves every stub row: the base name at the row's version finds exactly
 *     the exported symbol (the per-thread one with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM),
 *     so a program resolving entry points sees NOT_SUPPORTED when it calls, not "not found"; a
 *     stub answers even below its first version, a simulated entry point does not.
 */
#include <dlfcn.h>

#include "testutil.h"

#include "cuda_abi.h"

typedef CUresult (*any_entry)(void *, void *, void *, void *, void *, void *, void *, void *);

static const char *const stubs[] = {
#define CU_STUB(sym) #sym,
#define CU_ENTRY(base, version, sym, ptsym)
#include "../src/cuda_unsimulated.def"
#undef CU_ENTRY
#undef CU_STUB
};

static const struct tu_cu_entry rows[] = {
#define CU_STUB(sym)
#define CU_ENTRY TU_CU_ENTRY_ROW
#include "../src/cuda_unsimulated.def"
#undef CU_ENTRY
#undef CU_STUB
};

static void *exported(const char *name)
{
    void *fn = dlsym(RTLD_DEFAULT, name);
    if (fn == NULL) fprintf(stderr, "not exported: %s\n", name);
    CHECK(fn != NULL);
    return fn;
}

static void call_every_stub(void)
{
    for (size_t i = 0; i < sizeof(stubs) / sizeof(stubs[0]); i++) {
        any_entry fn;
        void *sym = exported(stubs[i]);
        memcpy(&fn, &sym, sizeof(fn));
        CUresult rc = fn(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        if (rc != CUDA_ERROR_NOT_SUPPORTED) fprintf(stderr, "%s returned %d\n", stubs[i], rc);
        CHECK_EQ_U(rc, CUDA_ERROR_NOT_SUPPORTED);
    }
}

static void case_every_stub_answers_not_supported(void)
{
    CHECK(sizeof(stubs) / sizeof(stubs[0]) > 400);
    tu_node(NULL);
    call_every_stub();
    CHECK_EQ_U(cuInit(0), CUDA_SUCCESS);
    call_every_stub();
    int count = 0;
    CHECK_EQ_U(cuDeviceGetCount(&count), CUDA_SUCCESS);
    CHECK_EQ_U(count, 2);
}

static void case_get_proc_address_serves_every_stub(void)
{
    CHECK(sizeof(rows) / sizeof(rows[0]) > 300);
    for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
        const struct tu_cu_entry *r = &rows[i];
        void *fn = NULL;
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        CHECK_EQ_U(cuGetProcAddress_v2(r->base, &fn, r->version, 0, &st), CUDA_SUCCESS);
        CHECK_EQ_U(st, CU_GET_PROC_ADDRESS_SUCCESS);
        if (fn != exported(r->sym)) fprintf(stderr, "%s@%d != %s\n", r->base, r->version, r->sym);
        CHECK(fn == exported(r->sym));
        CHECK_EQ_U(cuGetProcAddress_v2(r->base, &fn, r->version,
                                       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st),
                   CUDA_SUCCESS);
        CHECK(fn == exported(r->ptsym));
    }
    /* Below a stub's first version the oldest stub answers (it ignores its arguments); below a
     * simulated entry point's first version the lookup still says "version not sufficient". */
    void *fn = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CHECK_EQ_U(cuGetProcAddress_v2("cuLogsCurrent", &fn, 12080, 0, &st), CUDA_SUCCESS);
    CHECK_EQ_U(st, CU_GET_PROC_ADDRESS_SUCCESS);
    CHECK(fn == exported("cuLogsCurrent"));
    CHECK_EQ_U(cuGetProcAddress_v2("cuMemAllocAsync", &fn, 11000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ_U(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CHECK(fn == NULL);
}

int main(void)
{
    int failed = 0;
    failed |= tu_fork_case("every stub answers NOT_SUPPORTED", case_every_stub_answers_not_supported);
    failed |= tu_fork_case("cuGetProcAddress serves every stub", case_get_proc_address_serves_every_stub);
    return failed;
}
