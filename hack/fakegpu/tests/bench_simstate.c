/*
 * bench_simstate.c - figures for bench/fakegpu_state_bench.py (not a test: no pass/fail).
 *
 *   bench_simstate ops            ns per call of the shared-state hot paths (one process)
 *   bench_simstate storm N        N processes attach and reserve at once: wall ms until all done
 *   bench_simstate duty PCT       submit work at PCT % duty cycle (1 ms period) for 1 s, then
 *                                 print the utilisation the state reports (window 1/6 s and 1 s)
 * Needs VGPU_SIM_STATE/VGPU_SIM_PROFILE (a node with at least 2 GPUs). Prints key=value lines.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "simstate.h"

static double per_call_ns(unsigned long long t0, int n) { return (double)(sim_now_ns() - t0) / n; }

static void ops(void)
{
    const int n = 200000;
    unsigned long long t0 = sim_now_ns();
    for (int i = 0; i < n; i++)
        sim_submit_work(0, 0);
    printf("submit_work_ns=%.0f\n", per_call_ns(t0, n));
    t0 = sim_now_ns();
    for (int i = 0; i < n; i++) {
        sim_mem_reserve(1, 4096);
        sim_mem_release(1, 4096);
    }
    printf("reserve_release_ns=%.0f\n", per_call_ns(t0, n));
    /* Queries reap dead processes: measure with 8 other live processes holding memory. */
    pid_t kids[8];
    int ready[2];
    if (pipe(ready) != 0)
        exit(1);
    for (int k = 0; k < 8; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            sim_mem_reserve(1, 1 << 20);
            if (write(ready[1], "r", 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
    }
    for (int k = 0; k < 8; k++) {
        char c;
        if (read(ready[0], &c, 1) != 1)
            exit(1);
    }
    const int q = 20000;
    t0 = sim_now_ns();
    for (int i = 0; i < q; i++)
        (void)sim_mem_used(1);
    printf("mem_used_9procs_ns=%.0f\n", per_call_ns(t0, q));
    t0 = sim_now_ns();
    for (int i = 0; i < q; i++)
        (void)sim_utilization(0, 0, 0);
    printf("utilization_ns=%.0f\n", per_call_ns(t0, q));
    for (int k = 0; k < 8; k++) {
        kill(kids[k], SIGKILL);
        waitpid(kids[k], NULL, 0);
    }
}

static void storm(int n)
{
    unsigned long long t0 = sim_now_ns();
    for (int i = 0; i < n; i++) {
        if (fork() == 0) {
            int ok = sim_attach() == 0 && sim_mem_reserve(i % 2, 1 << 20) == 0;
            _exit(ok ? 0 : 1);
        }
    }
    int failed = 0, status;
    while (wait(&status) > 0)
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("processes=%d failed=%d wall_ms=%.1f\n", n, failed, (double)(sim_now_ns() - t0) / 1e6);
}

static void duty(int pct)
{
    const unsigned long long period = 1000000ULL, busy = period * (unsigned long long)pct / 100;
    unsigned long long start = sim_now_ns(), next = start;
    while (sim_now_ns() < start + 1000000000ULL) {
        sim_submit_work(1, busy);
        next += period;
        struct timespec ts = {0, 0};
        unsigned long long now = sim_now_ns();
        if (next > now) {
            ts.tv_nsec = (long)(next - now);
            nanosleep(&ts, NULL);
        }
    }
    printf("target=%d util_window=%u util_1s=%u\n", pct, sim_utilization(1, 0, 0),
           sim_utilization(1, 0, 1000000000ULL));
}

int main(int argc, char **argv)
{
    if (sim_attach() != 0 || sim_gpu_count() < 2) {
        fprintf(stderr, "bench_simstate: needs a simulated node with 2+ GPUs\n");
        return 2;
    }
    if (argc >= 2 && strcmp(argv[1], "ops") == 0)
        ops();
    else if (argc >= 3 && strcmp(argv[1], "storm") == 0)
        storm(atoi(argv[2]));
    else if (argc >= 3 && strcmp(argv[1], "duty") == 0)
        duty(atoi(argv[2]));
    else {
        fprintf(stderr, "usage: bench_simstate ops | storm N | duty PCT\n");
        return 2;
    }
    return 0;
}
