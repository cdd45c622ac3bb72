/* Spec loading: run the sandboxed chunk, then turn the table(s) it returns into
 * kl_spec values, checking every field's type, range and spelling.
 *
 * The result is read inside a protected call with raw access only: a table
 * with a metatable is refused before anything is read from it, so no spec
 * code (__index, __len, __tostring, ...) runs outside the sandbox's bounds,
 * and no Lua error can reach the panic handler (which aborts the process). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "klgen.h"
#include "lauxlib.h"
#include "sandbox.h"
#include "srcscan.h"

#define SPECS_MAX 256
/* Lua calls the chunk CHUNK_LABEL in messages ("spec:LINE:"), which
 * chunk_error replaces with the real file's name. */
#define CHUNK_LABEL "spec"
#define CHUNKNAME "=" CHUNK_LABEL

/* What one table conversion needs to report errors well. */
typedef struct ctx {
  lua_State *L;
  const kl_srcscan *scan;
  int index, count;
  kl_err *err;
} ctx;

static void set_origin(kl_spec *s, const char *file, const ctx *c) {
  snprintf(s->file, sizeof s->file, "%s", file);
  int fallback = kl_srcscan_line(c->scan, KL_F_NAME, c->index, c->count);
  if (fallback == 0) fallback = c->scan->return_line;
  for (int f = 0; f < KL_F_COUNT; f++) {
    int l = kl_srcscan_line(c->scan, (kl_field)f, c->index, c->count);
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

static int field_index(const char *key, size_t len) {
  for (int f = 0; f < KL_F_COUNT; f++)
    if (strlen(kl_field_names[f]) == len && memcmp(key, kl_field_names[f], len) == 0) return f;
  return -1;
}

/* A key for a message, without calling anything of the spec's (__tostring):
 * a string as it is (NULs and control bytes escaped), else its value or type. */
static const char *describe_key(lua_State *L, int i, char *buf, size_t n) {
  if (lua_type(L, i) == LUA_TSTRING) {
    size_t len;
    const char *k = lua_tolstring(L, i, &len);
    kl_escape(k, len, buf, n, 0);
  } else if (lua_type(L, i) == LUA_TNUMBER) {
    if (lua_isinteger(L, i)) snprintf(buf, n, "%lld", (long long)lua_tointeger(L, i));
    else snprintf(buf, n, "%.17g", (double)lua_tonumber(L, i));
  } else {
    snprintf(buf, n, "a %s", luaL_typename(L, i));
  }
  return buf;
}

/* The value of field f of the table at t, raw (no __index). */
static int raw_field(lua_State *L, int t, kl_field f) {
  lua_pushstring(L, kl_field_names[f]);
  return lua_rawget(L, t);
}

/* "unknown field", with the field it most likely meant. */
static int unknown_key(const ctx *c, const kl_spec *s, const char *key, size_t len) {
  const char *best = NULL;
  int bd = 3;
  for (int f = 0; f < KL_F_COUNT; f++) {
    int d = edit_distance(key, kl_field_names[f]);
    if (d < bd) bd = d, best = kl_field_names[f];
  }
  int line = kl_srcscan_name(c->scan, key, len, c->index, c->count);
  if (line == 0) line = s->line[KL_F_NAME];
  return kl_fail(c->err, KL_ESPEC, "%s:%d: %s: unknown field%s%s%s", s->file, line, key,
                 best ? " (did you mean '" : "", best ? best : "", best ? "'?)" : "");
}

/* Unknown keys are errors: a typo like `vocab_sise` must not pass silently,
 * nor a key that only starts like a field ("softcap\0"). */
static int check_keys(const ctx *c, const kl_spec *s, int t) {
  lua_State *L = c->L;
  char k[96];
  lua_pushnil(L);
  while (lua_next(L, t) != 0) {
    lua_pop(L, 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      return kl_spec_fail(c->err, s, KL_F_NAME, "spec table has a non-string key [%s]",
                          describe_key(L, -1, k, sizeof k));
    size_t len;
    const char *key = lua_tolstring(L, -1, &len);
    if (strlen(key) != len)
      return kl_fail(c->err, KL_ESPEC, "%s:%d: %s: unknown field (a NUL byte in a key)", s->file,
                     s->line[KL_F_NAME], describe_key(L, -1, k, sizeof k));
    if (field_index(key, len) < 0) return unknown_key(c, s, key, len);
  }
  return 0;
}

/* Integers only: 2^17 (a float with an integral value) is accepted, 1.5 and
 * "163840" are not. absent_ok leaves *out at 0 when the field is missing. */
static int get_int(const ctx *c, const kl_spec *s, int t, kl_field f, int64_t *out,
                   int absent_ok) {
  lua_State *L = c->L;
  int ty = raw_field(L, t, f);
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

/* A string: not empty (leave the field out for its default), no NUL (C
 * would read less than the spec said), shorter than n. */
static int get_string(const ctx *c, const kl_spec *s, int t, kl_field f, char *buf,
                      size_t n, int absent_ok) {
  lua_State *L = c->L;
  int ty = raw_field(L, t, f);
  int rc = 0;
  buf[0] = 0;
  size_t len = 0;
  const char *v = ty == LUA_TSTRING ? lua_tolstring(L, -1, &len) : NULL;
  if (ty == LUA_TNIL) {
    if (!absent_ok) rc = kl_spec_fail(c->err, s, f, "missing (a string is required)");
  } else if (ty != LUA_TSTRING) {
    rc = kl_spec_fail(c->err, s, f, "expected a string, got %s", luaL_typename(L, -1));
  } else if (len == 0) {
    rc = kl_spec_fail(c->err, s, f, "empty; give a value or leave the field out");
  } else if (strlen(v) != len) {
    char shown[96];
    rc = kl_spec_fail(c->err, s, f, "contains a NUL byte ('%s')",
                      kl_escape(v, len, shown, sizeof shown, 0));
  } else if (len >= n) {
    rc = kl_spec_fail(c->err, s, f, "too long (at most %zu chars)", n - 1);
  } else {
    memcpy(buf, v, len + 1);
  }
  lua_pop(L, 1);
  return rc;
}

/* A finite number; *given says whether the field is there (absent: *out alone). */
static int get_number(const ctx *c, const kl_spec *s, int t, kl_field f, double *out,
                      int *given) {
  lua_State *L = c->L;
  int ty = raw_field(L, t, f), rc = 0;
  *given = ty != LUA_TNIL;
  if (ty == LUA_TNUMBER) {
    double x = (double)lua_tonumber(L, -1);
    if (x != x || x > 1e300 || x < -1e300)
      rc = kl_spec_fail(c->err, s, f, "expected a finite number, got %.17g", x);
    else
      *out = x;
  } else if (ty != LUA_TNIL) {
    rc = kl_spec_fail(c->err, s, f, "expected a number, got %s", luaL_typename(L, -1));
  }
  lua_pop(L, 1);
  return rc;
}

/* An optional string naming one of two choices: *out 0 for `first` (also
 * its value when absent), 1 for `second`. */
static int get_choice(const ctx *c, const kl_spec *s, int t, kl_field f, const char *first,
                      const char *second, int *out) {
  char d[16];
  int rc = get_string(c, s, t, f, d, sizeof d, 1);
  *out = 0;
  if (rc || !d[0] || strcmp(d, first) == 0) return rc;
  if (strcmp(d, second) == 0) return *out = 1, 0;
  return kl_spec_fail(c->err, s, f, "'%s' is not \"%s\" or \"%s\"", d, first, second);
}

/* The epilogue's fields (all optional): out_dtype, softcap, scale, numerics. */
static int parse_epilogue(const ctx *c, kl_spec *s, int t) {
  char d[16];
  int rc = get_string(c, s, t, KL_F_OUT_DTYPE, d, sizeof d, 1);
  s->out_dtype = s->dtype;
  if (!rc && d[0]) {
    if (strcmp(d, "fp32") == 0) s->out_dtype = KL_FP32;
    else if (strcmp(d, kl_dtype_name(s->dtype)) != 0)
      return kl_spec_fail(c->err, s, KL_F_OUT_DTYPE, "'%s' is neither \"fp32\" nor the input "
                          "dtype \"%s\"", d, kl_dtype_name(s->dtype));
  }
  /* In kl_spec 0 means "not given": a given 0 (or less) is an error here. */
  int given = 0;
  if (!rc) rc = get_number(c, s, t, KL_F_SOFTCAP, &s->softcap, &given);
  if (!rc && given && !(s->softcap > 0))
    return kl_spec_fail(c->err, s, KL_F_SOFTCAP, "%g: must be a positive number", s->softcap);
  if (!rc) rc = get_number(c, s, t, KL_F_SCALE, &s->scale, &given);
  if (!rc && given && s->scale == 0)
    return kl_spec_fail(c->err, s, KL_F_SCALE, "0 would make every logit 0");
  int fp32 = 0;
  if (!rc) rc = get_choice(c, s, t, KL_F_NUMERICS, "engine", "fp32", &fp32);
  s->numerics = fp32 ? KL_NUMERICS_FP32 : KL_NUMERICS_ENGINE;
  return rc;
}

/* topk (optional): an integer; 0 stands for "not given" in kl_spec (get_int
 * refuses a given value below 1). */
static int parse_topk(const ctx *c, kl_spec *s, int t) {
  int64_t k = 0;
  int rc = get_int(c, s, t, KL_F_TOPK, &k, 1);
  if (rc) return rc;
  if (k > KL_TOPK_MAX)
    return kl_spec_fail(c->err, s, KL_F_TOPK, "%lld is out of range (1..%d)", (long long)k,
                        KL_TOPK_MAX);
  s->topk = (int)k;
  return 0;
}

/* noise (optional): "philox" (the default) or "vllm". */
static int parse_noise(const ctx *c, kl_spec *s, int t) {
  int vllm = 0;
  int rc = get_choice(c, s, t, KL_F_NOISE, "philox", "vllm", &vllm);
  s->noise = vllm ? KL_NOISE_VLLM : KL_NOISE_PHILOX;
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
  if (lua_getmetatable(c->L, t))
    return kl_spec_fail(c->err, s, KL_F_NAME, "the spec table has a metatable; return a plain "
                        "table (metamethods would run outside the sandbox's limits)");
  if ((rc = check_keys(c, s, t)) || (rc = get_string(c, s, t, KL_F_NAME, s->name, sizeof s->name, 0)) ||
      (rc = get_int(c, s, t, KL_F_VOCAB_SIZE, &s->vocab_size, 0)) ||
      (rc = get_int(c, s, t, KL_F_PAD_TO, &s->pad_to, 1)) ||
      (rc = get_int(c, s, t, KL_F_PADDED_VOCAB, &s->padded_vocab, 1)) ||
      (rc = get_int(c, s, t, KL_F_TP, &tp, 0)) || (rc = parse_dtype(c, s, t, &s->dtype)) ||
      (rc = get_int(c, s, t, KL_F_MAX_TOKENS, &s->max_tokens, 0)) ||
      (rc = get_int(c, s, t, KL_F_TIMEOUT_MS, &s->timeout_ms, 1)) ||
      (rc = parse_epilogue(c, s, t)) || (rc = parse_topk(c, s, t)) ||
      (rc = parse_noise(c, s, t)))
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

/* A list of specs is exactly the entries 1..n: an entry past a hole, or a
 * key of any other kind, would never be read. *n gets the length. */
static int list_length(lua_State *L, int t, const char *file, int line, lua_Integer *n,
                       kl_err *err) {
  lua_Integer count = 0, top = 0;
  char k[96];
  lua_pushnil(L);
  while (lua_next(L, t) != 0) {
    lua_pop(L, 1);
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1)
      return kl_fail(err, KL_ESPEC, "%s:%d: a list of specs has a key [%s] besides its entries "
                     "1, 2, ...", file, line, describe_key(L, -1, k, sizeof k));
    if (++count > SPECS_MAX)
      return kl_fail(err, KL_ESPEC, "%s:%d: more than %d specs in one file", file, line,
                     SPECS_MAX);
    if (lua_tointeger(L, -1) > top) top = lua_tointeger(L, -1);
  }
  if (top != count) {
    lua_Integer hole = 1;
    while (lua_rawgeti(L, t, hole) != LUA_TNIL) lua_pop(L, 1), hole++;
    return kl_fail(err, KL_ESPEC, "%s:%d: the list of specs has no entry %lld but one at %lld; "
                   "make it a sequence", file, line, (long long)hole, (long long)top);
  }
  *n = count;
  return 0;
}

static int collect(lua_State *L, const char *file, const kl_srcscan *scan,
                   kl_spec_list *out, kl_err *err) {
  int line = scan->return_line ? scan->return_line : 1;
  if (lua_type(L, -1) != LUA_TTABLE)
    return kl_fail(err, KL_ESPEC, "%s:%d: a spec must return a table (or a list of tables), got %s",
                   file, line, luaL_typename(L, -1));
  int t = lua_gettop(L);
  if (lua_getmetatable(L, t))
    return kl_fail(err, KL_ESPEC, "%s:%d: the returned table has a metatable; return a plain "
                   "table (metamethods would run outside the sandbox's limits)", file, line);
  int list = is_list(L, t), rc;
  lua_Integer n = 1;
  if (list && (rc = list_length(L, t, file, line, &n, err)) != 0) return rc;
  out->v = calloc((size_t)n, sizeof *out->v);
  if (!out->v) return kl_fail(err, KL_ENOMEM, "out of memory");
  for (lua_Integer i = 0; i < n; i++) {
    if (list && lua_rawgeti(L, t, i + 1) != LUA_TTABLE)
      return kl_fail(err, KL_ESPEC, "%s:%d: list entry %lld is a %s, not a spec table", file,
                     line, (long long)i + 1, luaL_typename(L, -1));
    ctx c = {L, scan, (int)i, (int)n, err};
    rc = convert(&c, file, list ? lua_gettop(L) : t, &out->v[i]);
    if (list) lua_pop(L, 1);
    if (rc) return rc;
    out->n++;
    for (int j = 0; j < i; j++)
      if (kl_name_equal_nocase(out->v[j].name, out->v[i].name))
        return kl_spec_fail(err, &out->v[i], KL_F_NAME,
                            strcmp(out->v[j].name, out->v[i].name) == 0
                                ? "'%s' is used by two specs (names become file names)"
                                : "'%s' differs from another spec's name only in case (they "
                                  "would share file names and header guards)",
                            out->v[i].name);
  }
  return 0;
}

/* Lua names the chunk "spec" (CHUNKNAME): "spec:LINE: msg" becomes
 * "file:LINE: msg", whatever the length of the file's path (Lua would cut
 * a long one to 60 characters). Other messages get line 1. */
static int chunk_error(kl_sandbox *sb, const char *file, int status, kl_err *err) {
  const char *m = kl_sandbox_message(sb, status);
  if (strstr(m, "binary chunk"))
    return kl_fail(err, KL_ESPEC, "%s:1: precompiled (binary) chunks are refused; give the spec as Lua text",
                   file);
  if (status == LUA_ERRMEM && !sb->expired && sb->refused == KL_REFUSED_STRING)
    return kl_fail(err, KL_ESPEC, "%s:1: spec made a string longer than %d KiB, the longest a "
                   "spec may make", file, KL_SPEC_STRING_MAX >> 10);
  if (status == LUA_ERRMEM && !sb->expired)
    return kl_fail(err, KL_ESPEC, "%s:1: spec exceeded its memory limit (%zu MiB)", file,
                   sb->cap >> 20);
  const char *p = m + strlen(CHUNK_LABEL);
  if (strncmp(m, CHUNK_LABEL, strlen(CHUNK_LABEL)) == 0 && *p == ':' && p[1] >= '0' &&
      p[1] <= '9') {
    char *end;
    long line = strtol(p + 1, &end, 10);
    if (*end == ':') return kl_fail(err, KL_ESPEC, "%s:%ld:%s", file, line, end + 1);
  }
  return kl_fail(err, KL_ESPEC, "%s:1: %s", file, m);
}

/* What the protected conversion needs. */
typedef struct collect_args {
  const char *file;
  const kl_srcscan *scan;
  kl_spec_list *out;
  kl_err *err;
  int rc;
} collect_args;

static int collect_protected(lua_State *L) {
  collect_args *a = lua_touserdata(L, 2);
  lua_settop(L, 1); /* the chunk's result */
  a->rc = collect(L, a->file, a->scan, a->out, a->err);
  return 0;
}

/* Parses, scans for lines, runs and reads the spec: all of it in the
 * sandbox's time (the scan is one pass over the text). A spec that names
 * _ENV is refused before it runs: `local _ENV = t`, a parameter or an
 * assignment would replace the strict globals, and a misspelt name would
 * read as nil. */
static int run_spec(kl_sandbox *sb, const char *file, const char *src, size_t len,
                    kl_spec_list *out, kl_err *err) {
  int st = kl_sandbox_load(sb, CHUNKNAME, src, len);
  if (st != LUA_OK) return chunk_error(sb, file, st, err);
  kl_srcscan scan;
  int rc = kl_srcscan_run(&scan, src, len) != 0 ? kl_fail(err, KL_ENOMEM, "out of memory") : 0;
  if (rc == 0 && scan.env_line)
    rc = kl_fail(err, KL_ESPEC, "%s:%d: _ENV: a spec may not name _ENV (its globals are fixed, "
                 "so that reading a name it does not define is an error)", file, scan.env_line);
  if (rc == 0 && (st = kl_sandbox_call(sb, 0, 1)) != LUA_OK) rc = chunk_error(sb, file, st, err);
  if (rc == 0) {
    collect_args a = {file, &scan, out, err, 0};
    lua_pushcfunction(sb->L, collect_protected);
    lua_insert(sb->L, -2);
    lua_pushlightuserdata(sb->L, &a);
    st = lua_pcall(sb->L, 2, 0, 0);
    rc = st != LUA_OK ? chunk_error(sb, file, st, err) : a.rc;
  }
  kl_srcscan_free(&scan);
  return rc;
}

int kl_spec_load_string(const char *chunkname, const char *src, size_t len,
                        const kl_limits *lim, kl_spec_list *out, kl_err *err) {
  if (!chunkname || !src || !out || !err) {
    if (err) kl_fail(err, KL_EARG, "kl_spec_load_string: NULL argument");
    return KL_EARG;
  }
  memset(out, 0, sizeof *out);
  if (len > KL_SPEC_FILE_MAX)
    return kl_fail(err, KL_ESPEC, "%s:1: %zu bytes, larger than the %d-byte limit for a spec",
                   chunkname, len, KL_SPEC_FILE_MAX);
  kl_sandbox sb;
  if (kl_sandbox_open(&sb, KL_SANDBOX_SPEC, lim) != 0)
    return kl_fail(err, KL_ENOMEM, "cannot create a Lua state");
  int rc = run_spec(&sb, chunkname, src, len, out, err);
  kl_sandbox_close(&sb);
  if (rc) kl_spec_list_free(out);
  return rc;
}

int kl_spec_load_file(const char *path, const kl_limits *lim, kl_spec_list *out, kl_err *err) {
  if (!path || !out || !err) {
    if (err) kl_fail(err, KL_EARG, "kl_spec_load_file: NULL argument");
    return KL_EARG;
  }
  memset(out, 0, sizeof *out);
  char *src;
  size_t len;
  int rc = kl_read_file(path, &src, &len, KL_SPEC_FILE_MAX, err);
  if (rc) return rc;
  rc = kl_spec_load_string(path, src, len, lim, out, err);
  free(src);
  return rc;
}

void kl_spec_list_free(kl_spec_list *l) {
  if (!l) return;
  free(l->v);
  l->v = NULL;
  l->n = 0;
}

char *kl_spec_list_names(const kl_spec_list *l, char *buf, size_t n) {
  size_t used = 0;
  if (n == 0) return buf;
  buf[0] = 0;
  for (int i = 0; i < l->n; i++) {
    /* room for this name and, should more follow, the count of the rest */
    char more[48];
    int m = i + 1 < l->n ? snprintf(more, sizeof more, ", and %d more", l->n - i - 1) : 0;
    size_t need = (i ? 2 : 0) + strlen(l->v[i].name);
    if (used + need + (size_t)m + 1 > n) {
      snprintf(buf + used, n - used, "%s%d more", i ? ", and " : "", l->n - i);
      return buf;
    }
    used += (size_t)snprintf(buf + used, n - used, "%s%s", i ? ", " : "", l->v[i].name);
  }
  return buf;
}

int kl_spec_list_find(const kl_spec_list *l, const char *name) {
  for (int i = 0; i < l->n; i++)
    if (strcmp(l->v[i].name, name) == 0) return i;
  return -1;
}
