/*
 * test_simstate_pidns.c - the node state's process table across PID namespaces, as on a node
 * whose tenants run in containers: each process is seen under the pid it has in the reader's
 * namespace, hidden from readers that cannot see it, never freed by them, and freed by anyone
 * once it is really gone. Namespaces come from unshare(CLONE_NEWPID) (root only; the cases say
 * so and pass when not root).
 *
 * What it proves:
 *  1. A tenant in a child namespace records its memory; the parent namespace lists it under the
 *     tenant's pid *there*, with its bytes. The tenant lists itself as pid 1 and not the parent's
 *     process, which it cannot see, but counts that process's memory in the GPU's used memory;
 *     and its queries (which reap) never free the parent's slot. Killed, it is freed.
 *  2. Nested namespaces (host > node > container): the node's reader names the container's
 *     tenant by its node pid (the one the node's /proc shows), the host's reader by the host pid.
 *  3. Sibling namespaces (two containers) never see each other's processes and never free them
 *     while they live; when one container's tenant is killed, the other container frees its
 *     memory although it never could see it (a namespace that died is still reclaimed).
 *  4. Busy time is attributed per namespace too: the parent reads a tenant's utilisation under
 *     the tenant's pid in its namespace, also after the tenant exited (its pid was learnt while it
 *     lived); the tenant reads its own under pid 1; per-process samples leave out what the
 *     reader cannot see, while the GPU's total counts everything.
 *  5. exec() ends the process as the driver sees it: an image that exec'd holds none of the old
 *     image's memory, although pid and start time are unchanged.
 */
#include "testutil.h" /* first: it defines _GNU_SOURCE (unshare, CLONE_NEWPID) */

#include <errno.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/prctl.h>

#include "simstate.h"

#define MiB (1024ULL * 1024)
#define MS 1000000ULL

/* What namespaced processes report back (shared anonymous memory, made before forking). */
struct report {
    int pid_self;                 /* getpid() inside */
    int nprocs;                   /* what sim_processes() listed inside */
    struct sim_proc_usage procs[8];
    unsigned long long used;      /* sim_mem_used() inside */
    int inner_pid;                /* a nested tenant's pid as its node sees it */
    int status;                   /* 0 ok */
};

static struct report *shared_reports(int n)
{
    void *m = mmap(NULL, sizeof(struct report) * (size_t)n, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    memset(m, 0, sizeof(struct report) * (size_t)n);
    return m;
}

/* A one-shot event between two processes: a byte through a pipe made before forking. (A case
 * that hangs because a process died before firing is ended by its alarm.) */
struct event {
    int fd[2];
};

static void event_init(struct event *e) { CHECK(pipe(e->fd) == 0); }
static void event_fire(struct event *e) { CHECK(write(e->fd[1], "!", 1) == 1); }
static void event_wait(struct event *e)
{
    char c;
    CHECK(read(e->fd[0], &c, 1) == 1);
}

/* Run fn(arg) as pid 1 of a new pid namespace (a child of the caller's). Returns the tenant's pid
 * in the caller's namespace (-1: no namespace, e.g. not root); *helper is the intermediate
 * process (in the caller's namespace) whose exit status is the tenant's. */
static pid_t spawn_in_pidns(void (*fn)(void *), void *arg, pid_t *helper)
{
    int p[2];
    CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t h = fork();
    CHECK(h >= 0);
    if (h == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        pid_t g = -1;
        if (unshare(CLONE_NEWPID) != 0) {
            CHECK(write(p[1], &g, sizeof(g)) == sizeof(g));
            _exit(77);
        }
        g = fork();
        if (g == 0) {
            close(p[1]);
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            fn(arg);
            _exit(0);
        }
        CHECK(write(p[1], &g, sizeof(g)) == sizeof(g));
        close(p[1]);
        int st = 0;
        waitpid(g, &st, 0);
        _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0));
    }
    close(p[1]);
    pid_t g = -1;
    CHECK(read(p[0], &g, sizeof(g)) == sizeof(g));
    close(p[0]);
    *helper = h;
    return g;
}

/* The exit status of a spawn_in_pidns() tenant, through its helper. */
static int tenant_status(pid_t helper)
{
    int st = 0;
    CHECK(waitpid(helper, &st, 0) == helper);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 200;
}

static int namespaces_available(void)
{
    if (geteuid() == 0)
        return 1;
    fprintf(stderr, "  (pid namespaces not tested: unshare(CLONE_NEWPID) needs root)\n");
    return 0;
}

static int listed(const struct sim_proc_usage *p, int n, int pid, unsigned long long bytes)
{
    for (int i = 0; i < n; i++)
        if (p[i].pid == pid && p[i].bytes == bytes)
            return 1;
    return 0;
}

/* ---- 1. child namespace --------------------------------------------------------------------- */

struct tenant_args {
    struct report *rep;
    struct event ready, done;
    int gpu;
    unsigned long long bytes;
    unsigned long long work_ns; /* submitted before reporting */
};

/* Holds `bytes`, reports its own view, waits for `done`. */
static void tenant(void *p)
{
    struct tenant_args *a = p;
    CHECK(sim_mem_reserve(a->gpu, a->bytes) == 0);
    if (a->work_ns)
        sim_submit_work(a->gpu, a->work_ns);
    a->rep->pid_self = getpid();
    a->rep->used = sim_mem_used(a->gpu);
    a->rep->nprocs = sim_processes(a->gpu, a->rep->procs, 8);
    event_fire(&a->ready);
    event_wait(&a->done);
    CHECK_EQ_U(sim_mem_used_by(a->gpu, 1), a->bytes); /* its own, under its own pid */
}

static void case_child_namespace(void)
{
    if (!namespaces_available())
        return;
    alarm(tu_slow() ? 300 : 60);
    struct report *rep = shared_reports(1);
    CHECK(sim_mem_reserve(0, 100 * MiB) == 0);
    struct tenant_args a = {.rep = rep, .gpu = 0, .bytes = 300 * MiB};
    event_init(&a.ready);
    event_init(&a.done);
    pid_t helper, t = spawn_in_pidns(tenant, &a, &helper);
    CHECK(t > 0);
    event_wait(&a.ready);

    /* Inside: itself as pid 1, not our process; the GPU's memory is everyone's. */
    CHECK(rep->pid_self == 1);
    CHECK(rep->nprocs == 1 && listed(rep->procs, 1, 1, 300 * MiB));
    CHECK_EQ_U(rep->used, 400 * MiB);
    /* Here: both, the tenant under its pid in our namespace. */
    struct sim_proc_usage p[8];
    int n = sim_processes(0, p, 8);
    CHECK(n == 2 && listed(p, n, getpid(), 100 * MiB) && listed(p, n, t, 300 * MiB));
    CHECK_EQ_U(sim_mem_used_by(0, t), 300 * MiB);
    CHECK_EQ_U(sim_mem_used_by(0, 1), 0); /* pid 1 of its namespace is not pid 1 of ours */
    CHECK_EQ_U(sim_mem_used(0), 400 * MiB);

    event_fire(&a.done);
    CHECK(tenant_status(helper) == 0);
    CHECK_EQ_U(sim_mem_used(0), 100 * MiB);
    CHECK(sim_processes(0, p, 8) == 1);
    sim_mem_release_all();
}

/* ---- 2. host > node > container ------------------------------------------------------------- */

struct node_args {
    struct report *rep;          /* [0] the node's view, [1] the container's */
    struct event ready, done;
};

static void container_tenant(void *p)
{
    struct node_args *a = p;
    CHECK(sim_mem_reserve(1, 256 * MiB) == 0);
    a->rep[1].pid_self = getpid();
    a->rep[1].nprocs = sim_processes(1, a->rep[1].procs, 8);
    event_fire(&a->ready);
    event_wait(&a->done);
}

/* The node: pid 1 of its namespace, holds 64 MiB itself, starts a container below it. */
static void node_init(void *p)
{
    struct node_args *a = p;
    struct node_args inner = {.rep = a->rep};
    event_init(&inner.ready);
    event_init(&inner.done);
    CHECK(sim_mem_reserve(1, 64 * MiB) == 0);
    pid_t helper, t = spawn_in_pidns(container_tenant, &inner, &helper);
    CHECK(t > 0);
    event_wait(&inner.ready);
    a->rep[0].pid_self = getpid();
    a->rep[0].inner_pid = t; /* the container's tenant, as the node (its fork) knows it */
    a->rep[0].nprocs = sim_processes(1, a->rep[0].procs, 8);
    a->rep[0].used = sim_mem_used(1);
    /* The node's /proc would show that pid: it is the one the kernel gave the node's fork. */
    CHECK(kill(t, 0) == 0);
    event_fire(&a->ready);
    event_wait(&a->done);
    event_fire(&inner.done);
    CHECK(tenant_status(helper) == 0);
    CHECK_EQ_U(sim_mem_used(1), 64 * MiB);
}

static void case_nested_namespaces(void)
{
    if (!namespaces_available())
        return;
    alarm(tu_slow() ? 300 : 60);
    struct report *rep = shared_reports(2);
    struct node_args a = {.rep = rep};
    event_init(&a.ready);
    event_init(&a.done);
    pid_t helper, node = spawn_in_pidns(node_init, &a, &helper);
    CHECK(node > 0);
    event_wait(&a.ready);

    /* The container sees itself only. */
    CHECK(rep[1].pid_self == 1);
    CHECK(rep[1].nprocs == 1 && listed(rep[1].procs, 1, 1, 256 * MiB));
    /* The node sees itself (pid 1 there) and the tenant under its node pid. */
    CHECK(rep[0].pid_self == 1 && rep[0].inner_pid > 1);
    CHECK(rep[0].nprocs == 2);
    CHECK(listed(rep[0].procs, 2, 1, 64 * MiB));
    CHECK(listed(rep[0].procs, 2, rep[0].inner_pid, 256 * MiB));
    CHECK_EQ_U(rep[0].used, 320 * MiB);
    /* The host sees both under host pids: the node's init is `node`; the tenant is neither its
     * container pid nor its node pid (those are small numbers of other namespaces). */
    struct sim_proc_usage p[8];
    int n = sim_processes(1, p, 8);
    CHECK(n == 2 && listed(p, n, node, 64 * MiB));
    int host_tenant = p[0].pid == node ? p[1].pid : p[0].pid;
    CHECK(host_tenant != node && host_tenant != 1 && host_tenant != rep[0].inner_pid);
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/status", host_tenant);
    CHECK(access(path, F_OK) == 0);

    event_fire(&a.done);
    CHECK(tenant_status(helper) == 0);
    CHECK_EQ_U(sim_mem_used(1), 0);
}

/* ---- 3. sibling namespaces ------------------------------------------------------------------ */

static void case_sibling_namespaces(void)
{
    if (!namespaces_available())
        return;
    alarm(tu_slow() ? 300 : 60);
    struct report *rep = shared_reports(2);
    struct tenant_args a = {.rep = &rep[0], .gpu = 0, .bytes = 200 * MiB};
    struct tenant_args b = {.rep = &rep[1], .gpu = 0, .bytes = 100 * MiB};
    event_init(&a.ready);
    event_init(&a.done);
    pid_t ha, ta = spawn_in_pidns(tenant, &a, &ha);
    CHECK(ta > 0);
    event_wait(&a.ready);
    event_init(&b.ready);
    event_init(&b.done);
    pid_t hb, tb = spawn_in_pidns(tenant, &b, &hb);
    CHECK(tb > 0);
    event_wait(&b.ready);

    /* B's view: itself only, but A's memory counts; A (reported first) saw only itself. */
    CHECK(rep[0].nprocs == 1 && listed(rep[0].procs, 1, 1, 200 * MiB));
    CHECK(rep[1].nprocs == 1 && listed(rep[1].procs, 1, 1, 100 * MiB));
    CHECK_EQ_U(rep[1].used, 300 * MiB);

    /* Kill A's namespace: its init (the tenant) and with it the namespace. */
    CHECK(kill(ta, SIGKILL) == 0);
    CHECK(tenant_status(ha) != 0);
    /* B, which never could see A, frees A's memory now that A is gone. */
    struct report *again = shared_reports(1);
    struct tenant_args c = {.rep = again, .gpu = 0, .bytes = 1 * MiB};
    event_init(&c.ready);
    event_init(&c.done);
    pid_t hc, tc = spawn_in_pidns(tenant, &c, &hc);
    CHECK(tc > 0);
    event_wait(&c.ready);
    CHECK_EQ_U(again->used, 101 * MiB); /* B's 100 and its own 1: A's 200 were reaped inside */
    event_fire(&c.done);
    CHECK(tenant_status(hc) == 0);

    struct sim_proc_usage p[8];
    CHECK(sim_processes(0, p, 8) == 1 && listed(p, 1, tb, 100 * MiB));
    event_fire(&b.done);
    CHECK(tenant_status(hb) == 0);
    CHECK_EQ_U(sim_mem_used(0), 0);
}

/* ---- 4. busy time per namespace ------------------------------------------------------------- */

static void case_busy_time_by_namespace(void)
{
    if (!namespaces_available())
        return;
    alarm(tu_slow() ? 300 : 60);
    struct report *rep = shared_reports(1);
    /* Our own 100 ms first, then the tenant's 200 ms queue behind it. */
    unsigned long long t0 = sim_now_ns();
    sim_submit_work(1, 100 * MS);
    struct tenant_args a = {.rep = rep, .gpu = 1, .bytes = MiB, .work_ns = 200 * MS};
    event_init(&a.ready);
    event_init(&a.done);
    pid_t helper, t = spawn_in_pidns(tenant, &a, &helper);
    CHECK(t > 0);
    event_wait(&a.ready);
    /* Learn its pid while it lives (as any NVML client that lists processes does). */
    struct sim_proc_usage p[8];
    CHECK(sim_processes(1, p, 8) == 2 && listed(p, 2, t, MiB));
    event_fire(&a.done);
    CHECK(tenant_status(helper) == 0);
    /* Wait until all the work is over, then look back at it. */
    while (sim_now_ns() < sim_busy_until(1) + 10 * MS)
        usleep(5000);
    unsigned long long elapsed = sim_now_ns() - t0;

    struct sim_proc_busy busy[8];
    int n = sim_process_busy(1, t0, sim_now_ns(), busy, 8);
    CHECK(n == 2);
    for (int i = 0; i < n; i++) {
        if (busy[i].pid == getpid())
            CHECK_EQ_U(busy[i].busy_ns, 100 * MS);
        else
            CHECK(busy[i].pid == t && busy[i].busy_ns == 200 * MS);
    }
    CHECK_EQ_U(sim_busy_total(1, t0, sim_now_ns()), 300 * MS);
    unsigned int mine = sim_utilization(1, getpid(), elapsed);
    unsigned int theirs = sim_utilization(1, t, elapsed);
    CHECK(theirs >= mine * 2 - 2 && theirs <= mine * 2 + 2 && mine >= 1);

    /* A reader in a new namespace that never saw the tenant alive: its own busy time under pid 1,
     * nobody else's (ours is invisible to it, the tenant's unnamed), but the total is everyone's. */
    struct tenant_args b = {.rep = rep, .gpu = 1, .bytes = MiB, .work_ns = 50 * MS};
    event_init(&b.ready);
    event_init(&b.done);
    pid_t hb, tb = spawn_in_pidns(tenant, &b, &hb);
    CHECK(tb > 0);
    event_wait(&b.ready);
    event_fire(&b.done);
    CHECK(tenant_status(hb) == 0);
    /* In that namespace's view (from its report): only itself. */
    CHECK(rep->nprocs == 1 && listed(rep->procs, 1, 1, MiB));
    /* In ours, after it exited: we never learnt its pid while it lived, so its busy time has no
     * name here (left out of the per-process figures); the total still has it. */
    while (sim_now_ns() < sim_busy_until(1) + 10 * MS)
        usleep(5000);
    n = sim_process_busy(1, t0, sim_now_ns(), busy, 8);
    CHECK(n == 2); /* us and the first tenant; the second is nameless here */
    CHECK_EQ_U(sim_busy_total(1, t0, sim_now_ns()), 350 * MS);
    sim_mem_release_all();
}

/* ---- 5. exec ---------------------------------------------------------------------------------- */

static void case_exec_is_a_new_process(void)
{
    alarm(tu_slow() ? 300 : 60);
    struct event ready;
    event_init(&ready);
    fflush(NULL);
    pid_t kid = fork();
    CHECK(kid >= 0);
    if (kid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(ready.fd[0]);
        CHECK(sim_mem_reserve(0, 200 * MiB) == 0);
        event_fire(&ready);
        execl("/bin/sleep", "sleep", "30", (char *)NULL);
        _exit(127);
    }
    event_wait(&ready);
    /* Until it execs, its memory is held; after, no image holds it (the pid lives on). */
    unsigned long long deadline = sim_now_ns() + 5000 * MS;
    while (sim_mem_used(0) != 0 && sim_now_ns() < deadline)
        usleep(2000);
    CHECK_EQ_U(sim_mem_used(0), 0);
    CHECK(kill(kid, 0) == 0);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
}

static const struct tu_case CASES[] = {
    {"child namespace: its pid here, pid 1 there, nothing reaped alive", case_child_namespace},
    {"host > node > container: each reader names the tenant its way", case_nested_namespaces},
    {"sibling namespaces: unseen, never reaped alive, reaped when dead", case_sibling_namespaces},
    {"busy time is named per namespace, also after exit", case_busy_time_by_namespace},
    {"exec starts a new process: the old image's memory is freed", case_exec_is_a_new_process},
};

int main(void)
{
    tu_node(NULL);
    return tu_report(__FILE__, TU_RUN_CASES(CASES));
}
