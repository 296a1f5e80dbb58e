/*
 * simstate.c - attach to the node state file and mutate it safely (see include/simstate.h for the
 * design, src/simstate_layout.h for the bytes). Linked privately into libnvidia-ml and libcuda.
 *
 * Locking: a GPU's dynamic block is changed only while holding g_mu (threads of this process) and
 * the GPU's OFD byte-range lock (other processes). The kernel releases an OFD lock when the last
 * descriptor of its open file description closes, which includes the holder being SIGKILLed, so
 * nobody ever waits on a dead process. Readers of single words (flags, busy_until) use atomic
 * loads without locking.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "simstate_layout.h"

#define LOAD(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static int g_fd = -1;
static struct sim_state_file *g_st;
static int g_attach_rc = -ENOENT;
static char g_err[640];
static char g_path[4096];
/* This process's identity, cached; cleared in a forked child. */
static int g_self_pid;
static uint64_t g_self_start;
/* When this process last reaped each GPU thoroughly (zombies, reused pids), CLOCK_MONOTONIC ns. */
static uint64_t g_thorough_at[SIM_MAX_GPUS];
#define SIM_THOROUGH_REAP_NS 10000000ULL /* 10 ms */


unsigned long long sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* ---- process identity and liveness ------------------------------------------------------ */

/* Read state (field 3) and start time (field 22) of /proc/<pid>/stat. 0, or -errno. */
static int read_proc_stat(int pid, char *state, uint64_t *start)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    int saved = errno;
    close(fd);
    if (n <= 0)
        return n < 0 ? -saved : -EIO;
    buf[n] = '\0';
    /* The command name (field 2) may contain spaces and parentheses: parse after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return -EIO;
    p += 2;
    *state = *p;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return -EIO;
        p++;
    }
    *start = strtoull(p, NULL, 10);
    return 0;
}

static int self_pid(void)
{
    int pid = LOAD(&g_self_pid);
    if (pid == 0) {
        char state;
        uint64_t start = 0;
        pid = getpid();
        if (read_proc_stat(pid, &state, &start) == 0)
            STORE(&g_self_start, start);
        STORE(&g_self_pid, pid);
    }
    return pid;
}

/* Is the process that claimed a slot with (pid, start) still running (and not a zombie)?
 * `thorough` also reads /proc/<pid>/stat to catch zombies and reused pids (~10-30 us); otherwise
 * only signal 0 is sent (~0.3 us), which sees processes that are gone and reaped. */
static int proc_alive(int pid, uint64_t start, int thorough)
{
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return 0;
    if (!thorough)
        return 1; /* exists (EPERM also means it exists) */
    char state;
    uint64_t now_start;
    if (read_proc_stat(pid, &state, &now_start) != 0)
        return 1; /* /proc unavailable: trust signal 0 */
    if (state == 'Z' || state == 'X')
        return 0;
    return start == 0 || now_start == start;
}

/* ---- attach ---------------------------------------------------------------------------- */

static void set_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_err(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof(g_err), fmt, ap);
    va_end(ap);
}

static int lock_range(int fd, off_t off, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = off;
    fl.l_len = 1;
    while (fcntl(fd, F_OFD_SETLKW, &fl) < 0) {
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

/* Read a whole small file into a malloc'd NUL-terminated buffer. */
static char *read_text(const char *path, int *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *err = errno;
        return NULL;
    }
    size_t cap = 8192, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            *err = ENOMEM;
            break;
        }
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                continue;
            }
            buf = nb;
            cap *= 2;
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            *err = errno;
            free(buf);
            buf = NULL;
            break;
        }
        if (n == 0) {
            buf[len] = '\0';
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    return buf;
}

static void release_all_at_exit(void) { sim_mem_release_all(); }

/* In a forked child: a fresh process-local view of the same state. No prepare handler takes the
 * mutex across fork(), because that would order it against the callers' own locks (a thread
 * holding the CUDA driver's lock while waiting for ours would deadlock the forking thread);
 * instead the child re-initialises the mutex, which only its single thread can be using. */
static void atfork_child(void)
{
    pthread_mutex_init(&g_mu, NULL);
    /* The child shares the parent's open file description, and OFD locks taken through a shared
     * description do not exclude each other: give the child its own (holding no locks). */
    if (g_fd >= 0) {
        int nfd = open(g_path, O_RDWR | O_CLOEXEC);
        if (nfd >= 0) {
            dup3(nfd, g_fd, O_CLOEXEC);
            close(nfd);
        }
    }
    g_self_pid = 0;
    g_self_start = 0;
    memset(g_thorough_at, 0, sizeof(g_thorough_at));
}

/* Fill a fresh (or half-initialised) mapping from the profile; the magic is stored last. */
static int init_state(struct sim_state_file *st, const char *profile_text, const char *profile_path)
{
    char perr[256];
    struct sim_node_info node;
    static struct sim_gpu_info gpus[SIM_MAX_GPUS]; /* only used under the init lock + once */
    if (sim_profile_parse(profile_text, &node, gpus, perr, sizeof(perr)) != 0) {
        set_err("invalid profile %s: %s", profile_path, perr);
        return -EINVAL;
    }
    memset(st, 0, sizeof(*st));
    st->layout_version = SIM_LAYOUT_VERSION;
    st->file_size = sizeof(*st);
    st->profile_hash = sim_profile_hash(profile_text);
    st->node = node;
    memcpy(st->gpus, gpus, sizeof(gpus));
    STORE(&st->magic, SIM_MAGIC);
    return 0;
}

static int attach_locked(int fd, const char *path)
{
    const char *ppath = getenv("VGPU_SIM_PROFILE");
    char *ptext = NULL;
    int perrno = 0;
    if (ppath && *ppath) {
        ptext = read_text(ppath, &perrno);
        if (!ptext) {
            set_err("cannot read VGPU_SIM_PROFILE=%s: %s", ppath, strerror(perrno));
            return -perrno;
        }
    }
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        int e = errno;
        free(ptext);
        set_err("cannot stat state file %s: %s", path, strerror(e));
        return -e;
    }
    if (sb.st_size != 0 && (size_t)sb.st_size != sizeof(struct sim_state_file)) {
        free(ptext);
        set_err("state file %s has size %lld, expected %zu (another layout version?): delete it",
                path, (long long)sb.st_size, sizeof(struct sim_state_file));
        return -EPROTO;
    }
    if (sb.st_size == 0 && ftruncate(fd, sizeof(struct sim_state_file)) < 0) {
        int e = errno;
        free(ptext);
        set_err("cannot size state file %s: %s", path, strerror(e));
        return -e;
    }
    void *m = mmap(NULL, sizeof(struct sim_state_file), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        int e = errno;
        free(ptext);
        set_err("cannot map state file %s: %s", path, strerror(e));
        return -e;
    }
    struct sim_state_file *st = m;
    int rc = 0;
    if (LOAD(&st->magic) != SIM_MAGIC) {
        /* New, or its creator died before publishing the magic: (re)initialise. */
        if (!ptext) {
            set_err("state file %s is not initialised and VGPU_SIM_PROFILE is not set", path);
            rc = -EINVAL;
        } else {
            rc = init_state(st, ptext, ppath);
        }
    } else if (st->layout_version != SIM_LAYOUT_VERSION || st->file_size != sizeof(*st)) {
        set_err("state file %s has layout version %u, this library uses %u: delete it", path,
                st->layout_version, SIM_LAYOUT_VERSION);
        rc = -EPROTO;
    } else if (ptext && st->profile_hash != sim_profile_hash(ptext)) {
        set_err("state file %s was built from another profile than %s: delete it to start a new "
                "node",
                path, ppath);
        rc = -ESTALE;
    }
    free(ptext);
    if (rc != 0) {
        munmap(m, sizeof(struct sim_state_file));
        return rc;
    }
    g_st = st;
    return 0;
}

static void attach_once(void)
{
    const char *path = getenv("VGPU_SIM_STATE");
    if (!path || !*path) {
        set_err("VGPU_SIM_STATE is not set (no simulated GPU node)");
        g_attach_rc = -ENOENT;
        return;
    }
    if (strlen(path) >= sizeof(g_path)) {
        set_err("VGPU_SIM_STATE is longer than %zu bytes", sizeof(g_path) - 1);
        g_attach_rc = -ENAMETOOLONG;
    } else {
        memcpy(g_path, path, strlen(path) + 1);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0) {
            g_attach_rc = -errno;
            set_err("cannot open state file %s: %s", path, strerror(errno));
        } else {
            int rc = lock_range(fd, SIM_LOCK_INIT_OFFSET, F_WRLCK);
            if (rc == 0) {
                rc = attach_locked(fd, path);
                lock_range(fd, SIM_LOCK_INIT_OFFSET, F_UNLCK);
            } else {
                set_err("cannot lock state file %s: %s", path, strerror(-rc));
            }
            if (rc == 0) {
                g_fd = fd;
                g_err[0] = '\0';
                pthread_atfork(NULL, NULL, atfork_child);
                atexit(release_all_at_exit);
            } else {
                close(fd);
            }
            g_attach_rc = rc;
        }
    }
    if (g_attach_rc != 0)
        fprintf(stderr, "vgpu-sim: %s\n", g_err);
}

int sim_attach(void)
{
    pthread_once(&g_once, attach_once);
    return g_attach_rc;
}

const char *sim_attach_error(void)
{
    sim_attach();
    return g_err;
}

const struct sim_node_info *sim_node(void) { return sim_attach() == 0 ? &g_st->node : NULL; }

int sim_gpu_count(void) { return sim_attach() == 0 ? g_st->node.gpu_count : 0; }

static int valid_gpu(int phys)
{
    return sim_attach() == 0 && phys >= 0 && phys < g_st->node.gpu_count;
}

const struct sim_gpu_info *sim_gpu(int phys) { return valid_gpu(phys) ? &g_st->gpus[phys] : NULL; }

/* ---- lookup and visibility ------------------------------------------------------------- */

/* Compare PCI bus ids ignoring case and the width of the domain ("0000:" vs "00000000:"). */
static int bus_id_equal(const char *a, const char *b)
{
    const char *ca = strchr(a, ':'), *cb = strchr(b, ':');
    if (!ca || !cb)
        return 0;
    char *end;
    unsigned long da = strtoul(a, &end, 16);
    if (end != ca)
        return 0;
    unsigned long db = strtoul(b, &end, 16);
    if (end != cb)
        return 0;
    return da == db && strcasecmp(ca, cb) == 0;
}

int sim_find_gpu(const char *key)
{
    if (!key || sim_attach() != 0)
        return -1;
    for (int i = 0; i < g_st->node.gpu_count; i++) {
        if (strcasecmp(g_st->gpus[i].uuid, key) == 0 || bus_id_equal(g_st->gpus[i].pci_bus_id, key))
            return i;
    }
    return -1;
}

/* Whether the process has GPU `phys`'s device node: <dir>/nvidia<minor>, a character device
 * 195:<minor> (dir: VGPU_SIM_DEV_DIR, default /dev). The simulated driver never opens it. */
static int has_device_node(int phys)
{
    const char *dir = getenv("VGPU_SIM_DEV_DIR");
    char path[512];
    struct stat st;
    int minor_no = g_st->gpus[phys].minor;
    snprintf(path, sizeof(path), "%s/nvidia%d", dir && *dir ? dir : "/dev", minor_no);
    return stat(path, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == SIM_NVIDIA_MAJOR &&
           minor(st.st_rdev) == (unsigned)minor_no;
}

int sim_visible_gpus(int *phys_out, int max)
{
    if (sim_attach() != 0)
        return 0;
    int n = g_st->node.gpu_count, count = 0;
    const char *env = getenv("NVIDIA_VISIBLE_DEVICES");
    int order[SIM_MAX_GPUS];
    if (!env || !*env || strcmp(env, "all") == 0) {
        for (int i = 0; i < n; i++)
            order[count++] = i;
    } else if (strcmp(env, "none") == 0 || strcmp(env, "void") == 0) {
        /* CDI mode: the runtime injected device nodes; those are the container's GPUs. */
        for (int i = 0; i < n; i++)
            if (has_device_node(i))
                order[count++] = i;
    } else {
        char buf[1024];
        snprintf(buf, sizeof(buf), "%s", env);
        char *save = NULL;
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            while (*tok == ' ')
                tok++;
            int phys = -1;
            char *end;
            long idx = strtol(tok, &end, 10);
            if (end != tok && *end == '\0')
                phys = idx >= 0 && idx < n ? (int)idx : -1;
            else
                phys = sim_find_gpu(tok);
            if (phys < 0) {
                fprintf(stderr, "vgpu-sim: NVIDIA_VISIBLE_DEVICES entry '%s' matches no GPU\n",
                        tok);
                continue;
            }
            int dup = 0;
            for (int j = 0; j < count; j++)
                dup |= order[j] == phys;
            if (!dup && count < SIM_MAX_GPUS)
                order[count++] = phys;
        }
    }
    int out = 0;
    for (int i = 0; i < count; i++) {
        if (LOAD(&g_st->dyn[order[i]].flags) & SIM_GPU_REMOVED)
            continue;
        if (out < max)
            phys_out[out] = order[i];
        out++;
    }
    return out < max ? out : max;
}

/* ---- per-GPU critical sections --------------------------------------------------------- */

static void gpu_lock(int phys)
{
    pthread_mutex_lock(&g_mu);
    /* Failure here (ENOLCK) cannot happen for a regular file on a local fs; if it does, we
     * still exclude our own threads and the update stays crash-safe. */
    (void)lock_range(g_fd, SIM_LOCK_GPU_OFFSET(phys), F_WRLCK);
}

static void gpu_unlock(int phys)
{
    (void)lock_range(g_fd, SIM_LOCK_GPU_OFFSET(phys), F_UNLCK);
    pthread_mutex_unlock(&g_mu);
}

/* Free the slots of dead processes. Caller holds the GPU lock. Processes that are gone are
 * always caught; zombies and reused pids need /proc reads, done at most every 10 ms per GPU per
 * process (or always when `force`), so hot queries stay cheap. */
static void reap_locked(int phys, int me, int force)
{
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    uint64_t now = sim_now_ns();
    int thorough = force || now - g_thorough_at[phys] >= SIM_THOROUGH_REAP_NS;
    if (thorough)
        g_thorough_at[phys] = now;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        int pid = LOAD(&d->procs[i].pid);
        if (pid != 0 && pid != me && !proc_alive(pid, d->procs[i].start_time, thorough))
            STORE(&d->procs[i].pid, 0);
    }
}

static uint64_t used_locked(const struct sim_gpu_dyn *d)
{
    uint64_t used = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        if (LOAD(&d->procs[i].pid) != 0)
            used += LOAD(&d->procs[i].bytes);
    return used;
}

static struct sim_proc_slot *find_slot(struct sim_gpu_dyn *d, int pid)
{
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        if (LOAD(&d->procs[i].pid) == pid)
            return &d->procs[i];
    return NULL;
}

/* Our slot on this GPU, claiming a free one (reaping if needed); NULL if the table is full. */
static struct sim_proc_slot *own_slot(int phys, int me)
{
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    struct sim_proc_slot *s = find_slot(d, me);
    if (s)
        return s;
    s = find_slot(d, 0);
    if (!s) {
        reap_locked(phys, me, 1);
        s = find_slot(d, 0);
        if (!s)
            return NULL;
    }
    STORE(&s->bytes, 0);
    STORE(&s->start_time, LOAD(&g_self_start));
    STORE(&s->pid, me);
    return s;
}

static int fits(uint64_t used, uint64_t total, unsigned long long bytes)
{
    return used <= total && bytes <= total - used;
}

/* Charge up to `bytes` of GPU phys to this process, reaping dead processes first when they do not
 * fit; *got is what was charged. all_or_nothing: charge nothing (-1) unless all of it fits. */
static int reserve(int phys, unsigned long long bytes, int all_or_nothing, unsigned long long *got)
{
    *got = 0;
    if (!valid_gpu(phys))
        return -3;
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    if (LOAD(&d->flags) & SIM_GPU_LOST)
        return -4;
    uint64_t total = g_st->gpus[phys].memory_total;
    int me = self_pid(), rc = 0;
    gpu_lock(phys);
    uint64_t used = used_locked(d);
    if (!fits(used, total, bytes)) {
        reap_locked(phys, me, 1);
        used = used_locked(d);
    }
    uint64_t free_bytes = used >= total ? 0 : total - used;
    uint64_t take = bytes < free_bytes ? bytes : free_bytes;
    struct sim_proc_slot *s;
    if (all_or_nothing && !fits(used, total, bytes)) {
        rc = -1;
    } else if (!(s = own_slot(phys, me))) {
        rc = -2;
    } else {
        STORE(&s->bytes, LOAD(&s->bytes) + take);
        *got = take;
    }
    gpu_unlock(phys);
    return rc;
}

int sim_mem_reserve(int phys, unsigned long long bytes)
{
    unsigned long long got;
    return reserve(phys, bytes, 1, &got);
}

int sim_mem_reserve_upto(int phys, unsigned long long bytes, unsigned long long *got)
{
    return reserve(phys, bytes, 0, got);
}

void sim_mem_release(int phys, unsigned long long bytes)
{
    if (!valid_gpu(phys))
        return;
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    int me = self_pid();
    gpu_lock(phys);
    struct sim_proc_slot *s = find_slot(d, me);
    if (s) {
        uint64_t held = LOAD(&s->bytes);
        STORE(&s->bytes, bytes >= held ? 0 : held - bytes);
    }
    gpu_unlock(phys);
}

void sim_mem_release_all(void)
{
    if (sim_attach() != 0)
        return;
    int me = getpid();
    for (int g = 0; g < g_st->node.gpu_count; g++) {
        struct sim_gpu_dyn *d = &g_st->dyn[g];
        if (!find_slot(d, me))  /* cheap unlocked check: only we write our own pid */
            continue;
        gpu_lock(g);
        struct sim_proc_slot *s = find_slot(d, me);
        if (s)
            STORE(&s->pid, 0);
        gpu_unlock(g);
    }
}

int sim_proc_register(int phys)
{
    if (!valid_gpu(phys))
        return -3;
    if (LOAD(&g_st->dyn[phys].flags) & SIM_GPU_LOST)
        return -4;
    int me = self_pid();
    gpu_lock(phys);
    struct sim_proc_slot *s = own_slot(phys, me);
    gpu_unlock(phys);
    return s ? 0 : -2;
}

unsigned long long sim_mem_used(int phys)
{
    if (!valid_gpu(phys))
        return 0;
    gpu_lock(phys);
    reap_locked(phys, self_pid(), 0);
    uint64_t used = used_locked(&g_st->dyn[phys]);
    gpu_unlock(phys);
    return used;
}

unsigned long long sim_mem_used_by(int phys, int pid)
{
    if (!valid_gpu(phys) || pid <= 0)
        return 0;
    gpu_lock(phys);
    struct sim_proc_slot *s = find_slot(&g_st->dyn[phys], pid);
    uint64_t bytes = s ? LOAD(&s->bytes) : 0;
    gpu_unlock(phys);
    return bytes;
}

int sim_processes(int phys, struct sim_proc_usage *out, int max)
{
    if (!valid_gpu(phys))
        return 0;
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    int n = 0;
    gpu_lock(phys);
    reap_locked(phys, self_pid(), 0);
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        int pid = LOAD(&d->procs[i].pid);
        if (pid == 0)
            continue;
        if (n < max) {
            out[n].pid = pid;
            out[n].bytes = LOAD(&d->procs[i].bytes);
        }
        n++;
    }
    gpu_unlock(phys);
    return n;
}

/* ---- SM time ---------------------------------------------------------------------------- */

unsigned long long sim_submit_work(int phys, unsigned long long duration_ns)
{
    if (!valid_gpu(phys))
        return 0;
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    if (LOAD(&d->flags) & SIM_GPU_LOST)
        return 0;
    int me = self_pid();
    gpu_lock(phys);
    uint64_t now = sim_now_ns();
    uint64_t busy = LOAD(&d->busy_until);
    uint64_t start = busy > now ? busy : now;
    uint64_t end = start + duration_ns;
    STORE(&d->busy_until, end);
    uint64_t count = LOAD(&d->tl_count);
    struct sim_busy *last = count ? &d->tl[(count - 1) % SIM_TIMELINE_SLOTS] : NULL;
    if (last && last->pid == me && LOAD(&last->end) == start) {
        STORE(&last->end, end); /* back-to-back work of the same process: extend */
    } else if (duration_ns > 0) {
        /* Written before it is published by the count; a torn write here is never read. */
        struct sim_busy *slot = &d->tl[count % SIM_TIMELINE_SLOTS];
        slot->pid = me;
        slot->start = start;
        STORE(&slot->end, end);
        STORE(&d->tl_count, count + 1);
    }
    gpu_unlock(phys);
    return end;
}

unsigned long long sim_busy_until(int phys)
{
    return valid_gpu(phys) ? LOAD(&g_st->dyn[phys].busy_until) : 0;
}

/* Busy time of `pid` (all if <= 0) overlapping [from, to). Caller holds the GPU lock. */
static uint64_t busy_in_window(const struct sim_gpu_dyn *d, int pid, uint64_t from, uint64_t to)
{
    uint64_t count = LOAD(&d->tl_count), total = 0;
    uint64_t oldest = count > SIM_TIMELINE_SLOTS ? count - SIM_TIMELINE_SLOTS : 0;
    for (uint64_t k = count; k > oldest; k--) {
        const struct sim_busy *b = &d->tl[(k - 1) % SIM_TIMELINE_SLOTS];
        uint64_t s = b->start, e = LOAD(&b->end);
        if (e <= from)
            break; /* intervals are FIFO-ordered: everything older ends earlier */
        if (pid > 0 && b->pid != pid)
            continue;
        uint64_t lo = s > from ? s : from, hi = e < to ? e : to;
        if (hi > lo)
            total += hi - lo;
    }
    return total;
}

unsigned int sim_utilization(int phys, int pid, unsigned long long window_ns)
{
    if (!valid_gpu(phys))
        return 0;
    if (window_ns == 0)
        window_ns = SIM_UTIL_WINDOW_NS;
    gpu_lock(phys);
    uint64_t now = sim_now_ns();
    uint64_t from = now > window_ns ? now - window_ns : 0;
    uint64_t busy = busy_in_window(&g_st->dyn[phys], pid, from, now);
    gpu_unlock(phys);
    uint64_t span = now - from;
    unsigned int pct = span ? (unsigned int)((busy * 100 + span / 2) / span) : 0;
    return pct > 100 ? 100 : pct;
}

/* Busy nanoseconds per process within [from, to) on a GPU's timeline, which the caller holds
 * locked: writes at most max entries {pid, busy_ns} and, when last is non-NULL, last[i] = the end
 * of process i's latest busy interval in the window; returns the number written. */
static int busy_by_process_locked(const struct sim_gpu_dyn *d, uint64_t from, uint64_t to,
                                  struct sim_proc_busy *out, uint64_t *last, int max)
{
    int n = 0;
    uint64_t count = LOAD(&d->tl_count);
    uint64_t oldest = count > SIM_TIMELINE_SLOTS ? count - SIM_TIMELINE_SLOTS : 0;
    for (uint64_t k = count; k > oldest; k--) {
        const struct sim_busy *b = &d->tl[(k - 1) % SIM_TIMELINE_SLOTS];
        uint64_t e = LOAD(&b->end);
        if (e <= from)
            break; /* FIFO-ordered: everything older ends earlier */
        uint64_t lo = b->start > from ? b->start : from, hi = e < to ? e : to;
        if (hi <= lo)
            continue;
        int j;
        for (j = 0; j < n; j++)
            if (out[j].pid == b->pid)
                break;
        if (j == n) {
            if (n == max)
                continue;
            out[n].pid = b->pid;
            out[n].busy_ns = 0;
            if (last)
                last[n] = hi; /* newest first: this is the process's latest interval */
            n++;
        }
        out[j].busy_ns += hi - lo;
    }
    return n;
}

int sim_process_utilization(int phys, unsigned long long since_ns, struct sim_proc_util *out,
                            int max)
{
    if (!valid_gpu(phys) || max <= 0)
        return 0;
    struct sim_proc_busy busy[SIM_MAX_PROCS];
    uint64_t last[SIM_MAX_PROCS];
    gpu_lock(phys);
    uint64_t now = sim_now_ns();
    uint64_t from = now > 1000000000ULL ? now - 1000000000ULL : 0;
    if (since_ns > from)
        from = since_ns;
    int n = busy_by_process_locked(&g_st->dyn[phys], from, now, busy, last,
                                   max < SIM_MAX_PROCS ? max : SIM_MAX_PROCS);
    gpu_unlock(phys);
    for (int j = 0; j < n; j++) {
        uint64_t span = now - from;
        unsigned int pct = (unsigned int)((busy[j].busy_ns * 100 + span / 2) / span);
        out[j].pid = busy[j].pid;
        out[j].last_ns = last[j];
        out[j].sm_util = pct > 100 ? 100 : pct;
    }
    return n;
}

int sim_process_busy(int phys, unsigned long long from_ns, unsigned long long to_ns,
                     struct sim_proc_busy *out, int max)
{
    if (!valid_gpu(phys) || max <= 0 || to_ns <= from_ns)
        return 0;
    gpu_lock(phys);
    int n = busy_by_process_locked(&g_st->dyn[phys], from_ns, to_ns, out, NULL, max);
    gpu_unlock(phys);
    return n;
}

/* ---- flags and XID events --------------------------------------------------------------- */

unsigned int sim_gpu_flags(int phys) { return valid_gpu(phys) ? LOAD(&g_st->dyn[phys].flags) : 0; }

int sim_set_flag(int phys, unsigned int flag, int on)
{
    if (!valid_gpu(phys))
        return -1;
    gpu_lock(phys);
    uint32_t f = LOAD(&g_st->dyn[phys].flags);
    STORE(&g_st->dyn[phys].flags, on ? (f | flag) : (f & ~flag));
    gpu_unlock(phys);
    return 0;
}

uint64_t sim_xid_inject(int phys, uint64_t xid)
{
    if (!valid_gpu(phys))
        return 0;
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    gpu_lock(phys);
    uint64_t seq = LOAD(&d->xid_seq) + 1;
    struct sim_xid_event *e = &d->xids[seq % SIM_XID_QUEUE];
    STORE(&e->seq, 0); /* invalid until complete */
    e->xid = xid;
    e->time_ns = sim_now_ns();
    STORE(&e->seq, seq);
    STORE(&d->xid_seq, seq);
    gpu_unlock(phys);
    return seq;
}

uint64_t sim_xid_seq(int phys) { return valid_gpu(phys) ? LOAD(&g_st->dyn[phys].xid_seq) : 0; }

int sim_xid_next(int phys, uint64_t *cursor, struct sim_xid_event *out)
{
    if (!valid_gpu(phys) || !cursor)
        return 0;
    struct sim_gpu_dyn *d = &g_st->dyn[phys];
    if (LOAD(&d->xid_seq) <= *cursor)
        return 0; /* the common case, without locking */
    int found = 0;
    gpu_lock(phys);
    uint64_t latest = LOAD(&d->xid_seq);
    uint64_t next = *cursor + 1;
    if (latest >= SIM_XID_QUEUE && next < latest - SIM_XID_QUEUE + 1)
        next = latest - SIM_XID_QUEUE + 1; /* older events were overwritten */
    for (; next <= latest && !found; next++) {
        const struct sim_xid_event *e = &d->xids[next % SIM_XID_QUEUE];
        if (LOAD(&e->seq) == next) {
            *out = *e;
            found = 1;
        }
        *cursor = next;
    }
    gpu_unlock(phys);
    return found;
}
