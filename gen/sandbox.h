/* A Lua 5.4 state that runs untrusted text: base/string/table/math/utf8 only,
 * a memory cap and an instruction budget (DESIGN §1). Shared by spec loading and
 * template rendering. */
#ifndef KL_SANDBOX_H
#define KL_SANDBOX_H

#include <stddef.h>
#include "lua.h"

#define KL_SANDBOX_MEM (32u << 20)   /* bytes a chunk may allocate */
#define KL_SANDBOX_STEPS 50000000LL /* VM instructions, ~0.1-0.5 s */

#define KL_SANDBOX_LOAD_KEY "klgen.load"

typedef struct kl_sandbox {
  lua_State *L;
  size_t used, cap;
  long long steps;
} kl_sandbox;

/* Returns 0, or -1 if the state could not be made. */
int kl_sandbox_open(kl_sandbox *sb);
void kl_sandbox_close(kl_sandbox *sb);
/* Loads a text chunk (binary refused); on success leaves the function on the stack. */
int kl_sandbox_load(kl_sandbox *sb, const char *chunkname, const char *src, size_t len);
/* lua_pcall with the budget armed; nargs/nres as lua_pcall. */
int kl_sandbox_call(kl_sandbox *sb, int nargs, int nres);

#endif
