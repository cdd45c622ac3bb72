/* The one place that derives a spec's layout: padding, shard, vector width,
 * buffer sizes, launch shape. The generator, the generated header and the
 * runtime all call this, so they cannot disagree. */
#include <stdio.h>
#include <string.h>

#include "kl_abi.h"
#include "klgen.h"

#define DEFAULT_PAD 64 /* vLLM's DEFAULT_VOCAB_PADDING_SIZE */
/* Generous: ranks can be seconds apart at their first step (warm-up, graph
 * capture); the limit is only there so a dead peer cannot hang the GPU. */
#define DEFAULT_TIMEOUT_MS 10000
#define CHUNK 16   /* bytes: one Lamport vector, one volatile poll */
#define BLOCK 128  /* threads per CTA: small CTAs spread the pushes over more SMs */
/* With an epilogue, CHUNK_THREADS threads share a 16-byte chunk, a 4-byte
 * quarter each: the epilogue of the chunk that arrives last is what a step
 * waits for after its poll, and a thread computes it for two elements, not
 * eight (docs/BENCHMARKS.md, "The epilogue, argmax and top-k"). */
#define EPI_CHUNK_THREADS 4
#define RELAYOUT_BLOCK 256
/* Select kernels (kl_argmax, kl_topk): one CTA reads SEL_BLOCK x (its
 * kernel's chunks a thread) chunks of a row, so a row is spread over up to
 * SEL_SPLIT_MAX CTAs (the kernel's split): at one token the reduction runs
 * on many SMs, not one. kl_topk's shared merge keeps every rank's records
 * of a token in shared memory: at most SHARED_MERGE_CHUNKS 16-byte chunks. */
#define SEL_BLOCK 256
#define SEL_SPLIT_MAX 16
#define SHARED_MERGE_CHUNKS 2560
/* kl_argmax's CTAs read at least this many chunks a thread (derive_select
 * says why). */
#define ARGMAX_THREAD_CHUNKS_MIN 2
/* kl_sample: a row the row sampler slices (greedy, or T and no filter) is
 * cut into ceil(vocab / (SEL_BLOCK x SAMPLE_SLICE_THREAD_COLS)) slices of equal
 * columns (a multiple of 4), at most 2,048 (two groups of four a thread),
 * at most SAMPLE_SLICES_MAX of them (the merge is a warp's; past 65,536
 * columns slices grow): at one token a row takes that many multiprocessors,
 * not one. */
#define SAMPLE_SLICE_THREAD_COLS 8
#define SAMPLE_SLICES_MAX 32
/* kl_sample's shard sampler without filters: CTAs a part at most (each a
 * share of every chunk's columns), and the records a token's merge takes
 * in two passes of its warp (shards_merge.cuh.tmpl). */
#define SHARD_SUBPARTS_MAX 4
#define SHARD_MERGE_RECORDS 64
/* ... and the CTAs a multiprocessor its launch bounds promise: at many
 * tokens its grid is at its cap, a wave of CTAs that each scan part after
 * part, so the bytes in flight a multiprocessor are these CTAs' loads. A
 * thread of one chunk a part keeps its scan within the registers of four;
 * more chunks a thread would spill there, and take two. */
#define SHARD_CTAS_NARROW 4
#define SHARD_CTAS_WIDE 2

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static int64_t gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b, b = t;
  }
  return a;
}

/* Says what would work: a pad_to (or padded_vocab) that tp divides, and the tp
 * values that divide the padded vocab as it stands. */
static int not_divisible(const kl_spec *s, int64_t padded, kl_err *err) {
  char tps[128] = "";
  size_t used = 0;
  for (int t = 1; t <= KL_TP_MAX && used < sizeof tps - 8; t *= 2)
    if (padded % t == 0) used += (size_t)snprintf(tps + used, sizeof tps - used, "%s%d", used ? ", " : "", t);
  if (s->padded_vocab) {
    return kl_spec_fail(err, s, KL_F_TP,
                        "padded_vocab %lld is not divisible by tp %d; padded_vocab = %lld "
                        "would work (or tp in %s)",
                        (long long)padded, s->tp, (long long)round_up(padded, s->tp), tps);
  }
  int64_t pad = s->pad_to ? s->pad_to : DEFAULT_PAD;
  int64_t lcm = pad / gcd64(pad, s->tp) * s->tp;
  return kl_spec_fail(err, s, KL_F_TP,
                      "padded vocab %lld (vocab_size %lld padded to a multiple of %lld) is not "
                      "divisible by tp %d; pad_to = %lld would work (padded vocab %lld), or tp "
                      "in %s",
                      (long long)padded, (long long)s->vocab_size, (long long)pad, s->tp,
                      (long long)lcm, (long long)round_up(s->vocab_size, lcm), tps);
}

/* Widest of 16/8/4/2 bytes dividing both the shard row and the output row, so
 * every user-memory load and store stays aligned (given aligned base pointers). */
static int vector_width(int64_t shard_bytes, int64_t vocab_bytes, int elem) {
  int64_t g = gcd64(shard_bytes, vocab_bytes);
  for (int w = 16; w > elem; w /= 2)
    if (g % w == 0) return w;
  return elem;
}

/* The epilogue's output side: element size, and the alignment out needs. A
 * 16-byte input chunk (chunk_elems elements) becomes chunk_elems output
 * elements, stored as whole 16-byte vectors when every chunk starts on a
 * multiple of chunk_elems columns of the output row, else one element at a
 * time. */
static void derive_epilogue(const kl_spec *s, kl_layout *l) {
  l->epilogue = s->out_dtype != s->dtype || s->softcap > 0 || (s->scale != 0 && s->scale != 1);
  l->out_elem_bytes = s->out_dtype == KL_FP32 ? 4 : l->elem_bytes;
  l->out_vec_bytes = l->vec_bytes;
  if (!l->epilogue) return;
  int64_t chunk_elems = CHUNK / l->elem_bytes;
  l->out_vec_bytes =
      s->vocab_size % chunk_elems == 0 && l->shard % chunk_elems == 0 ? 16 : l->out_elem_bytes;
}

/* kl_sample's shard sampler without filters at few tokens: each of kl_topk's
 * parts in up to this many subparts, a CTA each with a share of every
 * chunk's columns, so a token's noise (a Philox call and two logf a column, bound
 * by issue) spreads over more multiprocessors. A power of two that divides
 * a chunk's elements, at most 4, and within two bounds: a token's records
 * (tp x topk_split x subparts) within the two passes of a warp that the
 * merge polls (64), and a token's records, 8 words in 2 chunks, within the
 * region's stride of a token (rec_split x rec_chunks chunks), so that
 * subparts need no room of their own in the region or its refill. */
static int subparts_bound(const kl_spec *s, const kl_layout *l) {
  const int64_t chunk_elems = CHUNK / l->elem_bytes;
  const int64_t record_chunks = (KL_SHARD_RECORD_WORDS + 3) / 4;
  int sub = SHARD_SUBPARTS_MAX;
  while (sub > 1 && (sub > chunk_elems || s->tp * l->topk_split * sub > SHARD_MERGE_RECORDS ||
                     l->topk_split * sub * record_chunks > l->rec_split * l->rec_chunks))
    sub /= 2;
  return sub;
}

/* Records of candidates: room for record_keys keys of two words each and
 * (for topk) two words of log-sum-exp partial, and for kl_sample's shard
 * sampler (a spec with topk) its record, with its candidates when the call
 * has filters (kl_abi.h: KL_SHARD_CAND_WORD words, then two a candidate).
 * kl_argmax's record is one such key; kl_topk's is smaller when its values
 * are 16-bit (one-word keys and a one-word partial, templates/keys.cuh.tmpl);
 * the one-shot records of all three are packed at their own size inside
 * this stride. The split is from kl_topk's record alone: its merge holds a
 * token's records in shared memory (the shard samplers' merges do not). */
static void derive_select(const kl_spec *s, kl_layout *l) {
  l->record_keys = s->topk > 0 ? s->topk : 1;
  int words = 2 * l->record_keys + (s->topk > 0 ? 2 : 0);
  const int64_t split_chunks = (words + 3) / 4;
  if (s->topk > 0) {
    const int64_t cand = s->topk < s->vocab_size ? s->topk : s->vocab_size;
    if (words < KL_SHARD_CAND_WORD + 2 * cand) words = KL_SHARD_CAND_WORD + 2 * (int)cand;
  }
  l->rec_chunks = (words + 3) / 4;
  int64_t split_cap = SHARED_MERGE_CHUNKS / (split_chunks * s->tp);
  if (split_cap > SEL_SPLIT_MAX) split_cap = SEL_SPLIT_MAX;
  if (split_cap < 1) split_cap = 1; /* cannot happen: rec_chunks <= 33, tp <= 64 */
  int64_t per_cta = SEL_BLOCK * split_cap;
  l->sel_block = SEL_BLOCK;
  l->topk_thread_chunks = (int)((l->row_chunks + per_cta - 1) / per_cta);
  int64_t cta_chunks = (int64_t)SEL_BLOCK * l->topk_thread_chunks;
  l->topk_split = (int)((l->row_chunks + cta_chunks - 1) / cta_chunks);
  /* kl_argmax: at least ARGMAX_THREAD_CHUNKS_MIN chunks a thread, so half
   * the CTAs at most. Its per-element work is a float compare, so a CTA's
   * share costs little, and the grid is what a step of many tokens pays for. */
  l->argmax_thread_chunks = l->topk_thread_chunks < ARGMAX_THREAD_CHUNKS_MIN
                                ? ARGMAX_THREAD_CHUNKS_MIN
                                : l->topk_thread_chunks;
  cta_chunks = (int64_t)SEL_BLOCK * l->argmax_thread_chunks;
  l->argmax_split = (int)((l->row_chunks + cta_chunks - 1) / cta_chunks);
  l->rec_split = l->topk_split > l->argmax_split ? l->topk_split : l->argmax_split;
  l->shard_subparts = s->topk > 0 ? subparts_bound(s, l) : 1;
  l->shard_ctas = l->topk_thread_chunks == 1 ? SHARD_CTAS_NARROW : SHARD_CTAS_WIDE;
  l->sel_offset = l->total_bytes;
  l->sel_slot_bytes = s->max_tokens * l->rec_split * l->rec_chunks * CHUNK;
  l->sel_buffer_bytes = l->sel_slot_bytes * s->tp;
  /* kl_sample's staged rows (a spec with topk): a filtered call's shard
   * sampler leaves its rank rows here, where a peer reads those its
   * candidates cannot decide (shards_filter.cuh.tmpl); two buffers, by step
   * parity */
  l->stage_offset = l->total_bytes + 3 * l->sel_buffer_bytes;
  l->stage_buffer_bytes = s->topk > 0 ? s->max_tokens * l->row_chunks * CHUNK : 0;
  /* and their marks: a word a part, the step whose staged chunks the peers
   * may read (shards_filter.cuh.tmpl: the fence is off the records' path) */
  l->mark_offset = l->stage_offset + 2 * l->stage_buffer_bytes;
  l->mark_buffer_bytes = s->topk > 0 ? round_up(s->max_tokens * l->topk_split * 4, CHUNK) : 0;
  /* the group's fault word (kl_abi.h) after the buffers, where peers can write it */
  l->fault_offset = l->mark_offset + 2 * l->mark_buffer_bytes;
  l->recv_bytes = l->fault_offset + KL_FAULT_BYTES;
  l->sel_max_ctas = kl_layout_select_slots(l, (int)s->max_tokens, 0, 0, s->topk > 0);
}

int kl_layout_sample_slices(int64_t vocab, int64_t most, int64_t *cols) {
  if (most < 1) most = 1;
  *cols = round_up((vocab + most - 1) / most, 4);
  /* rounding up may leave the last slices empty: drop them */
  return (int)((vocab + *cols - 1) / *cols);
}

static void derive_sample(const kl_spec *s, kl_layout *l) {
  if (!s->topk) return;
  const int64_t per = (int64_t)SEL_BLOCK * SAMPLE_SLICE_THREAD_COLS;
  int64_t n = (s->vocab_size + per - 1) / per;
  n = n > SAMPLE_SLICES_MAX ? SAMPLE_SLICES_MAX : n;
  l->sample_slices = kl_layout_sample_slices(s->vocab_size, n, &l->sample_slice_cols);
}

int kl_layout_derive(const kl_spec *s, kl_layout *l, kl_err *err) {
  if (!s || !l) return kl_fail(err, KL_EARG, "kl_layout_derive: NULL argument");
  memset(l, 0, sizeof *l);
  int64_t pad = s->pad_to ? s->pad_to : DEFAULT_PAD;
  int64_t padded = s->padded_vocab ? s->padded_vocab : round_up(s->vocab_size, pad);
  if (s->tp < 1 || s->vocab_size < 1 || padded < s->vocab_size || s->max_tokens < 1)
    return kl_spec_fail(err, s, KL_F_VOCAB_SIZE, "spec is not validated");
  if (padded % s->tp) return not_divisible(s, padded, err);
  l->padded_vocab = padded;
  l->shard = padded / s->tp;
  l->elem_bytes = s->dtype == KL_FP32 ? 4 : 2;
  /* What the receive buffers are filled with and the kernel polls for. */
  l->sentinel32 = l->elem_bytes == 2 ? 0x80008000u : 0x80000000u;
  l->shard_bytes = l->shard * l->elem_bytes;
  l->vec_bytes = vector_width(l->shard_bytes, s->vocab_size * l->elem_bytes, l->elem_bytes);
  derive_epilogue(s, l);
  /* quarters of 4 bytes need 4-byte aligned rows (vec_bytes) */
  l->chunk_threads = l->epilogue && l->vec_bytes >= 4 ? EPI_CHUNK_THREADS : 1;
  l->row_chunks = (l->shard_bytes + CHUNK - 1) / CHUNK;
  l->slot_bytes = s->max_tokens * l->row_chunks * CHUNK;
  l->buffer_bytes = l->slot_bytes * s->tp;
  l->total_bytes = 3 * l->buffer_bytes; /* triple buffering, docs/design/oneshot.md */
  if (l->total_bytes > KL_BUFFER_CAP) {
    int64_t per_token = 3 * s->tp * l->row_chunks * CHUNK;
    return kl_spec_fail(err, s, KL_F_MAX_TOKENS,
                        "one-shot buffers would take %lld MiB per rank (3 x tp x max_tokens x "
                        "shard bytes), over the %lld MiB cap; max_tokens <= %lld fits",
                        (long long)(l->total_bytes >> 20), (long long)(KL_BUFFER_CAP >> 20),
                        (long long)(KL_BUFFER_CAP / per_token));
  }
  derive_select(s, l);
  derive_sample(s, l);
  if (l->recv_bytes > KL_BUFFER_CAP) {
    /* a token's bytes, the staged rows' marks too; what does not grow with
     * max_tokens is at most the fault word and the marks' rounding */
    int64_t per_token = (3 * s->tp * (l->row_chunks + (int64_t)l->rec_split * l->rec_chunks) +
                         2 * l->row_chunks) * CHUNK + (s->topk > 0 ? 2 * 4 * (int64_t)l->topk_split : 0);
    int64_t fixed = KL_FAULT_BYTES + 2 * CHUNK;
    return kl_spec_fail(err, s, KL_F_MAX_TOKENS,
                        "one-shot buffers would take %lld MiB per rank (3 x tp x max_tokens x "
                        "(shard bytes + candidate records) + staged rows and their marks), over the "
                        "%lld MiB cap; max_tokens <= %lld fits", (long long)(l->recv_bytes >> 20),
                        (long long)(KL_BUFFER_CAP >> 20), (long long)((KL_BUFFER_CAP - fixed) / per_token));
  }
  l->block = BLOCK;
  l->relayout_block = RELAYOUT_BLOCK;
  l->max_ctas = kl_layout_grid(l, (int)s->max_tokens, 0);
  l->timeout_ns = (s->timeout_ms ? s->timeout_ms : DEFAULT_TIMEOUT_MS) * 1000000LL;
  return 0;
}

/* One thread per 16-byte chunk of a shard row (chunk_threads per chunk with
 * an epilogue, a quarter each): it pushes that chunk to every peer, then polls
 * the same chunk of every rank's slot. */
int kl_layout_grid(const kl_layout *l, int tokens, int cap) {
  int64_t items = (int64_t)tokens * l->row_chunks * l->chunk_threads;
  int64_t g = (items + l->block - 1) / l->block;
  if (g < 1) g = 1;
  if (cap > 0 && g > cap) g = cap;
  return (int)g;
}

int kl_layout_relayout_grid(const kl_layout *l, int64_t out_bytes, int cap) {
  int64_t threads = out_bytes / l->vec_bytes;
  int64_t g = (threads + l->relayout_block - 1) / l->relayout_block;
  if (g > cap) g = cap;
  return g < 1 ? 1 : (int)g;
}

int kl_layout_select_grid(const kl_layout *l, int tokens, int cap, int topk) {
  int64_t g = (int64_t)tokens * (topk ? l->topk_split : l->argmax_split);
  if (cap > 0 && g > cap) g = cap;
  return g < 1 ? 1 : (int)g;
}

/* The select kernels share their step slots: as many as the larger grid. */
int kl_layout_select_slots(const kl_layout *l, int tokens, int argmax_cap, int topk_cap,
                           int topk) {
  int am = kl_layout_select_grid(l, tokens, argmax_cap, 0);
  int tk = topk ? kl_layout_select_grid(l, tokens, topk_cap, 1) : 0;
  return am > tk ? am : tk;
}
