/*
 * cuda_bypass - allocate device memory around any interposer and hold it: a tenant that gets
 * past vgpu_hook, for tests of node-side enforcement (which must catch it from NVML alone).
 *
 *   cuda_bypass ORDINAL BYTES SECONDS
 * Sets up a context through the ordinary entry points (an interposer sees those), then allocates
 * BYTES with the driver's own cuMemAlloc_v2, found the way a determined program finds it without
 * any dl* call: walking the loader's object list to libcuda and reading libcuda's dynamic symbol
 * table itself (docs/security.md: a path only node-side enforcement catches). Prints
 * "ready <bytes>" and holds the memory for SECONDS - it needs no stdin, so it can be a pod's
 * command - then exits 0. A failed allocation prints "error ..." and exits 3.
 */
#include "cuda_prog.h"

#include <link.h>
#include <string.h>
#include <unistd.h>

typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);

/* libcuda's own definition of `name` (not whatever the loader binds first). A linear scan of the
 * symbol table up to the string table, which follows it in every libcuda built here. */
static void *driver_symbol(const char *name)
{
    for (struct link_map *lm = _r_debug.r_map; lm != NULL; lm = lm->l_next) {
        if (lm->l_name == NULL || strstr(lm->l_name, "libcuda.so") == NULL)
            continue;
        const ElfW(Sym) *symtab = NULL;
        const char *strtab = NULL;
        for (const ElfW(Dyn) *d = lm->l_ld; d->d_tag != DT_NULL; d++) {
            if (d->d_tag == DT_SYMTAB)
                symtab = (const ElfW(Sym) *)d->d_un.d_ptr;
            if (d->d_tag == DT_STRTAB)
                strtab = (const char *)d->d_un.d_ptr;
        }
        if (symtab == NULL || strtab == NULL)
            continue;
        for (const ElfW(Sym) *s = symtab; (const char *)s < strtab; s++)
            if (s->st_value != 0 && strcmp(strtab + s->st_name, name) == 0)
                return (void *)(lm->l_addr + s->st_value);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: cuda_bypass ORDINAL BYTES SECONDS\n");
        return 2;
    }
    prog_context(atoi(argv[1]));
    unsigned long long bytes = strtoull(argv[2], NULL, 0);
    void *sym = driver_symbol("cuMemAlloc_v2");
    if (sym == NULL) {
        printf("error libcuda's cuMemAlloc_v2 not found\n");
        return 3;
    }
    alloc_fn alloc;
    memcpy(&alloc, &sym, sizeof(alloc));
    CUdeviceptr p;
    CU_OK(alloc(&p, (size_t)bytes));
    printf("ready %llu\n", bytes);
    fflush(stdout);
    unsigned int seconds = (unsigned int)strtoul(argv[3], NULL, 10);
    while (seconds > 0)
        seconds = sleep(seconds);
    return 0;
}
