/*
 * alloc_table.c - remembers what each live allocation was charged, so a free releases exactly
 * that (device pointers, VMM handles, arrays and mipmapped arrays share one table; callers tag
 * keys with their kind so numerically equal handles of different kinds never collide).
 *
 * A chained hash table under one process-local mutex: allocation calls are slow paths, and a
 * process-local mutex dies with its process, so it cannot block other processes.
 */
#include <pthread.h>
#include <stdlib.h>

#include "vgpu.h"

#define BUCKETS 4096

struct entry {
    uint64_t key;
    uint64_t bytes;
    int dev;
    bool managed;
    struct entry *next;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct entry *g_buckets[BUCKETS];

static size_t bucket_of(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)(key % BUCKETS);
}

void vgpu_alloc_put(uint64_t key, int dev, uint64_t bytes, bool managed) {
    struct entry *e = malloc(sizeof *e);
    if (e == NULL) {
        LOG_ERROR("out of host memory tracking an allocation; its free will not be credited");
        return;
    }
    e->key = key;
    e->bytes = bytes;
    e->dev = dev;
    e->managed = managed;
    pthread_mutex_lock(&g_lock);
    size_t b = bucket_of(key);
    e->next = g_buckets[b];
    g_buckets[b] = e;
    pthread_mutex_unlock(&g_lock);
}

bool vgpu_alloc_take(uint64_t key, int *dev, uint64_t *bytes, bool *managed) {
    pthread_mutex_lock(&g_lock);
    struct entry **pp = &g_buckets[bucket_of(key)];
    while (*pp && (*pp)->key != key) pp = &(*pp)->next;
    struct entry *e = *pp;
    if (e) *pp = e->next;
    pthread_mutex_unlock(&g_lock);
    if (e == NULL) return false;
    *dev = e->dev;
    *bytes = e->bytes;
    *managed = e->managed;
    free(e);
    return true;
}

static void prepare(void) { pthread_mutex_lock(&g_lock); }
static void parent(void) { pthread_mutex_unlock(&g_lock); }
static void child(void) {
    /* The child owns none of the parent's allocations (CUDA contexts do not survive fork). */
    for (size_t b = 0; b < BUCKETS; b++) {
        struct entry *e = g_buckets[b];
        while (e) {
            struct entry *next = e->next;
            free(e);
            e = next;
        }
        g_buckets[b] = NULL;
    }
    pthread_mutex_unlock(&g_lock);
}

void vgpu_alloc_register_atfork(void) { pthread_atfork(prepare, parent, child); }
