/* libFuzzer harness: any bytes as a spec. Loading must end, within the
 * bound the loader documents (its time limit + 1 s), in specs or in an
 * error of the form "fuzz.lua:LINE: ..."; a spec that loads must derive its
 * layout and render (source and header), each rendering within its own
 * sandbox's limit + 1 s. Anything else -- a crash, a sanitizer report, a
 * hang, a malformed message, a bound missed -- aborts, which libFuzzer
 * reports with the input that did it. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "klgen.h"

#define TIME_MS 250   /* the spec's limit here: short, so hostile inputs cost little */
/* What a load may take past its limit here: plain builds end a spec within
 * 1.5 times its limit (docs/design/spec.md); ASan and the fuzzer's coverage
 * slow the C work between two clock reads, and the state's close. */
#define SLACK_S 1.0

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void fail(const char *what, const char *msg, const uint8_t *data, size_t size) {
  char shown[1700];
  kl_escape((const char *)data, size < 400 ? size : 400, shown, sizeof shown, 1);
  fprintf(stderr, "fuzz_spec: %s: %s\ninput (%zu bytes): %s\n", what, msg, size, shown);
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

static void check_time(double t0, double limit_s, const char *what, const uint8_t *data,
                       size_t size) {
  double dt = seconds() - t0;
  if (dt <= limit_s + SLACK_S) return;
  char m[96];
  snprintf(m, sizeof m, "took %.2f s (limit %.2f s + %.1f s)", dt, limit_s, SLACK_S);
  fail(what, m, data, size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* the documented memory cap; a short time limit */
  kl_limits lim = {TIME_MS, KL_SPEC_MEM_BYTES};
  kl_spec_list l;
  kl_err e = {{0}};
  double t0 = seconds();
  int rc = kl_spec_load_string("fuzz.lua", (const char *)data, size, &lim, &l, &e);
  check_time(t0, TIME_MS / 1000.0, "load over its time bound", data, size);
  if (rc != 0) {
    if (rc != KL_ESPEC) fail("load returned an unexpected code", e.msg, data, size);
    if (!located(e.msg)) fail("error without file:line:", e.msg, data, size);
    if (l.v != NULL || l.n != 0) fail("failed load left specs", e.msg, data, size);
  }
  for (int i = 0; rc == 0 && i < l.n; i++) {
    kl_layout lay;
    char *src = NULL, *hdr = NULL;
    if (kl_layout_derive(&l.v[i], &lay, &e) != 0) fail("validated spec has no layout", e.msg, data, size);
    t0 = seconds();
    if (kl_render(&l.v[i], &lay, NULL, &src, &e) != 0) fail("render", e.msg, data, size);
    check_time(t0, KL_SPEC_TIME_MS / 1000.0, "render over its time bound", data, size);
    t0 = seconds();
    if (kl_render_header(&l.v[i], &lay, src, NULL, &hdr, &e) != 0) fail("header", e.msg, data, size);
    check_time(t0, KL_SPEC_TIME_MS / 1000.0, "header over its time bound", data, size);
    free(src);
    free(hdr);
  }
  kl_spec_list_free(&l);
  return 0;
}
