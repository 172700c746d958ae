/* check.h - the CHECK macro of the C unit tests: a false condition prints
 * file:line and a message, is counted in `failures`, and the test goes on
 * (main returns failures != 0). Included by one test file per binary. */
#ifndef DF_TEST_CHECK_H
#define DF_TEST_CHECK_H
#include <stdio.h>

static int failures;
#define CHECK(c, ...)                                                   \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                               \
            fputc('\n', stderr);                                        \
            failures++;                                                 \
        }                                                               \
    } while (0)

#endif
