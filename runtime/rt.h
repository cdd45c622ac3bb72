/* libklrt internals: the context and the modules that share it, each of
 * which calls only modules listed before it (docs/design/dispatch.md, "The
 * runtime's structure").
 *   (libklgen's param.c: environment variables, the table, reading and
 *   validation; it reports through a buffer, below everything here)
 *   err.c       kl_last_error, KLGEN_LOG (read through param.c)
 *   cu.c        driver access (dlopen)
 *   nccl_api.c  NCCL access (dlopen: the host's copy)
 *   jit.c       NVRTC + disk cache
 *   tune.c      the crossover: configured, tuned table or default
 *   exchange.c  host all-gather between ranks: group (threads), callback, NCCL
 *   kernels.c   the kernel table (c->kern): load, caps, step slots, peers,
 *               warm-up; the one launcher
 *   transport.c receive buffers, peer mapping, agreement on readiness
 *   dispatch.c  the layer every step call goes through: path rule, checks,
 *               buffers, staging, the NCCL exchange, stream order, the log
 *   gather.c    kl_gather's route: one-shot kernel, or NCCL + relayout
 *   select.c    kl_argmax's and kl_topk's routes: one-shot select kernel, or
 *               reduce, NCCL, merge (kl_sample's shard sampler rides on them)
 *   sample.c    kl_sample's route: the shard sampler, or gather + row sampler
 *   create.c    create / destroy, the live list, a call's hold on a context
 *   calls.c     the step calls' entry: kl_gather, kl_argmax, kl_topk, kl_sample
 *   query.c     spec info and names, context info / stats / status, devices
 *   testing.c   klrt_testing's hooks (KL_TESTING builds only) */
#ifndef KL_RT_H
#define KL_RT_H

#include <stdatomic.h>
#include <stdint.h>

#include "cu.h"
#include "kl_abi.h"
#include "nccl_api.h"
#include "klgen.h"
#include "klrt/klrt.h"

#define KL_WHY_MAX 256
#define KL_MIN_SM_MAJOR 8 /* the kernels' PTX (L2 cache hints, createpolicy) needs sm_80 */

/* ---- libklgen's param.c: param.h (the klgen command reads the table too) ---- */
#include "param.h"

/* ---- err.c ---- */
kl_result kl_rt_fail(kl_result r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* sized.c: the caller's size-prefixed input struct `src` as this library
 * knows it, into dst (dst_size bytes): an older one (at least `oldest`
 * bytes, the first layout this library reads) with the fields it lacks 0;
 * a smaller one is from no version that exists; a larger one (a newer
 * header) is accepted if the fields this library does not know are zero.
 * what, type, init name it in messages. */
kl_result kl_read_input(void *dst, size_t dst_size, size_t oldest, const void *src,
                        const char *fn, const char *what, const char *type, const char *init);
int kl_log_enabled(void);
void kl_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- exchange.c ---- */
typedef struct kl_exchange {
  kl_group *group;
  ncclComm_t nccl;
  const kl_nccl_api *nccl_api;
  kl_allgather_fn fn;
  void *user;
  int rank, nranks;
  const kl_cu *cu;
  CUstream stream;
} kl_exchange;
#define KL_EXCHANGE_MAX 1024 /* bytes per rank per exchange */
/* Every rank's `bytes` from `mine` into `all` (rank order). 0 or -1 with why. */
int kl_exchange_all(kl_exchange *ex, const void *mine, void *all, size_t bytes, char *why);
int kl_group_nranks(const kl_group *g);

/* ---- jit.c ---- */
#define KL_FNV_BASIS 0xcbf29ce484222325ULL
/* FNV-1a over n bytes, continuing from h (start from KL_FNV_BASIS). */
uint64_t kl_fnv1a(uint64_t h, const void *p, size_t n);
/* Resolves the cache directory (docs/design/dispatch.md); 0 if none can be determined. */
int kl_cache_dir(const char *configured, char *buf, size_t n);
/* The entries' payload checksum (not a defence against a writer: the
 * directory's ownership and mode are). */
void kl_cache_checksum(const void *p, size_t n, uint64_t c[2]);
/* Opens the directory at path if it and the path to it can be trusted: the
 * path walked from / without following links, every directory on it owned
 * by root or this user and writable by no one else unless sticky, the last
 * one this user's and not writable by others even if sticky when `mine`.
 * Returns the descriptor, or -1 with why. */
int kl_trusted_dir(const char *path, int mine, char *why, size_t n);
/* Creates dir (0700) if missing and opens it as a trusted cache directory
 * (kl_trusted_dir, mine); -1 with why if it may not hold a cache. */
int kl_cache_open(const char *dir, char *why, size_t n);
/* Cubin for source on arch, from the cache at dir (NULL: no cache) or NVRTC. */
int kl_jit_cubin(const char *source, const char *name, const char *arch, const char *dir,
                 kl_binary *out, int *hit, kl_err *err);
/* klrt_testing only (KL_TESTING; the installed library has none of this):
 * tests of the host's logic on a machine without a GPU give the library a
 * driver, an NCCL and a compiler of their own, used from the next
 * kl_cu_get, kl_nccl_api_get and kl_jit_cubin on (NULL: the real one;
 * kl_testing_fakes is testing.c's). Not thread-safe: set before any context
 * is made. */
typedef int (*kl_testing_jit_fn)(const char *source, const char *name, kl_binary *out,
                                 kl_err *err);
void kl_testing_fakes(const kl_cu *cu, const kl_nccl_api *nccl, kl_testing_jit_fn jit);
#ifdef KL_TESTING
extern kl_testing_jit_fn kl_testing_jit;
#endif

/* ---- tune.c ---- */
long long kl_crossover(const char *arch, int nranks, long long shard_bytes, long long configured,
                       const char *cache_dir, const char **source);

/* ---- kernels.c: the kernel table ---- */
/* The generated kernels a context loads, an entry each (c->kern[id]); a new
 * kernel is an id here and a row of kernels.c's table. */
typedef enum kl_kernel_id {
  KL_K_ONESHOT,         /* kl_gather, one-shot */
  KL_K_RELAYOUT,        /* kl_gather's NCCL path: [tp, tokens, shard] to [tokens, vocab] */
  KL_K_ARGMAX,          /* kl_argmax, one-shot or reduce / merge around NCCL */
  KL_K_TOPK,            /* kl_topk, alike; only for a spec with topk */
  KL_K_SAMPLE,          /* kl_sample's row sampler, after a gather; only for a spec with topk */
  KL_K_SHARDS,          /* kl_sample's shard sampler, as the select kernels; only with topk */
  KL_K_SHARDS_LISTS,    /* the same with the lists' code, for calls with lists */
  KL_K_SHARDS_FILTERED, /* the same for calls with filters (one-shot only) */
  KL_K_LISTS,           /* kl_sample's lists, before its samplers; only with topk */
  KL_K_COUNT
} kl_kernel_id;
/* A kernel's parameter (kl_abi.h): its args, then the peers' receive
 * buffers where it has them; the kernel reads as many bytes as its
 * parameter has (peers[tp]). */
typedef union kl_kernel_params {
  struct {
    kl_oneshot_args a;
    CUdeviceptr peers[KL_TP_MAX];
  } oneshot;
  kl_relayout_args relayout;
  kl_sample_args sample;
  kl_lists_args lists;
  struct {
    kl_select_args a;
    CUdeviceptr peers[KL_TP_MAX];
  } select;
} kl_kernel_params;
typedef struct kl_kernel {
  CUfunction fn; /* NULL: not loaded */
  int block;     /* threads a CTA */
  /* Most CTAs a launch: for a kernel that polls its peers, what stays
   * co-resident with the other ranks' grids (0 until mapped); for the
   * relayout, where its grid starts to loop. */
  int cap;
  int wave; /* CTAs resident at once on this GPU, alone on it (0: unknown) */
  /* A polling kernel's step slots (in the state block) and the largest grid
   * launched with them; kernels that share slots share both. */
  unsigned long long *slots;
  int nslots;
  /* Each launch writes the args (one thread at a time calls a context, and
   * the launch copies the parameter); the peers are set at mapping. */
  kl_kernel_params prm;
} kl_kernel;
#define KL_RELAYOUT_CTAS_PER_SM 4 /* the relayout grid's cap: larger outputs loop */
#define KL_SAMPLE_CTAS_PER_SM 4   /* the row sampler's (a CTA a row or slice): more loop */

/* ---- dispatch.c: what kl_gather, kl_argmax, kl_topk and kl_sample share ---- */
enum { PATH_ONESHOT = 0, PATH_NCCL = 1 };
/* The pointer arguments of the calls: each one's name in messages.
 * kl_sample's parameters come last, from KL_ARG_TEMPERATURE on, in
 * kl_sampling's order (sample.c checks them in it; kl_check_ptr takes
 * mapped host memory for them alone). */
typedef enum kl_arg { KL_ARG_SHARD, KL_ARG_OUT, KL_ARG_INDEX, KL_ARG_VALUE, KL_ARG_LSE,
                      KL_ARG_TOKEN, KL_ARG_LOGPROB, KL_ARG_TOP_INDEX, KL_ARG_TOP_LOGPROB, KL_ARG_RANK,
                      KL_ARG_TEMPERATURE, KL_ARG_TOP_K, KL_ARG_TOP_P, KL_ARG_MIN_P, KL_ARG_SEED,
                      KL_ARG_OFFSET, KL_ARG_STATE_ROWS, KL_ARG_OFFSET_ROWS, KL_ARG_BITMASK,
                      KL_ARG_REPETITION, KL_ARG_FREQUENCY, KL_ARG_PRESENCE, KL_ARG_PROMPT_MASK,
                      KL_ARG_OUTPUT_COUNTS, KL_ARG_ALLOWED_COUNT, KL_ARG_ALLOWED_IDS,
                      KL_ARG_BIAS_COUNT, KL_ARG_BIAS_IDS, KL_ARG_BIAS_VALUES, KL_ARG_MIN_LEN,
                      KL_ARG_STOP_COUNT, KL_ARG_STOP_IDS, KL_ARG_POSITION, KL_ARG_BANNED,
                      KL_ARG_COUNT } kl_arg;
/* Device buffers a context grows and keeps (kl_ensure): each one's name in
 * messages is kept beside it in dispatch.c. */
typedef enum kl_buf_id {
  KL_BUF_SCRATCH,   /* the gather's NCCL target, [tp, tokens, shard] */
  KL_BUF_RECORDS,   /* the select kernels' NCCL path: this rank's records, then every rank's */
  KL_BUF_STAGE_IN,  /* an input copied where the kernels can read it */
  KL_BUF_STAGE_OUT, /* an output the kernels write aligned, copied after */
  KL_BUF_SAMPLE,    /* kl_sample's gathered rows, [tokens, vocab] of the out dtype */
  KL_BUF_SLICE_RESULTS, /* its sliced rows' results and counters (kl_slice_results_bytes) */
  KL_BUF_LISTS,     /* its lists as the lists kernel leaves them (sample.c) */
  KL_BUF_COUNT
} kl_buf_id;
typedef struct kl_buffer {
  CUdeviceptr p;
  size_t bytes;
} kl_buffer;
#define KL_OUTS_MAX 5
typedef struct kl_out {
  void *p;      /* NULL (but out[0]): not written */
  size_t bytes; /* for this call's tokens (the route's measure) */
  kl_arg arg;
} kl_out;
typedef struct kl_call kl_call;
/* A kind of call, as its module (gather.c, select.c) describes it to the
 * layer: its outputs, the rules that differ, and its two paths. */
typedef struct kl_route {
  const char *fn;            /* the public function, for messages */
  kl_kernel_id kernel;       /* its kernel (the one-shot path's; select's NCCL path too) */
  int nouts;
  unsigned align_mask[KL_OUTS_MAX]; /* outputs the kernels write in place: 0, or the
                                       alignment they need less 1 */
  const char *misaligned;    /* the message when an output is not aligned so */
  const char *overlap;       /* the message when outputs overlap each other */
  int sized; /* moves the shard: the crossover applies (records never reach it) */
  int (*gathers)(const kl_call *k); /* NULL: every call as `sized` says; else the calls
                                       that move the shard (after check) */
  /* NULL: the NCCL path runs without the generated kernels. Else it runs
   * them too, so it needs them on every rank and the input as they read it
   * (staged before the choice); this says what it needs, for the message. */
  const char *nccl_kernels;
  int logged; /* its changes of path go to KLGEN_LOG (the gather's alone) */
  kl_result (*usable)(const kl_ctx *c); /* NULL: always; else called at every call */
  /* out[i].bytes for k->tokens, first: whatever the arguments (check
   * refuses them after) */
  void (*measure)(const kl_ctx *c, kl_call *k);
  /* NULL: none; else the route's own arguments (k->extra), after measure
   * and before the layer's checks */
  kl_result (*check)(kl_ctx *c, const kl_call *k);
  /* NULL: none; else the route's own counts of a call once its path is
   * chosen (kl_sample's sample_gathered), before anything may refuse it */
  void (*count)(kl_ctx *c, const kl_call *k, int path);
  /* The paths, after the layer's checks, choice, counts and staging; the
   * one-shot path only while this rank knows of no fault, the NCCL path
   * after the checks that every rank makes alike. */
  kl_result (*oneshot)(kl_ctx *c, kl_call *k, CUstream s);
  kl_result (*nccl)(kl_ctx *c, kl_call *k, CUstream s);
} kl_route;
/* kl_sample's arguments beside its outputs (kl_call.extra). */
typedef struct kl_sample_call {
  kl_sampling p; /* the caller's, as this library knows it (kl_read_input) */
  int n_top;
  /* where the lists kernel leaves the call's lists (sample.c), or NULL */
  unsigned *list_flags, *list_rows;
  long long list_row_words;
  int list_slot_bits;
} kl_sample_call;
/* select.c: kl_sample's parameters as the samplers read them. */
kl_row_params kl_row_params_of(const kl_sample_call *x);
struct kl_call {
  const kl_route *route;
  const void *in; /* the shard, [tokens, shard] */
  kl_out out[KL_OUTS_MAX];
  int tokens;
  void *extra; /* the route's own arguments (kl_sample's parameters: the call's copy, which
                * the route completes), or NULL */
  /* set by the layer */
  size_t in_bytes;
  CUdeviceptr kin; /* the input as the kernels read it: in, or its staged copy */
};

/* ---- the context ---- */
struct kl_ctx {
  kl_spec spec;
  kl_layout layout;
  int rank, nranks;
  const kl_cu *cu;
  CUdevice dev;
  int ordinal;
  CUcontext cuctx;
  int retained; /* we retained the primary context */
  uint64_t source_hash; /* of the kernel source: ranks must agree on it */
  char render_error[256];
  char arch[16];
  int sm_count;
  CUstream stream; /* internal: exchange and status reads */
  kl_exchange ex;
  ncclComm_t nccl;
  const kl_nccl_api *nccl_api; /* the host's NCCL, when nccl is set */
  CUmodule mod; /* the generated kernels (NULL: they did not build here) */
  kl_kernel kern[KL_K_COUNT];
  int pdl;     /* launch with programmatic dependent launch (sm_90+) */
  CUdeviceptr recv, state;
  /* The group's fault word as the kernels copy it to the host (pinned; the
   * device writes it): a one-shot call reads it before it enqueues anything. */
  volatile uint64_t *mirror;
  /* The group's fault once this rank has seen it (the mirror, or
   * kl_ctx_status's read of the device word), kept: 0 until then. */
  uint64_t fault;
  CUdeviceptr peers[KL_TP_MAX]; /* every rank's receive memory, mapped here */
  unsigned char ipc_opened[KL_TP_MAX];
  int ready, disabled;
  /* agreed at creation, the same on every rank: the fewest multiprocessors
   * of the group's GPUs, and the most CTAs a part of the shard sampler may
   * take (1, 2 or 4: within the layout's bound, shard_subparts, and every
   * rank's KLGEN_SHARD_SUBPARTS); a call takes at most that many */
  int group_sms, group_subparts;
  int nccl_everywhere; /* every rank has a communicator: size declines are possible */
  int kernels_everywhere; /* every rank loaded the kernels: NCCL paths that run them can run */
  long long crossover, crossover_cfg;
  const char *crossover_from; /* where this rank's limit came from */
  char cache_dir[4096];       /* "" when there is none */
  kl_buffer buf[KL_BUF_COUNT]; /* grown outside capture */
  CUdeviceptr *retired; /* buffers grown out of, freed at destroy (kl_ensure) */
  int nretired;
  kl_stats stats;
  int last_path; /* for the log: -1 none, 0 one-shot, 1 NCCL */
  atomic_int busy; /* a thread is inside a call on this context */
  /* the stream of the last call, to order a call on another one after it */
  CUstream last_stream;
  int have_last_stream;
  CUevent order_event;
};
/* This rank's copy of the group's fault word (kl_abi.h), in its receive memory. */
static inline unsigned long long *kl_fault_word(const kl_ctx *c) {
  return (unsigned long long *)(c->recv + (CUdeviceptr)c->layout.fault_offset);
}

/* ---- transport.c ---- */
/* What ranks exchange at creation (two rounds): records from other
 * processes, so every field is checked and every string bounded on arrival. */
#define KL_INFO_MAGIC 0x4b4c5254u /* "KLRT" */
#define KL_INFO_VERSION 3u
#define KL_PEER_WHY 160
typedef struct peer_info {
  uint32_t magic, version;
  int32_t rank, nranks;
  uint64_t fingerprint, nonce;
  int32_t usable; /* compiled, loaded, allocated */
  uint8_t uuid[16];
  uint64_t ptr;
  CUipcMemHandle handle;
  char why[KL_PEER_WHY];
} peer_info;
typedef struct agree_info {
  int32_t mapped, disabled, has_nccl;
  int32_t has_kernels; /* the generated kernels loaded (the select kernels' NCCL path runs them too) */
  int64_t crossover;
  /* its GPU's multiprocessors and KLGEN_SHARD_SUBPARTS: the group takes the
   * least of each, so every rank gives kl_sample's parts the same subparts */
  int32_t sm_count, subparts_cfg;
  char why[KL_PEER_WHY];
} agree_info;
/* Equal on every rank that runs the same kernel with the same limits. */
uint64_t kl_fingerprint(const kl_spec *s, const kl_layout *l, uint64_t source_hash);
/* Allocates receive memory, exchanges handles, maps peers, agrees on whether
 * the one-shot path is ready on all ranks. Fatal errors return non-OK on every
 * rank alike. */
kl_result kl_transport_setup(kl_ctx *c, int compiled, const char *compile_why);
void kl_transport_teardown(kl_ctx *c);

/* ---- kernels.c ---- */
/* The table's kernels from c->mod. CUDA_SUCCESS, or the first failure with
 * every entry cleared. */
CUresult kl_kernels_load(kl_ctx *c);
/* Once the peers are mapped (on_device ranks on this GPU, this one
 * included): caps, step slots, peers, and one launch of each kernel with
 * no work. 0, or -1 with why. */
int kl_kernels_ready(kl_ctx *c, int on_device, char *why);
/* c->peers into the parameter of every kernel that has peers. */
void kl_kernels_set_peers(kl_ctx *c);
/* Forgets what points into the state block and the peers (teardown, or a
 * context that is not ready): nothing is left to point at freed memory. */
void kl_kernels_forget(kl_ctx *c);
/* CTAs of kernel id for `items`, which its grid rule counts as rows: a
 * call's tokens, or tokens x slices for the row sampler (a CTA a slice)
 * and tokens x subparts for the shard sampler (each part's subparts); at
 * most its cap when capped, else as many as the items need. */
int kl_grid(const kl_ctx *c, kl_kernel_id id, int items, int capped);
/* The launcher: kernel k on s with `grid` CTAs and its parameter as it
 * stands. overlap: a one-shot step, which may begin while the previous
 * kernel drains (PDL, where the context launches with it). */
CUresult kl_launch(kl_ctx *c, kl_kernel_id k, int grid, int overlap, CUstream s);

/* ---- dispatch.c ---- */
/* The group's fault as this rank knows it: latched in c->fault from the
 * mirror (0: not seen here yet). */
uint64_t kl_fault_known(kl_ctx *c);
/* KLRT_EDEVICE naming the rank, peer and step of a fault word (kl_abi.h). */
kl_result kl_fault_error(const kl_ctx *c, uint64_t fault);
/* The path rule (docs/design/dispatch.md) for a step moving `bytes` per rank (0:
 * no size limit): PATH_ONESHOT, or PATH_NCCL with *why. */
int kl_path_for(const kl_ctx *c, int tokens, long long bytes, kl_decline *why);
/* One call, after the entry's checks (calls.c): the arguments checked,
 * the path chosen and counted, a one-shot call refused once this rank knows
 * of the group's fault, the input staged where the route says, the route's
 * path run, the log. */
kl_result kl_dispatch(kl_ctx *c, kl_call *k, CUstream s);
/* p, an argument of k, is memory of this context's GPU with `bytes` from p
 * inside its allocation (KLRT_EINVAL naming arg if not): one driver query. */
kl_result kl_check_ptr(const kl_ctx *c, const kl_call *k, const void *p, size_t bytes, kl_arg arg);
/* Before a call on s: s waits for the previous call's work when the streams
 * differ. *outside says s is not capturing (a graph runs later, on a stream
 * of its own, and is left to the caller to order). */
kl_result kl_order_streams(kl_ctx *c, CUstream s, int *outside);
/* After a call on s (outside capture): what the next call's ordering waits on. */
kl_result kl_order_mark(kl_ctx *c, CUstream s);
/* c->buf[b] grown to `need` bytes (allocated as `size`, zeroed), never while
 * capturing; the old buffer is kept until destroy. */
kl_result kl_ensure(kl_ctx *c, kl_buf_id b, size_t need, size_t size, CUstream s);
/* At creation: the NCCL paths' buffers for max_tokens. */
kl_result kl_buffers_alloc(kl_ctx *c);
/* Bytes of one rank's select records for `tokens` rows. */
size_t kl_record_bytes(const kl_ctx *c, long long tokens);
/* KL_BUF_RECORDS's bytes for `tokens` rows: this rank's records, then all ranks'. */
size_t kl_records_scratch_bytes(const kl_ctx *c, long long tokens);
/* KL_BUF_SLICE_RESULTS's bytes for `tokens` rows. */
size_t kl_slice_results_bytes(const kl_ctx *c, long long tokens);
/* Its rows' counters (the row sampler's sliced rows). */
unsigned *kl_slice_counters(const kl_ctx *c);
const char *kl_arg_name(kl_arg a);
int kl_overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn);
/* k->kin: the input itself when aligned for the kernels' vectors and apart
 * from the outputs, else a staged copy. */
kl_result kl_stage_in(kl_ctx *c, kl_call *k, CUstream s);
/* Where a kernel writes out[0] with the layout's output vectors: out[0]
 * itself when aligned, else the output staging buffer; kl_unstage_out then
 * copies it to out[0]. */
kl_result kl_stage_out(kl_ctx *c, const kl_call *k, CUstream s, CUdeviceptr *target);
kl_result kl_unstage_out(kl_ctx *c, const kl_call *k, CUdeviceptr target, CUstream s);
/* Every rank's `bytes` at mine into all, in rank order: NCCL's all-gather
 * (a copy for one rank). */
kl_result kl_allgather(kl_ctx *c, CUdeviceptr mine, CUdeviceptr all, size_t bytes, CUstream s);
/* ---- gather.c, select.c: the calls' routes ---- */
extern const kl_route kl_gather_route, kl_argmax_route, kl_topk_route, kl_sample_route;
/* A select kernel's two paths for a call (select.c): the kernel one-shot, or
 * reduce, NCCL all-gather, merge. The call's outputs are the kernel's index,
 * value and lse (the shard samplers': token and logprob); kl_sample's parameters come from k->extra for KL_K_SHARDS and
 * KL_K_SHARDS_FILTERED.
 * subparts: KL_K_SHARDS' parts each in that many subparts, a CTA each (else 1).
 * merge_ctas: KL_K_SHARDS_FILTERED's CTAs beyond the parts, each merging a token
 * alone: 0, or the call's tokens where the whole grid stays within the
 * kernel's cap and step slots (sample.c). */
kl_result kl_select_oneshot(kl_ctx *c, kl_kernel_id id, kl_call *k, CUstream s, int subparts,
                            int merge_ctas);
kl_result kl_select_nccl(kl_ctx *c, kl_kernel_id id, kl_call *k, CUstream s);

/* ---- create.c ---- */
/* KLRT_EUNAVAILABLE, naming the minimum, for a GPU the kernels cannot run on. */
kl_result kl_require_arch(int device, int major, int minor);
/* Makes c's CUDA context current if it is not; *pushed says to pop it. */
kl_result kl_ctx_enter(kl_ctx *c, int *pushed);
void kl_ctx_leave(kl_ctx *c, int pushed);
/* A call on c begins: c must be live, and no other thread inside a call on
 * it (KLRT_EBUSY: waiting could deadlock a collective, and two calls at once
 * would race on the context's buffers). remove: destroy takes it out.
 * kl_ctx_release ends the call. */
kl_result kl_ctx_acquire(kl_ctx *c, int remove, const char *fn);
void kl_ctx_release(kl_ctx *c);
/* fn(c, arg) under the live list's lock, which kl_ctx_destroy takes before
 * it frees, if c is live: 1; else 0 and nothing is called. */
int kl_ctx_if_live(const kl_ctx *c, void (*fn)(const kl_ctx *c, void *arg), void *arg);
/* The environment's variables, each valid if set (param.c). */
kl_result kl_check_environment(void);
/* Every spec of a file (path) or a string (src), under the environment's
 * limits (KLGEN_SPEC_TIME_MS). */
kl_result kl_load_specs(const char *path, const char *src, kl_spec_list *l);
/* The spec named `name` of l (NULL: its only one). */
kl_result kl_pick_spec(const kl_spec_list *l, const char *name, kl_spec *out);
#define KL_CU_TRY(c, call)                                                                \
  do {                                                                                    \
    CUresult r_ = (c)->cu->call;                                                          \
    if (r_ != CUDA_SUCCESS)                                                               \
      return kl_rt_fail(KLRT_ECUDA, "%s failed: %s", #call, kl_cu_errstr(r_));            \
  } while (0)

#endif
