/*
 * bypass_probe - tries one way of reaching the driver's real cuMemAlloc_v2 (the paths listed in
 * docs/security.md) and allocates with it; run in a container of a claim whose cap is below the
 * request. Prints "<path> rc=<CUresult>": rc=2 (CUDA_ERROR_OUT_OF_MEMORY) means the hook's cap
 * held, rc=0 means the path reached the driver uncapped.
 *
 * usage: bypass_probe PATH BYTES [ARG]
 *   dlsym-handle | dlsym-default | dlsym-next | dlvsym | dlvsym-dlsym | dlsym-next-dlsym |
 *   libc-dlsym | abspath ARG=<libcuda path> | procaddr | dlmopen | dlmopen-helper ARG=<helper.so>
 *   | deepbind-helper ARG=<helper.so> | elf-walk
 */
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);
typedef int (*helper_fn)(size_t);

static void *cuda;

/* Context set-up through ordinary lookups (not under test). */
static int setup(void) {
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(cuda, "cuInit");
    CUresult (*get)(int *, int) = (CUresult(*)(int *, int))dlsym(cuda, "cuDeviceGet");
    CUresult (*retain)(CUcontext *, int) =
        (CUresult(*)(CUcontext *, int))dlsym(cuda, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(CUcontext) = (CUresult(*)(CUcontext))dlsym(cuda, "cuCtxSetCurrent");
    int dev = 0;
    CUcontext ctx = NULL;
    if (!init || !get || !retain || !set) return -1;
    if (init(0) || get(&dev, 0) || retain(&ctx, dev) || set(ctx)) return -1;
    return 0;
}

/* What a determined program can do without any dl* call: walk the loader's object list and
 * read libcuda's dynamic symbol table itself (DT_HASH/DT_GNU_HASH-free linear scan of the
 * symbol table up to the string table, enough for a test). */
static void *elf_walk(const char *name) {
    for (struct link_map *lm = _r_debug.r_map; lm != NULL; lm = lm->l_next) {
        if (lm->l_name == NULL || strstr(lm->l_name, "libcuda.so") == NULL) continue;
        const ElfW(Sym) *symtab = NULL;
        const char *strtab = NULL;
        for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
            if (d->d_tag == DT_SYMTAB) symtab = (const ElfW(Sym) *)d->d_un.d_ptr;
            if (d->d_tag == DT_STRTAB) strtab = (const char *)d->d_un.d_ptr;
        }
        if (symtab == NULL || strtab == NULL) continue;
        for (const ElfW(Sym) *s = symtab; (const char *)s < strtab; s++)
            if (s->st_value != 0 && strcmp(strtab + s->st_name, name) == 0)
                return (void *)(lm->l_addr + s->st_value);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bypass_probe PATH BYTES [ARG]\n");
        return 2;
    }
    const char *path = argv[1];
    size_t bytes = strtoull(argv[2], NULL, 0);
    const char *arg = argc > 3 ? argv[3] : NULL;
    const char *sym = "cuMemAlloc_v2";
    cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (cuda == NULL || setup() != 0) {
        printf("%s setup failed: %s\n", path, dlerror());
        return 2;
    }
    alloc_fn fn = NULL;
    if (strcmp(path, "dlsym-handle") == 0) {
        fn = (alloc_fn)dlsym(cuda, sym);
    } else if (strcmp(path, "dlsym-default") == 0) {
        fn = (alloc_fn)dlsym(RTLD_DEFAULT, sym);
    } else if (strcmp(path, "dlsym-next") == 0) {
        fn = (alloc_fn)dlsym(RTLD_NEXT, sym);
    } else if (strcmp(path, "dlvsym") == 0) {
        fn = (alloc_fn)dlvsym(cuda, sym, "GLIBC_2.2.5");
        if (fn == NULL) fn = (alloc_fn)dlvsym(cuda, sym, "libcuda.so.1");
    } else if (strcmp(path, "dlvsym-dlsym") == 0) {
        dlsym_fn real = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
        if (real == NULL) real = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
        if (real == NULL) real = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        fn = real ? (alloc_fn)real(cuda, sym) : NULL;
    } else if (strcmp(path, "dlsym-next-dlsym") == 0) {
        dlsym_fn real = (dlsym_fn)dlsym(RTLD_NEXT, "dlsym");
        fn = real ? (alloc_fn)real(cuda, sym) : NULL;
    } else if (strcmp(path, "libc-dlsym") == 0) {
        void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
        dlsym_fn real = libc ? (dlsym_fn)dlsym(libc, "dlsym") : NULL;
        dlvsym_fn realv = libc ? (dlvsym_fn)dlsym(libc, "dlvsym") : NULL;
        fn = real ? (alloc_fn)real(cuda, sym) : NULL;
        if (fn != NULL && realv != NULL && (alloc_fn)realv(cuda, sym, "GLIBC_2.2.5") != fn &&
            realv(cuda, sym, "GLIBC_2.2.5") != NULL)
            fn = (alloc_fn)realv(cuda, sym, "GLIBC_2.2.5");
    } else if (strcmp(path, "abspath") == 0 && arg != NULL) {
        void *h = dlopen(arg, RTLD_NOW | RTLD_LOCAL);
        fn = h ? (alloc_fn)dlsym(h, sym) : NULL;
    } else if (strcmp(path, "procaddr") == 0) {
        CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) =
            (CUresult(*)(const char *, void **, int, unsigned long long, int *))dlsym(
                cuda, "cuGetProcAddress_v2");
        void *p = NULL;
        int status = 0;
        if (gpa && gpa("cuMemAlloc", &p, 12000, 0, &status) == 0) fn = (alloc_fn)p;
    } else if (strcmp(path, "dlmopen") == 0) {
        void *h = dlmopen(LM_ID_NEWLM, "libcuda.so.1", RTLD_NOW);
        fn = h ? (alloc_fn)dlsym(h, sym) : NULL;
    } else if ((strcmp(path, "dlmopen-helper") == 0 || strcmp(path, "deepbind-helper") == 0) &&
               arg != NULL) {
        void *h = path[0] == 'd' && path[1] == 'l'
                      ? dlmopen(LM_ID_NEWLM, arg, RTLD_NOW)
                      : dlopen(arg, RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
        helper_fn helper = h ? (helper_fn)dlsym(h, "bypass_helper_alloc") : NULL;
        if (helper == NULL) {
            printf("%s lookup failed: %s\n", path, dlerror());
            return 2;
        }
        printf("%s rc=%d\n", path, helper(bytes));
        return 0;
    } else if (strcmp(path, "elf-walk") == 0) {
        fn = (alloc_fn)elf_walk(sym);
    } else {
        fprintf(stderr, "bypass_probe: unknown path %s\n", path);
        return 2;
    }
    if (fn == NULL) {
        printf("%s lookup failed\n", path);
        return 2;
    }
    CUdeviceptr ptr = 0;
    printf("%s rc=%d\n", path, fn(&ptr, bytes));
    return 0;
}
