/*
 * test_nvml_unsimulated.c - the generated stubs for every nvml.h function the simulated NVML does
 * not model (src/nvml_unsimulated.def).
 *
 * What it proves: every stub is exported and, called before or after nvmlInit with null arguments,
 * returns NVML_ERROR_NOT_SUPPORTED without crashing (this test also runs under ASan and valgrind),
 * and a simulated call still works next to them.
 */
#include <dlfcn.h>

#include "testutil.h"

#include "nvml_abi.h"

typedef nvmlReturn_t (*any_entry)(void *, void *, void *, void *, void *, void *, void *, void *);

static const char *const stubs[] = {
#define NVML_STUB(sym) #sym,
#include "../src/nvml_unsimulated.def"
#undef NVML_STUB
};

static void call_every_stub(void)
{
    for (size_t i = 0; i < sizeof(stubs) / sizeof(stubs[0]); i++) {
        any_entry fn;
        void *sym = dlsym(RTLD_DEFAULT, stubs[i]);
        if (sym == NULL) fprintf(stderr, "not exported: %s\n", stubs[i]);
        CHECK(sym != NULL);
        memcpy(&fn, &sym, sizeof(fn));
        nvmlReturn_t rc = fn(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        if (rc != NVML_ERROR_NOT_SUPPORTED) fprintf(stderr, "%s returned %d\n", stubs[i], rc);
        CHECK_EQ_U(rc, NVML_ERROR_NOT_SUPPORTED);
    }
}

static void case_every_stub_answers_not_supported(void)
{
    CHECK(sizeof(stubs) / sizeof(stubs[0]) > 250);
    tu_node(NULL);
    call_every_stub();
    CHECK_EQ_U(nvmlInit_v2(), NVML_SUCCESS);
    call_every_stub();
    unsigned int count = 0;
    CHECK_EQ_U(nvmlDeviceGetCount_v2(&count), NVML_SUCCESS);
    CHECK_EQ_U(count, 2);
    CHECK_EQ_U(nvmlShutdown(), NVML_SUCCESS);
}

int main(void)
{
    return tu_fork_case("every stub answers NOT_SUPPORTED", case_every_stub_answers_not_supported);
}
