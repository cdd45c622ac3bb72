/* A Lua 5.4 state that runs untrusted text inside someone else's process
 * (docs/design/spec.md). Shared by spec loading and template rendering.
 *
 * What bounds it, without signals (the host owns them) and without trusting
 * Lua's own pcall:
 *   - time: a monotonic clock compared with a deadline set once the state
 *     is made, read by a hook on every function call (C functions included)
 *     and every `period` VM instructions; by the parser's reader between
 *     pieces of the text; by the allocator, every 256 KiB asked for or 64
 *     calls (rehashing, string building, table growth: C work linear in the
 *     bytes allocated, with no instruction between); and by the sandbox's
 *     own C loop (sort). An instruction's work is at most linear in the
 *     longest string (string comparison, coercion, hashing), so the period
 *     shrinks as strings grow: from 1000 instructions down to every
 *     instruction once a string of 1 MiB exists. Past the deadline every
 *     instruction and call raises an error and, a few reads later, the
 *     allocator refuses any growth, so a spec that catches one with pcall
 *     cannot run a single instruction more, and a C loop stops at an
 *     allocation; closing the state arms the same trap, so to-be-closed
 *     handlers cannot run either.
 *   - memory: the allocator refuses growth past a cap, and (specs) any
 *     string longer than KL_SPEC_STRING_MAX.
 *   - C code that could loop without a clock read: not in the restricted
 *     environment (pattern matching, table.move, setmetatable, whose __mode
 *     would let the collector's atomic step grow with the square of a weak
 *     table), bounded (string.rep by the string cap), or the sandbox's own
 *     (table.sort reads the clock as the hook does). Specs run in it, and
 *     so does template code (specs/README.md lists what it holds).
 * Every Lua API call that can raise an error runs inside lua_pcall: an error
 * outside one would reach Lua's panic handler, which aborts the process. */
#ifndef KL_SANDBOX_H
#define KL_SANDBOX_H

#include <stddef.h>
#include <stdint.h>

#include "klgen.h"
#include "lua.h"

/* The engine's (registry): its `load(text, chunkname, env)` and the
 * restricted environment that template code reads behind its constants. */
#define KL_SANDBOX_LOAD_KEY "klgen.load"
#define KL_SANDBOX_ENV_KEY "klgen.env"

typedef enum kl_sandbox_kind {
  KL_SANDBOX_SPEC,  /* a spec: the restricted environment of specs/README.md */
  KL_SANDBOX_ENGINE /* the template engine: the libraries, patterns included */
} kl_sandbox_kind;

/* Why the allocator last refused: the cap on all memory, or on one string. */
typedef enum kl_refusal { KL_REFUSED_NONE, KL_REFUSED_MEMORY, KL_REFUSED_STRING } kl_refusal;

typedef struct kl_sandbox {
  lua_State *L;
  size_t used, cap;
  size_t string_max;   /* 0: no cap on one string (the engine) */
  size_t longest;      /* the longest string allocated so far, in bytes */
  int period;          /* instructions between clock reads */
  int64_t alloc_work;  /* allocation work left until the allocator reads the clock */
  kl_refusal refused;
  int64_t deadline_ns; /* CLOCK_MONOTONIC */
  int64_t time_ms;     /* the limit, for messages */
  int expired;         /* sticky: every later instruction raises an error */
  int no_growth;       /* sticky: the allocator refuses every growth */
  int grace;           /* the allocator's clock turns since the deadline */
  char label[64];      /* the chunk being parsed, as messages name it */
  char here[96];       /* "label:line: " last noted (the hook, the parser) */
  int64_t located_ns;  /* when the hook last noted it */
  char timeout[160];   /* "label:line: ran past its time limit (N ms)" */
} kl_sandbox;

/* Opens a state and starts its clock. lim NULL or 0 fields: the defaults.
 * Returns 0, or -1 if the state could not be made. */
int kl_sandbox_open(kl_sandbox *sb, kl_sandbox_kind kind, const kl_limits *lim);
/* Closes the state; no Lua code runs during the close. */
void kl_sandbox_close(kl_sandbox *sb);
/* Parses a text chunk (binary refused) under the clock; on success leaves
 * the function on the stack. chunkname as lua_load's. */
int kl_sandbox_load(kl_sandbox *sb, const char *chunkname, const char *src, size_t len);
/* lua_pcall under the sandbox's bounds; nargs/nres as lua_pcall. */
int kl_sandbox_call(kl_sandbox *sb, int nargs, int nres);
/* Runs f(L) with ud as its only argument (a light userdata), protected.
 * Returns a lua_pcall status; on error the message is on the stack. */
int kl_sandbox_run(kl_sandbox *sb, lua_CFunction f, void *ud);
/* For C code running inside the sandbox: raises the time-limit error if the
 * deadline has passed. */
void kl_sandbox_check(lua_State *L);
/* The message of a failed call or load: the time limit once it has passed,
 * "exceeded its memory limit", or Lua's. */
const char *kl_sandbox_message(kl_sandbox *sb, int status);

#endif
