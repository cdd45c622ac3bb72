/* A Lua 5.4 state that runs untrusted text inside someone else's process
 * (docs/DESIGN.md §1). Shared by spec loading and template rendering.
 *
 * What bounds it, without signals (the host owns them) and without trusting
 * Lua's own pcall:
 *   - time: a count hook compares a monotonic clock with a deadline set when
 *     the state opens. Past it the hook raises an error at every instruction
 *     from then on, so a spec that catches the error with pcall cannot run a
 *     single instruction more; closing the state arms the same trap, so
 *     finalizers and to-be-closed handlers cannot run either.
 *   - memory: the allocator refuses growth past a cap.
 *   - C code that loops without running VM instructions (pattern matching,
 *     table.move, string.rep of "" a huge number of times, lengths taken
 *     through __len): not in a spec's environment, or wrapped so that its
 *     work is bounded by the memory cap (specs/README.md lists what a spec
 *     may use).
 * Every Lua API call that can raise an error runs inside lua_pcall: an error
 * outside one would reach Lua's panic handler, which aborts the process. */
#ifndef KL_SANDBOX_H
#define KL_SANDBOX_H

#include <stddef.h>
#include <stdint.h>

#include "klgen.h"
#include "lua.h"

#define KL_SANDBOX_LOAD_KEY "klgen.load"

typedef enum kl_sandbox_kind {
  KL_SANDBOX_SPEC,  /* a spec: the restricted environment of specs/README.md */
  KL_SANDBOX_ENGINE /* the template engine: also patterns and `load` (in the registry) */
} kl_sandbox_kind;

typedef struct kl_sandbox {
  lua_State *L;
  size_t used, cap;
  int64_t deadline_ns; /* CLOCK_MONOTONIC */
  int64_t time_ms;     /* the limit, for messages */
  int expired;         /* sticky: every later instruction raises an error */
  int closing;
} kl_sandbox;

/* Opens a state and starts its clock. lim NULL or 0 fields: the defaults.
 * Returns 0, or -1 if the state could not be made. */
int kl_sandbox_open(kl_sandbox *sb, kl_sandbox_kind kind, const kl_limits *lim);
/* Closes the state; no Lua code runs during the close. */
void kl_sandbox_close(kl_sandbox *sb);
/* Loads a text chunk (binary refused); on success leaves the function on the stack. */
int kl_sandbox_load(kl_sandbox *sb, const char *chunkname, const char *src, size_t len);
/* lua_pcall under the sandbox's bounds; nargs/nres as lua_pcall. */
int kl_sandbox_call(kl_sandbox *sb, int nargs, int nres);
/* Runs f(L) with ud as its only argument (a light userdata), protected.
 * Returns a lua_pcall status; on error the message is on the stack. */
int kl_sandbox_run(kl_sandbox *sb, lua_CFunction f, void *ud);
/* The message of a failed call ("time limit", "memory limit", or Lua's). */
const char *kl_sandbox_message(kl_sandbox *sb, int status);

#endif
