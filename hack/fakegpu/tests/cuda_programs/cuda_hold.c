/*
 * cuda_hold - allocate device memory and hold it until told to stop.
 *
 *   cuda_hold ORDINAL BYTES [free]
 * Prints "ready <bytes>" once the allocation succeeded, then waits for a line (or EOF) on stdin;
 * with "free" it frees the memory before exiting, else it exits holding it (the driver's exit
 * handling must return it). A failed allocation prints "error ... CUDA_ERROR_..." and exits 3.
 * Tests SIGKILL it while it waits to prove a killed process's memory is reclaimed.
 */
#include "cuda_prog.h"

#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: cuda_hold ORDINAL BYTES [free]\n");
        return 2;
    }
    prog_context(atoi(argv[1]));
    unsigned long long bytes = strtoull(argv[2], NULL, 0);
    CUdeviceptr p;
    CU_OK(cuMemAlloc_v2(&p, (size_t)bytes));
    printf("ready %llu\n", bytes);
    fflush(stdout);
    char line[16];
    (void)fgets(line, sizeof(line), stdin);
    if (argc > 3 && strcmp(argv[3], "free") == 0) CU_OK(cuMemFree_v2(p));
    return 0;
}
