/*
 * cuda_probe - a small CUDA driver client used by the integration tests, run "as a container
 * runs it" (the hook arrives through /etc/ld.so.preload, never through this program).
 *
 * It links nothing CUDA-specific: libcuda.so.1 is dlopen'ed by soname, and entry points are
 * resolved either with dlsym (default) or, with -p, through cuGetProcAddress_v2 by base name and
 * version the way the CUDA runtime and cuda-python do. Steps run in order; each prints one line
 * "<step> rc=<CUresult> ..." so tests can assert on exact results.
 *
 * usage: cuda_probe [-p] [-d ordinal] step...
 *   init | infonull | legacyinfo | alloc:B | alloc1:B (legacy 32-bit ABI) | pitch:WxH | managed:B | async:B | pool:B |
 *   vmm:B | array:WxH | array3d:WxHxD | mipmap:WxH:L | free | freeall | info | total |
 *   uuid | sleep:MS | ready | launch:N:BLOCKS | run:SECONDS:BLOCKS:SYNC |
 *   bursty:SECONDS:BLOCKS:ON_MS:OFF_MS (launch for ON_MS, synchronise, idle OFF_MS, repeat) |
 *   threads:N:B |
 *   forkhold:MS (fork a child that lives MS, parent continues) | forkalloc:B (child allocates) |
 *   ctx:ORD (make device ORD's primary context current) | push:ORD | pop (context stack)
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef void *CUstream;
typedef void *CUarray;
typedef void *CUmemoryPool;
typedef unsigned long long CUmemHandle;
typedef struct { size_t w, h; int format; unsigned channels; } ArrayDesc;
typedef struct { size_t w, h, d; int format; unsigned channels, flags; } Array3DDesc;
typedef struct {
    int type, handle_types;
    struct { int type, id; } location;
    void *win32;
    unsigned char flags[8];
} AllocProp;
typedef struct { char bytes[16]; } CUuuid;

static struct {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuDeviceGet)(CUdevice *, int);
    CUresult (*cuDeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuCtxPushCurrent)(CUcontext);
    CUresult (*cuCtxPopCurrent)(CUcontext *);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuMemAlloc)(CUdeviceptr *, size_t);
    CUresult (*cuMemAllocV1)(unsigned *, unsigned);
    CUresult (*cuMemFreeV1)(unsigned);
    CUresult (*cuMemAllocPitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
    CUresult (*cuMemAllocManaged)(CUdeviceptr *, size_t, unsigned);
    CUresult (*cuMemAllocAsync)(CUdeviceptr *, size_t, CUstream);
    CUresult (*cuMemFreeAsync)(CUdeviceptr, CUstream);
    CUresult (*cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
    CUresult (*cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*cuMemFree)(CUdeviceptr);
    CUresult (*cuMemCreate)(CUmemHandle *, size_t, const AllocProp *, unsigned long long);
    CUresult (*cuMemRelease)(CUmemHandle);
    CUresult (*cuArrayCreate)(CUarray *, const ArrayDesc *);
    CUresult (*cuArray3DCreate)(CUarray *, const Array3DDesc *);
    CUresult (*cuArrayDestroy)(CUarray);
    CUresult (*cuMipmappedArrayCreate)(CUarray *, const Array3DDesc *, unsigned);
    CUresult (*cuMipmappedArrayDestroy)(CUarray);
    CUresult (*cuMemGetInfo)(size_t *, size_t *);
    CUresult (*cuMemGetInfoV1)(unsigned *, unsigned *);
    CUresult (*cuDeviceTotalMemV1)(unsigned *, CUdevice);
    CUresult (*cuDeviceTotalMem)(size_t *, CUdevice);
    CUresult (*cuModuleLoadData)(CUmodule *, const void *);
    CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, CUstream, void **, void **);
} cu;

enum kind { K_PTR, K_PTR1, K_ASYNC, K_VMM, K_ARRAY, K_MIPMAP };
struct held { enum kind kind; uint64_t handle; };
static struct held g_held[4096];
static int g_nheld;
static CUdevice g_dev;
static int g_ordinal;
static CUfunction g_kernel;
/* Kernels per device ordinal and the probe's own view of the context stack (ctx/push/pop). */
static CUfunction g_kernels[8];
static int g_stack[16], g_depth;
static void load_kernel(int ordinal);

static void hold(enum kind k, uint64_t h) {
    if (g_nheld < 4096) g_held[g_nheld++] = (struct held){k, h};
}

static void *resolve(void *lib, int use_procaddr, const char *base, int version,
                     const char *symbol) {
    if (!use_procaddr) return dlsym(lib, symbol);
    static CUresult (*gpa)(const char *, void **, int, unsigned long long, int *);
    if (gpa == NULL) *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (gpa == NULL) return NULL;
    void *fn = NULL;
    int status = -1;
    if (gpa(base, &fn, version, 0, &status) != 0 || status != 0) return NULL;
    return fn;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static CUresult free_one(struct held *h) {
    switch (h->kind) {
    case K_PTR: return cu.cuMemFree(h->handle);
    case K_PTR1: return cu.cuMemFreeV1((unsigned)h->handle);
    case K_ASYNC: return cu.cuMemFreeAsync(h->handle, NULL);
    case K_VMM: return cu.cuMemRelease(h->handle);
    case K_ARRAY: return cu.cuArrayDestroy((CUarray)(uintptr_t)h->handle);
    case K_MIPMAP: return cu.cuMipmappedArrayDestroy((CUarray)(uintptr_t)h->handle);
    }
    return -1;
}

struct thread_arg { size_t bytes; int got; };
static void *thread_alloc(void *p) {
    struct thread_arg *a = p;
    CUcontext ctx;
    cu.cuDevicePrimaryCtxRetain(&ctx, g_dev);
    cu.cuCtxSetCurrent(ctx);
    for (int i = 0; i < 1000; i++) {
        CUdeviceptr d;
        if (cu.cuMemAlloc(&d, a->bytes) != 0) break;
        a->got++;
    }
    return NULL;
}

static CUresult launch(unsigned blocks) {
    return cu.cuLaunchKernel(g_kernel, blocks, 1, 1, 128, 1, 1, 0, NULL, NULL, NULL);
}

static void step(const char *s) {
    unsigned long long a = 0, b = 0, c = 0, e = 0;
    CUresult rc = 0;
    if (strcmp(s, "init") == 0) {
        CUcontext ctx = NULL;
        rc = cu.cuInit(0);
        if (rc == 0) rc = cu.cuDeviceGet(&g_dev, g_ordinal);
        if (rc == 0) rc = cu.cuDevicePrimaryCtxRetain(&ctx, g_dev);
        if (rc == 0) rc = cu.cuCtxSetCurrent(ctx);
        printf("init rc=%d\n", rc);
    } else if (sscanf(s, "alloc:%llu", &a) == 1) {
        CUdeviceptr d = 0;
        rc = cu.cuMemAlloc(&d, a);
        if (rc == 0) hold(K_PTR, d);
        printf("alloc rc=%d bytes=%llu\n", rc, a);
    } else if (sscanf(s, "alloc1:%llu", &a) == 1) {
        unsigned d = 0;
        rc = cu.cuMemAllocV1 ? cu.cuMemAllocV1(&d, (unsigned)a) : 500;
        if (rc == 0) hold(K_PTR1, d);
        printf("alloc1 rc=%d bytes=%llu\n", rc, a);
    } else if (sscanf(s, "pitch:%llux%llu", &a, &b) == 2) {
        CUdeviceptr d = 0;
        size_t pitch = 0;
        rc = cu.cuMemAllocPitch(&d, &pitch, a, b, 4);
        if (rc == 0) hold(K_PTR, d);
        printf("pitch rc=%d pitch=%zu\n", rc, pitch);
    } else if (sscanf(s, "managed:%llu", &a) == 1) {
        CUdeviceptr d = 0;
        rc = cu.cuMemAllocManaged(&d, a, 1);
        if (rc == 0) hold(K_PTR, d);
        printf("managed rc=%d bytes=%llu\n", rc, a);
    } else if (sscanf(s, "async:%llu", &a) == 1) {
        CUdeviceptr d = 0;
        rc = cu.cuMemAllocAsync(&d, a, NULL);
        if (rc == 0) hold(K_ASYNC, d);
        printf("async rc=%d bytes=%llu\n", rc, a);
    } else if (sscanf(s, "pool:%llu", &a) == 1) {
        CUdeviceptr d = 0;
        CUmemoryPool pool = NULL;
        rc = cu.cuDeviceGetDefaultMemPool(&pool, g_dev);
        if (rc == 0) rc = cu.cuMemAllocFromPoolAsync(&d, a, pool, NULL);
        if (rc == 0) hold(K_ASYNC, d);
        printf("pool rc=%d bytes=%llu\n", rc, a);
    } else if (sscanf(s, "vmm:%llu", &a) == 1) {
        AllocProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = 1;
        prop.location.type = 1;
        prop.location.id = g_dev;
        CUmemHandle h = 0;
        rc = cu.cuMemCreate(&h, a, &prop, 0);
        if (rc == 0) hold(K_VMM, h);
        printf("vmm rc=%d bytes=%llu\n", rc, a);
    } else if (sscanf(s, "array3d:%llux%llux%llu", &a, &b, &c) == 3) {
        Array3DDesc d = {a, b, c, 0x20, 1, 0};
        CUarray arr = NULL;
        rc = cu.cuArray3DCreate(&arr, &d);
        if (rc == 0) hold(K_ARRAY, (uintptr_t)arr);
        printf("array3d rc=%d\n", rc);
    } else if (sscanf(s, "array:%llux%llu", &a, &b) == 2) {
        ArrayDesc d = {a, b, 0x20, 1};
        CUarray arr = NULL;
        rc = cu.cuArrayCreate(&arr, &d);
        if (rc == 0) hold(K_ARRAY, (uintptr_t)arr);
        printf("array rc=%d\n", rc);
    } else if (sscanf(s, "mipmap:%llux%llu:%llu", &a, &b, &c) == 3) {
        Array3DDesc d = {a, b, 0, 0x20, 1, 0};
        CUarray arr = NULL;
        rc = cu.cuMipmappedArrayCreate(&arr, &d, (unsigned)c);
        if (rc == 0) hold(K_MIPMAP, (uintptr_t)arr);
        printf("mipmap rc=%d\n", rc);
    } else if (strcmp(s, "free") == 0) {
        rc = g_nheld ? free_one(&g_held[--g_nheld]) : -1;
        printf("free rc=%d\n", rc);
    } else if (strcmp(s, "freeall") == 0) {
        int bad = 0;
        while (g_nheld > 0) bad += free_one(&g_held[--g_nheld]) != 0;
        printf("freeall failures=%d\n", bad);
    } else if (strcmp(s, "info") == 0) {
        size_t fr = 0, tot = 0;
        rc = cu.cuMemGetInfo(&fr, &tot);
        printf("info rc=%d free=%zu total=%zu\n", rc, fr, tot);
    } else if (strcmp(s, "infonull") == 0) {
        size_t tot = 0, fr = 0;
        CUresult r1 = cu.cuMemGetInfo(NULL, &tot), r2 = cu.cuMemGetInfo(&fr, NULL);
        CUresult r3 = cu.cuMemGetInfo(NULL, NULL);
        printf("infonull rc=%d total=%zu rc2=%d free=%zu rc3=%d\n", r1, tot, r2, fr, r3);
    } else if (strcmp(s, "legacyinfo") == 0) {
        unsigned fr = 0, tot = 0, dt = 0;
        CUresult r1 = cu.cuMemGetInfoV1 ? cu.cuMemGetInfoV1(&fr, &tot) : 500;
        CUresult r2 = cu.cuDeviceTotalMemV1 ? cu.cuDeviceTotalMemV1(&dt, g_dev) : 500;
        printf("legacyinfo rc=%d free=%u total=%u rc2=%d devtotal=%u\n", r1, fr, tot, r2, dt);
    } else if (strcmp(s, "total") == 0) {
        size_t tot = 0;
        rc = cu.cuDeviceTotalMem(&tot, g_dev);
        printf("total rc=%d bytes=%zu\n", rc, tot);
    } else if (strcmp(s, "uuid") == 0) {
        CUuuid u;
        rc = cu.cuDeviceGetUuid(&u, g_dev);
        const unsigned char *x = (const unsigned char *)u.bytes;
        printf("uuid rc=%d GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x\n",
               rc, x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], x[8], x[9], x[10], x[11],
               x[12], x[13], x[14], x[15]);
    } else if (sscanf(s, "ctx:%llu", &a) == 1 || sscanf(s, "push:%llu", &b) == 1) {
        int push = strncmp(s, "push:", 5) == 0, ord = (int)(push ? b : a);
        CUdevice dev = 0;
        CUcontext ctx = NULL;
        rc = cu.cuDeviceGet(&dev, ord);
        if (rc == 0) rc = cu.cuDevicePrimaryCtxRetain(&ctx, dev);
        if (rc == 0) rc = push ? cu.cuCtxPushCurrent(ctx) : cu.cuCtxSetCurrent(ctx);
        if (rc == 0 && ord < 8) {
            if (push && g_depth < 16) g_stack[g_depth++] = g_ordinal;
            g_ordinal = ord;
            load_kernel(ord);
        }
        printf("%s rc=%d\n", push ? "push" : "ctx", rc);
    } else if (strcmp(s, "pop") == 0) {
        CUcontext ctx = NULL;
        rc = cu.cuCtxPopCurrent(&ctx);
        if (rc == 0 && g_depth > 0) {
            g_ordinal = g_stack[--g_depth];
            g_kernel = g_kernels[g_ordinal];
        }
        printf("pop rc=%d\n", rc);
    } else if (sscanf(s, "sleep:%llu", &a) == 1) {
        usleep((useconds_t)(a * 1000));
    } else if (strcmp(s, "ready") == 0) {
        printf("ready\n");
    } else if (sscanf(s, "launch:%llu:%llu", &a, &b) == 2) {
        int bad = 0;
        for (unsigned long long i = 0; i < a; i++) bad += launch((unsigned)b) != 0;
        rc = cu.cuCtxSynchronize();
        printf("launch failures=%d sync=%d\n", bad, rc);
    } else if (sscanf(s, "run:%llu:%llu:%llu", &a, &b, &c) == 3) {
        double end = now_s() + (double)a, start = now_s();
        unsigned long long n = 0;
        int bad = 0;
        while (now_s() < end) {
            bad += launch((unsigned)b) != 0;
            if (c) cu.cuCtxSynchronize();
            n++;
        }
        cu.cuCtxSynchronize();
        printf("run launches=%llu failures=%d seconds=%.3f\n", n, bad, now_s() - start);
    } else if (sscanf(s, "bursty:%llu:%llu:%llu:%llu", &a, &b, &c, &e) == 4) {
        double end = now_s() + (double)a, start = now_s();
        unsigned long long n = 0;
        int bad = 0;
        while (now_s() < end) {
            double burst_end = now_s() + (double)c / 1e3;
            while (now_s() < burst_end) {
                bad += launch((unsigned)b) != 0;
                n++;
            }
            cu.cuCtxSynchronize();
            usleep((useconds_t)(e * 1000));
        }
        printf("run launches=%llu failures=%d seconds=%.3f\n", n, bad, now_s() - start);
    } else if (sscanf(s, "threads:%llu:%llu", &a, &b) == 2) {
        pthread_t t[64];
        struct thread_arg args[64];
        int n = a > 64 ? 64 : (int)a, total = 0;
        for (int i = 0; i < n; i++) {
            args[i] = (struct thread_arg){.bytes = b, .got = 0};
            pthread_create(&t[i], NULL, thread_alloc, &args[i]);
        }
        for (int i = 0; i < n; i++) {
            pthread_join(t[i], NULL);
            total += args[i].got;
        }
        printf("threads allocations=%d\n", total);
    } else if (sscanf(s, "forkhold:%llu", &a) == 1) {
        pid_t pid = fork();
        if (pid == 0) {
            /* The child just lives (holding the inherited descriptors), then exits. */
            usleep((useconds_t)(a * 1000));
            _exit(0);
        }
        printf("forkhold pid=%d\n", (int)pid);
    } else if (sscanf(s, "forkalloc:%llu", &a) == 1) {
        /* The child allocates through the hook (its own slot), reports, and exits without
         * freeing; the parent waits for it. */
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            CUdeviceptr d = 0;
            CUresult r = cu.cuMemAlloc(&d, a);
            size_t fr = 0, tot = 0;
            cu.cuMemGetInfo(&fr, &tot);
            printf("child rc=%d free=%zu\n", r, fr);
            fflush(stdout);
            _exit(0);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("forkalloc status=%d\n", status);
    } else if (strcmp(s, "waitchildren") == 0) {
        while (wait(NULL) > 0) {
        }
        printf("waitchildren\n");
    } else {
        printf("unknown step %s\n", s);
    }
    fflush(stdout);
}

int main(int argc, char **argv) {
    int use_procaddr = 0, i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "-p") == 0) use_procaddr = 1;
        else if (strcmp(argv[i], "-d") == 0 && i + 1 < argc) g_ordinal = atoi(argv[++i]);
    }
    void *lib = dlopen("libcuda.so.1", RTLD_NOW);
    if (lib == NULL) {
        printf("dlopen failed: %s\n", dlerror());
        return 2;
    }
#define R(field, base, ver, sym) *(void **)&cu.field = resolve(lib, use_procaddr, base, ver, sym)
    R(cuInit, "cuInit", 2000, "cuInit");
    R(cuDeviceGet, "cuDeviceGet", 2000, "cuDeviceGet");
    R(cuDeviceGetUuid, "cuDeviceGetUuid", 11040, "cuDeviceGetUuid_v2");
    R(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000, "cuDevicePrimaryCtxRetain");
    R(cuCtxSetCurrent, "cuCtxSetCurrent", 4000, "cuCtxSetCurrent");
    R(cuCtxPushCurrent, "cuCtxPushCurrent", 4000, "cuCtxPushCurrent_v2");
    R(cuCtxPopCurrent, "cuCtxPopCurrent", 4000, "cuCtxPopCurrent_v2");
    R(cuCtxSynchronize, "cuCtxSynchronize", 2000, "cuCtxSynchronize");
    R(cuMemAlloc, "cuMemAlloc", 3020, "cuMemAlloc_v2");
    R(cuMemAllocV1, "cuMemAlloc", 2000, "cuMemAlloc");
    R(cuMemFreeV1, "cuMemFree", 2000, "cuMemFree");
    R(cuMemAllocPitch, "cuMemAllocPitch", 3020, "cuMemAllocPitch_v2");
    R(cuMemAllocManaged, "cuMemAllocManaged", 6000, "cuMemAllocManaged");
    R(cuMemAllocAsync, "cuMemAllocAsync", 11020, "cuMemAllocAsync");
    R(cuMemFreeAsync, "cuMemFreeAsync", 11020, "cuMemFreeAsync");
    R(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool", 11020, "cuDeviceGetDefaultMemPool");
    R(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", 11020, "cuMemAllocFromPoolAsync");
    R(cuMemFree, "cuMemFree", 3020, "cuMemFree_v2");
    R(cuMemCreate, "cuMemCreate", 10020, "cuMemCreate");
    R(cuMemRelease, "cuMemRelease", 10020, "cuMemRelease");
    R(cuArrayCreate, "cuArrayCreate", 3020, "cuArrayCreate_v2");
    R(cuArray3DCreate, "cuArray3DCreate", 3020, "cuArray3DCreate_v2");
    R(cuArrayDestroy, "cuArrayDestroy", 2000, "cuArrayDestroy");
    R(cuMipmappedArrayCreate, "cuMipmappedArrayCreate", 5000, "cuMipmappedArrayCreate");
    R(cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy", 5000, "cuMipmappedArrayDestroy");
    R(cuMemGetInfo, "cuMemGetInfo", 3020, "cuMemGetInfo_v2");
    R(cuDeviceTotalMem, "cuDeviceTotalMem", 3020, "cuDeviceTotalMem_v2");
    R(cuMemGetInfoV1, "cuMemGetInfo", 2000, "cuMemGetInfo");
    R(cuDeviceTotalMemV1, "cuDeviceTotalMem", 2000, "cuDeviceTotalMem");
    R(cuModuleLoadData, "cuModuleLoadData", 2000, "cuModuleLoadData");
    R(cuModuleGetFunction, "cuModuleGetFunction", 2000, "cuModuleGetFunction");
    R(cuLaunchKernel, "cuLaunchKernel", 4000, "cuLaunchKernel");
#undef R
    if (cu.cuInit == NULL || cu.cuMemAlloc == NULL) {
        printf("resolve failed\n");
        return 2;
    }
    for (; i < argc; i++) {
        step(argv[i]);
        if (strcmp(argv[i], "init") == 0) load_kernel(g_ordinal);
    }
    return 0;
}

/* Load the test kernel in the current context (for device `ordinal`) and make it current. */
static void load_kernel(int ordinal) {
    if (!cu.cuModuleLoadData || !cu.cuModuleGetFunction || ordinal < 0 || ordinal >= 8) return;
    const char *wave = getenv("PROBE_KERNEL");
    const char *name = wave ? wave : "busy__ns100000";
    const char *ns_part = strstr(name, "__ns");
    unsigned long long ns = ns_part ? strtoull(ns_part + 4, NULL, 10) : 0;
    /* Real PTX (the kernel spins on %globaltimer for its __ns<N> duration), so the probe also
     * runs on a real GPU; the simulated driver reads the duration from the name. */
    char image[1024];
    snprintf(image, sizeof image,
             ".version 7.0\n.target sm_50\n.address_size 64\n"
             ".visible .entry %s()\n{\n\t.reg .u64 %%t<3>;\n\t.reg .pred %%p;\n"
             "\tmov.u64 %%t0, %%globaltimer;\nSPIN:\n\tmov.u64 %%t1, %%globaltimer;\n"
             "\tsub.u64 %%t2, %%t1, %%t0;\n\tsetp.lt.u64 %%p, %%t2, %llu;\n"
             "\t@%%p bra SPIN;\n\tret;\n}\n",
             name, ns);
    CUmodule mod = NULL;
    if (g_kernels[ordinal] == NULL && cu.cuModuleLoadData(&mod, image) == 0)
        cu.cuModuleGetFunction(&g_kernels[ordinal], mod, name);
    g_kernel = g_kernels[ordinal];
}
