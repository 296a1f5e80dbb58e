/*
 * testutil.h - helpers shared by the C tests of the simulated GPUs (state, NVML, CUDA).
 *
 * tu_node() creates a private temporary node (profile text + state path) and points
 * VGPU_SIM_STATE/VGPU_SIM_PROFILE at it; call it before the first sim_, nvml or cu call of the
 * process. tu_fork_case() runs a test case in a fresh child process, because attachment happens
 * once per process; a program lists its cases in a `struct tu_case` table for TU_RUN_CASES and
 * reports the tally with tu_report(). CHECK() (vgpu_hook/tests/check.h) ends the case with file:line on failure.
 */
#ifndef VGPU_TESTUTIL_H
#define VGPU_TESTUTIL_H

#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* CHECK, CHECK_EQ_U64: the project's one definition (a failure prints file:line and exits 1). */
#include "../../../vgpu_hook/tests/check.h"
#define CHECK_EQ_U(a, b) CHECK_EQ_U64(a, b) /* this harness's older name */

/* Two small GPUs (1 GiB and 2 GiB) joined by 2 NVLink links, for tests. */
static const char TU_PROFILE_2GPU[] =
    "node.name=test-2gpu\n"
    "node.driver_version=580.95.05\n"
    "node.cuda_driver_version=13000\n"
    "gpu.count=2\n"
    "gpu.0.name=NVIDIA Test GPU A\n"
    "gpu.0.uuid=GPU-00000000-1111-2222-3333-444444444444\n"
    "gpu.0.serial=1650000000001\n"
    "gpu.0.pci_bus_id=00000000:18:00.0\n"
    "gpu.0.pcie_root=pci0000:15\n"
    "gpu.0.brand=nvidia\n"
    "gpu.0.architecture=hopper\n"
    "gpu.0.compute_capability=9.0\n"
    "gpu.0.memory_bytes=1073741824\n"
    "gpu.0.sm_count=132\n"
    "gpu.0.cores_per_sm=128\n"
    "gpu.0.pci_device_id=0x233010de\n"
    "gpu.0.minor=0\n"
    "gpu.0.numa_node=0\n"
    "gpu.0.mig_capable=1\n"
    "gpu.0.nvlink=1:2\n"
    "gpu.1.name=NVIDIA Test GPU B\n"
    "gpu.1.uuid=GPU-00000001-1111-2222-3333-444444444444\n"
    "gpu.1.serial=1650000000002\n"
    "gpu.1.pci_bus_id=00000000:2A:00.0\n"
    "gpu.1.pcie_root=pci0000:26\n"
    "gpu.1.brand=tesla\n"
    "gpu.1.architecture=ampere\n"
    "gpu.1.compute_capability=8.0\n"
    "gpu.1.memory_bytes=2147483648\n"
    "gpu.1.sm_count=108\n"
    "gpu.1.cores_per_sm=64\n"
    "gpu.1.pci_device_id=0x20b010de\n"
    "gpu.1.minor=1\n"
    "gpu.1.numa_node=1\n"
    "gpu.1.nvlink=0:2\n";

static char tu_dir[256], tu_state[300], tu_profile[300];
static pid_t tu_owner; /* only the process that made the node removes it */

static void tu_cleanup(void)
{
    if (!tu_dir[0] || getpid() != tu_owner)
        return;
    unlink(tu_state);
    unlink(tu_profile);
    rmdir(tu_dir);
}

/* Create a temporary node from profile text (NULL: TU_PROFILE_2GPU) and export its env. */
static void tu_node(const char *profile)
{
    snprintf(tu_dir, sizeof(tu_dir), "/tmp/vgpu-sim-test-XXXXXX");
    CHECK(mkdtemp(tu_dir) != NULL);
    snprintf(tu_state, sizeof(tu_state), "%s/state", tu_dir);
    snprintf(tu_profile, sizeof(tu_profile), "%s/profile", tu_dir);
    FILE *f = fopen(tu_profile, "w");
    CHECK(f != NULL);
    fputs(profile ? profile : TU_PROFILE_2GPU, f);
    CHECK(fclose(f) == 0);
    setenv("VGPU_SIM_STATE", tu_state, 1);
    setenv("VGPU_SIM_PROFILE", tu_profile, 1);
    tu_owner = getpid();
    atexit(tu_cleanup);
}

/* Run fn() in a fresh child; the case passes if the child exits 0. Returns 0/1 failures. */
static int tu_fork_case(const char *name, void (*fn)(void))
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        fn();
        exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    printf("%s %s\n", ok ? "ok  " : "FAIL", name);
    fflush(stdout);
    return ok ? 0 : 1;
}

/* One CU_ENTRY(base, version, sym, ptsym) line of a CUDA entry-point table (.def), as strings:
 * build a table with `#define CU_ENTRY TU_CU_ENTRY_ROW` before including the .def. */
struct tu_cu_entry {
    const char *base;
    int version;
    const char *sym;
    const char *ptsym;
};
#define TU_CU_ENTRY_ROW(base, version, sym, ptsym) {#base, version, #sym, #ptsym},

/* A test program's cases, each run in a child of its own (tu_fork_case). */
struct tu_case {
    const char *name;
    void (*fn)(void);
};

/* Run every case of the table; the number that failed. */
static inline int tu_run_cases(const struct tu_case *cases, size_t count)
{
    int failures = 0;
    for (size_t i = 0; i < count; i++)
        failures += tu_fork_case(cases[i].name, cases[i].fn);
    return failures;
}
#define TU_RUN_CASES(cases) tu_run_cases(cases, sizeof(cases) / sizeof((cases)[0]))

/* Print the program's tally; main()'s exit status. */
static inline int tu_report(const char *file, int failures)
{
    printf("%s: %d failure(s)\n", file, failures);
    return failures != 0;
}

/* Slow down timing-sensitive expectations when running under valgrind. */
static inline int tu_slow(void) { return getenv("VGPU_TEST_UNDER_VALGRIND") != NULL; }

#endif
