/* check.h - tiny assertion helpers for the C unit tests (no framework dependency). */
#ifndef VGPU_CHECK_H
#define VGPU_CHECK_H
#include <stdio.h>
#include <stdlib.h>

static int check_failures;
static int check_passes;

#define CHECK(cond)                                                                 \
    do {                                                                            \
        if (cond) {                                                                 \
            check_passes++;                                                         \
        } else {                                                                    \
            check_failures++;                                                       \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                           \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                              \
    do {                                                                                \
        unsigned long long a_ = (unsigned long long)(a), b_ = (unsigned long long)(b);  \
        if (a_ == b_) {                                                                 \
            check_passes++;                                                             \
        } else {                                                                        \
            check_failures++;                                                           \
            fprintf(stderr, "%s:%d: %s == %s failed: %llu != %llu\n", __FILE__, __LINE__, \
                    #a, #b, a_, b_);                                                    \
        }                                                                               \
    } while (0)

#define CHECK_DONE()                                                                   \
    do {                                                                               \
        printf("%s: %d checks passed, %d failed\n", __FILE__, check_passes, check_failures); \
        return check_failures ? 1 : 0;                                                 \
    } while (0)
#endif
