/* A random case: a spec (as Lua, the way a user writes one) and how it is run. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "diff.h"


static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static int pick(rng *r, const int *v, const int *w, int n) {
  int total = 0;
  for (int i = 0; i < n; i++) total += w[i];
  int x = (int)rng_below(r, (uint64_t)total);
  for (int i = 0; i < n; i++)
    if ((x -= w[i]) < 0) return v[i];
  return v[n - 1];
}

static int64_t draw_vocab(rng *r) {
  switch (rng_below(r, 4)) {
  case 0: return rng_range(r, 1, 300);
  case 1: return rng_range(r, 301, 8192);
  case 2: return rng_range(r, 8193, 65536);
  default: return rng_range(r, 65537, 300000);
  }
}

/* Appends ", key = value" to the spec text (1024 bytes). */
__attribute__((format(printf, 3, 4))) static void field(char *lua, const char *key,
                                                        const char *fmt, ...) {
  size_t n = strlen(lua);
  n += (size_t)snprintf(lua + n, 1024 - n, ", %s = ", key);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(lua + n, 1024 - n, fmt, ap);
  va_end(ap);
}

/* The padding: vLLM's default (pad_to 64, omitted), a pad_to, or a padded
 * vocabulary that may leave ranks mostly or wholly padding. Returns the
 * padded vocabulary; *valid 0 when tp does not divide it. */
static int64_t draw_padding(rng *r, int64_t vocab, int tp, char *lua, int *valid) {
  int mode = (int)rng_below(r, 20);
  if (mode < 8) { /* default */
    int64_t p = round_up(vocab, 64);
    if (p % tp == 0) return p;
    mode = 20; /* make it valid with an explicit padded vocab */
  } else if (mode < 13) {
    int64_t m = rng_chance(r, 0.5) ? tp * rng_range(r, 1, 256) : rng_range(r, 1, 4096);
    int64_t p = round_up(vocab, m);
    if (p % tp == 0 && p <= 2 * (int64_t)KL_VOCAB_MAX) {
      field(lua, "pad_to", "%lld", (long long)m);
      return p;
    }
    mode = 20;
  }
  /* padded_vocab: up to a few shards of padding, now and then most of the row */
  int64_t base = round_up(vocab, tp);
  int64_t shard = base / tp;
  int64_t extra = rng_chance(r, 0.3) ? 0 : rng_chance(r, 0.7) ? rng_range(r, 0, 3) * tp
                  : tp * rng_range(r, 1, 3 * shard + 8);
  int64_t p = base + extra;
  if (mode == 20 && rng_chance(r, 0.03)) { /* now and then a padded vocab tp does not divide */
    p += 1 + (int64_t)rng_below(r, (uint64_t)(tp > 1 ? tp - 1 : 1));
    *valid = tp == 1;
  }
  field(lua, "padded_vocab", "%lld", (long long)p);
  return p;
}

static void draw_epilogue(rng *r, const char *dtype, char *lua) {
  if (rng_chance(r, 0.45)) return;
  int any = 0;
  if (strcmp(dtype, "fp32") != 0 && rng_chance(r, 0.5)) field(lua, "out_dtype", "\"fp32\""), any = 1;
  if (rng_chance(r, 0.5)) field(lua, "softcap", "%.17g", pow(10.0, 5.0 * rng_unit(r) - 2.0)), any = 1;
  if (rng_chance(r, 0.45)) {
    double s = rng_chance(r, 0.1) ? 1.0 : pow(10.0, 6.0 * rng_unit(r) - 3.0);
    field(lua, "scale", "%.17g", rng_chance(r, 0.3) ? -s : s);
    any = 1;
  }
  if (any || rng_chance(r, 0.2)) field(lua, "numerics", rng_chance(r, 0.5) ? "\"engine\"" : "\"fp32\"");
}

static int draw_topk(rng *r, int64_t vocab) {
  static const int edges[] = {1, 2, 8, 16, 17, 31, 32, 33, 63, 64};
  int k = rng_chance(r, 0.4) ? edges[rng_below(r, 10)] : (int)rng_range(r, 1, 64);
  return k > vocab ? (int)vocab : k;
}

int diff_draw(uint64_t seed, const diff_knobs *k, diff_case *c, char *why, size_t n) {
  static const int tps[] = {1, 2, 3, 4, 6, 8, 16}, tpw[] = {2, 5, 2, 4, 2, 4, 2};
  static const char *const dtypes[] = {"bf16", "fp16", "fp32"};
  memset(c, 0, sizeof *c);
  c->seed = seed;
  rng r = rng_for(seed, 1);
  int tp = k->devices == 2 ? (rng_chance(&r, 0.85) ? 2 : 1) : pick(&r, tps, tpw, 7);
  while (tp > k->max_tp || (k->devices != 2 && tp < k->min_tp)) tp = tps[rng_below(&r, 7)];
  int64_t vocab = draw_vocab(&r);
  const char *dtype = dtypes[rng_below(&r, 3)];
  c->valid = 1;
  snprintf(c->lua, sizeof c->lua, "return { name = \"diff_%016llx\", vocab_size = %lld, tp = %d, "
           "dtype = \"%s\"", (unsigned long long)seed, (long long)vocab, tp, dtype);
  int64_t padded = draw_padding(&r, vocab, tp, c->lua, &c->valid);
  c->has_nccl = tp > 1 && k->nccl != NCCL_NONE;
  /* max_tokens: as large as the element budget leaves, steps past it too */
  int64_t room = DIFF_ELEM_BUDGET / padded;
  int64_t most = room < 1 ? 1 : room > 96 ? 96 : room;
  int64_t max_tokens = rng_chance(&r, 0.6) ? rng_range(&r, 1, most < 16 ? most : 16)
                                            : rng_range(&r, 1, most);
  c->extra_tokens = c->has_nccl || tp == 1 ? (int)rng_range(&r, 0, max_tokens / 2 + 2) : 0;
  if (max_tokens + c->extra_tokens > room && room >= 1) {
    c->extra_tokens = (int)(room - max_tokens);
    if (c->extra_tokens < 0) c->extra_tokens = 0;
  }
  field(c->lua, "max_tokens", "%lld", (long long)max_tokens);
  field(c->lua, "timeout_ms", "%d", k->timeout_ms);
  draw_epilogue(&r, dtype, c->lua);
  int topk = rng_chance(&r, 0.7);
  if (topk) field(c->lua, "topk", "%d", draw_topk(&r, vocab));
  /* from a stream of its own: the other draws of a seed stay as they were */
  rng nr = rng_for(seed, 3);
  if (topk && rng_chance(&nr, 0.3)) field(c->lua, "noise", "\"vllm\"");
  size_t len = strlen(c->lua);
  snprintf(c->lua + len, sizeof c->lua - len, " }");

  int other_path = c->has_nccl || tp == 1; /* the NCCL path can serve (tp 1: a copy) */
  c->disable = other_path && rng_chance(&r, 0.15);
  c->steps = (int)rng_range(&r, 3, 6);
  c->graph = rng_chance(&r, 0.35);
  c->wrap = rng_chance(&r, 0.15);

  kl_spec_list l;
  kl_err err;
  kl_limits lim = {10000, 0};
  int rc = kl_spec_load_string(DIFF_CHUNK, c->lua, strlen(c->lua), &lim, &l, &err);
  if (!c->valid) {
    if (rc == 0) {
      kl_spec_list_free(&l);
      snprintf(why, n, "the loader accepted a spec that tp cannot divide: %s", c->lua);
      return -1;
    }
    return 0;
  }
  if (rc != 0) {
    snprintf(why, n, "the loader refused a valid spec: %s", err.msg);
    return -1;
  }
  c->spec = l.v[0];
  kl_spec_list_free(&l);
  if (kl_layout_derive(&c->spec, &c->layout, &err) != 0) {
    snprintf(why, n, "layout: %s", err.msg);
    return -1;
  }
  if (other_path && !c->disable && rng_chance(&r, 0.12))
    c->crossover = 1 + (long long)rng_below(&r, (uint64_t)(c->layout.shard_bytes * max_tokens));
  return 0;
}
