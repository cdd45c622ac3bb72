/* Error formatting shared by every module of libklgen. */
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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

int kl_name_equal_nocase(const char *a, const char *b) {
  for (; *a && *b; a++, b++)
    if (tolower((unsigned char)*a) != tolower((unsigned char)*b)) return 0;
  return *a == *b;
}

/* The file's base name with anything but [A-Za-z0-9._-] turned into '_':
 * what generated files may say about where they came from. A path is the
 * caller's business (and could carry a newline or a comment terminator). */
void kl_file_label(const char *path, char *buf, size_t n) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t k = 0;
  for (; base[k] && k + 1 < n; k++) {
    unsigned char ch = (unsigned char)base[k];
    buf[k] = (isalnum(ch) && ch < 0x80) || ch == '.' || ch == '_' || ch == '-' ? (char)ch : '_';
  }
  buf[k] = 0;
  if (k == 0) snprintf(buf, n, "spec");
}
