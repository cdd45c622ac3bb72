/* Test rows: the kinds of input that break selection and gather code. A row
 * is the whole padded vocabulary (every rank's shard side by side), as element
 * bits; columns past vocab_size are padding, filled with NaN, Inf and random
 * bits that must never count. */
#include <math.h>
#include <string.h>

#include "diff.h"

enum {
  ROW_RANDOM_BITS, /* every bit pattern: NaN payloads, +-Inf, -0, subnormals */
  ROW_LOGITS,      /* normal, sigma 1..10: what a model gives */
  ROW_SMALL_INTS,  /* -3..3: ties everywhere */
  ROW_ALL_NEG_INF,
  ROW_ALL_EQUAL,   /* one value (finite, +-0, +Inf or NaN) everywhere */
  ROW_SPARSE,      /* -Inf but for a few finite values */
  ROW_SPECIALS,    /* logits with NaN, +-Inf, -0, subnormals sprinkled in */
  ROW_SORTED,      /* ascending or descending logits */
  ROW_EXTREMES,    /* the largest and smallest magnitudes of the dtype */
  ROW_TIED_TOP,    /* one maximum at several columns, across ranks and padding */
  ROW_EVERY_VALUE, /* 16-bit: every bit pattern in column order */
  ROW_KINDS
};

static uint32_t elem_mask(int dtype) { return dtype == KL_FP32 ? 0xffffffffu : 0xffffu; }
static uint32_t nan_bits(int dtype) { return dtype == KL_FP32 ? 0x7fc00000u : dtype == KL_BF16 ? 0x7fc0u : 0x7e00u; }
static uint32_t inf_bits(int dtype) { return dtype == KL_FP32 ? 0x7f800000u : dtype == KL_BF16 ? 0x7f80u : 0x7c00u; }
static uint32_t sign_bit(int dtype) { return dtype == KL_FP32 ? 0x80000000u : 0x8000u; }

static double normal(rng *r) {
  double u = rng_unit(r), v = rng_unit(r);
  return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

/* A special value of the dtype: NaN (random payload, either sign), +-Inf,
 * -0, +0, or a subnormal of either sign. */
static uint32_t special(rng *r, int dtype) {
  uint32_t m = elem_mask(dtype), s = rng_chance(r, 0.5) ? sign_bit(dtype) : 0;
  switch (rng_below(r, 5)) {
  case 0: return (inf_bits(dtype) | s | (1u + (uint32_t)rng_below(r, (m >> 1) - inf_bits(dtype)))) & m;
  case 1: return inf_bits(dtype) | s;
  case 2: return sign_bit(dtype);
  case 3: return 0;
  default: return s | (1u + (uint32_t)rng_below(r, inf_bits(dtype) >> (dtype == KL_FP32 ? 8 : 5)));
  }
}

static uint32_t of_float(int dtype, double x) { return f_to_elem(dtype, (float)x); }

static void fill_real(rng *r, int dtype, int kind, uint32_t *row, int64_t n) {
  uint32_t m = elem_mask(dtype), ninf = inf_bits(dtype) | sign_bit(dtype);
  double sigma = 1.0 + 9.0 * rng_unit(r);
  switch (kind) {
  case ROW_RANDOM_BITS:
    for (int64_t j = 0; j < n; j++) row[j] = (uint32_t)rng_next(r) & m;
    break;
  case ROW_SMALL_INTS:
    for (int64_t j = 0; j < n; j++) row[j] = of_float(dtype, (double)rng_range(r, -3, 3));
    break;
  case ROW_ALL_NEG_INF:
    for (int64_t j = 0; j < n; j++) row[j] = ninf;
    break;
  case ROW_ALL_EQUAL: {
    uint32_t v = rng_chance(r, 0.6) ? of_float(dtype, sigma * normal(r)) : special(r, dtype);
    int mix0 = rng_chance(r, 0.3); /* -0 and +0 side by side */
    for (int64_t j = 0; j < n; j++) row[j] = mix0 ? (rng_chance(r, 0.5) ? sign_bit(dtype) : 0) : v;
    break;
  }
  case ROW_SPARSE:
    for (int64_t j = 0; j < n; j++)
      row[j] = rng_chance(r, 0.002) ? of_float(dtype, sigma * normal(r)) : ninf;
    break;
  case ROW_SPECIALS:
    for (int64_t j = 0; j < n; j++)
      row[j] = rng_chance(r, 0.01) ? special(r, dtype) : of_float(dtype, sigma * normal(r));
    break;
  case ROW_SORTED: {
    int up = rng_chance(r, 0.5);
    for (int64_t j = 0; j < n; j++) {
      double x = -8.0 + 16.0 * (double)j / (double)(n > 1 ? n - 1 : 1);
      row[j] = of_float(dtype, up ? x : -x);
    }
    break;
  }
  case ROW_EXTREMES: {
    static const double big[] = {3.3e38, 6.5e4, 1e30, 1e-30, 1e-40, 3.0e-8, 1.0};
    for (int64_t j = 0; j < n; j++) {
      double x = big[rng_below(r, 7)] * (0.5 + rng_unit(r));
      row[j] = of_float(dtype, rng_chance(r, 0.5) ? -x : x);
    }
    break;
  }
  case ROW_TIED_TOP: {
    for (int64_t j = 0; j < n; j++) row[j] = of_float(dtype, -1.0 - 4.0 * rng_unit(r));
    uint32_t top = rng_chance(r, 0.8) ? of_float(dtype, 2.0) : special(r, dtype);
    int64_t ties = rng_range(r, 2, 70);
    for (int64_t i = 0; i < ties; i++) row[rng_below(r, (uint64_t)n)] = top;
    row[n - 1] = top; /* the last real column, beside the padding */
    break;
  }
  case ROW_EVERY_VALUE:
    if (dtype != KL_FP32) {
      uint32_t start = (uint32_t)rng_below(r, 65536);
      for (int64_t j = 0; j < n; j++) row[j] = (start + (uint32_t)j) & 0xffffu;
    } else { /* too many: logits */
      for (int64_t j = 0; j < n; j++) row[j] = of_float(dtype, sigma * normal(r));
    }
    break;
  default:
    for (int64_t j = 0; j < n; j++) row[j] = of_float(dtype, sigma * normal(r));
  }
}

int diff_row_kinds(void) { return ROW_KINDS; }

void diff_fill_row(rng *r, int dtype, int kind, uint32_t *row, int64_t vocab, int64_t padded) {
  fill_real(r, dtype, kind, row, vocab);
  int garbage = (int)rng_below(r, 3); /* padding: NaN, +Inf, or random bits */
  for (int64_t j = vocab; j < padded; j++)
    row[j] = garbage == 0 ? nan_bits(dtype) | (uint32_t)(rng_next(r) & 1u)
             : garbage == 1 ? inf_bits(dtype) : (uint32_t)rng_next(r) & elem_mask(dtype);
}
