/* Sandboxed Lua: what a spec or a template may do, and how much of it. */
#include "sandbox.h"

#include <stdlib.h>
#include <string.h>

#include "lauxlib.h"
#include "lualib.h"

#define HOOK_EVERY 1000 /* instructions between budget checks */

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

static void budget_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  kl_sandbox *sb;
  lua_getallocf(L, (void **)&sb);
  sb->steps -= HOOK_EVERY;
  if (sb->steps < 0) luaL_error(L, "instruction budget exhausted (infinite loop?)");
}

/* Globals a chunk must not see: they reach files, processes, other chunks
 * (including bytecode) or the collector's knobs. */
static const char *const banned[] = {"dofile", "loadfile", "load", "require",
                                     "collectgarbage", "print", NULL};

static void open_libs(lua_State *L) {
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
  /* Trusted code (the template engine) gets `load` back from the registry;
   * chunks run in the sandbox cannot reach the registry. */
  lua_getglobal(L, "load");
  lua_setfield(L, LUA_REGISTRYINDEX, KL_SANDBOX_LOAD_KEY);
  for (const char *const *b = banned; *b; b++) {
    lua_pushnil(L);
    lua_setglobal(L, *b);
  }
  /* string.dump makes bytecode; math.randomseed/random are harmless but make
   * specs non-reproducible. */
  lua_getglobal(L, LUA_STRLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "dump");
  lua_pop(L, 1);
  lua_getglobal(L, LUA_MATHLIBNAME);
  lua_pushnil(L);
  lua_setfield(L, -2, "random");
  lua_pushnil(L);
  lua_setfield(L, -2, "randomseed");
  lua_pop(L, 1);
}

int kl_sandbox_open(kl_sandbox *sb) {
  memset(sb, 0, sizeof *sb);
  sb->cap = KL_SANDBOX_MEM;
  sb->L = lua_newstate(cap_alloc, sb);
  if (sb->L == NULL) return -1;
  open_libs(sb->L);
  return 0;
}

void kl_sandbox_close(kl_sandbox *sb) {
  if (sb->L) lua_close(sb->L);
  sb->L = NULL;
}

int kl_sandbox_load(kl_sandbox *sb, const char *chunkname, const char *src, size_t len) {
  /* mode "t": a precompiled chunk can crash the VM, so only text is accepted. */
  return luaL_loadbufferx(sb->L, src, len, chunkname, "t");
}

int kl_sandbox_call(kl_sandbox *sb, int nargs, int nres) {
  sb->steps = KL_SANDBOX_STEPS;
  lua_sethook(sb->L, budget_hook, LUA_MASKCOUNT, HOOK_EVERY);
  int rc = lua_pcall(sb->L, nargs, nres, 0);
  lua_sethook(sb->L, NULL, 0, 0);
  return rc;
}
