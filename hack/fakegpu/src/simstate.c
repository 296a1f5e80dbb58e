/*
 * simstate.c - attach to the node state file and mutate it safely (see include/simstate.h for the
 * design, src/simstate_layout.h for the bytes). Linked privately into libnvidia-ml and libcuda.
 *
 * Locking: a GPU's dynamic block is changed only while holding g_mu (threads of this process) and
 * the GPU's OFD byte-range lock (other processes). The kernel releases an OFD lock when the last
 * descriptor of its open file description closes, which includes the holder being SIGKILLed, so
 * nobody ever waits on a dead process. Readers of single words (flags, busy_until) use atomic
 * loads without locking.
 *
 * Process identity across PID namespaces. A process has one pid per namespace it is visible in:
 * a tenant in a container has the container's pid, another in the node's namespace, another in
 * each ancestor's. Keying the process table by getpid() and testing liveness with kill(pid, 0)
 * (layout 1) broke as soon as processes sat in different namespaces: the node's plugin found no
 * container pid and freed the tenant's memory, and the tenant reaped the node's processes in
 * turn. What the design needs, and how it gets it:
 *
 *   Identity - which slot is this process's own. The owner records (pid namespace inode,
 *   getpid(), start time, AT_RANDOM). All four equal is "this very process image": the two
 *   library copies of one process (libcuda's and libnvidia-ml's) agree on it and share their
 *   slots; a forked child differs by pid; exec() keeps pid and start time but the kernel draws
 *   new AT_RANDOM bytes, so the new image is a new process, as for a real driver (the device
 *   files close at exec and the driver frees the old image's memory).
 *
 *   Liveness and pid, as seen from any namespace. The owner holds a classic POSIX lock on its
 *   slot's byte (SIM_LOCK_SLOT_OFFSET) for as long as it owns the slot. The kernel drops it when
 *   the process exits (before it becomes a zombie), is killed, or execs (the descriptor is
 *   close-on-exec); and F_GETLK reports a lock's holder as its pid *in the caller's* pid
 *   namespace, or 0 when the holder is not visible there (fs/locks.c, locks_translate_pid). So
 *   every reader, wherever it runs, learns exactly what it may know:
 *     unlocked        the owner is gone: the slot is freed by whoever looks first, whatever its
 *                     namespace (a container whose namespace died with it is still reclaimed);
 *     locked, pid > 0 alive, and that is its pid for this caller;
 *     locked, pid 0   alive in a namespace the caller cannot see: never freed, not listed.
 *   No reader guesses from /proc or from kill(pid, 0) in the wrong namespace; a reader that
 *   cannot see a process never reaps it. (Scanning /proc/<pid>/ns/pid and NSpid to map pids
 *   was the alternative: it costs a /proc walk per unknown slot and cannot tell "namespace not
 *   mine" from "namespace dead", so nobody could ever free a dead container's memory.)
 *
 *   Pids of processes that have exited. Busy intervals outlive their process (NVML reports a
 *   process's utilisation samples for a while after it ends), but a dead owner holds no lock to
 *   ask. A slot therefore keeps its identity after it is freed until it is claimed again (the
 *   longest-free slot is claimed first), and readers that resolved a live owner's pid in their
 *   own namespace cache it in the slot (SIM_PID_VIEWS entries); the owner's own namespace needs
 *   no cache (ns_pid).
 *
 *   The price of classic locks: closing *any* descriptor of the state file drops every classic
 *   lock the process holds on it. The libraries never close theirs while attached (a forked
 *   child swaps its inherited descriptor before it takes any lock), and a process re-takes its
 *   lock whenever it reserves memory or registers, so only a program that itself opens and
 *   closes the node's state file while it holds GPU memory could lose its slots.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
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
/* This process's identity (see the top of this file): computed when attaching and again in a
 * forked child, before either can touch a slot; read-only otherwise. */
struct sim_ident {
    int32_t pid;              /* getpid(): the pid in this process's own namespace */
    uint64_t ns_ino;          /* inode of /proc/self/ns/pid, 0 if unknown */
    uint64_t start;           /* /proc/self/stat field 22, 0 if unknown */
    uint64_t nonce;           /* the first 8 of the kernel's AT_RANDOM bytes for this image */
};
static struct sim_ident g_self;
/* The MIG device this library copy is confined to on each GPU (sim_mig_bind_uuid(); gi_id 0:
 * none): process-local, set once by the CUDA driver's enumeration before any context exists. */
struct sim_bind {
    uint32_t gi_id, ci_id;
    int gi_slot, ci_slot;
    uint64_t serial;          /* the compute instance's */
    struct sim_gpu_info info; /* what sim_gpu() returns for the GPU: the MIG device */
};
static struct sim_bind g_bind[SIM_MAX_GPUS];


unsigned long long sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
}

/* ---- process identity ------------------------------------------------------------------ */

/* Start time (field 22) of /proc/self/stat; 0 if unreadable (no /proc in a container). */
static uint64_t read_self_start(void)
{
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* The command name (field 2) may contain spaces and parentheses: parse after the last ')'. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return 0;
    p += 2; /* field 3 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* No locks, no allocation (system calls and plain string functions only), since a forked child
 * of a multithreaded program runs this in its atfork handler. */
static void compute_self(void)
{
    struct sim_ident id = {.pid = getpid()};
    struct stat sb;
    if (stat("/proc/self/ns/pid", &sb) == 0)
        id.ns_ino = (uint64_t)sb.st_ino;
    id.start = read_self_start();
    const void *random_bytes = (const void *)getauxval(AT_RANDOM);
    if (random_bytes)
        memcpy(&id.nonce, random_bytes, sizeof(id.nonce));
    g_self = id;
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
    compute_self(); /* a new process: new pid, no slot locks (classic locks are not inherited) */
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
                compute_self();
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

const struct sim_gpu_info *sim_gpu(int phys)
{
    if (!valid_gpu(phys))
        return NULL;
    return g_bind[phys].gi_id ? &g_bind[phys].info : &g_st->gpus[phys];
}

const struct sim_gpu_info *sim_gpu_board(int phys)
{
    return valid_gpu(phys) ? &g_st->gpus[phys] : NULL;
}

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
            else if (strncasecmp(tok, "MIG-", 4) == 0)
                phys = sim_mig_find_uuid(tok, NULL); /* a MIG device: its parent GPU */
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

/* ---- process slots: identity, liveness, the caller's view ---------------------------------- */

#define VIEW_GONE (-1) /* live_view(), tag_view(): exited (or no longer nameable from here) */

static struct sim_proc_slot *slot_at(int phys, int i) { return &g_st->dyn[phys].procs[i]; }

/* Whether the slot records this very process (image) as its owner. */
static int slot_is_self(const struct sim_proc_slot *s)
{
    return LOAD(&s->ns_pid) == g_self.pid && LOAD(&s->nonce) == g_self.nonce &&
           LOAD(&s->start_time) == g_self.start && LOAD(&s->ns_ino) == g_self.ns_ino;
}

/* Take (F_WRLCK) or drop (F_UNLCK) this process's classic lock on a slot's byte; never blocks.
 * 0, or -errno (EAGAIN: another process holds it). */
static int slot_lock(int phys, int i, short type)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = SIM_LOCK_SLOT_OFFSET(phys, i);
    fl.l_len = 1;
    while (fcntl(g_fd, F_SETLK, &fl) < 0) {
        if (errno != EINTR)
            return -errno;
    }
    return 0;
}

/* Who holds slot i's lock, as the caller sees it: 0 = nobody (the owner is gone); 1 = a live
 * process, *pid = its pid in the caller's pid namespace or 0 if it is not visible there. Never
 * call it for the caller's own slot: a process's own locks never conflict with it. */
static int slot_holder(int phys, int i, int *pid)
{
    struct flock fl;
    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = SIM_LOCK_SLOT_OFFSET(phys, i);
    fl.l_len = 1;
    *pid = 0;
    if (fcntl(g_fd, F_GETLK, &fl) < 0)
        return 1; /* cannot tell: alive and unseen, the answer that never frees a live process */
    if (fl.l_type == F_UNLCK)
        return 0;
    if (fl.l_pid > 0)
        *pid = fl.l_pid;
    return 1;
}

/* Remember that the slot's owner has pid `pid` in the caller's namespace (caller holds the GPU
 * lock). Most recent first; each entry is published by its ns_ino, stored last. */
static void remember_view(struct sim_proc_slot *s, int pid)
{
    uint64_t me = g_self.ns_ino;
    if (me == 0 || LOAD(&s->ns_ino) == me)
        return; /* unknown namespace, or the owner's own (ns_pid needs no cache) */
    if (LOAD(&s->views[0].ns_ino) == me && LOAD(&s->views[0].pid) == pid)
        return;
    struct sim_pid_view *last = &s->views[SIM_PID_VIEWS - 1];
    for (int k = 0; k < SIM_PID_VIEWS - 1; k++)
        if (LOAD(&s->views[k].ns_ino) == me)
            last = &s->views[k]; /* drop our stale entry rather than the oldest one */
    for (struct sim_pid_view *v = last; v > s->views; v--) {
        STORE(&v->ns_ino, 0);
        STORE(&v->pid, LOAD(&v[-1].pid));
        STORE(&v->ns_ino, LOAD(&v[-1].ns_ino));
    }
    STORE(&s->views[0].ns_ino, 0);
    STORE(&s->views[0].pid, pid);
    STORE(&s->views[0].ns_ino, me);
}

/* The owner of in-use slot i as the caller sees it: its pid in the caller's namespace (> 0), 0
 * if it lives where the caller cannot see, VIEW_GONE if it has exited. Caller holds the GPU lock. */
static int live_view(int phys, int i)
{
    struct sim_proc_slot *s = slot_at(phys, i);
    if (slot_is_self(s))
        return g_self.pid;
    int pid;
    if (!slot_holder(phys, i, &pid))
        return VIEW_GONE;
    if (pid > 0)
        remember_view(s, pid);
    return pid;
}

/* The process that slot `owner - 1` held at generation `gen` (a busy interval's tag), as the
 * caller sees it, alive or not: its pid (> 0), 0 if not visible from here, VIEW_GONE if it
 * exited before anyone in the caller's namespace learnt its pid, or the slot was claimed since.
 * Caller holds the GPU lock. */
static int tag_view(int phys, uint32_t owner, uint32_t gen)
{
    if (owner == 0 || owner > SIM_MAX_PROCS)
        return VIEW_GONE;
    struct sim_proc_slot *s = slot_at(phys, (int)owner - 1);
    if (LOAD(&s->gen) != gen)
        return VIEW_GONE;
    uint64_t me = g_self.ns_ino;
    if (me != 0) {
        if (LOAD(&s->ns_ino) == me)
            return LOAD(&s->ns_pid);
        for (int k = 0; k < SIM_PID_VIEWS; k++)
            if (LOAD(&s->views[k].ns_ino) == me)
                return LOAD(&s->views[k].pid);
    }
    if (!LOAD(&s->in_use))
        return VIEW_GONE;
    return live_view(phys, (int)owner - 1);
}

static void free_slot(struct sim_proc_slot *s)
{
    STORE(&s->in_use, 0);
    STORE(&s->freed_at, sim_now_ns());
}

/* Free the slots whose owners have exited; with `views`, also write each slot's live_view()
 * (VIEW_GONE for free slots). Caller holds the GPU lock. One F_GETLK per in-use slot of another
 * process: as cheap as the kill(pid, 0) it replaces, and it also sees zombies and exec. */
static void reap_locked(int phys, int *views)
{
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc_slot *s = slot_at(phys, i);
        int v = VIEW_GONE;
        if (LOAD(&s->in_use)) {
            v = live_view(phys, i);
            if (v == VIEW_GONE)
                free_slot(s);
        }
        if (views)
            views[i] = v;
    }
}

/* Bytes held by in-use slots: all of them (gi 0) or those on GPU instance gi. */
static uint64_t used_locked(const struct sim_gpu_dyn *d, uint32_t gi)
{
    uint64_t used = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        if (LOAD(&d->procs[i].in_use) && (!gi || SIM_MIG_TAG_GI(LOAD(&d->procs[i].mig_tag)) == gi))
            used += LOAD(&d->procs[i].bytes);
    return used;
}

/* Index of this process's slot on the GPU, or -1. Safe without the GPU lock: only this process
 * writes a slot whose identity is its own. */
static int find_self_slot(int phys)
{
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        struct sim_proc_slot *s = slot_at(phys, i);
        if (LOAD(&s->in_use) && slot_is_self(s))
            return i;
    }
    return -1;
}

/* Claim free slot i for this process: lock its byte first (a reader then never sees it in use
 * and unlocked), invalidate the old owner's tags, write the identity, publish in_use last.
 * 0, or -1 if another process holds the byte. Caller holds the GPU lock. */
static int claim_slot(int phys, int i)
{
    struct sim_proc_slot *s = slot_at(phys, i);
    if (slot_lock(phys, i, F_WRLCK) != 0)
        return -1;
    STORE(&s->gen, LOAD(&s->gen) + 1);
    STORE(&s->ns_pid, g_self.pid);
    STORE(&s->ns_ino, g_self.ns_ino);
    STORE(&s->start_time, g_self.start);
    STORE(&s->nonce, g_self.nonce);
    STORE(&s->bytes, 0);
    STORE(&s->mig_tag, g_bind[phys].gi_id ? SIM_MIG_TAG(g_bind[phys].gi_id, g_bind[phys].ci_id) : 0);
    for (int k = 0; k < SIM_PID_VIEWS; k++)
        STORE(&s->views[k].ns_ino, 0);
    STORE(&s->in_use, 1);
    return 0;
}

/* Our slot on this GPU, claiming a free one (reaping if needed); -1 if the table is full.
 * An existing slot's lock is taken again (cheap when held): it heals a lock that a close() of
 * another descriptor of the state file dropped. Caller holds the GPU lock. */
static int own_slot(int phys)
{
    int i = find_self_slot(phys);
    if (i >= 0) {
        (void)slot_lock(phys, i, F_WRLCK);
        return i;
    }
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            reap_locked(phys, NULL);
        /* Longest-free first, so dead processes stay nameable as long as possible. */
        unsigned char tried[SIM_MAX_PROCS] = {0};
        for (;;) {
            int best = -1;
            for (int k = 0; k < SIM_MAX_PROCS; k++) {
                const struct sim_proc_slot *s = slot_at(phys, k);
                if (tried[k] || LOAD(&s->in_use))
                    continue;
                if (best < 0 || LOAD(&s->freed_at) < LOAD(&slot_at(phys, best)->freed_at))
                    best = k;
            }
            if (best < 0)
                break;
            tried[best] = 1;
            if (claim_slot(phys, best) == 0)
                return best;
        }
    }
    return -1;
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
    /* A process bound to a MIG device allocates from its GPU instance's memory. */
    uint32_t gi = g_bind[phys].gi_id;
    uint64_t total = gi ? g_bind[phys].info.memory_total : g_st->gpus[phys].memory_total;
    int rc = 0, i;
    gpu_lock(phys);
    uint64_t used = used_locked(d, gi);
    if (!fits(used, total, bytes)) {
        reap_locked(phys, NULL);
        used = used_locked(d, gi);
    }
    uint64_t free_bytes = used >= total ? 0 : total - used;
    uint64_t take = bytes < free_bytes ? bytes : free_bytes;
    if (all_or_nothing && !fits(used, total, bytes)) {
        rc = -1;
    } else if ((i = own_slot(phys)) < 0) {
        rc = -2;
    } else {
        struct sim_proc_slot *s = slot_at(phys, i);
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
    gpu_lock(phys);
    int i = find_self_slot(phys);
    if (i >= 0) {
        struct sim_proc_slot *s = slot_at(phys, i);
        uint64_t held = LOAD(&s->bytes);
        STORE(&s->bytes, bytes >= held ? 0 : held - bytes);
    }
    gpu_unlock(phys);
}

void sim_mem_release_all(void)
{
    if (sim_attach() != 0)
        return;
    for (int g = 0; g < g_st->node.gpu_count; g++) {
        if (find_self_slot(g) < 0) /* cheap unlocked check: only we write our own slot */
            continue;
        gpu_lock(g);
        int i = find_self_slot(g);
        if (i >= 0) {
            free_slot(slot_at(g, i));
            (void)slot_lock(g, i, F_UNLCK);
        }
        gpu_unlock(g);
    }
}

int sim_proc_register(int phys)
{
    if (!valid_gpu(phys))
        return -3;
    if (LOAD(&g_st->dyn[phys].flags) & SIM_GPU_LOST)
        return -4;
    gpu_lock(phys);
    int i = own_slot(phys);
    gpu_unlock(phys);
    return i >= 0 ? 0 : -2;
}

unsigned long long sim_mem_used(int phys)
{
    if (!valid_gpu(phys))
        return 0;
    gpu_lock(phys);
    reap_locked(phys, NULL);
    uint64_t used = used_locked(&g_st->dyn[phys], g_bind[phys].gi_id);
    gpu_unlock(phys);
    return used;
}

unsigned long long sim_mem_used_by(int phys, int pid)
{
    if (!valid_gpu(phys) || pid <= 0)
        return 0;
    int views[SIM_MAX_PROCS];
    uint64_t bytes = 0;
    gpu_lock(phys);
    reap_locked(phys, views);
    for (int i = 0; i < SIM_MAX_PROCS; i++)
        if (views[i] == pid)
            bytes += LOAD(&slot_at(phys, i)->bytes);
    gpu_unlock(phys);
    return bytes;
}

int sim_processes(int phys, struct sim_proc_usage *out, int max)
{
    if (!valid_gpu(phys))
        return 0;
    int views[SIM_MAX_PROCS], n = 0;
    gpu_lock(phys);
    reap_locked(phys, views);
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        if (views[i] <= 0)
            continue; /* free, or a process the caller's namespace cannot see */
        if (n < max) {
            out[n].pid = views[i];
            out[n].bytes = LOAD(&slot_at(phys, i)->bytes);
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
    gpu_lock(phys);
    /* The work is tagged with our slot (claimed now if we have none: a process that runs
     * kernels has a context, and is listed as NVML lists it); unattributed if the table is full. */
    int i = find_self_slot(phys);
    if (i < 0)
        i = own_slot(phys);
    uint32_t owner = i >= 0 ? (uint32_t)i + 1 : 0;
    uint32_t gen = i >= 0 ? LOAD(&slot_at(phys, i)->gen) : 0;
    uint64_t now = sim_now_ns();
    if (g_bind[phys].gi_id) {
        /* A MIG device has SMs of its own: work queues FIFO on the device alone, and is not
         * recorded in the GPU's timeline (NVML has no GPU utilisation in MIG mode). */
        struct sim_mig_ci_entry *c =
            &d->mig.gi[g_bind[phys].gi_slot].ci[g_bind[phys].ci_slot];
        uint64_t cbusy = LOAD(&c->busy_until);
        uint64_t cend = (cbusy > now ? cbusy : now) + duration_ns;
        STORE(&c->busy_until, cend);
        gpu_unlock(phys);
        return cend;
    }
    uint64_t busy = LOAD(&d->busy_until);
    uint64_t start = busy > now ? busy : now;
    uint64_t end = start + duration_ns;
    STORE(&d->busy_until, end);
    uint64_t count = LOAD(&d->tl_count);
    struct sim_busy *last = count ? &d->tl[(count - 1) % SIM_TIMELINE_SLOTS] : NULL;
    if (last && owner && last->owner == owner && last->owner_gen == gen &&
        LOAD(&last->end) == start) {
        STORE(&last->end, end); /* back-to-back work of the same process: extend */
    } else if (duration_ns > 0) {
        /* Written before it is published by the count; a torn write here is never read. */
        struct sim_busy *slot = &d->tl[count % SIM_TIMELINE_SLOTS];
        slot->owner = owner;
        slot->owner_gen = gen;
        slot->start = start;
        STORE(&slot->end, end);
        STORE(&d->tl_count, count + 1);
    }
    gpu_unlock(phys);
    return end;
}

unsigned long long sim_busy_until(int phys)
{
    if (!valid_gpu(phys))
        return 0;
    if (g_bind[phys].gi_id)
        return LOAD(&g_st->dyn[phys].mig.gi[g_bind[phys].gi_slot].ci[g_bind[phys].ci_slot].busy_until);
    return LOAD(&g_st->dyn[phys].busy_until);
}

/* Busy time overlapping [from, to) of the intervals whose owner slot is selected (`pick`, indexed
 * by slot, holding the generation to match + 1; 0 = not selected), or of all if pick is NULL.
 * Caller holds the GPU lock. */
static uint64_t busy_in_window(const struct sim_gpu_dyn *d, const uint64_t *pick, uint64_t from,
                               uint64_t to)
{
    uint64_t count = LOAD(&d->tl_count), total = 0;
    uint64_t oldest = count > SIM_TIMELINE_SLOTS ? count - SIM_TIMELINE_SLOTS : 0;
    for (uint64_t k = count; k > oldest; k--) {
        const struct sim_busy *b = &d->tl[(k - 1) % SIM_TIMELINE_SLOTS];
        uint64_t s = b->start, e = LOAD(&b->end);
        if (e <= from)
            break; /* intervals are FIFO-ordered: everything older ends earlier */
        if (pick && (b->owner == 0 || b->owner > SIM_MAX_PROCS ||
                     pick[b->owner - 1] != (uint64_t)b->owner_gen + 1))
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
    uint64_t pick[SIM_MAX_PROCS];
    gpu_lock(phys);
    if (pid > 0) {
        /* The slots whose current holder is `pid` in our view (an earlier holder of a slot
         * that was claimed again is nobody we can name). */
        for (int i = 0; i < SIM_MAX_PROCS; i++) {
            uint32_t gen = LOAD(&slot_at(phys, i)->gen);
            pick[i] = tag_view(phys, (uint32_t)i + 1, gen) == pid ? (uint64_t)gen + 1 : 0;
        }
    }
    uint64_t now = sim_now_ns();
    uint64_t from = now > window_ns ? now - window_ns : 0;
    uint64_t busy = busy_in_window(&g_st->dyn[phys], pid > 0 ? pick : NULL, from, now);
    gpu_unlock(phys);
    uint64_t span = now - from;
    unsigned int pct = span ? (unsigned int)((busy * 100 + span / 2) / span) : 0;
    return pct > 100 ? 100 : pct;
}

unsigned long long sim_busy_total(int phys, unsigned long long from_ns, unsigned long long to_ns)
{
    if (!valid_gpu(phys) || to_ns <= from_ns)
        return 0;
    gpu_lock(phys);
    uint64_t busy = busy_in_window(&g_st->dyn[phys], NULL, from_ns, to_ns);
    gpu_unlock(phys);
    return busy;
}

/* Busy nanoseconds per process within [from, to) on a GPU's timeline, which the caller holds
 * locked, named as the caller sees the processes (those it cannot name are left out: they
 * still count in sim_busy_total()). Writes at most max entries {pid, busy_ns} and, when last is
 * non-NULL, last[i] = the end of process i's latest busy interval in the window; returns the
 * number written. */
static int busy_by_process_locked(int phys, uint64_t from, uint64_t to, struct sim_proc_busy *out,
                                  uint64_t *last, int max)
{
    /* First by tag (slot, generation): cheap, no names yet. A window holds the tags of at most
     * the live slots plus the dead ones since; more than the table is rare and the extra
     * (oldest) tags are dropped. */
    enum { MAX_TAGS = 2 * SIM_MAX_PROCS };
    struct {
        uint32_t owner, gen;
        uint64_t busy, last;
    } tags[MAX_TAGS];
    int ntags = 0;
    const struct sim_gpu_dyn *d = &g_st->dyn[phys];
    uint64_t count = LOAD(&d->tl_count);
    uint64_t oldest = count > SIM_TIMELINE_SLOTS ? count - SIM_TIMELINE_SLOTS : 0;
    for (uint64_t k = count; k > oldest; k--) {
        const struct sim_busy *b = &d->tl[(k - 1) % SIM_TIMELINE_SLOTS];
        uint64_t e = LOAD(&b->end);
        if (e <= from)
            break; /* FIFO-ordered: everything older ends earlier */
        uint64_t lo = b->start > from ? b->start : from, hi = e < to ? e : to;
        if (hi <= lo || b->owner == 0)
            continue;
        int j;
        for (j = 0; j < ntags; j++)
            if (tags[j].owner == b->owner && tags[j].gen == b->owner_gen)
                break;
        if (j == ntags) {
            if (ntags == MAX_TAGS)
                continue;
            tags[j].owner = b->owner;
            tags[j].gen = b->owner_gen;
            tags[j].busy = 0;
            tags[j].last = hi; /* newest first: this is the tag's latest interval */
            ntags++;
        }
        tags[j].busy += hi - lo;
    }
    /* Then by pid in the caller's view (one process may have held two slots over time). */
    int n = 0;
    for (int t = 0; t < ntags; t++) {
        int pid = tag_view(phys, tags[t].owner, tags[t].gen);
        if (pid <= 0)
            continue;
        int j;
        for (j = 0; j < n; j++)
            if (out[j].pid == pid)
                break;
        if (j == n) {
            if (n == max)
                continue;
            out[n].pid = pid;
            out[n].busy_ns = 0;
            if (last)
                last[n] = 0;
            n++;
        }
        out[j].busy_ns += tags[t].busy;
        if (last && tags[t].last > last[j])
            last[j] = tags[t].last;
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
    int n = busy_by_process_locked(phys, from, now, busy, last,
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
    int n = busy_by_process_locked(phys, from_ns, to_ns, out, NULL, max);
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
    return sim_xid_inject_scoped(phys, xid, SIM_MIG_NO_ID, SIM_MIG_NO_ID);
}

uint64_t sim_xid_inject_scoped(int phys, uint64_t xid, unsigned int gi_id, unsigned int ci_id)
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
    e->gpu_instance_id = gi_id;
    e->compute_instance_id = ci_id;
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

/* ---- MIG profile tables ---------------------------------------------------------------------
 *
 * The MIG profile tables of the simulated boards and the pure placement rules (the instances
 * themselves live in the state file, see "MIG" below).
 *
 * Facts from NVIDIA's public MIG user guide ("Supported MIG Profiles") and nvml.h: a MIG board
 * has 8 memory slices and 7 compute slices; each GPU instance profile takes a number of compute
 * slices and a run of memory slices at one of its valid starts (nvidia-smi mig -lgipp):
 *
 *   slices  mem  starts            A100 40 GB    A100 80 GB    H100 80 GB   profile id
 *   1       1    0,1,2,3,4,5,6     1g.5gb        1g.10gb       1g.10gb      19
 *   1 (+me) 1    0,1,2,3,4,5,6     1g.5gb+me     1g.10gb+me    1g.10gb+me   20
 *   1       2    0,2,4,6           1g.10gb       1g.20gb       1g.20gb      15
 *   2       2    0,2,4             2g.10gb       2g.20gb       2g.20gb      14
 *   3       4    0,4               3g.20gb       3g.40gb       3g.40gb       9
 *   4       4    0                 4g.20gb       4g.40gb       4g.40gb       5
 *   7       8    0                 7g.40gb       7g.80gb       7g.80gb       0
 *
 * SMs per profile: A100 14 per compute slice (98 for 7g: MIG leaves 10 of the 108 SMs unused);
 * H100 80 GB 16/16/26/32/60/64/132. Memory sizes are close to what nvidia-smi mig -lgip shows
 * (a little under the nominal size; the simulator's own figures, see docs/mig.md).
 */

/* nvml.h's NVML_GPU_INSTANCE_PROFILE_* indices used by these boards. */
enum {
    GIP_1_SLICE = 0x0,
    GIP_2_SLICE = 0x1,
    GIP_3_SLICE = 0x2,
    GIP_4_SLICE = 0x3,
    GIP_7_SLICE = 0x4,
    GIP_1_SLICE_REV1 = 0x7, /* 1 slice with media engines (+me) */
    GIP_1_SLICE_REV2 = 0x9, /* 1 slice, twice the memory */
};

#define P7 7, {0, 1, 2, 3, 4, 5, 6}
#define P4 4, {0, 2, 4, 6}
#define P3 3, {0, 2, 4}
#define P2 2, {0, 4}
#define P1 1, {0}

/* nvml_profile, id, name, compute slices, memory slices, instances, SMs, MiB,
 * copy engines, decoders, encoders, jpegs, ofas, placements */
static const struct sim_mig_profile A100_40[] = {
    {GIP_1_SLICE, 19, "1g.5gb", 1, 1, 7, 14, 4864, 1, 0, 0, 0, 0, P7},
    {GIP_1_SLICE_REV1, 20, "1g.5gb+me", 1, 1, 1, 14, 4864, 1, 1, 0, 1, 1, P7},
    {GIP_1_SLICE_REV2, 15, "1g.10gb", 1, 2, 4, 14, 9984, 1, 1, 0, 0, 0, P4},
    {GIP_2_SLICE, 14, "2g.10gb", 2, 2, 3, 28, 9984, 2, 1, 0, 0, 0, P3},
    {GIP_3_SLICE, 9, "3g.20gb", 3, 4, 2, 42, 20224, 3, 2, 0, 0, 0, P2},
    {GIP_4_SLICE, 5, "4g.20gb", 4, 4, 1, 56, 20224, 4, 2, 0, 0, 0, P1},
    {GIP_7_SLICE, 0, "7g.40gb", 7, 8, 1, 98, 40448, 7, 5, 0, 1, 1, P1},
};

static const struct sim_mig_profile A100_80[] = {
    {GIP_1_SLICE, 19, "1g.10gb", 1, 1, 7, 14, 9984, 1, 0, 0, 0, 0, P7},
    {GIP_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 1, 14, 9984, 1, 1, 0, 1, 1, P7},
    {GIP_1_SLICE_REV2, 15, "1g.20gb", 1, 2, 4, 14, 19968, 1, 1, 0, 0, 0, P4},
    {GIP_2_SLICE, 14, "2g.20gb", 2, 2, 3, 28, 19968, 2, 1, 0, 0, 0, P3},
    {GIP_3_SLICE, 9, "3g.40gb", 3, 4, 2, 42, 40192, 3, 2, 0, 0, 0, P2},
    {GIP_4_SLICE, 5, "4g.40gb", 4, 4, 1, 56, 40192, 4, 2, 0, 0, 0, P1},
    {GIP_7_SLICE, 0, "7g.80gb", 7, 8, 1, 98, 80384, 7, 5, 0, 1, 1, P1},
};

static const struct sim_mig_profile H100_80[] = {
    {GIP_1_SLICE, 19, "1g.10gb", 1, 1, 7, 16, 9984, 1, 1, 0, 1, 0, P7},
    {GIP_1_SLICE_REV1, 20, "1g.10gb+me", 1, 1, 1, 16, 9984, 1, 1, 0, 1, 1, P7},
    {GIP_1_SLICE_REV2, 15, "1g.20gb", 1, 2, 4, 26, 20096, 1, 1, 0, 1, 0, P4},
    {GIP_2_SLICE, 14, "2g.20gb", 2, 2, 3, 32, 20096, 2, 2, 0, 2, 0, P3},
    {GIP_3_SLICE, 9, "3g.40gb", 3, 4, 2, 60, 40448, 3, 3, 0, 3, 0, P2},
    {GIP_4_SLICE, 5, "4g.40gb", 4, 4, 1, 64, 40448, 4, 4, 0, 4, 0, P1},
    {GIP_7_SLICE, 0, "7g.80gb", 7, 8, 1, 132, 81152, 8, 7, 0, 7, 1, P1},
};

#define COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The table of a board: by architecture and memory size, for MIG-capable boards only. */
const struct sim_mig_profile *sim_mig_profiles(int phys, int *count)
{
    const struct sim_gpu_info *g = sim_gpu_board(phys);
    *count = 0;
    if (!g || !g->mig_capable)
        return NULL;
    unsigned long long gib = g->memory_total >> 30;
    if (g->arch == SIM_ARCH_AMPERE && gib >= 35 && gib < 60) {
        *count = COUNT(A100_40);
        return A100_40;
    }
    if (g->arch == SIM_ARCH_AMPERE && gib >= 60 && gib < 100) {
        *count = COUNT(A100_80);
        return A100_80;
    }
    if (g->arch == SIM_ARCH_HOPPER && gib >= 60 && gib < 100) {
        *count = COUNT(H100_80);
        return H100_80;
    }
    return NULL;
}

const struct sim_mig_profile *sim_mig_profile_by_id(int phys, unsigned int id)
{
    int n;
    const struct sim_mig_profile *t = sim_mig_profiles(phys, &n);
    for (int i = 0; i < n; i++)
        if (t[i].id == id)
            return &t[i];
    return NULL;
}

const struct sim_mig_profile *sim_mig_profile_by_nvml(int phys, unsigned int nvml_profile)
{
    int n;
    const struct sim_mig_profile *t = sim_mig_profiles(phys, &n);
    for (int i = 0; i < n; i++)
        if (t[i].nvml_profile == nvml_profile)
            return &t[i];
    return NULL;
}

unsigned int sim_mig_ci_slices(unsigned int profile)
{
    static const unsigned int slices[] = {1, 2, 3, 4, 7}; /* NVML_COMPUTE_INSTANCE_PROFILE_* */
    return profile < sizeof(slices) / sizeof(slices[0]) ? slices[profile] : 0;
}

/* A CI of s slices starts at a multiple of s rounded up to a power of two (1, 2, 4, 4, 8), as
 * GI placements do on the 8-slice grid: in a 7-slice GI, 1 slice at 0..6, 2 at 0/2/4, 3 at
 * 0/4, 4 and 7 at 0. */
int sim_mig_ci_starts(unsigned int slices, unsigned int gi_slices, unsigned int *starts)
{
    if (slices == 0 || slices > gi_slices)
        return 0;
    unsigned int align = 1;
    while (align < slices)
        align <<= 1;
    int n = 0;
    for (unsigned int s = 0; s + slices <= gi_slices && n < SIM_MIG_COMPUTE_SLICES; s += align)
        starts[n++] = s;
    return n;
}

/* ---- MIG ---------------------------------------------------------------------------------
 *
 * Per GPU, in its dynamic block (struct sim_mig_state): the mode (current, pending) and up to 7
 * GPU instance entries, each with up to 7 compute instance entries. Every function takes the
 * GPU's lock, so creation, destruction and the idle checks are atomic against every process;
 * each change is published by one aligned store (see simstate_layout.h), so a process killed in
 * the middle leaves either no instance or a complete one. */

static struct sim_mig_state *mig_of(int phys) { return &g_st->dyn[phys].mig; }

/* Whether GPU phys has a MIG table and MIG mode is currently enabled. */
static int mig_enabled(int phys) { return LOAD(&mig_of(phys)->current) == 1; }

static int mig_capable(int phys)
{
    int n;
    return valid_gpu(phys) && sim_mig_profiles(phys, &n) != NULL;
}

/* Live processes holding a slot on the GPU whose tag matches (gi 0: any; ci ~0u: any CI of gi).
 * Reaps dead ones first. Caller holds the GPU lock. */
static int procs_on_locked(int phys, uint32_t gi, uint32_t ci)
{
    reap_locked(phys, NULL);
    int n = 0;
    for (int i = 0; i < SIM_MAX_PROCS; i++) {
        const struct sim_proc_slot *s = slot_at(phys, i);
        if (!LOAD(&s->in_use))
            continue;
        uint32_t tag = LOAD(&s->mig_tag);
        if (gi && SIM_MIG_TAG_GI(tag) != gi)
            continue;
        if (gi && ci != ~0u && tag != SIM_MIG_TAG(gi, ci))
            continue;
        n++;
    }
    return n;
}

static int gi_count_locked(int phys)
{
    int n = 0;
    for (int k = 0; k < SIM_MIG_MAX_GI; k++)
        n += LOAD(&mig_of(phys)->gi[k].in_use) != 0;
    return n;
}

int sim_mig_mode(int phys, unsigned int *current, unsigned int *pending)
{
    if (valid_gpu(phys) && g_st->gpus[phys].mig_capable && !mig_capable(phys)) {
        *current = *pending = 0; /* MIG-capable board without a profile table: never enabled */
        return 0;
    }
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    *current = LOAD(&mig_of(phys)->current);
    *pending = LOAD(&mig_of(phys)->pending);
    return 0;
}

int sim_mig_set_mode(int phys, unsigned int mode)
{
    if (!mig_capable(phys) || mode > 1)
        return SIM_MIG_ENOTSUP;
    struct sim_mig_state *m = mig_of(phys);
    int rc = 0;
    gpu_lock(phys);
    STORE(&m->pending, mode);
    if (LOAD(&m->current) != mode) {
        /* Activation needs an idle GPU: no process on it, no GPU instance left. */
        if (procs_on_locked(phys, 0, 0) > 0 || gi_count_locked(phys) > 0)
            rc = SIM_MIG_EBUSY;
        else
            STORE(&m->current, mode);
    }
    gpu_unlock(phys);
    return rc;
}

static void gi_info(int phys, int k, struct sim_mig_gi_info *out)
{
    const struct sim_mig_gi_entry *e = &mig_of(phys)->gi[k];
    out->slot = k;
    out->id = e->id;
    out->profile_id = e->profile_id;
    out->start = e->start;
    out->size = e->size;
    out->compute_slices = e->compute_slices;
    out->sm_count = e->sm_count;
    out->memory_bytes = e->memory_bytes;
    out->serial = e->serial;
}

static void ci_info(int phys, int k, int j, struct sim_mig_ci_info *out)
{
    const struct sim_mig_gi_entry *g = &mig_of(phys)->gi[k];
    const struct sim_mig_ci_entry *c = &g->ci[j];
    out->gi_slot = k;
    out->slot = j;
    out->gi_id = g->id;
    out->id = c->id;
    out->profile = c->profile;
    out->start = c->start;
    out->size = c->size;
    out->sm_count = c->sm_count;
    out->memory_bytes = g->memory_bytes;
    out->serial = c->serial;
    memcpy(out->uuid, c->uuid, sizeof(out->uuid));
    out->uuid[sizeof(out->uuid) - 1] = '\0';
}

/* Whether a GI of profile p fits at `start` next to the existing GIs and those in `extra`
 * (mask of memory slices and compute slices taken by hypothetical ones). */
static int gi_fits(const struct sim_mig_profile *p, unsigned int start, unsigned int used_mask,
                   unsigned int used_compute, int same_profile)
{
    unsigned int mask = ((1u << p->mem_slices) - 1u) << start;
    return (mask & used_mask) == 0 && used_compute + p->compute_slices <= SIM_MIG_COMPUTE_SLICES &&
           (unsigned int)same_profile < p->instance_count;
}

static int valid_start(const struct sim_mig_profile *p, unsigned int start)
{
    for (unsigned int i = 0; i < p->nplacements; i++)
        if (p->starts[i] == start)
            return 1;
    return 0;
}

/* Occupancy of the GPU's existing GIs. Caller holds the GPU lock. */
static void gi_occupancy(int phys, unsigned int profile_id, unsigned int *mask,
                         unsigned int *compute, int *same)
{
    *mask = 0;
    *compute = 0;
    *same = 0;
    for (int k = 0; k < SIM_MIG_MAX_GI; k++) {
        const struct sim_mig_gi_entry *e = &mig_of(phys)->gi[k];
        if (!LOAD(&e->in_use))
            continue;
        *mask |= ((1u << e->size) - 1u) << e->start;
        *compute += e->compute_slices;
        *same += e->profile_id == profile_id;
    }
}

/* A UUID for MIG device number `serial` of the GPU: "MIG-" + a hash-based UUID (version 5 bits
 * set), stable for the instance's lifetime and different for every instance ever created. */
static void mig_uuid(int phys, uint64_t serial, char *out, size_t len)
{
    uint64_t h1 = 1469598103934665603ULL, h2 = 1099511628211ULL * 31;
    const char *u = g_st->gpus[phys].uuid;
    for (; *u; u++) {
        h1 = (h1 ^ (unsigned char)*u) * 1099511628211ULL;
        h2 = (h2 ^ (unsigned char)*u) * 1469598103934665603ULL;
    }
    for (int b = 0; b < 8; b++) {
        h1 = (h1 ^ ((serial >> (8 * b)) & 0xff)) * 1099511628211ULL;
        h2 = (h2 ^ ((serial >> (8 * b)) & 0xff)) * 1469598103934665603ULL;
    }
    snprintf(out, len, "MIG-%08x-%04x-%04x-%04x-%012llx", (unsigned)(h1 >> 32),
             (unsigned)(h1 >> 16) & 0xffff, (unsigned)(0x5000 | ((h1 >> 4) & 0x0fff)),
             (unsigned)(0x8000 | ((h2 >> 48) & 0x3fff)),
             (unsigned long long)(h2 & 0xffffffffffffULL));
}

int sim_mig_gi_create(int phys, unsigned int profile_id, int start, struct sim_mig_gi_info *out)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    const struct sim_mig_profile *p = sim_mig_profile_by_id(phys, profile_id);
    if (!p)
        return SIM_MIG_EINVAL;
    if (start >= 0 && !valid_start(p, (unsigned int)start))
        return SIM_MIG_EINVAL;
    struct sim_mig_state *m = mig_of(phys);
    int rc = 0;
    gpu_lock(phys);
    unsigned int mask, compute;
    int same;
    gi_occupancy(phys, profile_id, &mask, &compute, &same);
    int chosen = -1;
    if (!mig_enabled(phys)) {
        rc = SIM_MIG_ENOTSUP;
    } else if (start >= 0) {
        chosen = gi_fits(p, (unsigned int)start, mask, compute, same) ? start : -1;
    } else {
        /* Highest free placement first: small instances fill the GPU from the top, leaving
         * the low slices that the large profiles need. */
        for (int i = (int)p->nplacements - 1; i >= 0 && chosen < 0; i--)
            if (gi_fits(p, p->starts[i], mask, compute, same))
                chosen = (int)p->starts[i];
    }
    int slot = -1;
    for (int k = 0; k < SIM_MIG_MAX_GI && slot < 0; k++)
        if (!LOAD(&m->gi[k].in_use))
            slot = k;
    if (rc == 0 && (chosen < 0 || slot < 0))
        rc = SIM_MIG_ENOSPC;
    if (rc == 0) {
        /* Lowest unused id, from 1. */
        unsigned int id = 1;
        for (int again = 1; again;) {
            again = 0;
            for (int k = 0; k < SIM_MIG_MAX_GI; k++)
                if (LOAD(&m->gi[k].in_use) && m->gi[k].id == id) {
                    id++;
                    again = 1;
                }
        }
        struct sim_mig_gi_entry *e = &m->gi[slot];
        for (int j = 0; j < SIM_MIG_MAX_CI; j++)
            STORE(&e->ci[j].in_use, 0);
        e->id = id;
        e->profile_id = profile_id;
        e->start = (unsigned int)chosen;
        e->size = p->mem_slices;
        e->compute_slices = p->compute_slices;
        e->sm_count = p->sm_count;
        e->memory_bytes = p->memory_mib << 20;
        e->serial = __atomic_add_fetch(&g_st->mig_serial, 1, __ATOMIC_ACQ_REL);
        STORE(&e->in_use, 1);
        if (out)
            gi_info(phys, slot, out);
    }
    gpu_unlock(phys);
    return rc;
}

/* Entry index of GI `id` (and serial, unless 0), or -1. Caller holds the GPU lock. */
static int gi_slot_locked(int phys, unsigned int id, unsigned long long serial)
{
    for (int k = 0; k < SIM_MIG_MAX_GI; k++) {
        const struct sim_mig_gi_entry *e = &mig_of(phys)->gi[k];
        if (LOAD(&e->in_use) && e->id == id && (!serial || e->serial == serial))
            return k;
    }
    return -1;
}

int sim_mig_gi_destroy(int phys, unsigned int id, unsigned long long serial)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    int rc = 0;
    gpu_lock(phys);
    int k = gi_slot_locked(phys, id, serial);
    if (k < 0) {
        rc = SIM_MIG_ENOENT;
    } else {
        struct sim_mig_gi_entry *e = &mig_of(phys)->gi[k];
        int cis = 0;
        for (int j = 0; j < SIM_MIG_MAX_CI; j++)
            cis += LOAD(&e->ci[j].in_use) != 0;
        if (cis > 0 || procs_on_locked(phys, id, ~0u) > 0)
            rc = SIM_MIG_EBUSY;
        else
            STORE(&e->in_use, 0);
    }
    gpu_unlock(phys);
    return rc;
}

int sim_mig_gi_list(int phys, unsigned int profile_id, struct sim_mig_gi_info *out, int max)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    struct sim_mig_gi_info all[SIM_MIG_MAX_GI];
    int n = 0;
    gpu_lock(phys);
    for (int k = 0; k < SIM_MIG_MAX_GI; k++) {
        const struct sim_mig_gi_entry *e = &mig_of(phys)->gi[k];
        if (LOAD(&e->in_use) && (profile_id == ~0u || e->profile_id == profile_id))
            gi_info(phys, k, &all[n++]);
    }
    gpu_unlock(phys);
    for (int a = 1; a < n; a++) /* by id */
        for (int b = a; b > 0 && all[b - 1].id > all[b].id; b--) {
            struct sim_mig_gi_info t = all[b];
            all[b] = all[b - 1];
            all[b - 1] = t;
        }
    for (int i = 0; i < n && i < max; i++)
        out[i] = all[i];
    return n;
}

int sim_mig_gi_get(int phys, unsigned int id, unsigned long long serial, struct sim_mig_gi_info *out)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    gpu_lock(phys);
    int k = gi_slot_locked(phys, id, serial);
    if (k >= 0 && out)
        gi_info(phys, k, out);
    gpu_unlock(phys);
    return k >= 0 ? 0 : SIM_MIG_ENOENT;
}

int sim_mig_gi_remaining(int phys, unsigned int profile_id)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    const struct sim_mig_profile *p = sim_mig_profile_by_id(phys, profile_id);
    if (!p)
        return SIM_MIG_EINVAL;
    int n = 0;
    gpu_lock(phys);
    if (mig_enabled(phys)) {
        unsigned int mask, compute;
        int same;
        gi_occupancy(phys, profile_id, &mask, &compute, &same);
        /* Greedy from the lowest start: exact on the aligned 8-slice grid. */
        int slots = SIM_MIG_MAX_GI - gi_count_locked(phys);
        for (unsigned int i = 0; i < p->nplacements && n < slots; i++) {
            if (!gi_fits(p, p->starts[i], mask, compute, same))
                continue;
            mask |= ((1u << p->mem_slices) - 1u) << p->starts[i];
            compute += p->compute_slices;
            same++;
            n++;
        }
    }
    gpu_unlock(phys);
    return n;
}

/* CI occupancy of GI entry k: mask of compute slices. Caller holds the GPU lock. */
static unsigned int ci_mask_locked(int phys, int k, unsigned int profile, int *same)
{
    unsigned int mask = 0;
    *same = 0;
    const struct sim_mig_gi_entry *g = &mig_of(phys)->gi[k];
    for (int j = 0; j < SIM_MIG_MAX_CI; j++) {
        const struct sim_mig_ci_entry *c = &g->ci[j];
        if (!LOAD(&c->in_use))
            continue;
        mask |= ((1u << c->size) - 1u) << c->start;
        *same += c->profile == profile;
    }
    return mask;
}

int sim_mig_ci_create(int phys, unsigned int gi_id, unsigned long long gi_serial,
                      unsigned int profile, int start, struct sim_mig_ci_info *out)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    unsigned int slices = sim_mig_ci_slices(profile);
    if (slices == 0)
        return SIM_MIG_EINVAL;
    int rc = 0;
    gpu_lock(phys);
    int k = gi_slot_locked(phys, gi_id, gi_serial);
    if (k < 0) {
        rc = SIM_MIG_ENOENT;
    } else {
        struct sim_mig_gi_entry *g = &mig_of(phys)->gi[k];
        unsigned int starts[SIM_MIG_COMPUTE_SLICES];
        int ns = sim_mig_ci_starts(slices, g->compute_slices, starts);
        int same, chosen = -1, valid = 0;
        unsigned int mask = ci_mask_locked(phys, k, profile, &same);
        unsigned int cmask = ((1u << slices) - 1u);
        for (int i = 0; i < ns; i++) {
            int fits_here = ((cmask << starts[i]) & mask) == 0;
            if (start >= 0 && (unsigned int)start == starts[i]) {
                valid = 1;
                chosen = fits_here ? start : -1;
            } else if (start < 0 && fits_here && chosen < 0) {
                chosen = (int)starts[i]; /* lowest free, as the compute slices are one GI's */
            }
        }
        int slot = -1;
        for (int j = 0; j < SIM_MIG_MAX_CI && slot < 0; j++)
            if (!LOAD(&g->ci[j].in_use))
                slot = j;
        if (ns == 0)
            rc = SIM_MIG_ENOTSUP; /* profile larger than the GI */
        else if (start >= 0 && !valid)
            rc = SIM_MIG_EINVAL;
        else if (chosen < 0 || slot < 0)
            rc = SIM_MIG_ENOSPC;
        if (rc == 0) {
            unsigned int id = 0;
            for (int again = 1; again;) {
                again = 0;
                for (int j = 0; j < SIM_MIG_MAX_CI; j++)
                    if (LOAD(&g->ci[j].in_use) && g->ci[j].id == id) {
                        id++;
                        again = 1;
                    }
            }
            struct sim_mig_ci_entry *c = &g->ci[slot];
            c->id = id;
            c->profile = profile;
            c->start = (unsigned int)chosen;
            c->size = slices;
            c->sm_count = g->sm_count * slices / g->compute_slices;
            c->serial = __atomic_add_fetch(&g_st->mig_serial, 1, __ATOMIC_ACQ_REL);
            STORE(&c->busy_until, 0);
            mig_uuid(phys, c->serial, c->uuid, sizeof(c->uuid));
            STORE(&c->in_use, 1);
            if (out)
                ci_info(phys, k, slot, out);
        }
    }
    gpu_unlock(phys);
    return rc;
}

/* Entry index of CI ci_id in GI entry k (and serial unless 0), or -1. Caller holds the lock. */
static int ci_slot_locked(int phys, int k, unsigned int ci_id, unsigned long long serial)
{
    const struct sim_mig_gi_entry *g = &mig_of(phys)->gi[k];
    for (int j = 0; j < SIM_MIG_MAX_CI; j++) {
        const struct sim_mig_ci_entry *c = &g->ci[j];
        if (LOAD(&c->in_use) && c->id == ci_id && (!serial || c->serial == serial))
            return j;
    }
    return -1;
}

int sim_mig_ci_destroy(int phys, unsigned int gi_id, unsigned int ci_id, unsigned long long serial)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    int rc = 0;
    gpu_lock(phys);
    int k = gi_slot_locked(phys, gi_id, 0);
    int j = k >= 0 ? ci_slot_locked(phys, k, ci_id, serial) : -1;
    if (j < 0)
        rc = SIM_MIG_ENOENT;
    else if (procs_on_locked(phys, gi_id, ci_id) > 0)
        rc = SIM_MIG_EBUSY;
    else
        STORE(&mig_of(phys)->gi[k].ci[j].in_use, 0);
    gpu_unlock(phys);
    return rc;
}

static void sort_cis(struct sim_mig_ci_info *a, int n)
{
    for (int i = 1; i < n; i++)
        for (int b = i; b > 0 && (a[b - 1].gi_id > a[b].gi_id ||
                                  (a[b - 1].gi_id == a[b].gi_id && a[b - 1].id > a[b].id));
             b--) {
            struct sim_mig_ci_info t = a[b];
            a[b] = a[b - 1];
            a[b - 1] = t;
        }
}

int sim_mig_ci_list(int phys, unsigned int gi_id, unsigned int profile, struct sim_mig_ci_info *out,
                    int max)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    struct sim_mig_ci_info all[SIM_MIG_MAX_CI];
    int n = 0;
    gpu_lock(phys);
    int k = gi_slot_locked(phys, gi_id, 0);
    for (int j = 0; k >= 0 && j < SIM_MIG_MAX_CI; j++) {
        const struct sim_mig_ci_entry *c = &mig_of(phys)->gi[k].ci[j];
        if (LOAD(&c->in_use) && (profile == ~0u || c->profile == profile))
            ci_info(phys, k, j, &all[n++]);
    }
    gpu_unlock(phys);
    if (k < 0)
        return SIM_MIG_ENOENT;
    sort_cis(all, n);
    for (int i = 0; i < n && i < max; i++)
        out[i] = all[i];
    return n;
}

int sim_mig_ci_get(int phys, unsigned int gi_id, unsigned int ci_id, unsigned long long serial,
                   struct sim_mig_ci_info *out)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    gpu_lock(phys);
    int k = gi_slot_locked(phys, gi_id, 0);
    int j = k >= 0 ? ci_slot_locked(phys, k, ci_id, serial) : -1;
    if (j >= 0 && out)
        ci_info(phys, k, j, out);
    gpu_unlock(phys);
    return j >= 0 ? 0 : SIM_MIG_ENOENT;
}

int sim_mig_ci_remaining(int phys, unsigned int gi_id, unsigned int profile)
{
    if (!mig_capable(phys))
        return SIM_MIG_ENOTSUP;
    unsigned int slices = sim_mig_ci_slices(profile);
    if (slices == 0)
        return SIM_MIG_EINVAL;
    int n = 0, rc = 0;
    gpu_lock(phys);
    int k = gi_slot_locked(phys, gi_id, 0);
    if (k < 0) {
        rc = SIM_MIG_ENOENT;
    } else {
        unsigned int starts[SIM_MIG_COMPUTE_SLICES];
        int ns = sim_mig_ci_starts(slices, mig_of(phys)->gi[k].compute_slices, starts);
        int same;
        unsigned int mask = ci_mask_locked(phys, k, profile, &same);
        for (int i = 0; i < ns; i++) {
            unsigned int want = ((1u << slices) - 1u) << starts[i];
            if ((want & mask) == 0) {
                mask |= want;
                n++;
            }
        }
    }
    gpu_unlock(phys);
    return rc ? rc : n;
}

int sim_mig_devices(int phys, struct sim_mig_ci_info *out, int max)
{
    if (!mig_capable(phys))
        return 0;
    struct sim_mig_ci_info all[SIM_MIG_MAX_GI * SIM_MIG_MAX_CI];
    int n = 0;
    gpu_lock(phys);
    for (int k = 0; k < SIM_MIG_MAX_GI; k++) {
        const struct sim_mig_gi_entry *g = &mig_of(phys)->gi[k];
        if (!LOAD(&g->in_use))
            continue;
        for (int j = 0; j < SIM_MIG_MAX_CI; j++)
            if (LOAD(&g->ci[j].in_use))
                ci_info(phys, k, j, &all[n++]);
    }
    gpu_unlock(phys);
    sort_cis(all, n);
    for (int i = 0; i < n && i < max; i++)
        out[i] = all[i];
    return n;
}

int sim_mig_find_uuid(const char *uuid, struct sim_mig_ci_info *out)
{
    if (!uuid || sim_attach() != 0)
        return -1;
    for (int phys = 0; phys < g_st->node.gpu_count; phys++) {
        struct sim_mig_ci_info devs[SIM_MIG_MAX_GI * SIM_MIG_MAX_CI];
        int n = sim_mig_devices(phys, devs, SIM_MIG_MAX_GI * SIM_MIG_MAX_CI);
        for (int i = 0; i < n; i++)
            if (strcasecmp(devs[i].uuid, uuid) == 0) {
                if (out)
                    *out = devs[i];
                return phys;
            }
    }
    return -1;
}

unsigned long long sim_mig_mem_used(int phys, unsigned int gi_id)
{
    if (!valid_gpu(phys) || gi_id == 0)
        return 0;
    gpu_lock(phys);
    reap_locked(phys, NULL);
    uint64_t used = used_locked(&g_st->dyn[phys], gi_id);
    gpu_unlock(phys);
    return used;
}

int sim_mig_bind_uuid(const char *uuid)
{
    struct sim_mig_ci_info ci;
    int phys = sim_mig_find_uuid(uuid, &ci);
    if (phys < 0)
        return -1;
    struct sim_bind *b = &g_bind[phys];
    const struct sim_mig_profile *p = NULL;
    struct sim_mig_gi_info gi;
    if (sim_mig_gi_get(phys, ci.gi_id, 0, &gi) == 0)
        p = sim_mig_profile_by_id(phys, gi.profile_id);
    b->info = g_st->gpus[phys];
    /* As CUDA and NVML name a MIG device: the board, "MIG", the GI profile. */
    snprintf(b->info.name, sizeof(b->info.name), "%s MIG %s", g_st->gpus[phys].name,
             p ? p->name : "?");
    /* The MIG UUID's hex digits under the "GPU-" prefix: CUDA exposes a device's UUID only as
     * its 16 bytes (cuDeviceGetUuid), which are the MIG UUID's, as on a real MIG device. */
    snprintf(b->info.uuid, sizeof(b->info.uuid), "GPU-%s", ci.uuid + 4);
    b->info.memory_total = ci.memory_bytes;
    b->info.sm_count = ci.sm_count;
    b->info.nlinks = 0; /* no NVLink peer-to-peer in MIG mode */
    b->gi_slot = ci.gi_slot;
    b->ci_slot = ci.slot;
    b->serial = ci.serial;
    b->ci_id = ci.id;
    STORE(&b->gi_id, ci.gi_id);
    return phys;
}

int sim_mig_bound(int phys) { return valid_gpu(phys) && g_bind[phys].gi_id != 0; }
