/* libklrt internals: the context and the modules that share it.
 *   cu.c        driver access (dlopen)
 *   nccl_api.c  NCCL access (dlopen: the host's copy)
 *   param.c     environment variables: the table, reading and validation (calls
 *               nothing else here: the bottom of the library)
 *   err.c       kl_last_error, KLGEN_LOG (reads KLGEN_LOG through param.c)
 *   jit.c       NVRTC + disk cache + module load
 *   exchange.c  host all-gather between ranks: group (threads), callback, NCCL
 *   transport.c receive buffers, peer mapping, agreement on readiness
 *   gather.c    dispatch: one-shot kernel or NCCL + relayout, staging copies
 *   select.c    kl_argmax / kl_topk: one-shot select kernel or NCCL + merge
 *   context.c   create / destroy / stats / status */
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

/* ---- param.c ---- */
typedef enum kl_param_id {
  KL_P_DISABLE, KL_P_LOG, KL_P_CROSSOVER_BYTES, KL_P_TUNE_FILE, KL_P_PDL, KL_P_CACHE_DIR,
  KL_P_SPEC_TIME_MS, KL_P_NVRTC_LIBRARY, KL_P_NCCL_LIBRARY, KL_P_MAX_CONNECTIONS, KL_P_COUNT
} kl_param_id;
typedef enum { KL_PARAM_BOOL, KL_PARAM_INT, KL_PARAM_STR } kl_param_kind;
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
/* A BOOL or INT: its value if set and valid (*given = 1), else the default. */
long long kl_param_int(kl_param_id id, int *given);
/* A STR: its value, or NULL when unset or "". */
const char *kl_param_str(kl_param_id id);

/* ---- err.c ---- */
kl_result kl_rt_fail(kl_result r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
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
/* Resolves the cache directory (docs/DESIGN.md §5); 0 if none can be determined. */
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

/* ---- tune.c ---- */
long long kl_crossover(const char *arch, int nranks, long long shard_bytes, long long configured,
                       const char *cache_dir, const char **source);

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
  /* one-shot */
  CUmodule mod;
  CUfunction oneshot, relayout;
  CUfunction argmax, topk; /* select kernels (topk: NULL without the spec's topk) */
  int cta_cap; /* CTAs per rank that stay co-resident with the other ranks */
  int pdl;     /* launch with programmatic dependent launch (sm_90+) */
  int nslots;  /* the largest grid launched: the kernel's step slots in use */
  CUdeviceptr recv, state;
  /* The group's fault word as the kernels copy it to the host (pinned; the
   * device writes it): a call reads it before it enqueues anything. */
  volatile uint64_t *mirror;
  /* The one-shot kernel's parameter (kl_abi.h): peers are filled at mapping,
   * each launch writes only the args; the kernel reads as many bytes as its
   * parameter has (peers[tp]). */
  struct {
    kl_oneshot_args a;
    CUdeviceptr peers[KL_TP_MAX];
  } prm;
  /* The select kernels' parameter, alike: peers set at mapping. */
  struct {
    kl_select_args a;
    CUdeviceptr peers[KL_TP_MAX];
  } sprm;
  int argmax_cap, topk_cap; /* select CTAs per rank that stay co-resident (as cta_cap), per kernel */
  int sel_nslots; /* the largest select grid launched */
  unsigned char ipc_opened[KL_TP_MAX];
  int ready, disabled;
  int nccl_everywhere; /* every rank has a communicator: size declines are possible */
  int select_everywhere; /* every rank loaded the select kernels: their NCCL path can run */
  long long crossover, crossover_cfg;
  const char *crossover_from; /* where this rank's limit came from */
  char cache_dir[4096];       /* "" when there is none */
  /* scratch: NCCL gather target and staging copies; grown outside capture */
  CUdeviceptr scratch, stage_in, stage_out;
  size_t scratch_bytes, stage_in_bytes, stage_out_bytes;
  CUdeviceptr *retired; /* buffers grown out of, freed at destroy (kl_ensure) */
  int nretired;
  /* the select kernels' NCCL path: this rank's records, then every rank's */
  CUdeviceptr sel_scratch;
  size_t sel_scratch_bytes;
  /* last pointers validated as this device's (hot-path cache) */
  const void *checked_in, *checked_out, *checked_index, *checked_value, *checked_lse;
  kl_stats stats;
  int last_path; /* for the log: -1 none, 0 one-shot, 1 NCCL */
  atomic_int busy; /* a thread is inside a call on this context */
  /* the stream of the last call, to order a call on another one after it */
  CUstream last_stream;
  int have_last_stream;
  CUevent order_event;
};

/* ---- transport.c ---- */
/* This rank's copy of the group's fault word (kl_abi.h), in its receive memory. */
static inline unsigned long long *kl_fault_word(const kl_ctx *c) {
  return (unsigned long long *)(c->recv + (CUdeviceptr)c->layout.fault_offset);
}
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
  int32_t has_select; /* the select kernels loaded (their NCCL path runs them too) */
  int64_t crossover;
  char why[KL_PEER_WHY];
} agree_info;
/* Equal on every rank that runs the same kernel with the same limits. */
uint64_t kl_fingerprint(const kl_spec *s, const kl_layout *l, uint64_t source_hash);
/* Allocates receive memory, exchanges handles, maps peers, agrees on whether
 * the one-shot path is ready on all ranks. Fatal errors return non-OK on every
 * rank alike. */
kl_result kl_transport_setup(kl_ctx *c, int compiled, const char *compile_why);
void kl_transport_teardown(kl_ctx *c);

/* ---- gather.c ---- */
enum { PATH_ONESHOT = 0, PATH_NCCL = 1 };
#define KL_RELAYOUT_CTAS_PER_SM 4 /* the relayout grid's cap: larger outputs loop */
/* The one-shot kernel on s, as every step launches it (PDL when c->pdl). */
CUresult kl_launch_oneshot(kl_ctx *c, CUdeviceptr in, CUdeviceptr out, int tokens, int grid,
                           CUstream s);
/* The dispatch rule (docs/DESIGN.md §8) for a step moving `bytes` per rank:
 * PATH_ONESHOT, or PATH_NCCL with *why. kl_choose_path: the gather's step. */
int kl_path_for(const kl_ctx *c, int tokens, long long bytes, kl_decline *why);
int kl_choose_path(const kl_ctx *c, int tokens, kl_decline *why);
kl_result kl_gather_impl(kl_ctx *c, const void *in, void *out, int tokens, CUstream s);
/* Before a call on s: s waits for the previous call's work when the streams
 * differ. *outside says s is not capturing (a graph runs later, on a stream
 * of its own, and is left to the caller to order). */
kl_result kl_order_streams(kl_ctx *c, CUstream s, int *outside);
/* After a call on s (outside capture): what the next call's ordering waits on. */
kl_result kl_order_mark(kl_ctx *c, CUstream s);

/* Shared by the dispatchers. */
int kl_capturing(const kl_ctx *c, CUstream s);
/* *buf grown to `need` bytes (allocated as `size`, zeroed), never while
 * capturing; the old buffer is kept until destroy. */
kl_result kl_ensure(kl_ctx *c, CUdeviceptr *buf, size_t *cap, size_t need, size_t size,
                    CUstream s, const char *what);
int kl_overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn);
/* p must be device memory on c's GPU; *cache remembers the last one checked. */
kl_result kl_check_ptr(kl_ctx *c, const void *p, const void **cache, const char *what);
kl_result kl_copy(kl_ctx *c, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s);

/* ---- select.c ---- */
/* Bytes of select scratch for `tokens` rows: this rank's records, then all ranks'. */
size_t kl_select_scratch_bytes(const kl_ctx *c, long long tokens);
/* The select kernels' step slots: in the state block, after the one-shot kernel's. */
unsigned long long *kl_select_slots(const kl_ctx *c);
/* The select kernel f (c->argmax or c->topk) on s, one-shot (PDL when c->pdl). */
CUresult kl_launch_select(kl_ctx *c, CUfunction f, const kl_select_args *a, int grid, CUstream s);
/* kl_argmax (topk 0; lse NULL) or kl_topk (topk 1). value and lse may be NULL. */
kl_result kl_select_impl(kl_ctx *c, int topk, const void *in, int64_t *index, float *value,
                         float *lse, int tokens, CUstream s);

/* ---- context.c ---- */
/* KLRT_EDEVICE naming the rank, peer and step of a fault word (kl_abi.h). */
kl_result kl_fault_error(const kl_ctx *c, uint64_t fault);
/* KLRT_EUNAVAILABLE, naming the minimum, for a GPU the kernels cannot run on. */
kl_result kl_require_arch(int device, int major, int minor);
/* Makes c's CUDA context current if it is not; *pushed says to pop it. */
kl_result kl_ctx_enter(kl_ctx *c, int *pushed);
void kl_ctx_leave(kl_ctx *c, int pushed);
#define KL_CU_TRY(c, call)                                                                \
  do {                                                                                    \
    CUresult r_ = (c)->cu->call;                                                          \
    if (r_ != CUDA_SUCCESS)                                                               \
      return kl_rt_fail(KLRT_ECUDA, "%s failed: %s", #call, kl_cu_errstr(r_));            \
  } while (0)

#endif
