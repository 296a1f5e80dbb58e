/*
 * bench_simstate.c - figures for bench/fakegpu_state_bench.py (not a test: no pass/fail).
 *
 *   bench_simstate ops            ns per call of the shared-state hot paths (one process)
 *   bench_simstate storm N        N fresh processes (fork+exec) attach and reserve at once: wall
 *                                 ms until all are done
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

/* N fresh processes (exec'd, so each attaches from scratch) started at once. */
static void storm(const char *self, int n)
{
    unsigned long long t0 = sim_now_ns();
    for (int i = 0; i < n; i++) {
        if (fork() == 0) {
            char idx[16];
            snprintf(idx, sizeof(idx), "%d", i);
            execl(self, self, "one", idx, (char *)NULL);
            _exit(127);
        }
    }
    int failed = 0, status;
    while (wait(&status) > 0)
        failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    printf("processes=%d failed=%d wall_ms=%.1f\n", n, failed, (double)(sim_now_ns() - t0) / 1e6);
}

/* Busy time of the recorded intervals inside [from, to). */
static unsigned long long overlap(const unsigned long long (*iv)[2], int n, unsigned long long from,
                                  unsigned long long to)
{
    unsigned long long total = 0;
    for (int i = 0; i < n; i++) {
        unsigned long long lo = iv[i][0] > from ? iv[i][0] : from;
        unsigned long long hi = iv[i][1] < to ? iv[i][1] : to;
        if (hi > lo)
            total += hi - lo;
    }
    return total;
}

static void duty(int pct)
{
    enum { MAX = 4000 };
    static unsigned long long iv[MAX][2];
    const unsigned long long period = 1000000ULL, busy = period * (unsigned long long)pct / 100;
    unsigned long long start = sim_now_ns(), next = start;
    int n = 0;
    while (sim_now_ns() < start + 1000000000ULL && n < MAX) {
        unsigned long long end = sim_submit_work(1, busy);
        iv[n][0] = end - busy;
        iv[n][1] = end;
        n++;
        next += period;
        unsigned long long now = sim_now_ns();
        if (next > now) {
            struct timespec ts = {0, (long)(next - now)};
            nanosleep(&ts, NULL);
        }
    }
    unsigned long long now = sim_now_ns();
    unsigned int got_w = sim_utilization(1, 0, 0), got_1s = sim_utilization(1, 0, 1000000000ULL);
    /* What the reports should be, from the intervals this process submitted (sole user). */
    double want_w = 100.0 * (double)overlap(iv, n, now - SIM_UTIL_WINDOW_NS, now) /
                    (double)SIM_UTIL_WINDOW_NS;
    double want_1s = 100.0 * (double)overlap(iv, n, now - 1000000000ULL, now) / 1e9;
    printf("target=%d offered_1s=%.1f util_window=%u expected_window=%.1f util_1s=%u "
           "expected_1s=%.1f\n",
           pct, want_1s, got_w, want_w, got_1s, want_1s);
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "one") == 0) /* a storm member: attach, reserve, exit */
        return sim_attach() == 0 && sim_mem_reserve(atoi(argv[2]) % 2, 1 << 20) == 0 ? 0 : 1;
    if (sim_attach() != 0 || sim_gpu_count() < 2) {
        fprintf(stderr, "bench_simstate: needs a simulated node with 2+ GPUs\n");
        return 2;
    }
    if (argc >= 2 && strcmp(argv[1], "ops") == 0)
        ops();
    else if (argc >= 3 && strcmp(argv[1], "storm") == 0)
        storm(argv[0], atoi(argv[2]));
    else if (argc >= 3 && strcmp(argv[1], "duty") == 0)
        duty(atoi(argv[2]));
    else {
        fprintf(stderr, "usage: bench_simstate ops | storm N | duty PCT\n");
        return 2;
    }
    return 0;
}
