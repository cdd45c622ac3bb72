/* libFuzzer harness: any bytes as a spec. Loading must end, within its time
 * limit, in specs or in an error of the form "fuzz.lua:LINE: ..."; a spec
 * that loads must derive its layout and render (source and header) without
 * error. Anything else -- a crash, a sanitizer report, a hang, a malformed
 * message -- aborts, which libFuzzer reports with the input that did it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "klgen.h"

#define TIME_MS 250        /* the sandbox's limit for one input */
#define BOUND_S 3.0        /* what a run may take in all: limit + rendering + slack */

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fail(const char *what, const char *msg, const uint8_t *data, size_t size) {
  fprintf(stderr, "fuzz_spec: %s: %s\ninput (%zu bytes): %.*s\n", what, msg, size,
          (int)(size < 400 ? size : 400), (const char *)data);
  abort();
}

/* "fuzz.lua:<digits>:" -- the location every spec error carries. */
static int located(const char *msg) {
  if (strncmp(msg, "fuzz.lua:", 9) != 0) return 0;
  const char *p = msg + 9;
  if (*p < '1' || *p > '9') return 0;
  while (*p >= '0' && *p <= '9') p++;
  return *p == ':';
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  kl_limits lim = {TIME_MS, 8 << 20};
  kl_spec_list l;
  kl_err e = {{0}};
  double t0 = seconds();
  int rc = kl_spec_load_string("fuzz.lua", (const char *)data, size, &lim, &l, &e);
  if (rc != 0) {
    if (rc != KL_ESPEC) fail("load returned an unexpected code", e.msg, data, size);
    if (!located(e.msg)) fail("error without file:line:", e.msg, data, size);
    if (l.v != NULL || l.n != 0) fail("failed load left specs", e.msg, data, size);
  }
  for (int i = 0; rc == 0 && i < l.n; i++) {
    kl_layout lay;
    char *src = NULL, *hdr = NULL;
    if (kl_layout_derive(&l.v[i], &lay, &e) != 0) fail("validated spec has no layout", e.msg, data, size);
    if (kl_render(&l.v[i], &lay, NULL, &src, &e) != 0) fail("render", e.msg, data, size);
    if (kl_render_header(&l.v[i], &lay, src, NULL, &hdr, &e) != 0) fail("header", e.msg, data, size);
    free(src);
    free(hdr);
  }
  kl_spec_list_free(&l);
  double dt = seconds() - t0;
  if (dt > BOUND_S) {
    char m[64];
    snprintf(m, sizeof m, "took %.2f s (limit %d ms)", dt, TIME_MS);
    fail("over the time bound", m, data, size);
  }
  return 0;
}
