/* Finds the line of each `field =` in a spec's text. Lua tables keep no line
 * numbers, yet an error must name the line a spec author has to fix; a light
 * lexer that skips comments and strings is enough to find assignments. */
#include "srcscan.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* Length of a long bracket opener "[==[" at p (0 if none); *level gets the '='s. */
static size_t long_open(const char *p, const char *end, int *level) {
  if (p >= end || *p != '[') return 0;
  const char *q = p + 1;
  while (q < end && *q == '=') q++;
  if (q >= end || *q != '[') return 0;
  *level = (int)(q - p - 1);
  return (size_t)(q - p + 1);
}

/* Skips past the matching "]==]"; counts newlines. */
static const char *long_close(const char *p, const char *end, int level, int *line) {
  for (; p < end; p++) {
    if (*p == '\n') (*line)++;
    if (*p != ']') continue;
    const char *q = p + 1;
    int n = 0;
    while (q < end && *q == '=') q++, n++;
    if (n == level && q < end && *q == ']') return q + 1;
  }
  return end;
}

static const char *skip_string(const char *p, const char *end, int *line) {
  char quote = *p++;
  while (p < end && *p != quote) {
    if (*p == '\\' && p + 1 < end) {
      if (p[1] == '\n') (*line)++;
      p += 2;
      continue;
    }
    if (*p == '\n') (*line)++; /* unfinished string: Lua reports it anyway */
    p++;
  }
  return p < end ? p + 1 : end;
}

static int push(kl_srcscan *s, const char *id, size_t n, int line) {
  if (s->n == s->cap) {
    int cap = s->cap ? s->cap * 2 : 64;
    kl_assign *v = realloc(s->v, (size_t)cap * sizeof *v);
    if (!v) return -1;
    s->v = v, s->cap = cap;
  }
  kl_assign *a = &s->v[s->n++];
  if (n >= sizeof a->name) n = sizeof a->name - 1;
  memcpy(a->name, id, n);
  a->name[n] = 0;
  a->line = line;
  return 0;
}

/* After an identifier: is the next token a single '='? */
static int is_assign(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
  return p < end && *p == '=' && !(p + 1 < end && p[1] == '=');
}

int kl_srcscan_run(kl_srcscan *s, const char *src, size_t len) {
  memset(s, 0, sizeof *s);
  const char *p = src, *end = src + len;
  int line = 1, level;
  size_t k;
  while (p < end) {
    if (*p == '\n') {
      line++, p++;
    } else if (p + 1 < end && p[0] == '-' && p[1] == '-') {
      p += 2;
      if ((k = long_open(p, end, &level)) != 0) {
        p = long_close(p + k, end, level, &line);
      } else {
        while (p < end && *p != '\n') p++;
      }
    } else if (*p == '"' || *p == '\'') {
      p = skip_string(p, end, &line);
    } else if ((k = long_open(p, end, &level)) != 0) {
      p = long_close(p + k, end, level, &line);
    } else if (isalpha((unsigned char)*p) || *p == '_') {
      const char *id = p;
      while (p < end && (isalnum((unsigned char)*p) || *p == '_')) p++;
      size_t n = (size_t)(p - id);
      if (n == 6 && memcmp(id, "return", 6) == 0 && s->return_line == 0)
        s->return_line = line;
      else if (is_assign(p, end) && push(s, id, n, line) != 0)
        return -1;
    } else {
      p++;
    }
  }
  return 0;
}

int kl_srcscan_line(const kl_srcscan *s, const char *field, int index, int count) {
  int seen = 0, first = 0, match = 0;
  for (int i = 0; i < s->n; i++) {
    if (strcmp(s->v[i].name, field) != 0) continue;
    if (seen == 0) first = s->v[i].line;
    if (seen == index) match = s->v[i].line;
    seen++;
  }
  /* One assignment per spec (a literal list): the index-th is this spec's.
   * Otherwise (a loop, a helper) the first one is where the value is written. */
  if (seen == count && match) return match;
  return first;
}

void kl_srcscan_free(kl_srcscan *s) {
  free(s->v);
  memset(s, 0, sizeof *s);
}
