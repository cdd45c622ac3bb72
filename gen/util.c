/* Error formatting shared by every module of libklgen. */
#include <ctype.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "klgen.h"

/* Bytes of the UTF-8 sequence at p (at most len), or 0 if it is not one a
 * terminal should see: malformed, overlong, a surrogate, past U+10FFFF, or
 * a C1 control (U+0080..U+009F, which some terminals obey). */
static size_t utf8_printable(const unsigned char *p, size_t len) {
  size_t n = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : p[0] >= 0xc0 ? 2 : 0;
  if (n == 0 || n > len || p[0] > 0xf4) return 0;
  uint32_t c = p[0] & (0x7f >> n);
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0;
    c = c << 6 | (p[i] & 0x3f);
  }
  static const uint32_t least[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < least[n] || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff) || c < 0xa0) return 0;
  return n;
}

char *kl_escape(const char *p, size_t len, char *buf, size_t n, int keep_newlines) {
  const unsigned char *u = (const unsigned char *)p;
  size_t k = 0;
  for (size_t i = 0; i < len && k + 1 < n;) {
    size_t run;
    if (u[i] >= 0x80) run = utf8_printable(u + i, len - i);
    else run = (u[i] >= 0x20 && u[i] != 0x7f) || (keep_newlines && u[i] == '\n');
    if (run == 0) { /* one byte as \xHH */
      if (k + 5 > n) break;
      snprintf(buf + k, 5, "\\x%02x", u[i]);
      k += 4, i++;
    } else {
      if (k + run + 1 > n) break;
      memcpy(buf + k, u + i, run);
      k += run, i += run;
    }
  }
  buf[k] = 0;
  return buf;
}

/* err->msg from what the format makes, every control byte escaped (see
 * kl_escape): a message can carry a spec's text, a key or a path. */
static void set_message(kl_err *err, const char *prefix, int keep_newlines, const char *fmt,
                        va_list ap) {
  char raw[KL_ERR_MAX];
  size_t n = (size_t)snprintf(raw, sizeof raw, "%s", prefix);
  if (n < sizeof raw) vsnprintf(raw + n, sizeof raw - n, fmt, ap);
  kl_escape(raw, strlen(raw), err->msg, sizeof err->msg, keep_newlines);
}

int kl_fail(kl_err *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    set_message(err, "", 0, fmt, ap);
    va_end(ap);
  }
  return code;
}

int kl_fail_log(kl_err *err, int code, const char *fmt, ...) {
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    set_message(err, "", 1, fmt, ap);
    va_end(ap);
  }
  return code;
}

int kl_spec_fail(kl_err *err, const kl_spec *s, kl_field f, const char *fmt, ...) {
  if (!err) return KL_ESPEC;
  char prefix[sizeof s->file + 80];
  if (s->file[0] && s->line[f] > 0)
    snprintf(prefix, sizeof prefix, "%s:%d: %s: ", s->file, s->line[f], kl_field_names[f]);
  else
    snprintf(prefix, sizeof prefix, "%s: %s: ", s->file[0] ? s->file : s->name,
             kl_field_names[f]);
  va_list ap;
  va_start(ap, fmt);
  set_message(err, prefix, 0, fmt, ap);
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
