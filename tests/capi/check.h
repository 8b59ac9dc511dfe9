/* The check macro of the C API tests: counts checks, and exits 1 at the first that fails. */
#ifndef EPX_TESTS_CHECK_H
#define EPX_TESTS_CHECK_H

#include <stdio.h>
#include <stdlib.h>

static int checks = 0;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__);                                 \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
