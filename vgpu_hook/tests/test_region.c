/*
 * test_region.c - proves the shared accounting region without a GPU:
 *  1. opening creates the file 0660 with a valid header and the configured devices;
 *  2. charges within the cap succeed, a charge past it fails, refunds restore exactly, and a
 *     refund never wraps below zero;
 *  3. separate open file descriptions get separate slots; usage is summed across them;
 *  4. many processes charging concurrently never exceed the cap in total;
 *  5. a SIGKILLed process's usage is reclaimed by the next charge that needs it;
 *  6. a process SIGKILLed while holding the device lock blocks nobody for more than 1 s;
 *  7. a region written with another layout version is refused (caller falls back);
 *  8. the private fallback region enforces caps within the process.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "vgpu.h"

static char g_dir[] = "/tmp/vgpu-region-test-XXXXXX";
static char g_path[512];
static struct vgpu_claim_conf g_conf;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void setup(void) {
    CHECK(mkdtemp(g_dir) != NULL);
    snprintf(g_path, sizeof g_path, "%s/region", g_dir);
    CHECK(vgpu_config_parse("version 1\nclaim c-1\n"
                            "device uuid=GPU-r0 memory=1000 cores=30\n"
                            "device uuid=GPU-r1 memory=5000 cores=0\n",
                            "conf", &g_conf) == 0);
}

static void test_create(void) {
    struct vgpu_region_handle h;
    CHECK(vgpu_region_open(&h, g_path, &g_conf) == 0);
    struct stat st;
    CHECK(stat(g_path, &st) == 0);
    CHECK((st.st_mode & 0777) == 0660);
    CHECK_EQ_U64(st.st_size, sizeof(struct vgpu_region));
    CHECK(h.map->magic == VGPU_REGION_MAGIC && h.map->version == VGPU_REGION_VERSION);
    CHECK(h.map->device_count == 2);
    CHECK(strcmp(h.map->devices[1].uuid, "GPU-r1") == 0);
    CHECK_EQ_U64(h.map->devices[1].memory_limit, 5000);
    CHECK(h.map->devices[0].cores == 30);
    CHECK(strcmp(h.map->claim, "c-1") == 0);
    vgpu_region_close(&h);
}

/* Open the region the way a hooked process does: map it, then take a slot. */
static void open_with_slot(struct vgpu_region_handle *h) {
    CHECK(vgpu_region_open(h, g_path, &g_conf) == 0);
    CHECK(vgpu_region_claim_slot(h, getpid()) >= 0);
}

static void test_charge_refund(void) {
    struct vgpu_region_handle h;
    open_with_slot(&h);
    CHECK(vgpu_region_charge(&h, 0, 600, 1000, false) == 0);
    CHECK(vgpu_region_charge(&h, 0, 400, 1000, false) == 0);
    CHECK(vgpu_region_charge(&h, 0, 1, 1000, false) == -1);
    CHECK(vgpu_region_charge(&h, 1, 1, 5000, false) == 0); /* devices are independent */
    CHECK_EQ_U64(vgpu_region_used(&h, 0), 1000);
    vgpu_region_uncharge(&h, 0, 400, false);
    CHECK_EQ_U64(vgpu_region_used(&h, 0), 600);
    CHECK(vgpu_region_charge(&h, 0, UINT64_MAX, 1000, false) == -1); /* no overflow wrap */
    vgpu_region_uncharge(&h, 0, 10000, false); /* more than charged: clamps, never wraps */
    CHECK_EQ_U64(vgpu_region_used(&h, 0), 0);
    vgpu_region_mark_managed(&h, 1, 1);
    CHECK_EQ_U64(h.map->devices[1].oversub_allocs, 1);
    vgpu_region_uncharge(&h, 1, 1, true);
    CHECK_EQ_U64(vgpu_region_used(&h, 1), 0);
    vgpu_region_close(&h);
}

static void test_two_slots(void) {
    struct vgpu_region_handle a, b;
    CHECK(vgpu_region_open(&a, g_path, &g_conf) == 0);
    CHECK(vgpu_region_open(&b, g_path, &g_conf) == 0);
    int sa = vgpu_region_claim_slot(&a, getpid());
    int sb = vgpu_region_claim_slot(&b, getpid());
    CHECK(sa >= 0 && sb >= 0 && sa != sb);
    CHECK(vgpu_region_charge(&a, 0, 700, 1000, false) == 0);
    CHECK(vgpu_region_charge(&b, 0, 301, 1000, false) == -1);
    CHECK(vgpu_region_charge(&b, 0, 300, 1000, false) == 0);
    CHECK_EQ_U64(vgpu_region_used(&a, 0), 1000);
    vgpu_region_close(&a);
    vgpu_region_close(&b);
}

static void test_concurrent(void) {
    enum { PROCS = 8 };
    int iterations = getenv("VGPU_TEST_UNDER_VALGRIND") ? 20 : 300;
    int pipes[PROCS][2];
    pid_t pids[PROCS];
    for (int p = 0; p < PROCS; p++) {
        CHECK(pipe(pipes[p]) == 0);
        pids[p] = fork();
        if (pids[p] == 0) {
            struct vgpu_region_handle h;
            if (vgpu_region_open(&h, g_path, &g_conf) != 0) _exit(2);
            if (vgpu_region_claim_slot(&h, getpid()) < 0) _exit(3);
            /* charge 10 bytes at a time; hold whatever we get; report the total held */
            unsigned long held = 0;
            for (int i = 0; i < iterations; i++) {
                if (vgpu_region_charge(&h, 0, 10, 1000, false) == 0) held += 10;
                if (i % 3 == 2 && held >= 10) {
                    vgpu_region_uncharge(&h, 0, 10, false);
                    held -= 10;
                }
            }
            ssize_t w = write(pipes[p][1], &held, sizeof held);
            (void)w;
            pause(); /* keep the slot alive until the parent has summed */
            _exit(0);
        }
        close(pipes[p][1]);
    }
    unsigned long total = 0;
    for (int p = 0; p < PROCS; p++) {
        unsigned long held = 0;
        CHECK(read(pipes[p][0], &held, sizeof held) == (ssize_t)sizeof held);
        close(pipes[p][0]);
        total += held;
    }
    struct vgpu_region_handle h;
    CHECK(vgpu_region_open(&h, g_path, &g_conf) == 0);
    CHECK(total <= 1000);
    CHECK_EQ_U64(vgpu_region_used(&h, 0), total);
    for (int p = 0; p < PROCS; p++) {
        kill(pids[p], SIGKILL);
        waitpid(pids[p], NULL, 0);
    }
    /* Slots are taken lowest-first, so our claim may itself recycle one dead child's slot. */
    CHECK(vgpu_region_claim_slot(&h, getpid()) >= 0);
    CHECK(vgpu_region_reclaim_dead(&h) >= PROCS - 1);
    CHECK_EQ_U64(vgpu_region_used(&h, 0), 0);
    vgpu_region_close(&h);
}

/* Fork a process that opens the region, claims a slot, runs `hold` on it (non-zero: the child
 * exits with 4) and then waits to be killed; returns its pid once it has done all that. */
static pid_t spawn_holder(int (*hold)(struct vgpu_region_handle *h)) {
    int ready[2];
    CHECK(pipe(ready) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        struct vgpu_region_handle h;
        if (vgpu_region_open(&h, g_path, &g_conf) != 0) _exit(2);
        if (vgpu_region_claim_slot(&h, getpid()) < 0) _exit(3);
        if (hold(&h) != 0) _exit(4);
        char c = 'x';
        ssize_t w = write(ready[1], &c, 1);
        (void)w;
        pause();
        _exit(0);
    }
    char c;
    CHECK(read(ready[0], &c, 1) == 1);
    close(ready[0]);
    close(ready[1]);
    return pid;
}

static int charge_900(struct vgpu_region_handle *h) {
    return vgpu_region_charge(h, 0, 900, 1000, false);
}

/* Die in the middle of an allocation: holding the device lock. */
static int hold_device_lock(struct vgpu_region_handle *h) {
    return vgpu_lock_ofd(h->fd, VGPU_LOCK_DEVICE(0), true, true);
}

static void test_sigkill_reclaim(void) {
    pid_t pid = spawn_holder(charge_900);
    struct vgpu_region_handle h;
    open_with_slot(&h);
    CHECK(vgpu_region_charge(&h, 0, 500, 1000, false) == -1); /* child alive: over cap */
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    CHECK(vgpu_region_charge(&h, 0, 500, 1000, false) == 0); /* reclaimed on demand */
    CHECK_EQ_U64(vgpu_region_used(&h, 0), 500);
    vgpu_region_close(&h);
}

static void test_sigkill_holding_lock(void) {
    pid_t pid = spawn_holder(hold_device_lock);
    struct vgpu_region_handle h;
    open_with_slot(&h);
    kill(pid, SIGKILL);
    double start = now_s();
    CHECK(vgpu_region_charge(&h, 0, 100, 1000, false) == 0);
    double took = now_s() - start;
    CHECK(took < 1.0);
    waitpid(pid, NULL, 0);
    vgpu_region_close(&h);
}

static void test_version_mismatch(void) {
    char other[600];
    snprintf(other, sizeof other, "%s/region-v9", g_dir);
    int fd = open(other, O_RDWR | O_CREAT, 0660);
    CHECK(fd >= 0);
    uint32_t header[2] = {VGPU_REGION_MAGIC, 9};
    CHECK(write(fd, header, sizeof header) == (ssize_t)sizeof header);
    CHECK(ftruncate(fd, 4096) == 0);
    close(fd);
    struct vgpu_region_handle h;
    CHECK(vgpu_region_open(&h, other, &g_conf) == -1);
    CHECK(h.map == NULL);
    vgpu_region_open_private(&h, &g_conf);
    CHECK(h.map != NULL && !h.shared && h.slot == 0);
    CHECK(vgpu_region_charge(&h, 0, 1000, 1000, false) == 0);
    CHECK(vgpu_region_charge(&h, 0, 1, 1000, false) == -1);
    vgpu_region_close(&h);
    unlink(other);
}

/* A tenant appends to the region (to fill the node's disk): the next process to open it cuts
 * the file back to the layout size and keeps the live processes' usage (no re-initialisation). */
static void test_grown_region_is_cut_back(void) {
    struct vgpu_region_handle a, b;
    CHECK(vgpu_region_open(&a, g_path, &g_conf) == 0);
    CHECK(vgpu_region_claim_slot(&a, getpid()) >= 0);
    CHECK(vgpu_region_charge(&a, 0, 700, 1000, false) == 0);
    int fd = open(g_path, O_WRONLY);
    CHECK(fd >= 0);
    char junk[8192];
    memset(junk, 'x', sizeof junk);
    CHECK(pwrite(fd, junk, sizeof junk, (off_t)sizeof(struct vgpu_region)) == (ssize_t)sizeof junk);
    close(fd);
    CHECK(vgpu_region_open(&b, g_path, &g_conf) == 0);
    struct stat st;
    CHECK(stat(g_path, &st) == 0);
    CHECK_EQ_U64(st.st_size, sizeof(struct vgpu_region));
    CHECK_EQ_U64(vgpu_region_used(&b, 0), 700); /* a's charge survived */
    CHECK(vgpu_region_claim_slot(&b, getpid()) >= 0);
    CHECK(vgpu_region_charge(&b, 0, 301, 1000, false) == -1);
    vgpu_region_close(&b);
    vgpu_region_close(&a);
}

int main(void) {
    setup();
    test_create();
    test_charge_refund();
    test_two_slots();
    test_concurrent();
    test_sigkill_reclaim();
    test_sigkill_holding_lock();
    test_version_mismatch();
    test_grown_region_is_cut_back();
    unlink(g_path);
    rmdir(g_dir);
    CHECK_DONE();
}
