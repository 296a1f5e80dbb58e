/*
 * region.c - open/initialise the per-claim shared region and do the cross-process accounting.
 *
 * See region.h for the concurrency model. Everything here is usable without a GPU, and
 * tests/test_region.c drives it from several processes (including SIGKILLed ones).
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vgpu.h"

/* An OFD lock request of `type` on the one byte at `offset` (each lock in the region is a byte). */
static struct flock byte_lock(short type, long long offset) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)offset;
    fl.l_len = 1;
    return fl;
}

int vgpu_lock_ofd(int fd, long long offset, bool exclusive, bool wait) {
    struct flock fl = byte_lock(exclusive ? F_WRLCK : F_RDLCK, offset);
    int rc;
    do {
        rc = fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl);
    } while (rc != 0 && errno == EINTR);
    return rc;
}

void vgpu_unlock_ofd(int fd, long long offset) {
    struct flock fl = byte_lock(F_UNLCK, offset);
    (void)fcntl(fd, F_OFD_SETLK, &fl);
}

/* True when some open file description holds a lock on the byte (i.e. its owner is alive). */
static bool ofd_locked_by_other(int fd, long long offset) {
    struct flock fl = byte_lock(F_WRLCK, offset);
    if (fcntl(fd, F_OFD_GETLK, &fl) != 0) return true; /* unknown: assume alive (safe) */
    return fl.l_type != F_UNLCK;
}

static void fill_devices(struct vgpu_region *r, const struct vgpu_claim_conf *conf) {
    r->device_count = (uint32_t)conf->device_count;
    snprintf(r->claim, sizeof r->claim, "%s", conf->claim);
    for (int i = 0; i < conf->device_count; i++) {
        struct vgpu_region_device *d = &r->devices[i];
        snprintf(d->uuid, sizeof d->uuid, "%s", conf->devices[i].uuid);
        d->memory_limit = conf->devices[i].memory;
        d->cores = conf->devices[i].cores;
        d->policy = conf->devices[i].policy;
    }
}

static void init_header(struct vgpu_region *r, const struct vgpu_claim_conf *conf) {
    memset(r, 0, sizeof *r);
    r->magic = VGPU_REGION_MAGIC;
    r->version = VGPU_REGION_VERSION;
    r->size = (uint32_t)sizeof *r;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r->created_ns = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
    fill_devices(r, conf);
    atomic_store(&r->ready, 1);
}

int vgpu_region_open(struct vgpu_region_handle *h, const char *path,
                     const struct vgpu_claim_conf *conf) {
    memset(h, 0, sizeof *h);
    h->fd = -1;
    h->slot = -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0660);
    if (fd < 0) {
        LOG_WARN("cannot open region %s: %s", path, strerror(errno));
        return -1;
    }
    /* O_CREAT honours the umask; the contract is 0660 so group members can share it. */
    (void)fchmod(fd, 0660);
    if (vgpu_lock_ofd(fd, VGPU_LOCK_INIT, true, true) != 0) {
        LOG_WARN("cannot lock region %s: %s", path, strerror(errno));
        close(fd);
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) goto fail;
    if ((size_t)st.st_size != sizeof(struct vgpu_region)) {
        if (st.st_size != 0) {
            /* Written by another layout version: checked below via magic/version, but a size
             * mismatch alone means we cannot share it safely. */
            struct vgpu_region probe;
            ssize_t n = pread(fd, &probe, sizeof probe.magic * 2, 0);
            if (n == (ssize_t)(sizeof probe.magic * 2) && probe.magic == VGPU_REGION_MAGIC &&
                probe.version != VGPU_REGION_VERSION) {
                LOG_ERROR("region %s has layout version %u, this hook speaks %u; using a "
                          "private region (caps enforced per process only)", path,
                          probe.version, VGPU_REGION_VERSION);
                goto fail;
            }
        }
        /* Never trust the size: map exactly the layout and cut a grown file back (a tenant
         * appending to its region would fill the node's disk). Live counters are kept; a file
         * shrunk below its header reads as zero and is initialised below. */
        if (st.st_size != 0)
            LOG_WARN("region %s is %lld bytes, the layout is %zu: cut back", path,
                     (long long)st.st_size, sizeof(struct vgpu_region));
        if (ftruncate(fd, (off_t)sizeof(struct vgpu_region)) != 0) goto fail;
    }
    void *map = mmap(NULL, sizeof(struct vgpu_region), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) goto fail;
    h->map = map;
    if (h->map->magic != VGPU_REGION_MAGIC || atomic_load(&h->map->ready) != 1) {
        init_header(h->map, conf);
    } else if (h->map->version != VGPU_REGION_VERSION) {
        LOG_ERROR("region %s has layout version %u, this hook speaks %u; using a private "
                  "region", path, h->map->version, VGPU_REGION_VERSION);
        munmap(map, sizeof(struct vgpu_region));
        h->map = NULL;
        goto fail;
    } else {
        /* The plugin may rewrite vgpu.conf (e.g. a resized claim): limits follow the file. */
        fill_devices(h->map, conf);
    }
    vgpu_unlock_ofd(fd, VGPU_LOCK_INIT);
    h->fd = fd;
    h->shared = true;
    return 0;
fail:
    vgpu_unlock_ofd(fd, VGPU_LOCK_INIT);
    close(fd);
    return -1;
}

void vgpu_region_open_private(struct vgpu_region_handle *h, const struct vgpu_claim_conf *conf) {
    memset(h, 0, sizeof *h);
    h->fd = -1;
    h->slot = -1;
    void *map = mmap(NULL, sizeof(struct vgpu_region), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return;
    h->map = map;
    init_header(h->map, conf);
    h->slot = 0;
    atomic_store(&h->map->slots[0].pid, (int32_t)getpid());
    atomic_store(&h->map->slot_hwm, 1);
}

static void clear_slot(struct vgpu_region_slot *s) {
    for (int d = 0; d < VGPU_MAX_DEVICES; d++) {
        atomic_store(&s->used[d], 0);
        atomic_store(&s->managed[d], 0);
    }
}

int vgpu_region_claim_slot(struct vgpu_region_handle *h, int pid) {
    if (h->map == NULL) return -1;
    if (!h->shared) return h->slot;
    /* Lowest free slot first, so readers only scan up to the high-water mark. A slot is free
     * when its liveness lock can be taken (non-blocking: a held lock means a live owner). */
    for (int s = 0; s < VGPU_MAX_SLOTS; s++) {
        if (vgpu_lock_ofd(h->fd, VGPU_LOCK_SLOT(s), true, false) != 0) continue;
        struct vgpu_region_slot *slot = &h->map->slots[s];
        /* A previous owner that died left its counts: its memory died with it. */
        clear_slot(slot);
        atomic_fetch_add(&slot->generation, 1);
        atomic_store(&slot->pid, (int32_t)pid);
        uint32_t hwm = atomic_load(&h->map->slot_hwm);
        while (hwm < (uint32_t)s + 1 &&
               !atomic_compare_exchange_weak(&h->map->slot_hwm, &hwm, (uint32_t)s + 1)) {
        }
        h->slot = s;
        return s;
    }
    LOG_ERROR("region: all %d process slots are taken; this process is not accounted",
              VGPU_MAX_SLOTS);
    return -1;
}

void vgpu_region_close(struct vgpu_region_handle *h) {
    if (h->map && h->slot >= 0 && h->shared) {
        clear_slot(&h->map->slots[h->slot]);
        atomic_store(&h->map->slots[h->slot].pid, 0);
    }
    if (h->map) munmap(h->map, sizeof(struct vgpu_region));
    if (h->fd >= 0) close(h->fd);
    h->map = NULL;
    h->fd = -1;
    h->slot = -1;
}

/* Reclaim one slot whose owner is gone: take its liveness lock, zero it, release. */
static bool reclaim_slot(struct vgpu_region_handle *h, int s) {
    if (vgpu_lock_ofd(h->fd, VGPU_LOCK_SLOT(s), true, false) != 0) return false;
    struct vgpu_region_slot *slot = &h->map->slots[s];
    int32_t pid = atomic_load(&slot->pid);
    clear_slot(slot);
    atomic_store(&slot->pid, 0);
    vgpu_unlock_ofd(h->fd, VGPU_LOCK_SLOT(s));
    LOG_INFO("region: reclaimed slot %d of dead process %d", s, (int)pid);
    return true;
}

int vgpu_region_reclaim_dead(struct vgpu_region_handle *h) {
    if (h->map == NULL || !h->shared) return 0;
    int reclaimed = 0;
    int hwm = (int)atomic_load(&h->map->slot_hwm);
    for (int s = 0; s < hwm && s < VGPU_MAX_SLOTS; s++) {
        if (s == h->slot || atomic_load(&h->map->slots[s].pid) == 0) continue;
        if (!ofd_locked_by_other(h->fd, VGPU_LOCK_SLOT(s)) && reclaim_slot(h, s)) reclaimed++;
    }
    return reclaimed;
}

uint64_t vgpu_region_used(struct vgpu_region_handle *h, int dev) {
    if (h->map == NULL) return 0;
    uint64_t total = 0;
    int hwm = (int)atomic_load(&h->map->slot_hwm);
    if (hwm > VGPU_MAX_SLOTS) hwm = VGPU_MAX_SLOTS;
    for (int s = 0; s < hwm; s++) total += atomic_load(&h->map->slots[s].used[dev]);
    return total;
}

int vgpu_region_charge(struct vgpu_region_handle *h, int dev, uint64_t bytes, uint64_t limit,
                       bool managed) {
    if (h->map == NULL || h->slot < 0) return bytes <= limit ? 0 : -1;
    if (h->shared && vgpu_lock_ofd(h->fd, VGPU_LOCK_DEVICE(dev), true, true) != 0) {
        LOG_ERROR("region: device lock failed: %s; refusing allocation", strerror(errno));
        return -1;
    }
    uint64_t used = vgpu_region_used(h, dev);
    if (used + bytes > limit || used + bytes < used) {
        /* Maybe dead processes still hold usage: reclaim and look again. */
        if (vgpu_region_reclaim_dead(h) > 0) used = vgpu_region_used(h, dev);
    }
    int rc = -1;
    if (used + bytes <= limit && used + bytes >= used) {
        struct vgpu_region_slot *slot = &h->map->slots[h->slot];
        atomic_fetch_add(&slot->used[dev], bytes);
        if (managed) atomic_fetch_add(&slot->managed[dev], bytes);
        rc = 0;
    }
    if (h->shared) vgpu_unlock_ofd(h->fd, VGPU_LOCK_DEVICE(dev));
    return rc;
}

void vgpu_region_uncharge(struct vgpu_region_handle *h, int dev, uint64_t bytes, bool managed) {
    if (h->map == NULL || h->slot < 0) return;
    struct vgpu_region_slot *slot = &h->map->slots[h->slot];
    /* Never wrap: a free we did not see charged (e.g. after fork) must not underflow. */
    uint64_t cur = atomic_load(&slot->used[dev]);
    uint64_t next;
    do {
        next = cur >= bytes ? cur - bytes : 0;
    } while (!atomic_compare_exchange_weak(&slot->used[dev], &cur, next));
    if (managed) {
        cur = atomic_load(&slot->managed[dev]);
        do {
            next = cur >= bytes ? cur - bytes : 0;
        } while (!atomic_compare_exchange_weak(&slot->managed[dev], &cur, next));
    }
}

void vgpu_region_mark_managed(struct vgpu_region_handle *h, int dev, uint64_t bytes) {
    if (h->map == NULL || h->slot < 0) return;
    atomic_fetch_add(&h->map->slots[h->slot].managed[dev], bytes);
    atomic_fetch_add(&h->map->devices[dev].oversub_allocs, 1);
}

void vgpu_region_reclaim_if_due(struct vgpu_region_handle *h, uint64_t now_ns) {
    if (h->map == NULL || !h->shared) return;
    if (h->last_reclaim_ns != 0 && now_ns - h->last_reclaim_ns < 200000000ULL) return;
    h->last_reclaim_ns = now_ns;
    (void)vgpu_region_reclaim_dead(h);
}

void vgpu_region_release_slot(struct vgpu_region_handle *h) {
    if (h->map == NULL || !h->shared || h->slot < 0) return;
    clear_slot(&h->map->slots[h->slot]);
    atomic_store(&h->map->slots[h->slot].pid, 0);
}
