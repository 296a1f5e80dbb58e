/*
 * state.c - lazy, thread-safe initialisation of the hook's process state: find the claims'
 * vgpu.conf files, open each claim's shared region, take a process slot, and map CUDA
 * ordinals / NVML handles to configured devices by UUID (so CUDA_VISIBLE_DEVICES reordering
 * is harmless). No constructor does work: the first hooked call runs init via pthread_once.
 * After fork the child re-opens each region (its own OFD, its own slot) via pthread_atfork.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "vgpu.h"

#define DEFAULT_CLAIMS_DIR "/run/vgpu-dra/claims"
#define MAX_CONF_BYTES (64 * 1024)

static struct vgpu_state g_state;
static char g_region_paths[VGPU_MAX_CLAIMS][4096];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_mounted_claims; /* claim dirs found that are mounts, with or without vgpu.conf */
static _Atomic bool g_ready;

/* ordinal -> device index + 1 (0 = unknown yet, -1 = not one of ours) */
#define MAX_ORDINALS 64
static _Atomic int g_ordinal_map[MAX_ORDINALS];

uint64_t vgpu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static char *read_small_file(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    char *buf = malloc(MAX_CONF_BYTES + 1);
    size_t len = 0;
    if (buf != NULL) {
        ssize_t n;
        while (len < MAX_CONF_BYTES && (n = read(fd, buf + len, MAX_CONF_BYTES - len)) != 0) {
            if (n < 0) {
                if (errno == EINTR) continue;
                break;
            }
            len += (size_t)n;
        }
        buf[len] = '\0';
    }
    close(fd);
    return buf;
}

#ifndef STATX_ATTR_MOUNT_ROOT
#define STATX_ATTR_MOUNT_ROOT 0x2000 /* Linux 5.8 */
#endif

/* Whether `path` (a directory or a regular file, never a symlink) is the root of a mount, i.e.
 * something the container runtime mounted from the CDI spec. A claim directory a tenant created
 * itself beside the real ones (e.g. as root in the container, with a cap of its own choosing)
 * is not, and is ignored. Kernels before 5.8 do not report mount roots: there the path must at
 * least sit on another device than its parent directory. */
static bool is_mount_root(const char *path, bool want_dir) {
    struct statx sx;
    if (statx(AT_FDCWD, path, AT_SYMLINK_NOFOLLOW, STATX_TYPE, &sx) != 0) return false;
    if (want_dir ? !S_ISDIR(sx.stx_mode) : !S_ISREG(sx.stx_mode)) return false;
    if (sx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT)
        return (sx.stx_attributes & STATX_ATTR_MOUNT_ROOT) != 0;
    char parent_path[4096];
    snprintf(parent_path, sizeof parent_path, "%s", path);
    char *slash = strrchr(parent_path, '/');
    if (slash == NULL) return false;
    slash[slash == parent_path ? 1 : 0] = '\0';
    struct stat parent, child;
    return stat(parent_path, &parent) == 0 && lstat(path, &child) == 0 &&
           child.st_dev != parent.st_dev;
}

static void add_claim(const char *dir, const char *name) {
    struct vgpu_state *s = &g_state;
    if (s->region_count >= VGPU_MAX_CLAIMS) {
        LOG_ERROR("more than %d claims mounted; %s ignored", VGPU_MAX_CLAIMS, name);
        return;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s/vgpu.conf", dir, name);
    char claim_dir[4096];
    snprintf(claim_dir, sizeof claim_dir, "%s/%s", dir, name);
    if (!is_mount_root(claim_dir, true)) {
        LOG_ERROR("%s is not a mount made from a claim's CDI spec; ignored", claim_dir);
        return;
    }
    g_mounted_claims++;
    char *text = read_small_file(path);
    if (text == NULL) return; /* not a claim directory */
    struct vgpu_claim_conf conf;
    int rc = vgpu_config_parse(text, path, &conf);
    free(text);
    if (rc != 0 || conf.device_count == 0) {
        LOG_WARN("%s: no usable device lines; this claim is not enforced", path);
        return;
    }
    int idx = s->region_count;
    struct vgpu_region_handle *h = &s->regions[idx];
    snprintf(g_region_paths[idx], sizeof g_region_paths[idx], "%s/%s/region", dir, name);
    if (vgpu_region_open(h, g_region_paths[idx], &conf) != 0) {
        LOG_WARN("%s: shared region unavailable; caps are enforced per process only",
                 g_region_paths[idx]);
        g_region_paths[idx][0] = '\0';
        vgpu_region_open_private(h, &conf);
        if (h->map == NULL) return;
    }
    if (h->shared) vgpu_region_claim_slot(h, (int)getpid());
    s->region_count++;
    for (int i = 0; i < conf.device_count; i++) {
        bool dup = false;
        for (int j = 0; j < s->dev_count; j++)
            if (strcasecmp(s->devs[j].conf.uuid, conf.devices[i].uuid) == 0) dup = true;
        if (dup || s->dev_count >= VGPU_MAX_DEVICES) {
            LOG_ERROR("%s: device %s already configured by another claim; ignored", path,
                      conf.devices[i].uuid);
            continue;
        }
        struct vgpu_dev *d = &s->devs[s->dev_count++];
        d->conf = conf.devices[i];
        d->region = h;
        d->region_dev = i;
        d->cuda_ordinal = -1;
        d->nvml = NULL;
        if (d->conf.cores > 0 && d->conf.cores < 100 && d->conf.policy != VGPU_POLICY_NONE)
            s->compute_capped = true;
        LOG_INFO("claim %s: %s memory=%llu cores=%u policy=%u oversubscribe=%d", conf.claim,
                 d->conf.uuid, (unsigned long long)d->conf.memory, d->conf.cores,
                 d->conf.policy, (int)d->conf.oversubscribe);
    }
}

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

static void atfork_child(void) {
    /* The inherited fd shares the parent's open file description and therefore its slot lock;
     * the child needs its own description and slot, and must drop the shared one so the
     * parent's slot is released when the parent dies. */
    struct vgpu_state *s = &g_state;
    for (int i = 0; i < s->region_count; i++) {
        struct vgpu_region_handle *h = &s->regions[i];
        if (!h->shared) continue;
        if (h->fd >= 0) close(h->fd);
        h->fd = open(g_region_paths[i], O_RDWR | O_CLOEXEC);
        h->slot = -1;
        if (h->fd < 0) {
            LOG_ERROR("fork child: cannot reopen %s: %s", g_region_paths[i], strerror(errno));
            continue;
        }
        vgpu_region_claim_slot(h, (int)getpid());
    }
}

static void release_at_exit(void) {
    /* A normal exit frees the process's device memory: free its share of the caps now rather
     * than when the next allocation finds the slot dead. */
    for (int i = 0; i < g_state.region_count; i++) vgpu_region_release_slot(&g_state.regions[i]);
}

/*
 * The CDI spec that mounts /etc/ld.so.preload (which is how this library got here) always mounts
 * the claim dirs too. Seeing the first without the second means someone moved the claims away
 * (e.g. a root tenant renamed /run/vgpu-dra, whose mounts move with it): fail closed, as for an
 * unreadable memory cap. One catch-all device, matched by every GPU, with no memory at all.
 */
static void deny_all(void) {
    LOG_ERROR("no claim is mounted under %s although /etc/ld.so.preload is: every GPU "
              "allocation is refused", DEFAULT_CLAIMS_DIR);
    struct vgpu_claim_conf conf;
    memset(&conf, 0, sizeof conf);
    conf.device_count = 1;
    snprintf(conf.devices[0].uuid, sizeof conf.devices[0].uuid, "*");
    conf.devices[0].memory_invalid = true;
    struct vgpu_region_handle *h = &g_state.regions[0];
    vgpu_region_open_private(h, &conf);
    if (h->map == NULL) return;
    g_state.region_count = 1;
    g_state.deny_all = true;
    struct vgpu_dev *d = &g_state.devs[0];
    d->conf = conf.devices[0];
    d->region = h;
    d->region_dev = 0;
    d->cuda_ordinal = -1;
    d->nvml = NULL;
    g_state.dev_count = 1;
}

static void init_once(void) {
    vgpu_alloc_register_atfork();
    /* Fixed path, no override: whatever a tenant can set (environment, files it owns) must not
     * move the hook away from the read-only claim mounts. Tests use the real path through the
     * container runner's mount namespace (vgpu_testbed/container.py). */
    const char *dir = DEFAULT_CLAIMS_DIR;
    struct dirent **names = NULL;
    int n = scandir(dir, &names, NULL, by_name);
    if (n < 0) {
        LOG_DEBUG("no claims directory %s: pass-through", dir);
    } else {
        for (int i = 0; i < n; i++) {
            if (names[i]->d_name[0] != '.') add_claim(dir, names[i]->d_name);
            free(names[i]);
        }
        free(names);
    }
    if (g_mounted_claims == 0 && is_mount_root("/etc/ld.so.preload", false)) deny_all();
    g_state.configured = g_state.dev_count > 0;
    pthread_atfork(NULL, NULL, atfork_child);
    if (g_state.region_count > 0) atexit(release_at_exit);
    atomic_store_explicit(&g_ready, true, memory_order_release);
}

struct vgpu_state *vgpu_state(void) {
    if (__builtin_expect(!atomic_load_explicit(&g_ready, memory_order_acquire), 0))
        pthread_once(&g_once, init_once);
    return &g_state;
}

static void format_uuid(const CUuuid *u, char *out, size_t len) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
             b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
             b[14], b[15]);
}

static struct vgpu_dev *dev_by_uuid(const char *uuid) {
    for (int i = 0; i < g_state.dev_count; i++)
        if (strcasecmp(g_state.devs[i].conf.uuid, uuid) == 0) return &g_state.devs[i];
    return NULL;
}

struct vgpu_dev *vgpu_dev_for_ordinal(CUdevice ordinal) {
    struct vgpu_state *s = vgpu_state();
    if (s->deny_all) return &s->devs[0];
    if (!s->configured || ordinal < 0 || ordinal >= MAX_ORDINALS) return NULL;
    int cached = atomic_load_explicit(&g_ordinal_map[ordinal], memory_order_relaxed);
    if (cached > 0) return &s->devs[cached - 1];
    if (cached < 0) return NULL;
    if (!vgpu_cuda_load() || vgpu_cu.cuDeviceGetUuid_v2_ == NULL) return NULL;
    CUuuid uuid;
    if (vgpu_cu.cuDeviceGetUuid_v2_(&uuid, ordinal) != CUDA_SUCCESS) return NULL;
    char text[VGPU_UUID_LEN];
    format_uuid(&uuid, text, sizeof text);
    struct vgpu_dev *d = dev_by_uuid(text);
    atomic_store(&g_ordinal_map[ordinal], d ? (int)(d - s->devs) + 1 : -1);
    if (d) d->cuda_ordinal = ordinal;
    else LOG_DEBUG("CUDA device %d (%s) is not in any claim: uncapped", ordinal, text);
    return d;
}

struct vgpu_dev *vgpu_dev_current(void) {
    struct vgpu_state *s = vgpu_state();
    if (!s->configured || !vgpu_cuda_load() || vgpu_cu.cuCtxGetDevice_ == NULL) return NULL;
    CUdevice dev = -1;
    if (vgpu_cu.cuCtxGetDevice_(&dev) != CUDA_SUCCESS) return NULL;
    return vgpu_dev_for_ordinal(dev);
}

struct vgpu_dev *vgpu_dev_for_nvml(nvmlDevice_t device) {
    struct vgpu_state *s = vgpu_state();
    if (s->deny_all && device != NULL) return &s->devs[0];
    if (!s->configured || device == NULL) return NULL;
    for (int i = 0; i < s->dev_count; i++)
        if (__atomic_load_n(&s->devs[i].nvml, __ATOMIC_RELAXED) == device) return &s->devs[i];
    if (!vgpu_nvml_load() || vgpu_nvml.nvmlDeviceGetUUID_ == NULL) return NULL;
    char uuid[VGPU_UUID_LEN];
    if (vgpu_nvml.nvmlDeviceGetUUID_(device, uuid, sizeof uuid) != NVML_SUCCESS) return NULL;
    struct vgpu_dev *d = dev_by_uuid(uuid);
    if (d) __atomic_store_n(&d->nvml, device, __ATOMIC_RELAXED);
    return d;
}
