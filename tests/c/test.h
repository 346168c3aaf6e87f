/* test.h - a tiny C test harness shared by the runtime's tests.
 * Each test binary ends by printing "N passed, N failed" and exits non-zero on failure. */
#ifndef TPU_TEST_H
#define TPU_TEST_H
#include <stdio.h>
#include <string.h>
#include <stdlib.h>

static int test_passed, test_failed, test_cur_failed;
static const char *test_cur_name;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL %s:%d in %s: %s\n", __FILE__, __LINE__, test_cur_name, #cond); \
            test_cur_failed = 1;                                                                   \
        }                                                                                          \
    } while (0)
#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "  FAIL %s:%d in %s: %s: ", __FILE__, __LINE__, test_cur_name, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            test_cur_failed = 1;                                                                   \
        }                                                                                          \
    } while (0)
#define CHECK_OK(expr)                                                                                       \
    do {                                                                                                     \
        tpu_status s__ = (expr);                                                                             \
        if (s__ != TPU_OK) {                                                                                 \
            fprintf(stderr, "  FAIL %s:%d in %s: %s -> %s (%s)\n", __FILE__, __LINE__, test_cur_name, #expr, \
                    tpu_status_name(s__), tpu_last_error());                                                 \
            test_cur_failed = 1;                                                                             \
        }                                                                                                    \
    } while (0)

#define RUN_TEST(fn)                  \
    do {                              \
        test_cur_name = #fn;          \
        test_cur_failed = 0;          \
        fn();                         \
        if (test_cur_failed) {        \
            test_failed++;            \
            printf("FAIL %s\n", #fn); \
        } else {                      \
            test_passed++;            \
            printf("ok   %s\n", #fn); \
        }                             \
        fflush(stdout);               \
    } while (0)

#define TEST_SUMMARY() (printf("%d passed, %d failed\n", test_passed, test_failed), test_failed ? 1 : 0)
#endif
