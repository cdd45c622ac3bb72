/* klbench --grid: every kernel over row widths x dtypes x tokens on GPU 0
 * (tp 1), with its roofline, the noise reference and FlashInfer's kernels
 * beside it. Modules: grid_opts.c (the options, the kernels and their byte
 * model: no GPU), grid.c (the run), grid_noise.c (the noise reference
 * kernel), grid_report.c (the tables and the CSV), fi.c (FlashInfer's
 * library, dlopen'd). */
#ifndef KL_BENCH_GRID_H
#define KL_BENCH_GRID_H

#include <stdint.h>
#include <stdio.h>

#include <cuda.h>

#include "flashinfer_sampling.h"
#include "klgen.h"

#define GRID_MAX_WIDTHS 16
#define GRID_MAX_TOKENS_DEFAULT 512
#define GRID_MIN_WIDTH 1024
#define GRID_MAX_WIDTH (1 << 21)

/* The grid's kernels: its rows, each with its own byte model. */
enum grid_kernel {
  G_GATHER,   /* kl_gather, no epilogue */
  G_FUSED,    /* kl_gather through the epilogue: fp32 out, soft-cap 30, engine numerics */
  G_ARGMAX,   /* kl_argmax, index and value */
  G_TOPK8,    /* kl_topk, k 8, with the log-sum-exp */
  G_TOPK64,   /* kl_topk, k 64, with the log-sum-exp */
  G_GREEDY,   /* kl_sample, T 0 */
  G_PLAIN,    /* kl_sample, T 0.7 */
  G_FILTERED, /* kl_sample, T 0.7, top_k 50, top_p 0.9 */
  G_MINP,     /* kl_sample, T 0.7, min_p 0.1 */
  G_NKERNELS
};
extern const char *const grid_kernel_names[G_NKERNELS];

typedef struct grid_opts {
  int widths[GRID_MAX_WIDTHS], nwidths; /* 0: the default or --quick's */
  unsigned dtypes;                      /* bits 1 << kl_dtype; 0: default */
  unsigned kernels;                     /* bits 1 << grid_kernel; 0: all */
  int quick;
  const char *fi_path; /* --flashinfer LIB or "none"; NULL: libkl_flashinfer.so beside klbench */
} grid_opts;

/* --widths, --dtypes, --kernels, --flashinfer: 0, or 2 after a message on
 * stderr. */
int grid_option(grid_opts *o, const char *opt, const char *value);
/* The defaults for what was not given (--quick's subset where it is). */
void grid_defaults(grid_opts *o);
/* Tokens of --quick and of the whole grid, "1,2,4". */
extern const char grid_quick_tokens[], grid_tokens[];

/* The bytes a kernel must move once at `tokens` rows of `width` columns of
 * elem bytes: the rows read once, what it writes, the per-row parameters it
 * reads (grid_opts.c states the model; --help prints it). */
long long grid_bytes(int kernel, long long tokens, long long width, int elem);
/* The byte model in words, one line a kernel, for --help and the report. */
extern const char grid_byte_model[];

/* ---- fi.c: libkl_flashinfer (flashinfer_sampling.h), dlopen'd ---- */

#define FI_FUNCS(X)                                                                   \
  X(kl_fi_abi) X(kl_fi_about) X(kl_fi_error) X(kl_fi_create) X(kl_fi_destroy)       \
  X(kl_fi_top_k) X(kl_fi_plain) X(kl_fi_filtered) X(kl_fi_min_p)
#define FI_MEMBER(name) __typeof__(&name) name;
typedef struct fi_lib {
  void *so;
  FI_FUNCS(FI_MEMBER)
} fi_lib;
#undef FI_MEMBER

/* Loads the library at path (NULL: libkl_flashinfer.so beside this program).
 * 0: loaded; 1: path "none", or no file there and no path was given (why:
 * how to build it); -1: it cannot be used (why). */
int fi_load(fi_lib *f, const char *path, char *why, size_t n);

/* ---- grid_noise.c: the noise reference kernel ---- */

typedef struct grid_noise {
  CUmodule mod;
  CUfunction fn[2]; /* bf16, fp32 */
  uint64_t *slot;   /* a row's best key so far, 0 between launches */
  uint32_t *count;  /* a row's parts done, 0 between launches */
  int sms;
} grid_noise;

/* The noise section of a source klgen rendered for a spec of noise
 * noise_id, with the kernels after it (free it); dies if the source has no
 * noise.cuh.tmpl section. */
char *grid_noise_source(const char *rendered, kl_noise noise_id);
/* Loads the compiled source, for up to max_rows rows a launch. */
void grid_noise_load(grid_noise *g, const kl_binary *bin, int max_rows, int sms);
void grid_noise_release(grid_noise *g);
/* token[r] = row r's draw at temperature[r], as kl_sample's plain draw; a
 * CUresult. */
int grid_noise_launch(const grid_noise *g, int elem, const void *x, int rows, int cols,
                      const float *temperature, const uint64_t *seed, const uint64_t *offset,
                      int64_t *token, CUstream s);

/* ---- grid_report.c: the printed tables and the CSV ---- */
typedef struct grid_meta {
  const char *gpu, *arch, *command, *flashinfer;
  char date[32];
  double copy_gbps, floor_us;
  int steps, replays;
} grid_meta;

/* One kernel in one cell. */
typedef struct grid_row {
  int width, tokens, steps, kernel;
  const char *dtype, *path, *check, *fi_call; /* fi_call NULL: no FlashInfer figure */
  long long bytes;
  double roofline_us, klgen_us, noise_us, fi_us; /* NAN: not measured */
} grid_row;

/* The roofline of `bytes` in the run of m: bytes at the copy bandwidth, and
 * the launch floor. */
double grid_roofline(const grid_meta *m, long long bytes);
/* The run's lines above the CSV's header ("# key: value"), and the header. */
void grid_csv_begin(FILE *f, const grid_meta *m);
void grid_csv_row(FILE *f, const grid_meta *m, const grid_row *r);
/* A setting's table: rows[i * G_NKERNELS + kernel] for the i-th token count. */
void grid_print_setting(const grid_row *rows, int ntok, unsigned kernels);

#endif
