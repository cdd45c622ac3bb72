/* The contract between libklrt and the kernels klgen generates: the state
 * block in device memory and the kernels' parameters, defined once. The
 * runtime includes this file; klgen renders it into every kernel source
 * (NVRTC compiles it as C++ with no headers, so: no includes, only built-in
 * types). A change here is a change to both sides at once, and the asserts
 * below hold them to one layout. Bump KL_ABI_VERSION with any change. */
#ifndef KL_ABI_H
#define KL_ABI_H

#define KL_ABI_VERSION 2

#ifdef __cplusplus
#define KL_ABI_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define KL_ABI_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* Per-rank state in device memory, zeroed at creation: a 64-byte header,
 * then one 8-byte step slot per CTA the kernel may be launched with
 * ({steps done, tokens of the last step}). The kernel advances it, so a
 * captured CUDA graph replays with no host involvement. */
typedef struct kl_state {
  unsigned int error;            /* 0, or KL_DEV_ETIMEOUT: a peer never arrived */
  unsigned int err_peer;         /* the rank whose data did not arrive */
  unsigned int err_step;         /* the step it happened in */
  unsigned int reserved0;
  unsigned long long timeout_ns; /* poll limit, set by the host */
  unsigned long long reserved[5];
} kl_state;
#define KL_DEV_ETIMEOUT 1u

/* The one-shot kernel's parameter: these fields, then peers[TP], the receive
 * buffers of every rank (this rank's own at peers[rank]), passed by value. */
typedef struct kl_oneshot_args {
  const void *in;  /* this rank's [tokens, SHARD] */
  void *out;       /* [tokens, VOCAB] */
  kl_state *state; /* this rank's state block */
  int tokens;      /* rows this step; 0 moves nothing (a warm-up) */
  int rank;
  int nslots;      /* the largest grid ever launched with this state */
  int reserved;
} kl_oneshot_args;

/* The relayout kernel's parameter: ncclAllGather's [TP, tokens, SHARD] in,
 * [tokens, VOCAB] out. */
typedef struct kl_relayout_args {
  const void *in;
  void *out;
  int tokens;
  int reserved;
} kl_relayout_args;

/* The select kernels' parameter (kl_argmax, kl_topk): these fields, then
 * peers[TP] as for the one-shot kernel. mode 0: one-shot (reduce, exchange
 * candidates through the peers' buffers, merge); mode 1: reduce only, records
 * to rec ([tokens, SPLIT] records); mode 2: merge only, from rec
 * ([TP, tokens, SPLIT] records: ncclAllGather's layout). */
typedef struct kl_select_args {
  const void *in;            /* this rank's [tokens, SHARD] */
  long long *index;          /* [tokens, K] */
  float *value;              /* [tokens, K], or NULL */
  float *lse;                /* [tokens] (topk only), or NULL */
  kl_state *state;           /* this rank's state block */
  unsigned long long *slots; /* the select kernels' step slots (after the one-shot's) */
  void *rec;                 /* modes 1 and 2 */
  int tokens, rank, nslots, mode;
} kl_select_args;
#define KL_SELECT_ONESHOT 0
#define KL_SELECT_REDUCE 1
#define KL_SELECT_MERGE 2

KL_ABI_ASSERT(sizeof(kl_state) == 64, "kl_state is 64 bytes: the step slots follow it");
KL_ABI_ASSERT(sizeof(unsigned long long) == 8 && sizeof(void *) == 8, "a 64-bit ABI");
KL_ABI_ASSERT(sizeof(kl_oneshot_args) == 40, "peers[] follow kl_oneshot_args at byte 40");
KL_ABI_ASSERT(sizeof(kl_relayout_args) == 24, "kl_relayout_args layout");
KL_ABI_ASSERT(sizeof(kl_select_args) == 72, "peers[] follow kl_select_args at byte 72");

#endif
