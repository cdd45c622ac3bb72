/* klbench --grid's options and its kernels' byte model (grid.h): what is
 * decided before any GPU is touched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grid.h"
#include "klgen.h"

const char *const grid_kernel_names[G_NKERNELS] = {"gather", "fused", "argmax",   "topk8", "topk64",
                                                   "greedy", "plain", "filtered", "minp"};

const char grid_tokens[] = "1,2,4,8,16,32,64,128,256,512";
const char grid_quick_tokens[] = "1,8,64,256";
static const int default_widths[] = {20480, 64128, 163840, 262144};
static const int quick_widths[] = {20480, 163840};

/* Per-row parameters kl_sample reads (temperature float, seed and offset
 * int64; top_k int64, top_p and min_p float where the call has them) and
 * the token it writes. */
#define SAMPLE_ROW (4 + 8 + 8 + 8)

const char grid_byte_model[] =
    "  gather    T x W x e read + T x W x e written\n"
    "  fused     T x W x e read + T x W x 4 written (fp32 out)\n"
    "  argmax    T x W x e read + T x 12 written (int64 index, fp32 value)\n"
    "  topk8/64  T x W x e read + T x (12 k + 4) written (indices, values, lse)\n"
    "  greedy    T x W x e read + T x 28 (T, seed, offset read; the int64 token written)\n"
    "  plain     the same as greedy\n"
    "  filtered  T x W x e read + T x 40 (greedy's, top_k int64 and top_p read)\n"
    "  minp      T x W x e read + T x 32 (greedy's, min_p read)\n";

long long grid_bytes(int kernel, long long tokens, long long width, int elem) {
  const long long rows = tokens * width * elem;
  switch (kernel) {
    case G_GATHER: return 2 * rows;
    case G_FUSED: return rows + tokens * width * 4;
    case G_ARGMAX: return rows + tokens * 12;
    case G_TOPK8: return rows + tokens * (12 * 8 + 4);
    case G_TOPK64: return rows + tokens * (12 * 64 + 4);
    case G_GREEDY:
    case G_PLAIN: return rows + tokens * SAMPLE_ROW;
    case G_FILTERED: return rows + tokens * (SAMPLE_ROW + 8 + 4);
    case G_MINP: return rows + tokens * (SAMPLE_ROW + 4);
  }
  return 0;
}

static int usage_error(const char *opt, const char *what) {
  fprintf(stderr, "klbench: %s: %s\n", opt, what);
  return 2;
}

/* Each comma-separated item of list through fn; -1 on an empty item. */
static int each_item(const char *list, int (*fn)(grid_opts *, const char *, size_t), grid_opts *o) {
  const char *p = list;
  for (;;) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == 0 || fn(o, p, n)) return -1;
    if (!end) return 0;
    p = end + 1;
  }
}

static int add_width(grid_opts *o, const char *s, size_t n) {
  char buf[16], *end;
  if (n >= sizeof buf || o->nwidths == GRID_MAX_WIDTHS) return -1;
  memcpy(buf, s, n);
  buf[n] = '\0';
  long v = strtol(buf, &end, 10);
  if (*end || v < GRID_MIN_WIDTH || v > GRID_MAX_WIDTH || v % 8) return -1;
  for (int i = 0; i < o->nwidths; i++)
    if (o->widths[i] == v) return -1;
  o->widths[o->nwidths++] = (int)v;
  return 0;
}

static int add_dtype(grid_opts *o, const char *s, size_t n) {
  unsigned bit = n == 4 && !strncmp(s, "bf16", 4)   ? 1u << KL_BF16
                 : n == 4 && !strncmp(s, "fp32", 4) ? 1u << KL_FP32
                                                     : 0;
  if (!bit || (o->dtypes & bit)) return -1;
  o->dtypes |= bit;
  return 0;
}

static int add_kernel(grid_opts *o, const char *s, size_t n) {
  for (int k = 0; k < G_NKERNELS; k++)
    if (strlen(grid_kernel_names[k]) == n && !strncmp(s, grid_kernel_names[k], n)) {
      if (o->kernels & (1u << k)) return -1;
      o->kernels |= 1u << k;
      return 0;
    }
  return -1;
}

int grid_option(grid_opts *o, const char *opt, const char *value) {
  if (!strcmp(opt, "--widths")) {
    o->nwidths = 0;
    if (each_item(value, add_width, o))
      return usage_error(opt, "expected distinct multiples of 8 from 1024 to 2097152, "
                              "e.g. 20480,163840");
    return 0;
  }
  if (!strcmp(opt, "--dtypes")) {
    o->dtypes = 0;
    if (each_item(value, add_dtype, o)) return usage_error(opt, "expected bf16, fp32 or bf16,fp32");
    return 0;
  }
  if (!strcmp(opt, "--kernels")) {
    o->kernels = 0;
    if (each_item(value, add_kernel, o))
      return usage_error(opt, "expected distinct names of gather, fused, argmax, topk8, topk64, "
                              "greedy, plain, filtered, minp");
    return 0;
  }
  if (!strcmp(opt, "--flashinfer")) {
    if (strcmp(value, "none") && (!*value || access(value, R_OK)))
      return usage_error(opt, "expected the path of a readable libkl_flashinfer.so, or none");
    o->fi_path = value;
    return 0;
  }
  return usage_error(opt, "not a --grid option");
}

void grid_defaults(grid_opts *o) {
  if (!o->nwidths) {
    const int *w = o->quick ? quick_widths : default_widths;
    int n = o->quick ? 2 : 4;
    for (int i = 0; i < n; i++) o->widths[o->nwidths++] = w[i];
  }
  if (!o->dtypes) o->dtypes = o->quick ? 1u << KL_BF16 : (1u << KL_BF16) | (1u << KL_FP32);
  if (!o->kernels) o->kernels = (1u << G_NKERNELS) - 1;
}
