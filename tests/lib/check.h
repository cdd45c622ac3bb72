/* A minimal test harness: CHECK(cond, fmt, ...) records a failure and goes on;
 * check_done() prints "N passed, N failed" and gives the exit status. */
#ifndef KL_CHECK_H
#define KL_CHECK_H

#include <stdio.h>

static int check_pass, check_fail;

#define CHECK(cond, ...)                                       \
  do {                                                         \
    if (cond) {                                                \
      check_pass++;                                            \
    } else {                                                   \
      check_fail++;                                            \
      fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);    \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, "\n");                                   \
    }                                                          \
  } while (0)

static inline int check_done(void) {
  printf("%d passed, %d failed\n", check_pass, check_fail);
  return check_fail ? 1 : 0;
}

#endif
