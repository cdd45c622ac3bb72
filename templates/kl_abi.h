/* The contract between libklrt and the kernels klgen generates: the state
 * block in device memory and the kernels' parameters, defined once. The
 * runtime includes this file; klgen renders it into every kernel source
 * (NVRTC compiles it as C++ with no headers, so: no includes, only built-in
 * types). A change here is a change to both sides at once, and the asserts
 * below hold them to one layout. Bump KL_ABI_VERSION with any change. */
#ifndef KL_ABI_H
#define KL_ABI_H

#define KL_ABI_VERSION 18

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
  unsigned long long timeout_ns; /* poll limit, set by the host */
  /* Host memory (pinned, mapped), two words: the kernels copy the group's
   * fault word (below) into the first, so the host reads it with a load,
   * never a device sync; the second counts kl_sample's calls that sampled a
   * row whole on the device (in the stats' sample_gathered). */
  unsigned long long *mirror;
  /* The step + 1 of the last call counted there: the first CTA of a call
   * to sample a row whole swaps its own in, and counts the call if the word
   * held another. */
  unsigned long long whole_step;
  unsigned long long reserved[5];
} kl_state;

/* Step counters wrap here, a multiple of 3, so the three rotating buffers
 * keep their roles across the wrap (at 2^32, which 3 does not divide, two
 * steps in a row would use one buffer), and even, so the two by the step's
 * parity (kl_sample's staged rows and their marks) keep theirs. */
#define KL_STEP_WRAP 3221225472u /* 3 << 30 */
KL_ABI_ASSERT(KL_STEP_WRAP % 6 == 0, "the step's buffers, three and two, keep their roles at the wrap");

/* The group's fault word: in every rank's receive memory, after its buffers
 * (KL_FAULT_BYTES at the layout's fault_offset), where its peers can write
 * it. 0 while the group is healthy; the first rank whose poll times out
 * writes KL_FAULT(step, itself, the rank it waited for) into its own copy
 * and every peer's. From then on every kernel of the group that polls finds
 * it set (when it starts, or while it polls) and writes only poison into its
 * outputs (NaN logits, index -1, NaN values and lse), and the host's next
 * one-shot call returns KLRT_EDEVICE once it has seen the word (NCCL-path
 * calls run on). */
#define KL_FAULT_BYTES 64
#define KL_FAULT(step, rank, peer)                                                      \
  (1ull << 63 | (unsigned long long)(step) << 16 | (unsigned long long)(rank) << 8 |   \
   (unsigned long long)(peer))
#define KL_FAULT_STEP(f) ((unsigned)((f) >> 16))
#define KL_FAULT_RANK(f) ((unsigned)((f) >> 8) & 0xffu)
#define KL_FAULT_PEER(f) ((unsigned)(f) & 0xffu)

/* The one-shot kernel's parameter: these fields, then peers[TP], the receive
 * buffers of every rank (this rank's own at peers[rank]), passed by value. */
typedef struct kl_oneshot_args {
  const void *in;  /* this rank's [tokens, SHARD] */
  void *out;       /* [tokens, VOCAB] */
  kl_state *state; /* this rank's state block */
  unsigned long long *fault; /* this rank's copy of the group's fault word */
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

/* A special column's slot in its row's hash table (open addressing,
 * linear probing from kl_list_hash): its column + 1 (0: empty), its last
 * bias entry + 1 (0: no bias), whether it is banned, and its bias. */
typedef struct kl_list_slot {
  unsigned key, last, banned;
  float bias;
} kl_list_slot;
#define KL_LISTS_KEPT 1u    /* the row keeps only its kept words' columns */
#define KL_LISTS_SPECIAL 2u /* the row has special columns */
#define KL_LISTS_BAD 4u     /* its lists are outside the domain: token -1 */

/* kl_sample's per-row parameters (klrt.h's kl_sampling), as both samplers
 * read them: row t's temperature, top_k, top_p, min_p and seed at entry t,
 * or state_rows[t] of `states` entries; its offset at t, or offset_rows[t]
 * of `offsets` entries (index arrays of 32- or 64-bit entries, as their
 * `_bits` say); an index outside its table makes the row's parameters
 * outside the domain. NULL but temperature: off. bitmask: row t's grammar
 * mask at words t * ceil(VOCAB / 32) on (column c kept where bit c % 32 of
 * word c / 32 is set, else -inf before anything else reads it). The
 * penalties are per state, as temperature: repetition, frequency and
 * presence at entry s; prompt_mask, the prompt's tokens as bits, at words
 * s * ceil(VOCAB / 32) on; output_counts, each column's count in the
 * output, at s * VOCAB on. */
typedef struct kl_row_params {
  const float *temperature;
  const int *top_k;
  const float *top_p, *min_p;
  const unsigned long long *seed, *offset;
  const void *state_rows, *offset_rows;
  long long states, offsets;
  int state_rows_bits, offset_rows_bits; /* 32 or 64 */
  const unsigned *bitmask;
  const float *repetition, *frequency, *presence;
  const unsigned *prompt_mask;
  const int *output_counts;
  /* The sparse processors (allowed ids, logit bias, min_tokens, banned
   * ids) as the lists kernel left them for this call's rows, or NULL (a
   * call without lists): row t's flags (KL_LISTS_*), and its block at
   * list_rows + t * list_row_words, in parts of W = ceil(ceil(VOCAB / 32)
   * / 4) * 4 words: the words of kept columns (KL_LISTS_KEPT: the
   * grammar's, the allowed ids, without the stopped ones) at 0, of special
   * columns (KL_LISTS_SPECIAL: a bias or a ban) at W, their hash table of
   * 1 << list_slot_bits slots at 2 * W. */
  const unsigned *list_flags;
  const unsigned *list_rows;
  long long list_row_words;
  int list_slot_bits;
  int logit_values; /* kl_sampling's: logprob outputs hold the logits */
} kl_row_params;

/* The lists kernel's parameter: kl_sampling's lists in, per row, the
 * call's row parameters' list fields out (which params holds too; the
 * kernel reads none of them). A CTA a row. */
typedef struct kl_lists_args {
  kl_row_params params;
  const int *allowed_count, *allowed_ids;
  const int *bias_count, *bias_ids;
  const float *bias_values;
  const int *min_len, *stop_count, *stop_ids;
  const long long *position;
  const int *banned;
  int allowed_width, bias_width, stop_width, banned_width;
  unsigned *flags, *rows; /* params' list_flags and list_rows, written */
  long long row_words;
  int slot_bits, tokens;
} kl_lists_args;

/* The select kernels' parameter (kl_argmax, kl_topk, and kl_sample's shard
 * sampler): these fields, then peers[TP] as for the one-shot kernel. mode 0:
 * one-shot (reduce, exchange candidates through the peers' buffers, merge);
 * mode 1: reduce only, records to rec ([tokens, SPLIT] records); mode 2:
 * merge only, from rec ([TP, tokens, SPLIT] records: ncclAllGather's
 * layout). The shard sampler writes token and logprob, [tokens] each (in
 * the places of the others' index and value), and reads the rows'
 * parameters (params); the others leave them NULL. With whole_rows (one-shot only) the
 * call has filters: each part stages its rank row and sends its candidates
 * too, and a row they cannot decide is copied whole from every rank's
 * staged rows into whole_rows, where the CTA that merged it samples it. */
typedef struct kl_select_args {
  const void *in;            /* this rank's [tokens, SHARD] */
  union {
    long long *index;        /* kl_argmax, kl_topk: [tokens, K] */
    long long *token;        /* the shard sampler: [tokens] */
  };
  union {
    float *value;            /* kl_argmax, kl_topk: [tokens, K], or NULL */
    float *logprob;          /* the shard sampler: [tokens], or NULL */
  };
  float *lse;                /* [tokens] (topk only), or NULL */
  kl_state *state;           /* this rank's state block */
  unsigned long long *fault; /* this rank's copy of the group's fault word */
  unsigned long long *slots; /* the select kernels' step slots (after the one-shot's) */
  void *rec;                 /* modes 1 and 2 */
  kl_row_params params;      /* the shard sampler's; filters only with whole_rows */
  void *whole_rows;          /* [tokens, VOCAB] (out dtype), or NULL: no filters */
  int tokens, rank, nslots, mode;
  /* The shard sampler without filters, one-shot: this call's subparts of
   * each of TOPK_SPLIT's parts, 2 or 4 (at most the layout's bound,
   * SHARD_SUBPARTS), a CTA each with a share of every chunk's columns and a
   * record of its own; any other value is 1. The same on every rank. */
  int subparts;
  int reserved;
} kl_select_args;
/* A shard sampler's record (shards.cu.tmpl), in 32-bit words: a part's
 * first largest t and its best draw (each a logit and its column + 1, 0:
 * none), its largest logit, the double sum of exp(x - that) for the
 * logprob (two words, its last bit clear), and the best draw's t + g. */
#define KL_SHARD_RECORD_WORDS 8
/* With filters, word KL_SHARD_CAND_WORD on holds the part's first
 * min(TOPK, VOCAB) columns in the key order of t, two words each (the
 * logit, and the column + 1; 0: none, a part with fewer columns). Its
 * first column word KL_SHARD_CAND_UNKNOWN: too many equal keys to rank,
 * the row is sampled whole. */
#define KL_SHARD_CAND_WORD 8
#define KL_SHARD_CAND_UNKNOWN 0xfffffffeu
#define KL_SELECT_ONESHOT 0
#define KL_SELECT_REDUCE 1
#define KL_SELECT_MERGE 2

/* kl_sample's row sampler: the gathered logits and per-row parameters in,
 * a token per row out (kl_sample's gathering path: it reads whole rows;
 * params as kl_row_params says). A greedy or plain-temperature row may be sliced, a
 * CTA a slice (up to SAMPLE_SLICES), each leaving its slice's result; the
 * last to finish merges them and sets arrived[row] back to 0 (zeroed at
 * allocation). */
typedef struct kl_slice_result {
  unsigned long long kx, kt, best; /* the slice's largest key of x, of t, of t + g */
  double sum; /* the sum of exp(x - its largest x); 0 if that is not finite or no logprob is
                 asked for; -1: the slice saw the group's fault, the row is poison */
} kl_slice_result;
typedef struct kl_sample_args {
  const void *logits;             /* [tokens, VOCAB], the spec's out dtype */
  kl_row_params params;
  long long *token;               /* [tokens] */
  float *logprob;                 /* [tokens], or NULL */
  long long *top_index;           /* [tokens, n_top], or NULL */
  float *top_logprob;             /* [tokens, n_top], or NULL */
  long long *rank;                /* [tokens], or NULL */
  /* this rank's copy of the group's fault word after a one-shot gather, or
   * NULL (no one-shot state, or the rows came through NCCL: results): set
   * when the sampler starts, the gather before it may have run dead, and
   * every row gets token -1 and NaN logprobs */
  const unsigned long long *fault;
  kl_slice_result *slice_results; /* [tokens, SAMPLE_SLICES], or NULL: no row is sliced */
  unsigned *arrived;              /* [tokens]: a sliced row's slices done */
  int tokens, n_top;              /* n_top <= TOPK and <= VOCAB */
  /* a sliced row's slices this call: `slices` (1..SAMPLE_SLICES) of slice_cols
   * columns each (a multiple of 4), the last one maybe fewer, none empty */
  int slices;
  long long slice_cols;
} kl_sample_args;

KL_ABI_ASSERT(sizeof(kl_state) == 64, "kl_state is 64 bytes: the step slots follow it");
KL_ABI_ASSERT(sizeof(unsigned long long) == 8 && sizeof(void *) == 8, "a 64-bit ABI");
KL_ABI_ASSERT(sizeof(kl_oneshot_args) == 48, "peers[] follow kl_oneshot_args at byte 48");
KL_ABI_ASSERT(sizeof(kl_relayout_args) == 24, "kl_relayout_args layout");
KL_ABI_ASSERT(sizeof(kl_row_params) == 168, "kl_row_params layout");
KL_ABI_ASSERT(sizeof(kl_list_slot) == 16, "kl_list_slot layout");
KL_ABI_ASSERT(sizeof(kl_lists_args) == 296, "kl_lists_args layout");
KL_ABI_ASSERT(sizeof(kl_select_args) == 264, "peers[] follow kl_select_args at byte 264");
KL_ABI_ASSERT(sizeof(kl_slice_result) == 32, "kl_slice_result layout");
KL_ABI_ASSERT(sizeof(kl_sample_args) == 264, "kl_sample_args layout");

#endif
