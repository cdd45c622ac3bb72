/* Error formatting shared by every module of libklgen. */
#include <stdarg.h>
#include <stdio.h>

#include "klgen.h"

int kl_fail(kl_err *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

int kl_spec_fail(kl_err *err, const kl_spec *s, kl_field f, const char *fmt, ...) {
  if (!err) return KL_ESPEC;
  int n;
  if (s->file[0] && s->line[f] > 0)
    n = snprintf(err->msg, sizeof err->msg, "%s:%d: %s: ", s->file, s->line[f], kl_field_names[f]);
  else
    n = snprintf(err->msg, sizeof err->msg, "%s: %s: ", s->file[0] ? s->file : s->name,
                 kl_field_names[f]);
  if (n < 0 || (size_t)n >= sizeof err->msg) return KL_ESPEC;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
  va_end(ap);
  return KL_ESPEC;
}
