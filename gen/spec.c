/* Spec loading: run the sandboxed chunk, then turn the table(s) it returns into
 * kl_spec values, checking every field's type, range and spelling. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "klgen.h"
#include "lauxlib.h"
#include "sandbox.h"
#include "srcscan.h"

#define SPEC_FILE_MAX (1u << 20) /* a spec is a page of text, not a data file */
#define SPECS_MAX 256

const char *const kl_field_names[KL_F_COUNT] = {
    "name", "vocab_size", "pad_to", "padded_vocab",
    "tp",   "dtype",      "max_tokens", "timeout_ms"};

/* What one table conversion needs to report errors well. */
typedef struct ctx {
  lua_State *L;
  const kl_srcscan *scan;
  int index, count;
  kl_err *err;
} ctx;

static void set_origin(kl_spec *s, const char *file, const ctx *c) {
  snprintf(s->file, sizeof s->file, "%s", file);
  int fallback = kl_srcscan_line(c->scan, "name", c->index, c->count);
  if (fallback == 0) fallback = c->scan->return_line;
  for (int f = 0; f < KL_F_COUNT; f++) {
    int l = kl_srcscan_line(c->scan, kl_field_names[f], c->index, c->count);
    s->line[f] = l ? l : fallback;
  }
}

static int edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n > 31 || m > 31) return 99;
  int d[32][32];
  for (size_t i = 0; i <= n; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= m; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= n; i++)
    for (size_t j = 1; j <= m; j++) {
      int sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
      int del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
      d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
    }
  return d[n][m];
}

static int field_index(const char *key) {
  for (int f = 0; f < KL_F_COUNT; f++)
    if (strcmp(key, kl_field_names[f]) == 0) return f;
  return -1;
}

/* Unknown keys are errors: a typo like `vocab_sise` must not pass silently. */
static int check_keys(const ctx *c, const kl_spec *s, int t) {
  lua_State *L = c->L;
  lua_pushnil(L);
  while (lua_next(L, t) != 0) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING) {
      const char *k = luaL_tolstring(L, -1, NULL);
      return kl_spec_fail(c->err, s, KL_F_NAME, "spec table has a non-string key [%s]", k);
    }
    const char *key = lua_tostring(L, -1);
    if (field_index(key) >= 0) continue;
    const char *best = NULL;
    int bd = 3;
    for (int f = 0; f < KL_F_COUNT; f++) {
      int d = edit_distance(key, kl_field_names[f]);
      if (d < bd) bd = d, best = kl_field_names[f];
    }
    int line = kl_srcscan_line(c->scan, key, c->index, c->count);
    if (line == 0) line = s->line[KL_F_NAME];
    return kl_fail(c->err, KL_ESPEC, "%s:%d: %s: unknown field%s%s%s", s->file, line, key,
                   best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "");
  }
  return 0;
}

/* Integers only: 2^17 (a float with an integral value) is accepted, 1.5 and
 * "163840" are not. absent_ok leaves *out at 0 when the field is missing. */
static int get_int(const ctx *c, const kl_spec *s, int t, kl_field f, int64_t *out,
                   int absent_ok) {
  lua_State *L = c->L;
  int ty = lua_getfield(L, t, kl_field_names[f]);
  int rc = 0;
  if (ty == LUA_TNIL) {
    if (!absent_ok) rc = kl_spec_fail(c->err, s, f, "missing (an integer is required)");
  } else if (ty != LUA_TNUMBER) {
    rc = kl_spec_fail(c->err, s, f, "expected an integer, got %s", luaL_typename(L, -1));
  } else if (lua_isinteger(L, -1)) {
    *out = (int64_t)lua_tointeger(L, -1);
  } else {
    lua_Number x = lua_tonumber(L, -1);
    if (x != x || x != floor(x) || fabs(x) > 9.0e15)
      rc = kl_spec_fail(c->err, s, f, "expected an integer, got %.17g", (double)x);
    else
      *out = (int64_t)x;
  }
  /* Optional fields use 0 for "not given", so a given one must be positive. */
  if (rc == 0 && ty != LUA_TNIL && absent_ok && *out <= 0)
    rc = kl_spec_fail(c->err, s, f, "%lld is out of range (must be at least 1)", (long long)*out);
  lua_pop(L, 1);
  return rc;
}

static int get_string(const ctx *c, const kl_spec *s, int t, kl_field f, char *buf,
                      size_t n, int absent_ok) {
  lua_State *L = c->L;
  int ty = lua_getfield(L, t, kl_field_names[f]);
  int rc = 0;
  buf[0] = 0;
  if (ty == LUA_TNIL) {
    if (!absent_ok) rc = kl_spec_fail(c->err, s, f, "missing (a string is required)");
  } else if (ty != LUA_TSTRING) {
    rc = kl_spec_fail(c->err, s, f, "expected a string, got %s", luaL_typename(L, -1));
  } else {
    size_t len;
    const char *v = lua_tolstring(L, -1, &len);
    if (len >= n || strlen(v) != len)
      rc = kl_spec_fail(c->err, s, f, "too long or contains a NUL byte (at most %zu chars)",
                        n - 1);
    else
      memcpy(buf, v, len + 1);
  }
  lua_pop(L, 1);
  return rc;
}

static int parse_dtype(const ctx *c, const kl_spec *s, int t, kl_dtype *out) {
  char d[16];
  int rc = get_string(c, s, t, KL_F_DTYPE, d, sizeof d, 0);
  if (rc) return rc;
  for (int i = KL_BF16; i <= KL_FP32; i++)
    if (strcmp(d, kl_dtype_name((kl_dtype)i)) == 0) return *out = (kl_dtype)i, 0;
  return kl_spec_fail(c->err, s, KL_F_DTYPE, "'%s' is not one of bf16, fp16, fp32", d);
}

/* The table at stack index t -> *s; validated in full. */
static int convert(const ctx *c, const char *file, int t, kl_spec *s) {
  memset(s, 0, sizeof *s);
  set_origin(s, file, c);
  int64_t tp = 0;
  int rc;
  if ((rc = check_keys(c, s, t)) || (rc = get_string(c, s, t, KL_F_NAME, s->name, sizeof s->name, 0)) ||
      (rc = get_int(c, s, t, KL_F_VOCAB_SIZE, &s->vocab_size, 0)) ||
      (rc = get_int(c, s, t, KL_F_PAD_TO, &s->pad_to, 1)) ||
      (rc = get_int(c, s, t, KL_F_PADDED_VOCAB, &s->padded_vocab, 1)) ||
      (rc = get_int(c, s, t, KL_F_TP, &tp, 0)) || (rc = parse_dtype(c, s, t, &s->dtype)) ||
      (rc = get_int(c, s, t, KL_F_MAX_TOKENS, &s->max_tokens, 0)) ||
      (rc = get_int(c, s, t, KL_F_TIMEOUT_MS, &s->timeout_ms, 1)))
    return rc;
  if (tp < 1 || tp > KL_TP_MAX)
    return kl_spec_fail(c->err, s, KL_F_TP, "%lld is out of range (1..%d)", (long long)tp,
                        KL_TP_MAX);
  s->tp = (int)tp;
  return kl_spec_validate(s, c->err);
}

/* A spec table has string keys; a list of specs is a non-empty sequence. */
static int is_list(lua_State *L, int t) {
  lua_rawgeti(L, t, 1);
  int list = lua_type(L, -1) == LUA_TTABLE;
  lua_pop(L, 1);
  return list;
}

static int collect(lua_State *L, const char *file, const kl_srcscan *scan,
                   kl_spec_list *out, kl_err *err) {
  int line = scan->return_line ? scan->return_line : 1;
  if (lua_type(L, -1) != LUA_TTABLE)
    return kl_fail(err, KL_ESPEC, "%s:%d: a spec must return a table (or a list of tables), got %s",
                   file, line, luaL_typename(L, -1));
  int t = lua_gettop(L), list = is_list(L, t);
  lua_Integer n = list ? luaL_len(L, t) : 1;
  if (n > SPECS_MAX)
    return kl_fail(err, KL_ESPEC, "%s:%d: %lld specs in one file (at most %d)", file, line,
                   (long long)n, SPECS_MAX);
  if (list && luaL_len(L, t) == 0)
    return kl_fail(err, KL_ESPEC, "%s:%d: the spec list is empty", file, line);
  out->v = calloc((size_t)n, sizeof *out->v);
  if (!out->v) return kl_fail(err, KL_ENOMEM, "out of memory");
  for (lua_Integer i = 0; i < n; i++) {
    if (list && lua_rawgeti(L, t, i + 1) != LUA_TTABLE)
      return kl_fail(err, KL_ESPEC, "%s:%d: list entry %lld is a %s, not a spec table", file,
                     line, (long long)i + 1, luaL_typename(L, -1));
    ctx c = {L, scan, (int)i, (int)n, err};
    int rc = convert(&c, file, list ? lua_gettop(L) : t, &out->v[i]);
    if (list) lua_pop(L, 1);
    if (rc) return rc;
    out->n++;
    for (int j = 0; j < i; j++)
      if (strcmp(out->v[j].name, out->v[i].name) == 0)
        return kl_spec_fail(err, &out->v[i], KL_F_NAME,
                            "'%s' is used by two specs (names become file names)", out->v[i].name);
  }
  return 0;
}

/* Lua's own messages carry "file:line:"; the few that do not get a location. */
static int chunk_error(kl_sandbox *sb, const char *file, int status, kl_err *err) {
  const char *m = lua_tostring(sb->L, -1);
  if (status == LUA_ERRMEM)
    return kl_fail(err, KL_ESPEC, "%s:1: spec exceeded its memory limit (%u MiB)", file,
                   KL_SANDBOX_MEM >> 20);
  if (m && strstr(m, "binary chunk"))
    return kl_fail(err, KL_ESPEC, "%s:1: precompiled (binary) chunks are refused; give the spec as Lua text",
                   file);
  if (!m) m = "error object is not a string";
  size_t n = strlen(file);
  if (strncmp(m, file, n) == 0 && m[n] == ':') return kl_fail(err, KL_ESPEC, "%s", m);
  return kl_fail(err, KL_ESPEC, "%s:1: %s", file, m);
}

int kl_spec_load_string(const char *chunkname, const char *src, size_t len, kl_spec_list *out,
                        kl_err *err) {
  if (!chunkname || !src || !out || !err) {
    if (err) kl_fail(err, KL_EARG, "kl_spec_load_string: NULL argument");
    return KL_EARG;
  }
  memset(out, 0, sizeof *out);
  kl_sandbox sb;
  kl_srcscan scan;
  if (kl_sandbox_open(&sb) != 0) return kl_fail(err, KL_ENOMEM, "cannot create a Lua state");
  if (kl_srcscan_run(&scan, src, len) != 0) {
    kl_sandbox_close(&sb);
    return kl_fail(err, KL_ENOMEM, "out of memory");
  }
  char lname[300];
  snprintf(lname, sizeof lname, "@%s", chunkname); /* Lua then says "file:line:" */
  int rc = KL_OK;
  int st = kl_sandbox_load(&sb, lname, src, len);
  if (st == LUA_OK) st = kl_sandbox_call(&sb, 0, 1);
  if (st != LUA_OK) {
    rc = chunk_error(&sb, chunkname, st, err);
  } else {
    rc = collect(sb.L, chunkname, &scan, out, err);
  }
  kl_srcscan_free(&scan);
  kl_sandbox_close(&sb);
  if (rc) kl_spec_list_free(out);
  return rc;
}

int kl_spec_load_file(const char *path, kl_spec_list *out, kl_err *err) {
  if (!path || !out || !err) {
    if (err) kl_fail(err, KL_EARG, "kl_spec_load_file: NULL argument");
    return KL_EARG;
  }
  char *src;
  size_t len;
  int rc = kl_read_file(path, &src, &len, SPEC_FILE_MAX, err);
  if (rc) return rc;
  rc = kl_spec_load_string(path, src, len, out, err);
  free(src);
  return rc;
}

void kl_spec_list_free(kl_spec_list *l) {
  if (!l) return;
  free(l->v);
  l->v = NULL;
  l->n = 0;
}

const char *kl_dtype_name(kl_dtype d) {
  switch (d) {
    case KL_BF16: return "bf16";
    case KL_FP16: return "fp16";
    case KL_FP32: return "fp32";
  }
  return "?";
}
