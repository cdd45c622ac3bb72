/* Environment variables: the one table of what libklrt and klgen read (NCCL's model),
 * and the one place that reads and validates them. README's table of
 * variables is checked against this one (test_api). A bad value is an error
 * at context creation that names the variable: a typo in a setting that
 * changes the path or the limits must not pass silently. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "klgen.h"
#include "param.h"

const kl_param kl_params[KL_P_COUNT] = {
    [KL_P_DISABLE] = {"KLGEN_DISABLE", KL_PARAM_BOOL, 0, 0, 1,
                      "force the NCCL path (on any rank: all ranks agree at creation)"},
    [KL_P_LOG] = {"KLGEN_LOG", KL_PARAM_BOOL, 0, 0, 1,
                  "log creation and every change of path, with the decline reason, to stderr"},
    [KL_P_CROSSOVER_BYTES] = {"KLGEN_CROSSOVER_BYTES", KL_PARAM_INT, 0, 0, 1LL << 40,
                              "per-rank bytes per step above which NCCL serves"},
    [KL_P_TUNE_FILE] = {"KLGEN_TUNE_FILE", KL_PARAM_STR, 0, 0, 0,
                        "crossover table written by klbench --tune"},
    [KL_P_PDL] = {"KLGEN_PDL", KL_PARAM_BOOL, 1, 0, 1,
                  "0: launch the one-shot kernel without programmatic dependent launch"},
    [KL_P_CACHE_DIR] = {"KLGEN_CACHE_DIR", KL_PARAM_DIR, 0, 0, 0,
                        "JIT cache directory (an absolute path)"},
    [KL_P_SPEC_TIME_MS] = {"KLGEN_SPEC_TIME_MS", KL_PARAM_INT, KL_SPEC_TIME_MS, 1, 3600000,
                           "wall-clock limit for a spec's code, in ms"},
    [KL_P_NVRTC_LIBRARY] = {"KLGEN_NVRTC_LIBRARY", KL_PARAM_STR, 0, 0, 0,
                            "NVRTC to load when none is in the process yet"},
    [KL_P_NCCL_LIBRARY] = {"KLGEN_NCCL_LIBRARY", KL_PARAM_STR, 0, 0, 0,
                           "NCCL to load when none is in the process yet"},
    [KL_P_MAX_CONNECTIONS] = {"CUDA_DEVICE_MAX_CONNECTIONS", KL_PARAM_INT, 8, 1, 1 << 20,
                              "CUDA's; must be 32 when ranks share a GPU"},
    [KL_P_SHARD_SUBPARTS] = {"KLGEN_SHARD_SUBPARTS", KL_PARAM_INT, 4, 1, 4,
                             "kl_sample without filters at few tokens: CTAs a part of the shard "
                             "sampler at most (1: off; the group's least)"},
};

static const char *const truths[] = {"1", "true", "yes", "on", NULL};
static const char *const lies[] = {"0", "false", "no", "off", NULL};

static int in_list(const char *v, const char *const *list) {
  for (; *list; list++)
    if (strcasecmp(v, *list) == 0) return 1;
  return 0;
}

int kl_param_parse(kl_param_id id, const char *v, const char *what, long long *out, char *why,
                   size_t n) {
  const kl_param *p = &kl_params[id];
  char given[96];
  if (!what) snprintf(given, sizeof given, "%s='%.64s'", p->name, v);
  else snprintf(given, sizeof given, "%s", what);
  *out = 0;
  if (p->kind == KL_PARAM_STR) return 0;
  if (p->kind == KL_PARAM_DIR) {
    if (v[0] == '/') return 0;
    snprintf(why, n, "%s: expected an absolute path", given);
    return -1;
  }
  if (p->kind == KL_PARAM_BOOL) {
    if (in_list(v, truths)) return *out = 1, 0;
    if (in_list(v, lies)) return 0;
    snprintf(why, n, "%s: expected 1/true/yes/on or 0/false/no/off", given);
    return -1;
  }
  char *end;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || x < p->lo || x > p->hi) {
    snprintf(why, n, "%s: expected an integer in %lld..%lld", given, p->lo, p->hi);
    return -1;
  }
  *out = x;
  return 0;
}

static const char *value_of(kl_param_id id) {
  const char *v = getenv(kl_params[id].name);
  return v && *v ? v : NULL; /* set to "": as if unset */
}

int kl_params_check(char *why, size_t n) {
  for (int i = 0; i < KL_P_COUNT; i++) {
    const char *v = value_of((kl_param_id)i);
    long long x;
    if (v && kl_param_parse((kl_param_id)i, v, NULL, &x, why, n) != 0) return -1;
  }
  return 0;
}

int kl_param_get(kl_param_id id, long long *out, char *why, size_t n) {
  const char *v = value_of(id);
  *out = kl_params[id].def;
  return v ? kl_param_parse(id, v, NULL, out, why, n) : 0;
}

long long kl_param_int(kl_param_id id, int *given) {
  long long x;
  char why[KL_PARAM_WHY];
  int ok = value_of(id) && kl_param_get(id, &x, why, sizeof why) == 0;
  if (given) *given = ok;
  return ok ? x : kl_params[id].def;
}

const char *kl_param_str(kl_param_id id) {
  const char *v = value_of(id);
  long long x;
  char why[KL_PARAM_WHY];
  return v && kl_param_parse(id, v, NULL, &x, why, sizeof why) == 0 ? v : NULL;
}
