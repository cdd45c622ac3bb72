/* Errors are return codes plus a per-thread message; the library prints only
 * through the opt-in log (KLGEN_LOG=1), on stderr. Both carry what callers,
 * specs and the file system said (names, paths): control bytes come out as
 * \xHH (kl_escape), so a message is one line that cannot drive a terminal. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

static _Thread_local char last[1024];

kl_result kl_rt_fail(kl_result r, const char *fmt, ...) {
  char raw[sizeof last];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  kl_escape(raw, strlen(raw), last, sizeof last, 0);
  if (kl_log_enabled()) kl_log("error: %s: %s", kl_result_name(r), last);
  return r;
}

const char *kl_last_error(void) { return last; }

const char *kl_result_name(kl_result r) {
  static const char *const names[] = {"KLRT_OK",      "KLRT_EINVAL",       "KLRT_ESPEC",
                                      "KLRT_ENODRIVER", "KLRT_ECUDA",      "KLRT_ENCCL",
                                      "KLRT_EDEVICE", "KLRT_EUNAVAILABLE", "KLRT_ENOMEM",
                                      "KLRT_ESTATE", "KLRT_EBUSY"};
  return (unsigned)r < sizeof names / sizeof *names ? names[r] : "KLRT_?";
}

const char *kl_decline_name(kl_decline d) {
  static const char *const names[] = {"disabled", "not-ready", "tokens", "size"};
  return (unsigned)d < KL_DECLINE_COUNT ? names[d] : "?";
}

/* Read once: the hot path asks on every call. */
static int log_on = -1;
int kl_log_enabled(void) {
  if (log_on < 0) log_on = (int)kl_param_int(KL_P_LOG, NULL);
  return log_on;
}

void kl_log(const char *fmt, ...) {
  char raw[1200], shown[1200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(raw, sizeof raw, fmt, ap);
  va_end(ap);
  fprintf(stderr, "[klgen] %s\n", kl_escape(raw, strlen(raw), shown, sizeof shown, 0));
}
