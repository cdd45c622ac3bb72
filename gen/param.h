/* The environment variables klgen's libraries read (param.c): one table, one
 * parser, in libklgen so that libklrt and the klgen command share it: a
 * value (KLGEN_SPEC_TIME_MS) means, and is refused, the same everywhere.
 * Needs nothing but libc. */
#ifndef KL_PARAM_H
#define KL_PARAM_H

#include <stddef.h>

typedef enum kl_param_id {
  KL_P_DISABLE, KL_P_LOG, KL_P_CROSSOVER_BYTES, KL_P_TUNE_FILE, KL_P_PDL, KL_P_CACHE_DIR,
  KL_P_SPEC_TIME_MS, KL_P_NVRTC_LIBRARY, KL_P_NCCL_LIBRARY, KL_P_MAX_CONNECTIONS,
  KL_P_SHARD_SUBPARTS, KL_P_COUNT
} kl_param_id;
/* DIR: a STR that must be an absolute path (a relative one would depend on
 * the working directory of whatever process reads it). */
typedef enum { KL_PARAM_BOOL, KL_PARAM_INT, KL_PARAM_STR, KL_PARAM_DIR } kl_param_kind;
typedef struct kl_param {
  const char *name;
  kl_param_kind kind;
  long long def, lo, hi; /* BOOL and INT */
  const char *doc;
} kl_param;
extern const kl_param kl_params[KL_P_COUNT];
/* Every variable of the table that is set must parse: 0, or -1 with why
 * naming the first that does not. The bottom of the library: it reports
 * through why, never through err.c (which reads KLGEN_LOG from here). */
#define KL_PARAM_WHY 200
int kl_params_check(char *why, size_t n);
/* v as a value of parameter id: 0 and *out (BOOL, INT; 0 for the others),
 * or -1 with why: "<what>: expected ...", what being how v was given
 * (NULL: "NAME='v'", the variable). */
int kl_param_parse(kl_param_id id, const char *v, const char *what, long long *out, char *why,
                   size_t n);
/* A BOOL or INT as kl_params_check reads it: 0 and *out (the default when
 * unset), or -1 with why when it is set to what does not parse. */
int kl_param_get(kl_param_id id, long long *out, char *why, size_t n);
/* A BOOL or INT: its value if set and valid (*given = 1), else the default. */
long long kl_param_int(kl_param_id id, int *given);
/* A STR or DIR: its value, or NULL when unset, "" or (DIR) not valid. */
const char *kl_param_str(kl_param_id id);

#endif
