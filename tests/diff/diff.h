/* The randomized differential suite (tests/diff): random specs and steps,
 * every call of kl_gather, kl_argmax and kl_topk compared with a reference
 * computed on the host from the gathered input. See diff_main.c. */
#ifndef KL_DIFF_H
#define KL_DIFF_H

#include <stddef.h>
#include <stdint.h>

#include "klgen.h"

/* ---- diff_rng.c: splitmix64, the only source of randomness ---- */
typedef struct rng {
  uint64_t s;
} rng;
uint64_t rng_next(rng *r);
uint64_t rng_below(rng *r, uint64_t n);            /* [0, n), n > 0 */
int64_t rng_range(rng *r, int64_t lo, int64_t hi); /* [lo, hi] */
int rng_chance(rng *r, double p);
double rng_unit(rng *r); /* [0, 1) */
/* A stream of its own for part `tag` of case `seed`. */
rng rng_for(uint64_t seed, uint64_t tag);

/* ---- diff_spec.c: a random case ---- */
typedef enum nccl_mode { NCCL_NONE, NCCL_STANDIN, NCCL_REAL } nccl_mode;

typedef struct diff_case {
  uint64_t seed;
  char lua[1024];   /* the spec as the runtime gets it */
  int valid;        /* the drawn spec is valid (else creation must fail with KLRT_ESPEC) */
  kl_spec spec;     /* loaded from lua (valid cases) */
  kl_layout layout;
  int has_nccl;     /* the ranks have a communicator (tp > 1) */
  int disable;      /* KLGEN_DISABLE=1 on every rank */
  long long crossover; /* kl_config.crossover_bytes (0: the default) */
  int steps;        /* eager steps */
  int graph;        /* then a step captured in a CUDA graph and replayed */
  int wrap;         /* step counters started just below their wrap */
  int extra_tokens; /* steps draw tokens up to max_tokens + this */
} diff_case;

/* Elements of one step's input, all ranks (tokens x padded vocab): bounds the
 * host's reference work and the memory of up to 16 ranks. Rows per step. */
#define DIFF_ELEM_BUDGET (2 << 20)
#define DIFF_MAX_ROWS 160

/* What every case of a run shares: ranks on `devices` GPUs (1: tp from
 * min_tp to max_tp, at most 16; 2: tp 1 or 2 on two GPUs), the NCCL the
 * ranks have, the specs' poll limit. min_tp 0 or 1 leaves the draws as they
 * are without it (a seed replays the same case). */
typedef struct diff_knobs {
  int devices;
  nccl_mode nccl;
  int max_tp;
  int timeout_ms;
  int min_tp;
} diff_knobs;

/* Draws case `seed`. Deterministic. 0, or -1 with why (the loader refused a
 * spec the draw meant to be valid: a finding of its own). */
int diff_draw(uint64_t seed, const diff_knobs *k, diff_case *c, char *why, size_t n);
/* The chunk name the runtime gives a spec string (kl_ctx_create_string). */
#define DIFF_CHUNK "<spec string>"

/* ---- diff_data.c: test rows ---- */
int diff_row_kinds(void);
/* Row of `padded` element bits (low 16 bits for 16-bit dtypes) of kind
 * `kind`: columns past vocab are padding (NaN, Inf, random bits). */
void diff_fill_row(rng *r, int dtype, int kind, uint32_t *row, int64_t vocab, int64_t padded);

/* ---- diff_ref.c: the reference, from the host's copy of the input ---- */
uint32_t f32_bits(float f);
float f32_of(uint32_t bits);
float bf16_to_f(uint16_t h);
float fp16_to_f(uint16_t h);
uint16_t f_to_bf16(float f); /* round to nearest even */
uint16_t f_to_fp16(float f); /* round to nearest even */
/* Element bits of dtype d as a float (exact). */
float elem_to_f(int dtype, uint32_t bits);
/* A float rounded to dtype d, as bits. */
uint32_t f_to_elem(int dtype, float f);

/* The spec's epilogue in the engine's order, split around tanhf, whose
 * result must be the device's (it is not correctly rounded): args_for gives
 * tanhf's argument for an input, finish the output bits from the input and
 * tanhf of that argument (ignored without a soft-cap). */
typedef struct epilogue {
  int on, dtype, out_dtype, engine, has_cap, has_scale;
  float cap, inv_cap, scale;
} epilogue;
void epilogue_of(const kl_spec *s, epilogue *e);
float epilogue_arg(const epilogue *e, float x);
uint32_t epilogue_finish(const epilogue *e, float x, float tanh_arg);

/* Row t's selections from its `n` values (as out holds them, in fp32):
 * the index and value of the largest (torch.argmax: first of equals, NaN
 * largest, -0 == +0), the k largest (descending, ties to the lowest column),
 * and the log-sum-exp in float64. */
void ref_topk(const float *v, int64_t n, int k, int64_t *index, uint32_t *value_bits);
double ref_lse(const float *v, int64_t n);
/* Whether a kernel's lse is within the tolerance of the float64 one. */
int lse_close(float got, double want);

#endif
