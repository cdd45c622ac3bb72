/* libklgen: a model's vocab-parallel LM-head spec -> specialized CUDA gather kernels.
 *
 * Load a sandboxed Lua spec (kl_spec_load_*), derive its layout (kl_layout_derive),
 * render the kernel source (kl_render) and, optionally, compile it with NVRTC
 * (kl_nvrtc_compile). Every function returns 0 or a KL_E* code and, on failure,
 * fills the caller's kl_err with a message of the form "file:line: field: what". */
#ifndef KLGEN_H
#define KLGEN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KLGEN_VERSION "0.1.0"

enum {
  KL_OK = 0,
  KL_ESPEC = 1,     /* the spec is malformed or invalid */
  KL_ETEMPLATE = 2, /* a template failed to render */
  KL_ECOMPILE = 3,  /* NVRTC rejected the source */
  KL_EIO = 4,       /* a file could not be read or written */
  KL_ENOMEM = 5,
  KL_EARG = 6 /* API misuse: NULL, out of range */
};

#define KL_ERR_MAX 5120 /* room for a PATH_MAX file name and the message */
typedef struct kl_err {
  char msg[KL_ERR_MAX];
} kl_err;

typedef enum kl_dtype { KL_BF16 = 0, KL_FP16 = 1, KL_FP32 = 2 } kl_dtype;
/* How the epilogue rounds: as the engine's separate torch ops on the model
 * dtype (each step rounded), or all in fp32 with one rounding at the end. */
typedef enum kl_numerics { KL_NUMERICS_ENGINE = 0, KL_NUMERICS_FP32 = 1 } kl_numerics;
/* The sampler's Gumbel noise of (seed, offset, column): klgen's Philox, or
 * vLLM 0.33's murmur3 (docs/design/sampling.md, "The noise"). */
typedef enum kl_noise { KL_NOISE_PHILOX = 0, KL_NOISE_VLLM = 1 } kl_noise;

typedef enum kl_field {
  KL_F_NAME, KL_F_VOCAB_SIZE, KL_F_PAD_TO, KL_F_PADDED_VOCAB, KL_F_TP,
  KL_F_DTYPE, KL_F_MAX_TOKENS, KL_F_TIMEOUT_MS, KL_F_OUT_DTYPE, KL_F_SOFTCAP, KL_F_SCALE,
  KL_F_NUMERICS, KL_F_TOPK, KL_F_NOISE, KL_F_COUNT
} kl_field;

#define KL_NAME_MAX 48 /* a spec name is a C identifier of at most this many chars */
#define KL_TP_MAX 64
#define KL_VOCAB_MAX (1 << 24)
#define KL_TOKENS_MAX 65536
#define KL_BUFFER_CAP ((int64_t)1 << 30) /* one-shot buffer bytes per rank */
#define KL_TOPK_MAX 64

/* A spec as written by its author. 0 in an optional field means "not given". */
typedef struct kl_spec {
  char name[KL_NAME_MAX + 1];
  int64_t vocab_size;   /* columns kept in the output */
  int64_t pad_to;       /* padding multiple (default 64) ... */
  int64_t padded_vocab; /* ... or the padded vocabulary itself */
  int tp;
  kl_dtype dtype;
  int64_t max_tokens;  /* rows per step the one-shot buffers hold */
  int64_t timeout_ms;  /* one-shot poll limit before the kernel gives up */
  /* The epilogue, applied to every gathered element on its way to `out`
   * (absent: out = the gathered logits, today's kernel). */
  kl_dtype out_dtype;  /* dtype (default) or KL_FP32 */
  double softcap;      /* 0: none; else x -> tanh(x / softcap) * softcap */
  double scale;        /* 0: not given (1); else x -> x * scale, after the cap */
  kl_numerics numerics;
  int topk;            /* 0: no kl_topk; else its k (1..KL_TOPK_MAX) */
  kl_noise noise;      /* kl_sample's noise (a spec with topk) */
  /* Where each field was written, for messages ("file:line: field: ..."). */
  char file[4096];
  int line[KL_F_COUNT]; /* indexed by kl_field */
} kl_spec;
/* The names a spec writes (spec_names.c): "vocab_size", "bf16"... */
extern const char *const kl_field_names[KL_F_COUNT];
const char *kl_dtype_name(kl_dtype d);
const char *kl_noise_name(kl_noise n);

/* Everything derived from a spec; computed in one place (layout.c) and shared by
 * the generator, the generated header and the runtime. */
typedef struct kl_layout {
  int64_t padded_vocab;
  int64_t shard;       /* columns per rank */
  int elem_bytes;      /* 2 or 4 */
  int vec_bytes;       /* widest aligned width for user loads/stores: 16/8/4/2 */
  int epilogue;        /* the spec has one (out_dtype, softcap or scale) */
  int out_elem_bytes;  /* element size of out: elem_bytes, or 4 for out_dtype fp32 */
  int out_vec_bytes;   /* the alignment out needs (== vec_bytes without an epilogue) */
  int64_t shard_bytes; /* bytes one rank contributes per token */
  int64_t row_chunks;  /* 16-byte chunks per shard row in the one-shot buffer */
  int64_t slot_bytes;  /* one rank's slot: max_tokens rows */
  int64_t buffer_bytes; /* one of the three rotating buffers: tp slots */
  int64_t total_bytes;  /* all three: what each rank allocates */
  uint32_t sentinel32;  /* -0.0 in every element of a 32-bit word: "not arrived" */
  int block;            /* threads per CTA of the one-shot kernel */
  int chunk_threads;    /* its threads per 16-byte chunk: 4 with an epilogue, else 1 */
  int relayout_block;   /* threads per CTA of the relayout kernel */
  int max_ctas;         /* CTAs per rank at max_tokens (before residency caps) */
  int64_t timeout_ns;
  /* The sampling-ready gathers (kl_argmax, kl_topk: docs/design/select.md).
   * Each kernel splits a rank's row over its own number of CTAs (its
   * split), each reducing a part of the row to one record of candidates;
   * records go through their own triple-buffered region of the receive
   * memory, after the gather's. "sel_": both select kernels. */
  int record_keys;          /* candidates per record: max(1, topk) */
  int sel_block;            /* threads per CTA of the select kernels */
  int topk_thread_chunks;   /* kl_topk: 16-byte input chunks per thread */
  int topk_split;           /* kl_topk: CTAs (records) per rank row */
  /* kl_sample's shard sampler without filters, one-shot, at few tokens:
   * the bound on the subparts of each of kl_topk's parts (1, 2 or 4), a CTA
   * each taking a share of every chunk's columns; the group agrees
   * on its own (the runtime's group_subparts, within this and every rank's
   * KLGEN_SHARD_SUBPARTS) and each call takes its own within that */
  int shard_subparts;
  /* kl_sample's shard sampler without filters: the CTAs a multiprocessor
   * its launch bounds promise (its registers a thread follow from it) */
  int shard_ctas;
  int argmax_thread_chunks; /* kl_argmax: 16-byte input chunks per thread */
  int argmax_split;         /* kl_argmax: CTAs (records) per rank row */
  int rec_split;        /* records per rank row the region holds: the larger split */
  int rec_chunks;       /* 16-byte chunks per record */
  int64_t sel_offset;   /* byte offset of the select region in the receive memory */
  int64_t sel_slot_bytes;   /* one rank's slot: max_tokens x rec_split records */
  int64_t sel_buffer_bytes; /* one of three: tp slots */
  int64_t stage_offset; /* byte offset of kl_sample's staged rows (total_bytes + 3 x sel_buffer_bytes) */
  int64_t stage_buffer_bytes; /* one of their 2 buffers: max_tokens shard rows (0 without topk) */
  int64_t mark_offset;  /* byte offset of the staged rows' marks (stage_offset + 2 x stage_buffer_bytes) */
  int64_t mark_buffer_bytes; /* one of their 2 buffers: a word per part of max_tokens rows, to 16 bytes */
  int64_t fault_offset; /* byte offset of the group's fault word (mark_offset + 2 x mark_buffer_bytes) */
  int64_t recv_bytes;   /* fault_offset + KL_FAULT_BYTES: what each rank allocates */
  int sel_max_ctas;     /* select CTAs at max_tokens (before residency caps) */
  /* kl_sample's row sampler (sample.cu.tmpl): a greedy or plain-temperature
   * gathered row is sliced over sample_slices CTAs of sample_slice_cols
   * columns (a multiple of 4: one Philox call serves four columns); 0
   * without a topk (no sampler). */
  int sample_slices;
  int64_t sample_slice_cols;
} kl_layout;

/* ---- spec loading (spec.c) ---- */
typedef struct kl_spec_list {
  kl_spec *v;
  int n;
} kl_spec_list;

/* Bounds on a spec's code: all of it (evaluation, reading the result,
 * finalizers) runs within time_ms of wall clock and mem_bytes of memory.
 * NULL or a field <= 0: the default. */
#define KL_SPEC_TIME_MS 2000
#define KL_SPEC_MEM_BYTES (32 << 20)
#define KL_SPEC_FILE_MAX (1 << 20) /* a spec is a page of text, not a data file */
#define KL_SPEC_STRING_MAX (1 << 20) /* the longest string a spec may make: its own size */
typedef struct kl_limits {
  int64_t time_ms;
  int64_t mem_bytes;
} kl_limits;

/* Loads every spec a file (or a string) defines. The file must be a regular
 * file; chunkname is what error messages call the string. */
int kl_spec_load_file(const char *path, const kl_limits *lim, kl_spec_list *out, kl_err *err);
int kl_spec_load_string(const char *chunkname, const char *src, size_t len,
                        const kl_limits *lim, kl_spec_list *out, kl_err *err);
void kl_spec_list_free(kl_spec_list *l);
/* The list's spec names, "a, b, c", into buf (n bytes, NUL-terminated):
 * those that fit, then how many more ("..., and 12 more"). Returns buf. */
char *kl_spec_list_names(const kl_spec_list *l, char *buf, size_t n);
/* The index of the spec named `name` in the list, or -1. */
int kl_spec_list_find(const kl_spec_list *l, const char *name);
/* Full validation of a spec built by hand (loading already does this). */
int kl_spec_validate(const kl_spec *s, kl_err *err);

/* ---- layout (layout.c) ---- */
int kl_layout_derive(const kl_spec *s, kl_layout *out, kl_err *err);
/* CTAs to launch for `tokens` rows, at most `cap` (0: no cap). */
int kl_layout_grid(const kl_layout *l, int tokens, int cap);
/* CTAs of the relayout kernel for an output of out_bytes: one vector per
 * thread, at most cap (> 0) CTAs, which then loop. */
int kl_layout_relayout_grid(const kl_layout *l, int64_t out_bytes, int cap);
/* CTAs of a one-shot select launch for `tokens` rows, at most cap (0: none). */
int kl_layout_select_grid(const kl_layout *l, int tokens, int cap, int topk);
/* Step slots both select kernels need at `tokens` (the larger grid; topk:
 * whether kl_topk exists), each grid at most its cap (0: none). */
int kl_layout_select_slots(const kl_layout *l, int tokens, int argmax_cap, int topk_cap,
                           int topk);
/* kl_sample's sliced row of `vocab` columns in at most `most` (>= 1) slices of
 * equal columns, a multiple of 4, none empty: their count, and *cols each
 * (the last may have fewer). The layout's sample_slices at few rows; a call
 * with more rows than one wave of the grid holds takes fewer. */
int kl_layout_sample_slices(int64_t vocab, int64_t most, int64_t *cols);

/* ---- rendering (render.c) ---- */
/* Templates come from the binary (dir == NULL) or from a directory. */
int kl_render(const kl_spec *s, const kl_layout *l, const char *template_dir,
              char **source, kl_err *err);
/* The generated C header: spec, layout, entry names, source as a string. */
int kl_render_header(const kl_spec *s, const kl_layout *l, const char *source,
                     const char *template_dir, char **header, kl_err *err);
/* Entry point names, e.g. kl_<name>_oneshot. */
void kl_entry_name(const kl_spec *s, const char *kind, char *buf, size_t n);

/* ---- NVRTC (compile.c) ---- */
typedef struct kl_binary {
  void *data;
  size_t size;
  char *log; /* NVRTC's log, possibly empty (warnings land here) */
} kl_binary;
/* arch: "sm_90". Produces a cubin. */
int kl_nvrtc_compile(const char *source, const char *name, const char *arch,
                     kl_binary *out, kl_err *err);
void kl_binary_free(kl_binary *b);
int kl_nvrtc_version(int *major, int *minor);
/* NVRTC is loaded at run time, on first use: a copy already in the process,
 * else this path (the runtime passes $KLGEN_NVRTC_LIBRARY), else the soname
 * through the system's search, else the toolkit this was built with. A
 * compile that finds none fails with KL_ECOMPILE saying what was searched. */
void kl_nvrtc_set_library(const char *path);
/* The options every compile passes besides --gpu-architecture, space-separated. */
void kl_nvrtc_options(char *buf, size_t n);
/* A hash of the embedded templates and template engine: what, besides the
 * spec, decides the kernels' source (and so the JIT cache's key). */
uint64_t kl_template_set_hash(void);
/* NVRTC compilations this process has run (a JIT cache hit runs none). */
unsigned long kl_nvrtc_compiles(void);

/* ---- files (files.c) ---- */
/* Writes every (path, data) pair via temp files, then renames them all; on any
 * failure removes what it created and leaves existing files untouched. */
typedef struct kl_file_out {
  char *path;
  const void *data;
  size_t size;
} kl_file_out;
int kl_write_files_atomic(const kl_file_out *files, int n, kl_err *err);
int kl_read_file(const char *path, char **data, size_t *size, size_t limit,
                 kl_err *err);
/* Opens path read-only as a regular file: never blocks (FIFOs), never follows
 * a final symbolic link when nofollow is set. Returns the descriptor, or -1
 * with errno (EINVAL: not a regular file). The _at form: path relative to
 * the directory dirfd (openat's rules). */
int kl_open_regular(const char *path, int nofollow);
int kl_open_regular_at(int dirfd, const char *path, int nofollow);
/* Creates name (relative to dirfd, ending in XXXXXX, which is replaced) as a
 * new file (O_EXCL, never through a link) for writing with `mode` less the
 * umask. Returns the descriptor, or -1 with errno. */
int kl_create_temp_at(int dirfd, char *name, int mode);

/* Names equal up to ASCII case (they would share files and header guards). */
int kl_name_equal_nocase(const char *a, const char *b);
/* The sanitised base name of path, as generated files show it. */
#define KL_FILE_LABEL_MAX 64
void kl_file_label(const char *path, char *buf, size_t n);

/* "file:line: field: message" for field f of spec s; returns KL_ESPEC. */
int kl_spec_fail(kl_err *err, const kl_spec *s, kl_field f, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

/* printf into err; returns code. Control bytes are escaped as \xHH. */
int kl_fail(kl_err *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* The same with newlines kept: a compiler's log. */
int kl_fail_log(kl_err *err, int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* len bytes of p into buf (n bytes, always terminated), with control bytes
 * (newlines too unless keep_newlines), C1 controls and bytes of malformed
 * UTF-8 written as \xHH: text a spec chose must not drive a terminal.
 * Returns buf. */
char *kl_escape(const char *p, size_t len, char *buf, size_t n, int keep_newlines);

#ifdef __cplusplus
}
#endif
#endif
