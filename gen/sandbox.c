/* Sandboxed Lua: what a spec or a template may do, and for how long (see
 * sandbox.h for the bounds and why they hold). */
#include "sandbox.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lauxlib.h"
#include "lualib.h"

/* Instructions between clock reads: few enough that the time between two
 * reads is small beside any limit, many enough that reading costs little. */
#define HOOK_EVERY 1000
/* Bytes of string that the instructions between two clock reads may touch:
 * an instruction's work is at most linear in the longest string (comparing
 * strings of NULs is the slowest), so bounding the bytes bounds the time
 * between reads. */
#define WORK_BYTES (1 << 20)
#define HOOK_MASK (LUA_MASKCOUNT | LUA_MASKCALL)
#define READ_PIECE 4096 /* bytes the parser gets between clock reads */
/* The allocator's share: the C work of a rehash, a string build or a
 * table's growth is at most linear in the bytes it (re)allocates, so the
 * clock is read once ALLOC_WORK bytes have been asked for, a call counting
 * ALLOC_CALL of them (a read every 64 small calls): ~1 ms of such work. */
#define ALLOC_WORK (256 << 10)
#define ALLOC_CALL 4096
#define ALLOC_GRACE 4
/* How often the count hook records where the spec is, for a time-limit
 * error that the allocator raises (it must not inspect the stack). */
#define LOCATE_NS 1000000
/* A new string's allocation carries its header besides its bytes. */
#define STRING_HEADER 64

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void deadline_hook(lua_State *L, lua_Debug *ar);

/* Fewer instructions between clock reads (never more: a reset of the count
 * must not let a spec postpone the next read). lua_sethook is safe anywhere,
 * the allocator included (Lua's own interpreter calls it from a signal). */
static void shorten_period(kl_sandbox *sb, int period) {
  if (period < 1) period = 1;
  if (period >= sb->period) return;
  sb->period = period;
  if (sb->L) lua_sethook(sb->L, deadline_hook, HOOK_MASK, period);
}

/* "label:line:" of the innermost function with a line, or "" if none. */
static void locate(lua_State *L, char *buf, size_t n) {
  lua_Debug ar;
  buf[0] = 0;
  for (int level = 0; lua_getstack(L, level, &ar); level++)
    if (lua_getinfo(L, "Sl", &ar) && ar.currentline > 0) {
      snprintf(buf, n, "%s:%d: ", ar.short_src, ar.currentline);
      return;
    }
}

/* The time-limit message, at `where` ("label:line: " or ""). */
static void set_timeout(kl_sandbox *sb, const char *where) {
  snprintf(sb->timeout, sizeof sb->timeout, "%sran past its time limit (%lld ms)", where,
           (long long)sb->time_ms);
}

/* Records that the deadline has passed and arms the trap: a clock read at
 * every instruction, each of which then raises the error. With L (a hook,
 * a C function of the sandbox's), the message names the innermost line
 * running there, else the last place noted; the first one is reported. */
static void expire(kl_sandbox *sb, lua_State *L) {
  if (L && !sb->timeout[0]) {
    char loc[96];
    locate(L, loc, sizeof loc);
    set_timeout(sb, loc[0] ? loc : sb->here);
  }
  sb->expired = 1;
  shorten_period(sb, 1);
}

/* Reads the clock at `now`; past the deadline, arms the trap (see expire). */
static int past_deadline(kl_sandbox *sb, int64_t now) {
  if (!sb->expired && now >= sb->deadline_ns) expire(sb, NULL);
  return sb->expired;
}

/* The allocator's clock (see ALLOC_WORK): charges a call for `bytes` and
 * reads the clock when the charges reach ALLOC_WORK. Past the deadline all
 * growth stops once the trap has raised (and named the line), or after
 * ALLOC_GRACE more turns of C work that runs no instruction: the
 * instruction under way may finish, so that the trap names where the spec
 * is (the allocator cannot look). */
static void charge_work(kl_sandbox *sb, size_t bytes) {
  sb->alloc_work -= (int64_t)(ALLOC_CALL + (bytes < ALLOC_WORK ? bytes : ALLOC_WORK));
  if (sb->alloc_work > 0) return;
  sb->alloc_work = ALLOC_WORK;
  if (!sb->expired) past_deadline(sb, now_ns());
  else if (sb->timeout[0] || ++sb->grace > ALLOC_GRACE) sb->no_growth = 1;
}

/* Refuses growth past the cap so a memory bomb fails with "not enough memory"
 * instead of taking the machine, strings past string_max, and any growth
 * once the deadline has passed (charge_work): a C loop that allocates
 * (table growth, rehashing, string building) then fails where it stands,
 * and the error is the time limit's (kl_sandbox_message). Shrinking never
 * fails (Lua relies on it). (A refusal costs a full collection, but its
 * error reaches the spec only through pcall, a call the hook sees.) Lua
 * passes a new object's type as osize: that is how strings are told. No Lua
 * API call here but lua_sethook: the stack may be mid-reallocation. */
static void *cap_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  kl_sandbox *sb = ud;
  if (ptr == NULL) {
    if (osize == LUA_TSTRING && nsize > sb->longest) {
      if (sb->string_max && nsize > sb->string_max + STRING_HEADER) {
        sb->refused = KL_REFUSED_STRING;
        return NULL;
      }
      sb->longest = nsize;
      shorten_period(sb, (int)(WORK_BYTES / nsize));
    }
    osize = 0;
  }
  charge_work(sb, osize + nsize);
  if (nsize == 0) {
    free(ptr);
    sb->used -= osize;
    return NULL;
  }
  if (nsize > osize && sb->no_growth) return NULL;
  if (nsize > osize && sb->used + (nsize - osize) > sb->cap) {
    sb->refused = KL_REFUSED_MEMORY;
    return NULL;
  }
  void *p = realloc(ptr, nsize);
  if (p != NULL) sb->used = sb->used - osize + nsize;
  return p;
}

static kl_sandbox *sandbox_of(lua_State *L) {
  void *ud;
  lua_getallocf(L, &ud);
  return ud;
}

/* The trap's error. Its value allocates nothing (past the deadline the
 * allocator refuses growth, and each refusal costs a full collection);
 * what it says is kl_sandbox_message's. */
static void raise_expired(kl_sandbox *sb, lua_State *L) {
  lua_pushlightuserdata(L, sb);
  lua_error(L);
}

/* Past the deadline: records where (the first place reported) and raises. */
static void trap(kl_sandbox *sb, lua_State *L) {
  expire(sb, L);
  raise_expired(sb, L);
}

/* Past the deadline, every instruction raises: pcall in the chunk can catch
 * one, but the next instruction after it raises the next. */
void kl_sandbox_check(lua_State *L) {
  kl_sandbox *sb = sandbox_of(L);
  if (past_deadline(sb, now_ns())) trap(sb, L);
}

/* On every call and every `period` instructions; a count event also notes,
 * at most every LOCATE_NS, where the spec is (the allocator's time-limit
 * error reports that place). */
static void deadline_hook(lua_State *L, lua_Debug *ar) {
  kl_sandbox *sb = sandbox_of(L);
  int64_t now = now_ns();
  if (past_deadline(sb, now)) trap(sb, L);
  if (ar->event == LUA_HOOKCOUNT && now - sb->located_ns >= LOCATE_NS) {
    locate(L, sb->here, sizeof sb->here);
    sb->located_ns = now;
  }
}

/* ---- the restricted environment's own and wrapped functions ---- */

/* string.rep: with an empty string and separator the C loop runs n times and
 * allocates nothing, so the string cap does not bound it; this does, and
 * says why before the work is done. */
static int safe_rep(lua_State *L) {
  size_t l, lsep;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n <= 0 || l + lsep == 0) {
    lua_pushliteral(L, "");
    return 1;
  }
  kl_sandbox *sb = sandbox_of(L);
  size_t most = sb->string_max ? sb->string_max : sb->cap;
  if ((size_t)n > most / (l + lsep) + 1)
    return luaL_error(L, "string.rep: the result would be longer than %d KiB, the longest "
                      "string %s", (int)(most >> 10),
                      sb->string_max ? "a spec may make" : "its memory limit allows");
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

/* table.sort, interruptible. Lua's own sort is one C call that compares
 * values without running an instruction (strings of a MiB, NULs between),
 * so it could outlast any limit. This heapsort (n log n comparisons at
 * worst, in place) reads the clock as the hook would: every `period`
 * comparisons, a comparison counting as an instruction. Like Lua's, it is
 * not stable; an inconsistent order function gives some order, no error.
 * The table is read raw: a spec's tables have no metatables. */
typedef struct sorter {
  lua_State *L;
  kl_sandbox *sb;
  int by_function; /* the order function is at index 2 */
  int countdown;
} sorter;

/* t[i] < t[j] (t at index 1). */
static int sort_less(sorter *s, lua_Integer i, lua_Integer j) {
  lua_State *L = s->L;
  if (--s->countdown <= 0) {
    kl_sandbox_check(L);
    s->countdown = s->sb->period;
  }
  if (s->by_function) lua_pushvalue(L, 2);
  lua_rawgeti(L, 1, i);
  lua_rawgeti(L, 1, j);
  if (!s->by_function) {
    int lt = lua_compare(L, -2, -1, LUA_OPLT);
    lua_pop(L, 2);
    return lt;
  }
  lua_call(L, 2, 1);
  int lt = lua_toboolean(L, -1);
  lua_pop(L, 1);
  return lt;
}

static void sort_swap(lua_State *L, lua_Integer i, lua_Integer j) {
  lua_rawgeti(L, 1, i);
  lua_rawgeti(L, 1, j);
  lua_rawseti(L, 1, i);
  lua_rawseti(L, 1, j);
}

/* Moves t[root] down the max-heap t[1..n]. */
static void sort_sift(sorter *s, lua_Integer root, lua_Integer n) {
  for (lua_Integer child; (child = 2 * root) <= n; root = child) {
    if (child < n && sort_less(s, child, child + 1)) child++;
    if (!sort_less(s, root, child)) return;
    sort_swap(s->L, root, child);
  }
}

static int safe_sort(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_Integer n = (lua_Integer)lua_rawlen(L, 1);
  sorter s = {L, sandbox_of(L), !lua_isnoneornil(L, 2), 0};
  if (s.by_function) luaL_checktype(L, 2, LUA_TFUNCTION);
  lua_settop(L, 2);
  luaL_checkstack(L, 4, "table.sort");
  for (lua_Integer i = n / 2; i >= 1; i--) sort_sift(&s, i, n);
  for (lua_Integer last = n; last > 1; last--) {
    sort_swap(L, 1, last);
    sort_sift(&s, 1, last - 1);
  }
  return 0;
}

/* ---- strict tables ----
 * The restricted globals and their library tables raise an error for a name
 * that is not there: a typo (`vocab_sise`, `math.pie`), or `nan`, would
 * otherwise read as nil and make a field vanish. rawget on them does too. */

/* The error for key (at index k) missing from a strict table that `what`
 * names ("" for the globals). Level 1 of luaL_error is the caller's Lua
 * code, both as an __index and from rawget. */
static int raise_undefined(lua_State *L, const char *what, int k) {
  int named = lua_type(L, k) == LUA_TSTRING;
  if (!*what)
    return named ? luaL_error(L, "undefined global '%s'", lua_tostring(L, k))
                 : luaL_error(L, "undefined global (a %s key)", luaL_typename(L, k));
  return named ? luaL_error(L, "undefined field '%s.%s'", what, lua_tostring(L, k))
               : luaL_error(L, "undefined field of %s (a %s key)", what, luaL_typename(L, k));
}

/* __index of a strict table (t, key); upvalue 1: what the table is. */
static int undefined_name(lua_State *L) {
  return raise_undefined(L, lua_tostring(L, lua_upvalueindex(1)), 2);
}

/* Makes the table at the top strict, its metatable hidden. */
static void make_strict(lua_State *L, const char *what) {
  lua_createtable(L, 0, 2);
  lua_pushstring(L, what);
  lua_pushcclosure(L, undefined_name, 1);
  lua_setfield(L, -2, "__index");
  lua_pushboolean(L, 0);
  lua_setfield(L, -2, "__metatable");
  lua_setmetatable(L, -2);
}

/* rawget(t, k), which on a strict table raises for a missing key as reading
 * it would: raw access is no way around the check. */
static int strict_rawget(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkany(L, 2);
  lua_settop(L, 2);
  lua_pushvalue(L, 2);
  if (lua_rawget(L, 1) != LUA_TNIL || !lua_getmetatable(L, 1)) return 1;
  lua_pushliteral(L, "__index");
  lua_rawget(L, -2);
  if (lua_tocfunction(L, -1) != undefined_name) {
    lua_settop(L, 3);
    return 1;
  }
  lua_getupvalue(L, -1, 1);
  return raise_undefined(L, lua_tostring(L, -1), 2);
}

/* Replaces t[name] (t at the top) by f with the original as upvalue 1. */
static void wrap(lua_State *L, const char *name, lua_CFunction f) {
  lua_getfield(L, -1, name);
  lua_pushcclosure(L, f, 1);
  lua_setfield(L, -2, name);
}

/* ---- environments ----
 * Never xpcall: Lua runs the message handler of an error raised in a hook
 * with hooks off, so a handler that loops could not be stopped. */

static const char *const spec_base[] = {
    "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "rawequal",
    "rawget", "rawlen", "rawset", "select", "tonumber", "tostring", "type", "_VERSION", NULL};
static const char *const spec_string[] = {"byte", "char", "format", "len", "lower", "rep",
                                          "reverse", "sub", "upper", NULL};
static const char *const spec_table[] = {"concat", "insert", "remove", "sort", "unpack", NULL};
static const char *const spec_math[] = {
    "abs", "acos", "asin", "atan", "ceil", "cos", "deg", "exp", "floor", "fmod", "huge", "log",
    "max", "maxinteger", "min", "mininteger", "modf", "pi", "rad", "sin", "sqrt", "tan",
    "tointeger", "type", "ult", NULL};
static const char *const spec_utf8[] = {"char", "charpattern", "codepoint", "codes", "len",
                                        "offset", NULL};

/* A new table with src[names] copied (src at index `src`); left at the top. */
static void copy_names(lua_State *L, int src, const char *const *names) {
  lua_newtable(L);
  for (; *names; names++) {
    lua_getfield(L, src, *names);
    lua_setfield(L, -2, *names);
  }
}

/* The restricted globals of specs/README.md: a strict whitelist built from
 * the opened libraries (the global table at g), with the sandbox's
 * string.rep, table.sort and rawget; left at the top. Specs run with it as
 * their globals, template code (the engine's) with it behind its constants. */
static void restricted_env(lua_State *L, int g) {
  copy_names(L, g, spec_base);
  int env = lua_gettop(L);
  static const struct {
    const char *lib;
    const char *const *names;
  } libs[] = {{LUA_STRLIBNAME, spec_string}, {LUA_TABLIBNAME, spec_table},
              {LUA_MATHLIBNAME, spec_math}, {LUA_UTF8LIBNAME, spec_utf8}};
  for (size_t i = 0; i < sizeof libs / sizeof *libs; i++) {
    lua_getfield(L, g, libs[i].lib);
    copy_names(L, lua_gettop(L), libs[i].names);
    lua_remove(L, -2);
    if (libs[i].names == spec_string) wrap(L, "rep", safe_rep);
    if (libs[i].names == spec_table) {
      lua_pushcfunction(L, safe_sort);
      lua_setfield(L, -2, "sort");
    }
    make_strict(L, libs[i].lib);
    lua_setfield(L, env, libs[i].lib);
  }
  lua_pushcfunction(L, strict_rawget);
  lua_setfield(L, env, "rawget");
  lua_pushvalue(L, env);
  lua_setfield(L, env, "_G");
  make_strict(L, "");
}

/* String methods reach only the restricted string table (env at index env),
 * and the string metatable itself is hidden. */
static void restrict_string_methods(lua_State *L, int env) {
  lua_pushliteral(L, "");
  lua_getmetatable(L, -1);
  lua_getfield(L, env, LUA_STRLIBNAME);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, "string");
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);
}

/* The spec's globals: the restricted environment, which replaces the
 * state's global table (so every chunk loaded sees only it). */
static void spec_env(lua_State *L) {
  lua_pushglobaltable(L);
  int g = lua_gettop(L);
  restricted_env(L, g);
  restrict_string_methods(L, g + 1);
  lua_rawseti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  lua_settop(L, g - 1);
}

/* The engine's load(text, chunkname, env): template code, parsed as
 * kl_sandbox_load parses (a piece at a time, under the clock, text only),
 * with env as its globals. A syntax error is raised. */
static int engine_load(lua_State *L) {
  size_t len;
  const char *src = luaL_checklstring(L, 1, &len);
  const char *name = luaL_checkstring(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  kl_sandbox *sb = sandbox_of(L);
  if (kl_sandbox_load(sb, name, src, len) != LUA_OK) {
    if (sb->expired) raise_expired(sb, L);
    return lua_error(L);
  }
  lua_pushvalue(L, 3);
  lua_setupvalue(L, -2, 1); /* a main chunk's only upvalue is its _ENV */
  return 1;
}

/* The engine's globals: the libraries, less what reaches files, processes or
 * bytecode. Template code sees none of them: the engine gets (registry) its
 * `load` and the restricted environment, which template code reads behind
 * the constants; string methods are the restricted ones. */
static void engine_env(lua_State *L) {
  static const char *const banned[] = {"dofile", "loadfile", "load", "require", "xpcall",
                                       "collectgarbage", "print", "warn", NULL};
  for (const char *const *b = banned; *b; b++) {
    lua_pushnil(L);
    lua_setglobal(L, *b);
  }
  lua_pushglobaltable(L);
  int g = lua_gettop(L);
  lua_getfield(L, g, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 1);
  lua_pushcfunction(L, engine_load);
  lua_setfield(L, LUA_REGISTRYINDEX, KL_SANDBOX_LOAD_KEY);
  restricted_env(L, g);
  restrict_string_methods(L, g + 1);
  lua_setfield(L, LUA_REGISTRYINDEX, KL_SANDBOX_ENV_KEY);
  lua_settop(L, g - 1);
}

static int open_protected(lua_State *L) {
  kl_sandbox_kind kind = (kl_sandbox_kind)(intptr_t)lua_touserdata(L, 1);
  static const luaL_Reg libs[] = {{LUA_GNAME, luaopen_base},
                                  {LUA_STRLIBNAME, luaopen_string},
                                  {LUA_TABLIBNAME, luaopen_table},
                                  {LUA_MATHLIBNAME, luaopen_math},
                                  {LUA_UTF8LIBNAME, luaopen_utf8},
                                  {NULL, NULL}};
  for (const luaL_Reg *l = libs; l->func; l++) {
    luaL_requiref(L, l->name, l->func, 1);
    lua_pop(L, 1);
  }
  /* math.random is harmless but would make specs non-reproducible. */
  lua_getglobal(L, LUA_MATHLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "random");
  lua_pushnil(L);
  lua_setfield(L, -2, "randomseed");
  lua_pop(L, 1);
  if (kind == KL_SANDBOX_SPEC) spec_env(L);
  else engine_env(L);
  return 0;
}

int kl_sandbox_open(kl_sandbox *sb, kl_sandbox_kind kind, const kl_limits *lim) {
  memset(sb, 0, sizeof *sb);
  sb->time_ms = lim && lim->time_ms > 0 ? lim->time_ms : KL_SPEC_TIME_MS;
  sb->cap = lim && lim->mem_bytes > 0 ? (size_t)lim->mem_bytes : KL_SPEC_MEM_BYTES;
  sb->string_max = kind == KL_SANDBOX_SPEC ? KL_SPEC_STRING_MAX : 0;
  sb->period = HOOK_EVERY;
  sb->alloc_work = ALLOC_WORK;
  /* The clock starts once the environment is made: the time is the chunk's. */
  sb->deadline_ns = INT64_MAX;
  lua_State *L = lua_newstate(cap_alloc, sb);
  if (L == NULL) return -1;
  lua_sethook(L, deadline_hook, HOOK_MASK, sb->period);
  sb->L = L;
  if (kl_sandbox_run(sb, open_protected, (void *)(intptr_t)kind) != LUA_OK) {
    kl_sandbox_close(sb);
    return -1;
  }
  sb->deadline_ns = now_ns() + sb->time_ms * 1000000;
  return 0;
}

void kl_sandbox_close(kl_sandbox *sb) {
  if (!sb->L) return;
  /* __close handlers still pending run at close: none may run an instruction. */
  sb->expired = 1;
  lua_sethook(sb->L, deadline_hook, HOOK_MASK, 1);
  lua_close(sb->L);
  sb->L = NULL;
}

/* The parser runs no instruction, and a page of gotos and labels costs it
 * the square of their number: it gets the text a piece at a time, and the
 * clock is read between pieces. Past the deadline the text ends there. */
typedef struct reader {
  kl_sandbox *sb;
  const char *p;
  size_t left;
  int line; /* of the next piece's first byte */
} reader;

static const char *read_piece(lua_State *L, void *ud, size_t *size) {
  reader *r = ud;
  (void)L;
  *size = 0;
  if (r->left == 0) return NULL;
  snprintf(r->sb->here, sizeof r->sb->here, "%s:%d: ", r->sb->label, r->line);
  if (past_deadline(r->sb, now_ns())) return NULL;
  const char *piece = r->p;
  *size = r->left < READ_PIECE ? r->left : READ_PIECE;
  for (const char *q = piece; (q = memchr(q, '\n', (size_t)(piece + *size - q))); q++) r->line++;
  r->p += *size;
  r->left -= *size;
  return piece;
}

int kl_sandbox_load(kl_sandbox *sb, const char *chunkname, const char *src, size_t len) {
  /* Messages name the chunk as Lua does: "=name" is "name". */
  snprintf(sb->label, sizeof sb->label, "%s", chunkname + (chunkname[0] == '='));
  reader r = {sb, src, len, 1};
  int top = lua_gettop(sb->L);
  /* mode "t": a precompiled chunk can crash the VM, so only text is accepted. */
  int st = lua_load(sb->L, read_piece, &r, chunkname, "t");
  if (!sb->expired) return st;
  lua_settop(sb->L, top); /* what a cut text parsed to, or its error */
  return LUA_ERRRUN;
}

int kl_sandbox_call(kl_sandbox *sb, int nargs, int nres) {
  return lua_pcall(sb->L, nargs, nres, 0);
}

int kl_sandbox_run(kl_sandbox *sb, lua_CFunction f, void *ud) {
  lua_pushcfunction(sb->L, f);
  lua_pushlightuserdata(sb->L, ud);
  return lua_pcall(sb->L, 1, 0, 0);
}

const char *kl_sandbox_message(kl_sandbox *sb, int status) {
  /* Past the deadline any error (a refused allocation, the spec's own caught
   * and raised again) is the time limit's doing. Where no hook saw it pass,
   * the place is the last one noted (the allocator's, the parser's). */
  if (sb->expired) {
    if (!sb->timeout[0]) set_timeout(sb, sb->here);
    return sb->timeout;
  }
  if (status == LUA_ERRMEM) return "exceeded its memory limit";
  const char *m = lua_type(sb->L, -1) == LUA_TSTRING ? lua_tostring(sb->L, -1) : NULL;
  return m ? m : "error object is not a string";
}
