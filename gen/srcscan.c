/* Finds the line of each `field =` in a spec's text. Lua tables keep no line
 * numbers, yet an error must name the line a spec author has to fix; a light
 * lexer that skips comments and strings is enough to find assignments, and
 * the names `_ENV` (the text has parsed: tokens are Lua's). */
#include "srcscan.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

/* Lua's line breaks: '\n' or '\r', and "\r\n" or "\n\r" as one. */
static int is_newline(char c) { return c == '\n' || c == '\r'; }
static const char *skip_newline(const char *p, const char *end, int *line) {
  const char c = *p++;
  if (p < end && is_newline(*p) && *p != c) p++;
  (*line)++;
  return p;
}

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
  while (p < end) {
    if (is_newline(*p)) {
      p = skip_newline(p, end, line);
      continue;
    }
    if (*p++ != ']') continue;
    const char *q = p;
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
      p = is_newline(p[1]) ? skip_newline(p + 1, end, line) : p + 2;
      continue;
    }
    if (is_newline(*p)) { /* unfinished string: Lua reports it anyway */
      p = skip_newline(p, end, line);
      continue;
    }
    p++;
  }
  return p < end ? p + 1 : end;
}

/* After an identifier: is the next token a single '='? */
static int is_assign(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  return p < end && *p == '=' && !(p + 1 < end && p[1] == '=');
}

/* What scan reports: a `return`, an `id =`, or the variable `_ENV` (a
 * name not after `.` or `:`, where it would be a field or a method). */
enum { SEEN_RETURN, SEEN_ASSIGN, SEEN_ENV };

/* Calls visit(id, n, line, seen, ud) for each of those, in order; stops at
 * a nonzero return. */
typedef int (*visit_fn)(const char *id, size_t n, int line, int seen, void *ud);

/* The kind of an identifier at id (n bytes), followed by p; -1: none. */
static int seen_as(const char *id, size_t n, const char *p, const char *end, int after_dot) {
  if (n == 4 && memcmp(id, "_ENV", 4) == 0 && !after_dot) return SEEN_ENV;
  if (is_assign(p, end)) return SEEN_ASSIGN;
  return n == 6 && memcmp(id, "return", 6) == 0 ? SEEN_RETURN : -1;
}

static int scan(const char *src, size_t len, visit_fn visit, void *ud) {
  const char *p = src, *end = src + len;
  int line = 1, level, rc, seen;
  int after_dot = 0; /* the last token is a single '.' or ':' */
  size_t k;
  while (p < end) {
    if (is_newline(*p)) {
      p = skip_newline(p, end, &line);
    } else if (p + 1 < end && p[0] == '-' && p[1] == '-') {
      p += 2;
      if ((k = long_open(p, end, &level)) != 0) {
        p = long_close(p + k, end, level, &line);
      } else {
        while (p < end && !is_newline(*p)) p++;
      }
    } else if (*p == '"' || *p == '\'') {
      p = skip_string(p, end, &line);
      after_dot = 0;
    } else if ((k = long_open(p, end, &level)) != 0) {
      p = long_close(p + k, end, level, &line);
      after_dot = 0;
    } else if (isalpha((unsigned char)*p) || *p == '_') {
      const char *id = p;
      while (p < end && (isalnum((unsigned char)*p) || *p == '_')) p++;
      size_t n = (size_t)(p - id);
      if ((seen = seen_as(id, n, p, end, after_dot)) >= 0 &&
          (rc = visit(id, n, line, seen, ud)) != 0)
        return rc;
      after_dot = 0;
    } else if (*p == '.' || *p == ':') {
      const char *run = p;
      while (p < end && *p == *run) p++;
      after_dot = p - run == 1;
    } else {
      after_dot = after_dot && (*p == ' ' || *p == '\t' || *p == '\f' || *p == '\v');
      p++;
    }
  }
  return 0;
}

static int push(kl_lines *l, int line) {
  if (l->n == l->cap) {
    int cap = l->cap ? l->cap * 2 : 8;
    int *v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) return -1;
    l->v = v, l->cap = cap;
  }
  l->v[l->n++] = line;
  return 0;
}

static int index_field(const char *id, size_t n, int line, int seen, void *ud) {
  kl_srcscan *s = ud;
  if (seen == SEEN_ENV) {
    if (s->env_line == 0) s->env_line = line;
    return 0;
  }
  if (seen == SEEN_RETURN) {
    if (s->return_line == 0) s->return_line = line;
    return 0;
  }
  for (int f = 0; f < KL_F_COUNT; f++)
    if (strlen(kl_field_names[f]) == n && memcmp(id, kl_field_names[f], n) == 0)
      return push(&s->field[f], line);
  return 0;
}

int kl_srcscan_run(kl_srcscan *s, const char *src, size_t len) {
  memset(s, 0, sizeof *s);
  s->src = src, s->len = len;
  return scan(src, len, index_field, s);
}

/* One assignment per spec (a literal list): the index-th is this spec's.
 * Otherwise (a loop, a helper) the first one is where the value is written. */
static int pick(const kl_lines *l, int index, int count) {
  if (l->n == 0) return 0;
  return l->n == count && index < count ? l->v[index] : l->v[0];
}

int kl_srcscan_line(const kl_srcscan *s, kl_field f, int index, int count) {
  return pick(&s->field[f], index, count);
}

typedef struct name_query {
  const char *name;
  size_t n;
  kl_lines lines;
} name_query;

static int collect_name(const char *id, size_t n, int line, int seen, void *ud) {
  name_query *q = ud;
  if (seen != SEEN_ASSIGN || n != q->n || memcmp(id, q->name, n) != 0) return 0;
  return push(&q->lines, line);
}

int kl_srcscan_name(const kl_srcscan *s, const char *name, size_t n, int index, int count) {
  name_query q = {name, n, {NULL, 0, 0}};
  int line = scan(s->src, s->len, collect_name, &q) == 0 ? pick(&q.lines, index, count) : 0;
  free(q.lines.v);
  return line;
}

void kl_srcscan_free(kl_srcscan *s) {
  for (int f = 0; f < KL_F_COUNT; f++) free(s->field[f].v);
  memset(s, 0, sizeof *s);
}
