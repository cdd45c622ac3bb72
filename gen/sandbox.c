/* Sandboxed Lua: what a spec or a template may do, and for how long (see
 * sandbox.h for the bounds and why they hold). */
#include "sandbox.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lauxlib.h"
#include "lualib.h"

#define HOOK_EVERY 1000 /* instructions between clock reads: ~20 ns per ~10 us */

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Refuses growth past the cap so a memory bomb fails with "not enough memory"
 * instead of taking the machine. */
static void *cap_alloc(void *ud, void *ptr, size_t osize, size_t nsize) {
  kl_sandbox *sb = ud;
  if (ptr == NULL) osize = 0;
  if (nsize == 0) {
    free(ptr);
    sb->used -= osize;
    return NULL;
  }
  if (nsize > osize && sb->used + (nsize - osize) > sb->cap) return NULL;
  void *p = realloc(ptr, nsize);
  if (p != NULL) sb->used = sb->used - osize + nsize;
  return p;
}

static kl_sandbox *sandbox_of(lua_State *L) {
  void *ud;
  lua_getallocf(L, &ud);
  return ud;
}

/* Past the deadline, every instruction raises an error: pcall in the chunk
 * can catch one, but the next instruction after it raises the next. */
static void deadline_hook(lua_State *L, lua_Debug *ar) {
  kl_sandbox *sb = sandbox_of(L);
  if (!sb->expired) {
    if (now_ns() < sb->deadline_ns) return;
    sb->expired = 1;
    lua_sethook(L, deadline_hook, LUA_MASKCOUNT, 1);
  }
  if (sb->closing) { /* no message to format: nobody reads it */
    lua_pushboolean(L, 0);
    lua_error(L);
  }
  lua_getinfo(L, "Sl", ar);
  lua_pushfstring(L, "%s:%d: ran past its time limit (%d ms)", ar->short_src, ar->currentline,
                  (int)sb->time_ms);
  lua_error(L);
}

/* ---- the spec environment's wrapped functions ---- */

/* string.rep: with an empty string and separator the C loop runs n times and
 * allocates nothing, so the memory cap does not bound it; this does. */
static int safe_rep(lua_State *L) {
  size_t l, lsep;
  luaL_checklstring(L, 1, &l);
  lua_Integer n = luaL_checkinteger(L, 2);
  luaL_optlstring(L, 3, "", &lsep);
  if (n <= 0 || l + lsep == 0) {
    lua_pushliteral(L, "");
    return 1;
  }
  if ((size_t)n > sandbox_of(L)->cap / (l + lsep) + 1)
    return luaL_error(L, "string.rep: the result would exceed the spec's memory limit");
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

/* table.insert/remove/concat/unpack/sort loop in C up to #t; through __len
 * that can be any number. On a table without a metatable it is the raw
 * border, bounded by the memory the table takes. */
static int plain_table(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  if (lua_getmetatable(L, 1))
    return luaL_error(L, "%s: a table with a metatable is not allowed here in a spec",
                      lua_tostring(L, lua_upvalueindex(2)));
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

/* setmetatable without __gc: Lua runs finalizers with hooks off, so the time
 * limit could not stop one (a table gets one only if __gc is present when
 * setmetatable is called). */
static int no_gc_setmetatable(lua_State *L) {
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_pushliteral(L, "__gc");
    if (lua_rawget(L, 2) != LUA_TNIL)
      return luaL_error(L, "setmetatable: __gc finalizers are not allowed");
    lua_pop(L, 1);
  }
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 1);
  return 1;
}

/* Replaces t[name] (t at the top) by f with the original as upvalue 1 and
 * `label` as upvalue 2. */
static void wrap(lua_State *L, const char *name, lua_CFunction f, const char *label) {
  lua_getfield(L, -1, name);
  lua_pushstring(L, label);
  lua_pushcclosure(L, f, 2);
  lua_setfield(L, -2, name);
}

/* ---- environments ----
 * Never xpcall: Lua runs the message handler of an error raised in a hook
 * with hooks off, so a handler that loops could not be stopped. */

static const char *const spec_base[] = {
    "assert", "error", "getmetatable", "ipairs", "next", "pairs", "pcall", "rawequal",
    "rawget", "rawlen", "rawset", "select", "setmetatable", "tonumber", "tostring", "type",
    "_VERSION", NULL};
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

/* The spec's globals: a whitelist built from the opened libraries, which then
 * replaces the state's global table (so every chunk loaded sees only it), and
 * the string metatable's __index (so ("").find is gone too). */
static void spec_env(lua_State *L) {
  lua_pushglobaltable(L);
  int g = lua_gettop(L);
  copy_names(L, g, spec_base);
  int env = lua_gettop(L);
  wrap(L, "setmetatable", no_gc_setmetatable, "setmetatable");
  static const struct {
    const char *lib;
    const char *const *names;
  } libs[] = {{LUA_STRLIBNAME, spec_string}, {LUA_TABLIBNAME, spec_table},
              {LUA_MATHLIBNAME, spec_math}, {LUA_UTF8LIBNAME, spec_utf8}};
  for (size_t i = 0; i < sizeof libs / sizeof *libs; i++) {
    lua_getfield(L, g, libs[i].lib);
    copy_names(L, lua_gettop(L), libs[i].names);
    lua_remove(L, -2);
    lua_setfield(L, env, libs[i].lib);
  }
  lua_getfield(L, env, LUA_STRLIBNAME);
  wrap(L, "rep", safe_rep, "string.rep");
  lua_pop(L, 1);
  lua_getfield(L, env, LUA_TABLIBNAME);
  for (const char *const *t = spec_table; *t; t++) {
    char label[32];
    snprintf(label, sizeof label, "table.%s", *t);
    wrap(L, *t, plain_table, label);
  }
  lua_pop(L, 1);
  lua_pushvalue(L, env);
  lua_setfield(L, env, "_G");
  /* string methods: the restricted table, and the metatable itself hidden */
  lua_pushliteral(L, "");
  lua_getmetatable(L, -1);
  lua_getfield(L, env, LUA_STRLIBNAME);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, "string");
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);
  lua_pushvalue(L, env);
  lua_rawseti(L, LUA_REGISTRYINDEX, LUA_RIDX_GLOBALS);
  lua_settop(L, g - 1);
}

/* The engine's globals: the libraries, less what reaches files, processes or
 * bytecode; `load` only for the engine itself, through the registry. */
static void engine_env(lua_State *L) {
  static const char *const banned[] = {"dofile", "loadfile", "load", "require", "xpcall",
                                       "collectgarbage", "print", "warn", NULL};
  lua_getglobal(L, "load");
  lua_setfield(L, LUA_REGISTRYINDEX, KL_SANDBOX_LOAD_KEY);
  for (const char *const *b = banned; *b; b++) {
    lua_pushnil(L);
    lua_setglobal(L, *b);
  }
  lua_pushglobaltable(L);
  wrap(L, "setmetatable", no_gc_setmetatable, "setmetatable");
  lua_getfield(L, -1, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 2);
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
  sb->deadline_ns = now_ns() + sb->time_ms * 1000000;
  sb->L = lua_newstate(cap_alloc, sb);
  if (sb->L == NULL) return -1;
  lua_sethook(sb->L, deadline_hook, LUA_MASKCOUNT, HOOK_EVERY);
  if (kl_sandbox_run(sb, open_protected, (void *)(intptr_t)kind) != LUA_OK) {
    kl_sandbox_close(sb);
    return -1;
  }
  return 0;
}

void kl_sandbox_close(kl_sandbox *sb) {
  if (!sb->L) return;
  /* __close handlers still pending run at close: none may run an instruction. */
  sb->expired = sb->closing = 1;
  lua_sethook(sb->L, deadline_hook, LUA_MASKCOUNT, 1);
  lua_close(sb->L);
  sb->L = NULL;
}

int kl_sandbox_load(kl_sandbox *sb, const char *chunkname, const char *src, size_t len) {
  /* mode "t": a precompiled chunk can crash the VM, so only text is accepted. */
  return luaL_loadbufferx(sb->L, src, len, chunkname, "t");
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
  if (status == LUA_ERRMEM && !sb->expired) return "exceeded its memory limit";
  const char *m = lua_type(sb->L, -1) == LUA_TSTRING ? lua_tostring(sb->L, -1) : NULL;
  return m ? m : "error object is not a string";
}
