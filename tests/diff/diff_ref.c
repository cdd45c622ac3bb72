/* The reference: written from torch's and IEEE's definitions on the host, not
 * from the kernels' helpers. Only tanhf comes from the device (it is not
 * correctly rounded, so the host's would differ in the last bit); diff_inputs.c
 * evaluates it there for every argument this file asks for. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "diff.h"

uint32_t f32_bits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}
float f32_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

float bf16_to_f(uint16_t h) { return f32_of((uint32_t)h << 16); }

float fp16_to_f(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return f32_of(sign | 0x7f800000u | m << 13); /* Inf, NaN (payload kept) */
  if (e == 0) { /* zero and subnormals: m x 2^-24, exact in float */
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  return f32_of(sign | (e + 112u) << 23 | m << 13);
}

uint16_t f_to_bf16(float f) {
  uint32_t b = f32_bits(f);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40u); /* NaN stays NaN */
  b += 0x7fffu + ((b >> 16) & 1u); /* to nearest, ties to even; carries into Inf */
  return (uint16_t)(b >> 16);
}

uint16_t f_to_fp16(float f) {
  uint32_t b = f32_bits(f), sign = (b >> 16) & 0x8000u, a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to Inf */
  if (a < 0x38800000u) { /* below 2^-14: multiples of 2^-24, rounded to nearest even */
    double q = nearbyint((double)f32_of(a) * 0x1p24);
    return (uint16_t)(sign | (uint32_t)q);
  }
  uint32_t h = ((a >> 23) - 112u) << 10 | (a & 0x7fffffu) >> 13, rem = a & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
  return (uint16_t)(sign | h);
}

float elem_to_f(int dtype, uint32_t bits) {
  return dtype == KL_BF16 ? bf16_to_f((uint16_t)bits)
         : dtype == KL_FP16 ? fp16_to_f((uint16_t)bits) : f32_of(bits);
}

uint32_t f_to_elem(int dtype, float f) {
  return dtype == KL_BF16 ? f_to_bf16(f) : dtype == KL_FP16 ? f_to_fp16(f) : f32_bits(f);
}

/* ---- the epilogue, as the engine's torch ops compute it ---- */

void epilogue_of(const kl_spec *s, epilogue *e) {
  memset(e, 0, sizeof *e);
  e->dtype = (int)s->dtype;
  e->out_dtype = (int)s->out_dtype;
  e->engine = s->numerics == KL_NUMERICS_ENGINE;
  e->has_cap = s->softcap > 0;
  e->has_scale = s->scale != 0 && s->scale != 1;
  e->on = s->out_dtype != s->dtype || e->has_cap || e->has_scale;
  e->cap = (float)s->softcap;
  /* torch divides by a Python scalar as a multiplication by its inverse,
   * taken in float: x / c is x * (1.0f / (float)c) */
  e->inv_cap = e->has_cap ? 1.0f / e->cap : 0.0f;
  e->scale = (float)s->scale;
}

/* Rounded to the model dtype, as each of the engine's ops leaves it. */
static float rnd(const epilogue *e, float x) { return elem_to_f(e->dtype, f_to_elem(e->dtype, x)); }

float epilogue_arg(const epilogue *e, float x) {
  return e->engine ? rnd(e, x * e->inv_cap) : x * e->inv_cap;
}

uint32_t epilogue_finish(const epilogue *e, float x, float t) {
  float y = x;
  if (e->engine) {
    if (e->has_cap) y = rnd(e, rnd(e, t) * e->cap);
    if (e->has_scale) y = rnd(e, y * e->scale);
  } else {
    if (e->has_cap) y = t * e->cap;
    if (e->has_scale) y = y * e->scale;
  }
  return e->out_dtype == KL_FP32 ? f32_bits(y) : f_to_elem(e->dtype, y);
}

/* ---- selections ---- */

/* The order the selections use, as an unsigned key: NaN above everything
 * (all NaNs alike), -0 equal to +0; of equal values the lower column is
 * larger. */
static uint64_t order_key(float v, int64_t col) {
  uint32_t b = f32_bits(v), o;
  if (v != v) o = 0xffffffffu;
  else {
    if (b == 0x80000000u) b = 0;
    o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  }
  return (uint64_t)o << 32 | (uint32_t)(0xffffffffu - (uint32_t)col);
}

static uint32_t value_bits(float v) { return v != v ? 0x7fc00000u : f32_bits(v); }

/* A min-heap of the k largest keys seen. */
static void sift_down(uint64_t *h, int n, int i) {
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < n && h[l] < h[m]) m = l;
    if (r < n && h[r] < h[m]) m = r;
    if (m == i) return;
    uint64_t t = h[i];
    h[i] = h[m], h[m] = t, i = m;
  }
}

static int desc(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? 1 : x > y ? -1 : 0;
}

void ref_topk(const float *v, int64_t n, int k, int64_t *index, uint32_t *value_bits_out) {
  uint64_t heap[64];
  int size = 0;
  for (int64_t j = 0; j < n; j++) {
    uint64_t key = order_key(v[j], j);
    if (size < k) {
      heap[size++] = key;
      if (size == k)
        for (int i = k / 2 - 1; i >= 0; i--) sift_down(heap, k, i);
    } else if (key > heap[0]) {
      heap[0] = key;
      sift_down(heap, k, 0);
    }
  }
  qsort(heap, (size_t)size, sizeof *heap, desc);
  for (int i = 0; i < size; i++) {
    int64_t col = (int64_t)(0xffffffffu - (uint32_t)heap[i]);
    index[i] = col;
    value_bits_out[i] = value_bits(v[col]);
  }
}

double ref_lse(const float *v, int64_t n) {
  int nan = 0, inf = 0;
  double m = -INFINITY;
  for (int64_t j = 0; j < n; j++) {
    if (v[j] != v[j]) nan = 1;
    else if (v[j] == INFINITY) inf = 1;
    else if (v[j] > m) m = v[j];
  }
  if (nan) return NAN;
  if (inf) return INFINITY;
  if (m == -INFINITY) return -INFINITY;
  double s = 0;
  for (int64_t j = 0; j < n; j++) s += exp((double)v[j] - m);
  return m + log(s);
}

/* The kernels sum in float with approximate exponentials, hierarchically
 * (a thread's chunks, a CTA, the records): ~1e-6 relative in the sum, so
 * ~1e-6 absolute in its log, plus float's rounding of the result. */
int lse_close(float got, double want) {
  if (want != want) return got != got;
  if (isinf(want)) return (double)got == want;
  if (!isfinite(got)) return 0;
  return fabs((double)got - want) <= 1e-5 * fmax(1.0, fabs(want));
}
