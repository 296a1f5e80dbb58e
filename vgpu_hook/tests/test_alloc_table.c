/*
 * test_alloc_table.c - proves the allocation table:
 *  1. each key gives back exactly what was put, once;
 *  2. unknown keys are reported as such (a free of memory we never charged refunds nothing);
 *  3. many threads putting/taking concurrently lose nothing;
 *  4. a fork child starts with an empty table (it owns none of the parent's allocations).
 */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "vgpu.h"

static void test_put_take(void) {
    vgpu_alloc_put(0x1000, 2, 4096, false);
    vgpu_alloc_put(0x2000, 3, 8192, true);
    int dev = -1;
    uint64_t bytes = 0;
    bool managed = false;
    CHECK(vgpu_alloc_take(0x2000, &dev, &bytes, &managed));
    CHECK(dev == 3 && bytes == 8192 && managed);
    CHECK(!vgpu_alloc_take(0x2000, &dev, &bytes, &managed));
    CHECK(vgpu_alloc_take(0x1000, &dev, &bytes, &managed));
    CHECK(dev == 2 && bytes == 4096 && !managed);
    CHECK(!vgpu_alloc_take(0xdead, &dev, &bytes, &managed));
}

static void *worker(void *arg) {
    uint64_t base = (uint64_t)(uintptr_t)arg << 32;
    uint64_t *sum = malloc(sizeof *sum);
    *sum = 0;
    for (uint64_t i = 1; i <= 2000; i++) vgpu_alloc_put(base + i, 0, i, false);
    for (uint64_t i = 1; i <= 2000; i++) {
        int dev;
        uint64_t bytes;
        bool managed;
        if (vgpu_alloc_take(base + i, &dev, &bytes, &managed)) *sum += bytes;
    }
    return sum;
}

static void test_threads(void) {
    pthread_t t[8];
    for (uintptr_t i = 0; i < 8; i++) pthread_create(&t[i], NULL, worker, (void *)(i + 1));
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(t[i], &r);
        CHECK_EQ_U64(*(uint64_t *)r, 2000ULL * 2001 / 2);
        free(r);
    }
}

static void test_fork(void) {
    vgpu_alloc_register_atfork();
    vgpu_alloc_put(0x3000, 1, 10, false);
    pid_t pid = fork();
    if (pid == 0) {
        int dev;
        uint64_t bytes;
        bool managed;
        _exit(vgpu_alloc_take(0x3000, &dev, &bytes, &managed) ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    int dev;
    uint64_t bytes;
    bool managed;
    CHECK(vgpu_alloc_take(0x3000, &dev, &bytes, &managed) && bytes == 10);
}

int main(void) {
    test_put_take();
    test_threads();
    test_fork();
    CHECK_DONE();
}
