/*
 * loader.c - finds the real driver entry points and hands out the hook's wrappers.
 *
 * Real functions come from dlopen("libcuda.so.1"/"libnvidia-ml.so.1") (RTLD_NOLOAD first) and
 * dlsym on *that handle*, never through the global (interposed) names. The hook's wrappers reach
 * applications three ways, all generated from hooks.def:
 *   1. direct calls bind to our exported symbols (we are preloaded);
 *   2. cuGetProcAddress(_v2): we call the real one and map the returned pointer back to our
 *      wrapper, which covers versioned (_v2, _v3) and per-thread (_ptsz/_ptds) variants;
 *   3. dlsym/dlvsym(handle, "cu..."/"nvml..."), e.g. cuda-python and pynvml: we export both, do
 *      the real lookup and, when it found a hooked name, return our wrapper of that name; a
 *      lookup of "dlsym"/"dlvsym" themselves returns ours (docs/security.md lists every path).
 * Recursion/deadlock guard: while this thread is inside a dlopen we issued, our dlsym is a
 * pure pass-through, and our dlsym never loads anything itself (see below).
 */

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "vgpu.h"

struct vgpu_real_cuda vgpu_cu;
struct vgpu_real_nvml vgpu_nvml;

static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;
static pthread_once_t g_nvml_once = PTHREAD_ONCE_INIT;
static _Atomic bool g_cuda_ok, g_nvml_ok;
/* initial-exec: reading it must not call __tls_get_addr, which sanitizer runtimes intercept
 * (and cannot serve while they initialise, when they call our dlsym). */
static __thread int t_in_loader __attribute__((tls_model("initial-exec")));

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
typedef void *(*dlmopen_fn)(Lmid_t, const char *, int);
/* libc's own dlsym, dlvsym and dlmopen (ours replace them for everyone else). */
static void *_Atomic g_real_dlsym, *_Atomic g_real_dlvsym, *_Atomic g_real_dlmopen;

/* The functions our dlsym runs before returning are not sanitizer-instrumented: a sanitizer
 * runtime calls dlsym while initialising, before its shadow memory exists. */
#define NO_SANITIZE __attribute__((no_sanitize("address", "undefined")))

/* Byte compare without calling libc: this runs before other preloaded libraries (e.g.
 * sanitizer runtimes) have initialised their interceptors of strcmp & co. */
NO_SANITIZE static bool same_name(const char *a, const char *b) {
    while (*a && *a == *b) {
        a++;
        b++;
    }
    return *a == *b;
}

NO_SANITIZE static uint32_t gnu_hash(const char *name) {
    uint32_t h = 5381;
    for (const unsigned char *c = (const unsigned char *)name; *c; c++) h = h * 33 + *c;
    return h;
}

/* Address of `name` in one loaded object, found through its dynamic section alone (no libc
 * calls). Supports DT_GNU_HASH and DT_HASH. */
NO_SANITIZE static void *lookup_in_object(const struct link_map *lm, const char *name) {
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    const uint32_t *gnu = NULL, *sysv = NULL;
    uintptr_t base = (uintptr_t)lm->l_addr;
    for (const ElfW(Dyn) *d = lm->l_ld; d != NULL && d->d_tag != DT_NULL; d++) {
        uintptr_t v = (uintptr_t)d->d_un.d_ptr;
        if (v < base) v += base; /* glibc relocates these in place; others may not */
        if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)v;
        else if (d->d_tag == DT_STRTAB) strtab = (const char *)v;
        else if (d->d_tag == DT_GNU_HASH) gnu = (const uint32_t *)v;
        else if (d->d_tag == DT_HASH) sysv = (const uint32_t *)v;
    }
    if (symtab == NULL || strtab == NULL) return NULL;
    if (gnu != NULL) {
        uint32_t nbuckets = gnu[0], symoffset = gnu[1], bloom_size = gnu[2];
        const uint32_t *buckets = gnu + 4 + bloom_size * (sizeof(ElfW(Addr)) / 4);
        const uint32_t *chain = buckets + nbuckets;
        uint32_t h = gnu_hash(name);
        if (nbuckets == 0) return NULL;
        uint32_t i = buckets[h % nbuckets];
        if (i < symoffset) return NULL;
        for (;; i++) {
            uint32_t hh = chain[i - symoffset];
            const ElfW(Sym) *sym = &symtab[i];
            if ((h | 1) == (hh | 1) && sym->st_value != 0 && same_name(strtab + sym->st_name, name))
                return (void *)(base + sym->st_value);
            if (hh & 1) return NULL;
        }
    }
    if (sysv != NULL) {
        uint32_t nchain = sysv[1];
        for (uint32_t i = 0; i < nchain; i++) {
            const ElfW(Sym) *sym = &symtab[i];
            if (sym->st_value != 0 && same_name(strtab + sym->st_name, name))
                return (void *)(base + sym->st_value);
        }
    }
    return NULL;
}

/* The objects that define the real dlsym/dlvsym: libc.so.6 (glibc >= 2.34) or libdl.so.2. */
NO_SANITIZE static bool defines_dl(const char *path) {
    const char *base = path;
    for (const char *c = path; *c; c++)
        if (*c == '/') base = c + 1;
    return same_name(base, "libc.so.6") || same_name(base, "libdl.so.2");
}

/* Walk the loader's list of objects (plain data: no function another preloaded library could
 * intercept before it is ready) and take the first definition of `name` in libc/libdl. Never
 * through dlsym/dlvsym themselves: both are ours. */
NO_SANITIZE static void *libc_symbol(const char *name) {
    for (const struct link_map *lm = _r_debug.r_map; lm != NULL; lm = lm->l_next) {
        if (lm->l_name == NULL || !defines_dl(lm->l_name)) continue;
        void *fn = lookup_in_object(lm, name);
        if (fn != NULL) return fn;
    }
    return NULL;
}

/* libc_symbol(name), looked up once and kept in *slot. */
NO_SANITIZE static void *libc_symbol_once(void *_Atomic *slot, const char *name) {
    void *fn = atomic_load_explicit(slot, memory_order_acquire);
    if (fn == NULL) {
        fn = libc_symbol(name);
        atomic_store_explicit(slot, fn, memory_order_release);
    }
    return fn;
}

NO_SANITIZE static dlsym_fn real_dlsym_fn(void) {
    return (dlsym_fn)libc_symbol_once(&g_real_dlsym, "dlsym");
}

NO_SANITIZE static dlvsym_fn real_dlvsym_fn(void) {
    return (dlvsym_fn)libc_symbol_once(&g_real_dlvsym, "dlvsym");
}

NO_SANITIZE void *vgpu_real_dlsym(void *handle, const char *name) {
    dlsym_fn fn = real_dlsym_fn();
    return fn ? fn(handle, name) : NULL;
}

static void *open_lib(const char *soname) {
    t_in_loader++;
    void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL) h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    t_in_loader--;
    return h;
}

static void load_cuda(void) {
    void *h = open_lib("libcuda.so.1");
    if (h == NULL) {
        LOG_DEBUG("libcuda.so.1 not loadable: %s", dlerror());
        return;
    }
#define HOOK_CU(name) vgpu_cu.name = (__typeof__(vgpu_cu.name))vgpu_real_dlsym(h, #name);
#define HOOK_NVML(name)
#include "hooks.def"
#undef HOOK_CU
#undef HOOK_NVML
    vgpu_cu.cuDeviceGet_ = (__typeof__(vgpu_cu.cuDeviceGet_))vgpu_real_dlsym(h, "cuDeviceGet");
    vgpu_cu.cuDeviceGetCount_ =
        (__typeof__(vgpu_cu.cuDeviceGetCount_))vgpu_real_dlsym(h, "cuDeviceGetCount");
    vgpu_cu.cuDeviceGetUuid_v2_ =
        (__typeof__(vgpu_cu.cuDeviceGetUuid_v2_))vgpu_real_dlsym(h, "cuDeviceGetUuid_v2");
    if (vgpu_cu.cuDeviceGetUuid_v2_ == NULL) /* same ABI in the v1 name */
        vgpu_cu.cuDeviceGetUuid_v2_ =
            (__typeof__(vgpu_cu.cuDeviceGetUuid_v2_))vgpu_real_dlsym(h, "cuDeviceGetUuid");
    vgpu_cu.cuCtxGetDevice_ =
        (__typeof__(vgpu_cu.cuCtxGetDevice_))vgpu_real_dlsym(h, "cuCtxGetDevice");
    atomic_store(&g_cuda_ok, true);
}

static void load_nvml(void) {
    void *h = open_lib("libnvidia-ml.so.1");
    if (h == NULL) {
        LOG_DEBUG("libnvidia-ml.so.1 not loadable: %s", dlerror());
        return;
    }
#define HOOK_CU(name)
#define HOOK_NVML(name) vgpu_nvml.name = (__typeof__(vgpu_nvml.name))vgpu_real_dlsym(h, #name);
#include "hooks.def"
#undef HOOK_CU
#undef HOOK_NVML
#define REAL(field, sym) vgpu_nvml.field = (__typeof__(vgpu_nvml.field))vgpu_real_dlsym(h, sym)
    REAL(nvmlInit_v2_, "nvmlInit_v2");
    REAL(nvmlDeviceGetHandleByUUID_, "nvmlDeviceGetHandleByUUID");
    REAL(nvmlDeviceGetUUID_, "nvmlDeviceGetUUID");
    REAL(nvmlDeviceGetUtilizationRates_, "nvmlDeviceGetUtilizationRates");
    REAL(nvmlDeviceGetProcessUtilization_, "nvmlDeviceGetProcessUtilization");
#undef REAL
    atomic_store(&g_nvml_ok, true);
}

bool vgpu_cuda_load(void) {
    if (atomic_load_explicit(&g_cuda_ok, memory_order_acquire)) return true;
    if (t_in_loader) return false;
    pthread_once(&g_cuda_once, load_cuda);
    return atomic_load(&g_cuda_ok);
}

bool vgpu_nvml_load(void) {
    if (atomic_load_explicit(&g_nvml_ok, memory_order_acquire)) return true;
    if (t_in_loader) return false;
    pthread_once(&g_nvml_once, load_nvml);
    return atomic_load(&g_nvml_ok);
}

void *vgpu_wrapper_for_real(void *real_fn) {
    if (real_fn == NULL) return NULL;
#define HOOK_CU(name) \
    if (vgpu_cu.name != NULL && (void *)vgpu_cu.name == real_fn) return (void *)&name;
#define HOOK_NVML(name) \
    if (vgpu_nvml.name != NULL && (void *)vgpu_nvml.name == real_fn) return (void *)&name;
#include "hooks.def"
#undef HOOK_CU
#undef HOOK_NVML
    return NULL;
}

NO_SANITIZE static bool is_driver_name(const char *name) {
    return name != NULL && ((name[0] == 'c' && name[1] == 'u') ||
                            (name[0] == 'n' && strncmp(name, "nvml", 4) == 0));
}

/* Wrapper of the hooked symbol with exactly this name, NULL when the name is not hooked. */
NO_SANITIZE static void *wrapper_for_name(const char *name) {
#define HOOK_CU(fn) \
    if (strcmp(name, #fn) == 0) return (void *)&fn;
#define HOOK_NVML(fn) HOOK_CU(fn)
#include "hooks.def"
#undef HOOK_CU
#undef HOOK_NVML
    return NULL;
}

/*
 * What dlsym/dlvsym hand out for a symbol the real lookup found. Mapping is by name, not by
 * pointer: dlsym may run inside a library constructor while the dynamic loader's lock is held,
 * so it must never load anything or wait for our loaders; the wrappers resolve their real
 * functions lazily on first call instead. Asking for "dlsym" or "dlvsym" (through any handle,
 * RTLD_NEXT included, or by version) yields ours, so libc's real lookup never reaches the
 * program; cu* and nvml* names yield our wrapper whatever the handle (RTLD_NEXT included: our
 * wrappers call the driver directly, so handing one to another interposer cannot loop).
 */
NO_SANITIZE static void *remap_symbol(void *sym, const char *name) {
    if (sym == NULL || name == NULL || t_in_loader) return sym;
    /* glibc before 2.34 exported its internal lookups (GLIBC_PRIVATE): a second real dlsym. */
    if (name[0] == '_' && (same_name(name, "__libc_dlsym") || same_name(name, "__libc_dlvsym") ||
                           same_name(name, "_dl_sym") || same_name(name, "_dl_vsym")))
        return NULL;
    if (name[0] == 'd') {
        if (same_name(name, "dlsym")) return (void *)&dlsym;
        if (same_name(name, "dlvsym")) return (void *)&dlvsym;
        return sym;
    }
    if (!is_driver_name(name)) return sym;
    void *wrapper = wrapper_for_name(name);
    if (wrapper == NULL || wrapper == sym) return sym;
    LOG_DEBUG("dlsym(%s) -> hook wrapper", name);
    return wrapper;
}

NO_SANITIZE VGPU_EXPORT void *dlsym(void *handle, const char *name) {
    return remap_symbol(vgpu_real_dlsym(handle, name), name);
}

NO_SANITIZE VGPU_EXPORT void *dlvsym(void *handle, const char *name, const char *version) {
    dlvsym_fn fn = real_dlvsym_fn();
    return remap_symbol(fn ? fn(handle, name, version) : NULL, name);
}

/*
 * A new link-map namespace (dlmopen LM_ID_NEWLM) gets no preloads, so a library opened into one
 * would bind its cu* calls straight to the driver. Load this library into the namespace first:
 * the first object of a namespace is the head of every later object's lookup scope there, so
 * the library's cu* and dl* references bind to the hook's copy, which enforces the same claims
 * through the same regions (its own slot). If the hook cannot be loaded there, nothing is.
 */
VGPU_EXPORT void *dlmopen(Lmid_t lmid, const char *file, int mode) {
    dlmopen_fn real = (dlmopen_fn)libc_symbol_once(&g_real_dlmopen, "dlmopen");
    if (real == NULL) return NULL;
    if (lmid != LM_ID_NEWLM || file == NULL) return real(lmid, file, mode);
    Dl_info self;
    if (dladdr((void *)&dlmopen, &self) == 0 || self.dli_fname == NULL) return NULL;
    void *hook = real(LM_ID_NEWLM, self.dli_fname, RTLD_NOW);
    Lmid_t ns;
    if (hook == NULL || dlinfo(hook, RTLD_DI_LMID, &ns) != 0) {
        LOG_ERROR("dlmopen(%s): cannot load the hook into a new namespace; refused", file);
        return NULL;
    }
    LOG_DEBUG("dlmopen(%s): hook loaded first into namespace %ld", file, (long)ns);
    return real(ns, file, mode);
}

static void map_proc(const char *symbol, void **pfn) {
    void *wrapper = vgpu_wrapper_for_real(*pfn);
    if (wrapper != NULL) {
        LOG_DEBUG("cuGetProcAddress(%s) -> hook wrapper", symbol ? symbol : "?");
        *pfn = wrapper;
    }
}

VGPU_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                         cuuint64_t flags,
                                         CUdriverProcAddressQueryResult *symbolStatus) {
    if (!vgpu_cuda_load() || vgpu_cu.cuGetProcAddress_v2 == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = vgpu_cu.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (rc == CUDA_SUCCESS && pfn != NULL) map_proc(symbol, pfn);
    return rc;
}

VGPU_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                      cuuint64_t flags) {
    if (!vgpu_cuda_load() || vgpu_cu.cuGetProcAddress == NULL) return CUDA_ERROR_NOT_FOUND;
    CUresult rc = vgpu_cu.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    if (rc == CUDA_SUCCESS && pfn != NULL) map_proc(symbol, pfn);
    return rc;
}
