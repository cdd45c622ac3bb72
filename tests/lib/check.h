/* The tests' checks: CHECK(cond, fmt, ...) records a failure and goes on;
 * CHECK_KL is CHECK for a libklrt call, its message followed by libklrt's
 * last error (the file using it includes klrt.h); check_done() prints
 * "N passed, N failed" and gives the exit status. */
#ifndef KL_CHECK_H
#define KL_CHECK_H

#include <stdio.h>

static int check_pass, check_fail;

/* tail: what is printed after the message, a statement */
#define CHECK_THEN(cond, tail, ...)                            \
  do {                                                         \
    if (cond) {                                                \
      check_pass++;                                            \
    } else {                                                   \
      check_fail++;                                            \
      fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);    \
      fprintf(stderr, __VA_ARGS__);                            \
      tail;                                                    \
      fprintf(stderr, "\n");                                   \
    }                                                          \
  } while (0)
#define CHECK(cond, ...) CHECK_THEN(cond, (void)0, __VA_ARGS__)
#define CHECK_KL(cond, ...) \
  CHECK_THEN(cond, fprintf(stderr, " (last error: %s)", kl_last_error()), __VA_ARGS__)

static inline int check_done(void) {
  printf("%d passed, %d failed\n", check_pass, check_fail);
  return check_fail ? 1 : 0;
}

#endif
