/*
 * check.h - THE assertion helpers of the project's C tests (vgpu_hook/tests and, through
 * hack/fakegpu/tests/testutil.h, the simulated GPUs' tests). One semantics everywhere:
 *
 *   CHECK(cond), CHECK_EQ_U64(a, b)
 *       on success count a pass; on failure print `file:line: CHECK failed: ...` (with both
 *       values for CHECK_EQ_U64) and end the calling process with exit status 1.
 *   CHECK_DONE()
 *       from main: print the number of passed checks and return 0 (any failure already exited).
 *
 * A failure is fatal because tests fork: a child that checks and then _exit(0)s would otherwise
 * lose its failure, and a failed precondition (a NULL file, a failed mmap) would run on into a
 * crash that hides the real message. Forked children report through their exit status, which
 * the parent CHECKs.
 */
#ifndef VGPU_CHECK_H
#define VGPU_CHECK_H
#include <stdio.h>
#include <stdlib.h>

static int check_passes;

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (cond) {                                                                     \
            check_passes++;                                                             \
        } else {                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);    \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                              \
    do {                                                                                \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);  \
        if (a_ == b_) {                                                                 \
            check_passes++;                                                             \
        } else {                                                                        \
            fprintf(stderr, "%s:%d: CHECK failed: %s == %s (%llu != %llu)\n", __FILE__, \
                    __LINE__, #a, #b, a_, b_);                                          \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

#define CHECK_DONE()                                                        \
    do {                                                                    \
        printf("%s: %d checks passed\n", __FILE__, check_passes);           \
        return 0;                                                           \
    } while (0)
#endif
