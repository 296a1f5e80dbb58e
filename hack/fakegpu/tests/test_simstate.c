/*
 * test_simstate.c - the shared node state, without any GPU library on top.
 *
 * What it proves:
 *  1. Without VGPU_SIM_STATE the state is "no GPU" and every call is harmless.
 *  2. A broken profile is refused with a message naming the line and key; a state built from
 *     another profile is refused (-ESTALE).
 *  3. Static attributes come from the profile; lookup by UUID and by bus id (4- or 8-digit
 *     domain); NVIDIA_VISIBLE_DEVICES selects and orders GPUs (indices, UUIDs, all); with
 *     "void"/"none" (CDI mode) the GPUs are those whose /dev/nvidia<minor> node the process has.
 *  4. Memory reservation is exact: never more than the GPU's memory, released by release().
 *  5. Concurrent reservation by 4 processes x 3 threads never over-commits and fills the GPU
 *     exactly.
 *  6. A SIGKILLed process's memory is reaped, even while it is still a zombie.
 *  7. Processes SIGKILLed in the middle of state updates never block or corrupt the others.
 *  8. A normal exit releases the process's memory; a forked child has its own identity/locks,
 *     even when another thread was inside the state at fork().
 *  9. Submitted work queues FIFO behind other processes' work and is measured as utilisation
 *     (total and per process).
 * 10. XID events are queued per GPU, read through a cursor, and overflow drops the oldest.
 * 11. Lost/removed flags: lost GPUs refuse reservations, removed GPUs are not visible.
 */
#include <errno.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/sysmacros.h>
#include <time.h>

#include "simstate.h"
#include "testutil.h"

#define GiB (1024ULL * 1024 * 1024)
#define MiB (1024ULL * 1024)

static void case_no_env(void)
{
    unsetenv("VGPU_SIM_STATE");
    CHECK(sim_attach() == -ENOENT);
    CHECK(sim_gpu_count() == 0);
    CHECK(sim_gpu(0) == NULL);
    CHECK(sim_mem_reserve(0, 1) == -3);
    CHECK(sim_submit_work(0, 1000) == 0);
    int v[4];
    CHECK(sim_visible_gpus(v, 4) == 0);
    CHECK(strstr(sim_attach_error(), "VGPU_SIM_STATE") != NULL);
}

static void case_bad_profile(void)
{
    tu_node("node.name=x\nnode.driver_version=1\nnode.cuda_driver_version=13000\ngpu.count=1\n"
            "gpu.0.nmae=typo\n");
    CHECK(sim_attach() == -EINVAL);
    CHECK(strstr(sim_attach_error(), "line 5") != NULL);
    CHECK(strstr(sim_attach_error(), "gpu.0.nmae") != NULL);
}

static void case_missing_key(void)
{
    tu_node("node.name=x\nnode.driver_version=1\nnode.cuda_driver_version=13000\ngpu.count=1\n"
            "gpu.0.name=A\n");
    CHECK(sim_attach() == -EINVAL);
    CHECK(strstr(sim_attach_error(), "missing key 'gpu.0.uuid'") != NULL);
}

static void case_stale_profile(void)
{
    /* The shared node exists already; point the profile at different text. */
    char path[320];
    snprintf(path, sizeof(path), "%s/other-profile", tu_dir);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(TU_PROFILE_2GPU, f);
    fputs("# changed\n", f);
    fclose(f);
    setenv("VGPU_SIM_PROFILE", path, 1);
    CHECK(sim_attach() == -ESTALE);
    unlink(path);
}

/* CDI mode ("void"/"none"): the GPUs whose device nodes the process has, in physical order; a
 * plain file or a node with the wrong numbers does not count. Needs CAP_MKNOD (root). */
static void case_device_nodes(void)
{
    char dir[] = "/tmp/vgpu-sim-dev-XXXXXX", path[64];
    int v[8];
    if (geteuid() != 0) {
        fprintf(stderr, "  (device-node view not tested: mknod needs root)\n");
        return;
    }
    CHECK(mkdtemp(dir) != NULL);
    setenv("VGPU_SIM_DEV_DIR", dir, 1);
    setenv("NVIDIA_VISIBLE_DEVICES", "void", 1);
    CHECK(sim_visible_gpus(v, 8) == 0);
    snprintf(path, sizeof(path), "%s/nvidia1", dir);
    CHECK(mknod(path, S_IFCHR | 0600, makedev(SIM_NVIDIA_MAJOR, 1)) == 0);
    CHECK(sim_visible_gpus(v, 8) == 1 && v[0] == 1);
    snprintf(path, sizeof(path), "%s/nvidia0", dir);
    FILE *plain = fopen(path, "w");
    CHECK(plain != NULL);
    fclose(plain);
    CHECK(sim_visible_gpus(v, 8) == 1 && v[0] == 1); /* a regular file is no device */
    CHECK(unlink(path) == 0);
    CHECK(mknod(path, S_IFCHR | 0600, makedev(SIM_NVIDIA_MAJOR, 7)) == 0);
    CHECK(sim_visible_gpus(v, 8) == 1 && v[0] == 1); /* the wrong minor is another GPU's node */
    CHECK(unlink(path) == 0);
    CHECK(mknod(path, S_IFCHR | 0600, makedev(SIM_NVIDIA_MAJOR, 0)) == 0);
    setenv("NVIDIA_VISIBLE_DEVICES", "none", 1);
    CHECK(sim_visible_gpus(v, 8) == 2 && v[0] == 0 && v[1] == 1);
    CHECK(unlink(path) == 0);
    snprintf(path, sizeof(path), "%s/nvidia1", dir);
    CHECK(unlink(path) == 0);
    CHECK(rmdir(dir) == 0);
    unsetenv("VGPU_SIM_DEV_DIR");
    setenv("NVIDIA_VISIBLE_DEVICES", "void", 1);
}

static void case_static(void)
{
    CHECK(sim_attach() == 0);
    CHECK(sim_gpu_count() == 2);
    const struct sim_node_info *n = sim_node();
    CHECK(strcmp(n->driver_version, "580.95.05") == 0 && n->cuda_driver_version == 13000);
    const struct sim_gpu_info *g = sim_gpu(1);
    CHECK(strcmp(g->name, "NVIDIA Test GPU B") == 0);
    CHECK(g->memory_total == 2 * GiB && g->sm_count == 108 && g->cc_major == 8);
    CHECK(g->brand_code == 2 && g->arch == SIM_ARCH_AMPERE && g->numa_node == 1);
    CHECK(g->nlinks == 1 && g->links[0].peer == 0 && g->links[0].count == 2);
    CHECK(sim_gpu(2) == NULL && sim_gpu(-1) == NULL);
    CHECK(sim_find_gpu("GPU-00000001-1111-2222-3333-444444444444") == 1);
    CHECK(sim_find_gpu("gpu-00000000-1111-2222-3333-444444444444") == 0);
    CHECK(sim_find_gpu("0000:2a:00.0") == 1);
    CHECK(sim_find_gpu("00000000:18:00.0") == 0);
    CHECK(sim_find_gpu("0000:99:00.0") == -1);

    int v[8];
    unsetenv("NVIDIA_VISIBLE_DEVICES");
    CHECK(sim_visible_gpus(v, 8) == 2 && v[0] == 0 && v[1] == 1);
    setenv("NVIDIA_VISIBLE_DEVICES", "1", 1);
    CHECK(sim_visible_gpus(v, 8) == 1 && v[0] == 1);
    setenv("NVIDIA_VISIBLE_DEVICES", "GPU-00000001-1111-2222-3333-444444444444,0,1", 1);
    CHECK(sim_visible_gpus(v, 8) == 2 && v[0] == 1 && v[1] == 0);
    setenv("NVIDIA_VISIBLE_DEVICES", "none", 1);
    CHECK(sim_visible_gpus(v, 8) == 0);
    setenv("NVIDIA_VISIBLE_DEVICES", "void", 1);
    CHECK(sim_visible_gpus(v, 8) == 0);
    case_device_nodes();
    setenv("NVIDIA_VISIBLE_DEVICES", "all", 1);
    CHECK(sim_visible_gpus(v, 1) == 1 && v[0] == 0);
    unsetenv("NVIDIA_VISIBLE_DEVICES");
}

static void case_reserve(void)
{
    CHECK(sim_mem_used(0) == 0);
    CHECK(sim_mem_reserve(0, 600 * MiB) == 0);
    CHECK(sim_mem_reserve(0, 600 * MiB) == -1); /* 1 GiB GPU */
    CHECK(sim_mem_reserve(0, 424 * MiB) == 0);
    CHECK_EQ_U(sim_mem_used(0), GiB);
    CHECK(sim_mem_reserve(0, 1) == -1);
    CHECK(sim_mem_reserve(0, ~0ULL) == -1);
    CHECK_EQ_U(sim_mem_used_by(0, getpid()), GiB);
    struct sim_proc_usage p[4];
    CHECK(sim_processes(0, p, 4) == 1 && p[0].pid == getpid() && p[0].bytes == GiB);
    sim_mem_release(0, 424 * MiB);
    CHECK_EQ_U(sim_mem_used(0), 600 * MiB);
    sim_mem_release(0, 10 * GiB); /* clamped */
    CHECK_EQ_U(sim_mem_used(0), 0);
    CHECK(sim_processes(0, p, 4) == 1 && p[0].bytes == 0); /* still registered */
    CHECK(sim_mem_reserve(5, 1) == -3);
    CHECK(sim_proc_register(1) == 0);
    CHECK(sim_processes(1, p, 4) == 1 && p[0].bytes == 0);
    sim_mem_release_all();
    CHECK(sim_processes(0, p, 4) == 0 && sim_processes(1, p, 4) == 0);
}

/* 4 processes x 3 threads reserve 1 MiB chunks on GPU 1 (2 GiB) until it is full. */
static void *reserve_until_full(void *arg)
{
    unsigned long long *got = arg;
    while (sim_mem_reserve(1, MiB) == 0)
        (*got)++;
    return NULL;
}

static void case_concurrent(void)
{
    enum { PROCS = 4, THREADS = 3 };
    int fds[PROCS][2], go[2];
    pid_t kids[PROCS];
    CHECK(pipe(go) == 0);
    for (int i = 0; i < PROCS; i++) {
        CHECK(pipe(fds[i]) == 0);
        kids[i] = fork();
        if (kids[i] == 0) {
            char c;
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
            CHECK(sim_proc_register(1) == 0); /* listed even if the others fill the GPU first */
            close(go[1]);
            CHECK(read(go[0], &c, 1) == 0); /* start together */
            pthread_t t[THREADS];
            unsigned long long got[THREADS] = {0}, sum = 0;
            for (int k = 0; k < THREADS; k++)
                pthread_create(&t[k], NULL, reserve_until_full, &got[k]);
            for (int k = 0; k < THREADS; k++) {
                pthread_join(t[k], NULL);
                sum += got[k];
            }
            CHECK_EQ_U(sim_mem_used_by(1, getpid()), sum * MiB);
            CHECK(write(fds[i][1], &sum, sizeof(sum)) == sizeof(sum));
            pause(); /* hold the memory until killed */
            _exit(0);
        }
        close(fds[i][1]);
    }
    close(go[0]);
    close(go[1]);
    unsigned long long total = 0;
    for (int i = 0; i < PROCS; i++) {
        unsigned long long n = 0;
        CHECK(read(fds[i][0], &n, sizeof(n)) == sizeof(n));
        total += n;
    }
    CHECK_EQ_U(total * MiB, 2 * GiB);
    CHECK_EQ_U(sim_mem_used(1), 2 * GiB);
    struct sim_proc_usage p[8];
    CHECK(sim_processes(1, p, 8) == PROCS);
    for (int i = 0; i < PROCS; i++)
        kill(kids[i], SIGKILL);
    /* Dead (zombies, not yet waited for) processes are reaped: SIGKILL is asynchronous (under
     * valgrind a process takes long to die), so await it for up to 10 s. */
    for (int waited_ms = 0; sim_mem_used(1) != 0 && waited_ms < 10000; waited_ms += 10)
        usleep(10000);
    CHECK_EQ_U(sim_mem_used(1), 0);
    for (int i = 0; i < PROCS; i++)
        waitpid(kids[i], NULL, 0);
}

static void case_kill_midway(void)
{
    /* Children hammer the state; we SIGKILL them at arbitrary moments and must never block. */
    unsigned int seed = 12345;
    int rounds = tu_slow() ? 5 : 40;
    alarm(60);
    for (int r = 0; r < rounds; r++) {
        pid_t kid = fork();
        if (kid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            for (;;) {
                if (sim_mem_reserve(0, MiB) == 0)
                    sim_mem_release(0, MiB / 2);
                sim_submit_work(0, 1000);
                sim_xid_inject(0, 13);
                (void)sim_utilization(0, 0, 0);
            }
        }
        usleep(200 + rand_r(&seed) % 3000);
        kill(kid, SIGKILL);
        waitpid(kid, NULL, 0);
        CHECK(sim_mem_reserve(0, MiB) == 0); /* not blocked, and the kid's memory is gone */
        sim_mem_release(0, MiB);
        CHECK_EQ_U(sim_mem_used(0), 0);
    }
    alarm(0);
    sim_mem_release_all();
}

static void case_exit_releases(void)
{
    pid_t kid = fork();
    if (kid == 0) {
        CHECK(sim_mem_reserve(0, 100 * MiB) == 0);
        exit(0); /* normal exit: atexit releases */
    }
    int st;
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* Its slot is free: released at exit, or else reaped now that its lock is gone. */
    CHECK_EQ_U(sim_mem_used_by(0, kid), 0);

    /* Fork after attaching: the child is a different process with its own memory. */
    CHECK(sim_mem_reserve(0, 10 * MiB) == 0);
    kid = fork();
    if (kid == 0) {
        CHECK_EQ_U(sim_mem_used_by(0, getpid()), 0);
        CHECK(sim_mem_reserve(0, 20 * MiB) == 0);
        CHECK_EQ_U(sim_mem_used(0), 30 * MiB);
        _exit(0); /* no atexit: reaped instead */
    }
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_EQ_U(sim_mem_used(0), 10 * MiB);
    sim_mem_release_all();
}

static volatile int churn_stop;

static void *churn(void *arg)
{
    (void)arg;
    while (!churn_stop) {
        if (sim_mem_reserve(0, 4096) == 0)
            sim_mem_release(0, 4096);
        (void)sim_mem_used(1);
    }
    return NULL;
}

static void case_fork_while_busy(void)
{
    /* Another thread is inside the state (holding our mutex and OFD lock) when we fork: the
     * child must neither deadlock nor share the parent's locks. */
    alarm(tu_slow() ? 300 : 30);
    pthread_t th;
    CHECK(pthread_create(&th, NULL, churn, NULL) == 0);
    for (int i = 0; i < (tu_slow() ? 10 : 50); i++) {
        pid_t kid = fork();
        if (kid == 0) {
            CHECK(sim_mem_reserve(0, MiB) == 0);
            CHECK(sim_mem_used_by(0, getpid()) == MiB);
            sim_mem_release(0, MiB);
            _exit(0);
        }
        int st;
        CHECK(waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    churn_stop = 1;
    CHECK(pthread_join(th, NULL) == 0);
    alarm(0);
    sim_mem_release_all();
    CHECK_EQ_U(sim_mem_used(0), 0);
}

static void case_work_and_utilisation(void)
{
    const unsigned long long ms = 1000000ULL;
    unsigned long long t0 = sim_now_ns();
    CHECK(sim_utilization(1, 0, 0) == 0);
    /* Two processes each submit 300 ms: the second queues behind the first. */
    unsigned long long end1 = sim_submit_work(1, 300 * ms);
    CHECK(end1 >= t0 + 300 * ms);
    pid_t kid = fork();
    if (kid == 0) {
        unsigned long long end2 = sim_submit_work(1, 300 * ms);
        CHECK(end2 >= end1 + 300 * ms);
        _exit(0);
    }
    int st;
    waitpid(kid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(sim_busy_until(1) >= end1 + 300 * ms);
    /* Sleep into the second kernel, then measure the last 300 ms: all busy, about half each
     * (generous bounds: a loaded machine may wake us late). */
    while (sim_now_ns() < end1 + 150 * ms)
        usleep(1000);
    unsigned int u = sim_utilization(1, 0, 300 * ms);
    CHECK(u >= 95);
    unsigned int mine = sim_utilization(1, getpid(), 300 * ms);
    unsigned int theirs = sim_utilization(1, kid, 300 * ms);
    CHECK(mine + theirs >= 95 && mine + theirs <= 101);
    CHECK(mine >= 10 && theirs >= 10);
    struct sim_proc_util pu[4];
    int n = sim_process_utilization(1, 0, pu, 4);
    CHECK(n == 2);
    /* An idle GPU reads 0 once its work is over. */
    while (sim_now_ns() < sim_busy_until(1) + 200 * ms)
        usleep(5000);
    CHECK(sim_utilization(1, 0, 150 * ms) == 0);
    /* Back-to-back launches of one process coalesce and read ~100%. */
    unsigned long long end = 0;
    for (int i = 0; i < 100; i++)
        end = sim_submit_work(0, 2 * ms);
    while (sim_now_ns() < end)
        usleep(2000);
    CHECK(sim_utilization(0, 0, 150 * ms) >= 97);
}

static void case_xid(void)
{
    uint64_t cur = sim_xid_seq(0);
    struct sim_xid_event e;
    CHECK(sim_xid_next(0, &cur, &e) == 0);
    uint64_t s1 = sim_xid_inject(0, 79);
    uint64_t s2 = sim_xid_inject(0, 48);
    CHECK(s2 == s1 + 1);
    CHECK(sim_xid_next(0, &cur, &e) == 1 && e.xid == 79 && e.seq == s1);
    CHECK(sim_xid_next(0, &cur, &e) == 1 && e.xid == 48);
    CHECK(sim_xid_next(0, &cur, &e) == 0);
    CHECK(sim_xid_next(1, &cur, &e) == 0 || e.seq > 0);
    /* Overflow: a slow reader skips what was overwritten and gets the newest QUEUE events. */
    uint64_t slow = sim_xid_seq(0);
    for (int i = 0; i < SIM_XID_QUEUE + 10; i++)
        sim_xid_inject(0, 1000 + (uint64_t)i);
    CHECK(sim_xid_next(0, &slow, &e) == 1 && e.xid == 1010);
    int more = 0;
    while (sim_xid_next(0, &slow, &e) == 1)
        more++;
    CHECK(more == SIM_XID_QUEUE - 1 && e.xid == 1000 + SIM_XID_QUEUE + 9);
    CHECK(sim_xid_inject(9, 1) == 0);
}

static void case_flags(void)
{
    int v[4];
    CHECK(sim_set_flag(1, SIM_GPU_REMOVED, 1) == 0);
    CHECK(sim_visible_gpus(v, 4) == 1 && v[0] == 0);
    CHECK(sim_set_flag(1, SIM_GPU_REMOVED, 0) == 0);
    CHECK(sim_visible_gpus(v, 4) == 2);
    CHECK(sim_set_flag(0, SIM_GPU_LOST, 1) == 0);
    CHECK(sim_gpu_flags(0) == SIM_GPU_LOST);
    CHECK(sim_mem_reserve(0, 1) == -4);
    CHECK(sim_submit_work(0, 1) == 0);
    CHECK(sim_set_flag(0, SIM_GPU_LOST, 0) == 0);
    CHECK(sim_mem_reserve(0, 1) == 0);
    CHECK(sim_set_flag(7, SIM_GPU_LOST, 1) == -1);
}

static const struct tu_case WITHOUT_NODE[] = {
    {"no state configured", case_no_env},
    {"unknown profile key is named", case_bad_profile},
    {"missing profile key is named", case_missing_key},
};

static const struct tu_case WITH_NODE[] = {
    {"static attributes, lookup, visible devices", case_static},
    {"state from another profile is refused", case_stale_profile},
    {"reserve and release", case_reserve},
    {"concurrent reservation is exact; killed holders reaped", case_concurrent},
    {"SIGKILL mid-update never blocks or leaks", case_kill_midway},
    {"exit releases; fork gets its own identity", case_exit_releases},
    {"fork while another thread is in the state", case_fork_while_busy},
    {"work queues FIFO and shows as utilisation", case_work_and_utilisation},
    {"XID queue", case_xid},
    {"lost and removed flags", case_flags},
};

int main(void)
{
    int failures = TU_RUN_CASES(WITHOUT_NODE);
    tu_node(NULL);
    failures += TU_RUN_CASES(WITH_NODE);
    return tu_report(__FILE__, failures);
}
