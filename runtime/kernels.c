/* The kernel table: the generated kernels a context loads, an entry each
 * (rt.h's kl_kernel), filled from the rows below; and the one launcher.
 * Everything here runs at creation but kl_grid and kl_launch, which every
 * step calls. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rt.h"

/* How each kernel takes its parameter (kl_kernel_params' members). */
enum params_kind { PARAMS_ONESHOT, PARAMS_RELAYOUT, PARAMS_SELECT, PARAMS_SAMPLE, PARAMS_LISTS };
/* Which step slots a polling kernel advances (kl_abi.h: the state block
 * holds kl_state, the gather's slots, then the select kernels' shared ones). */
enum slot_group { SLOTS_NONE, SLOTS_GATHER, SLOTS_SELECT, SLOTS_COUNT };

/* The grids, as the layout (libklgen) defines them: CTAs for `items` (rows,
 * but for the callers of kl_grid that say otherwise), at most cap (0: none;
 * the relayout always has one). */
static int oneshot_grid(const kl_ctx *c, int items, int cap) {
  return kl_layout_grid(&c->layout, items, cap);
}
static int relayout_grid(const kl_ctx *c, int items, int cap) {
  int64_t out_bytes = (int64_t)items * c->spec.vocab_size * c->layout.out_elem_bytes;
  return kl_layout_relayout_grid(&c->layout, out_bytes, cap);
}
static int argmax_grid(const kl_ctx *c, int items, int cap) {
  return kl_layout_select_grid(&c->layout, items, cap, 0);
}
static int topk_grid(const kl_ctx *c, int items, int cap) {
  return kl_layout_select_grid(&c->layout, items, cap, 1);
}
static int sample_grid(const kl_ctx *c, int items, int cap) {
  (void)c; /* a CTA an item (a row, or a slice of one); past cap (0: none) the CTAs take
             several */
  if (items < 1) return 1;
  return cap > 0 && items > cap ? cap : items;
}

static const struct row {
  const char *kind;   /* its entry point: kl_<spec>_<kind> (kl_entry_name) */
  size_t block_at;    /* offsetof(kl_layout, its threads a CTA) */
  enum params_kind params;
  /* SLOTS_NONE: it polls no peer. Else it does: its grid is capped to stay
   * co-resident, it advances these slots, and a one-shot step may use PDL. */
  enum slot_group slots;
  int needs_topk;     /* loaded only for a spec with topk */
  int (*grid)(const kl_ctx *c, int items, int cap);
  int cap_per_sm;     /* a kernel that polls no peer: its cap, per multiprocessor */
} rows[KL_K_COUNT] = {
    [KL_K_ONESHOT] = {"oneshot", offsetof(kl_layout, block), PARAMS_ONESHOT, SLOTS_GATHER, 0,
                      oneshot_grid, 0},
    [KL_K_RELAYOUT] = {"relayout", offsetof(kl_layout, relayout_block), PARAMS_RELAYOUT,
                       SLOTS_NONE, 0, relayout_grid, KL_RELAYOUT_CTAS_PER_SM},
    [KL_K_ARGMAX] = {"argmax", offsetof(kl_layout, sel_block), PARAMS_SELECT, SLOTS_SELECT, 0,
                     argmax_grid, 0},
    [KL_K_TOPK] = {"topk", offsetof(kl_layout, sel_block), PARAMS_SELECT, SLOTS_SELECT, 1,
                   topk_grid, 0},
    [KL_K_SAMPLE] = {"sample", offsetof(kl_layout, sel_block), PARAMS_SAMPLE, SLOTS_NONE, 1,
                     sample_grid, KL_SAMPLE_CTAS_PER_SM},
    /* kl_topk's grid: a CTA a part of kl_topk's split */
    [KL_K_SHARDS] = {"shards", offsetof(kl_layout, sel_block), PARAMS_SELECT, SLOTS_SELECT, 1,
                     topk_grid, 0},
    /* the same, for calls with lists: the kernel above has none of their code */
    [KL_K_SHARDS_LISTS] = {"shards_lists", offsetof(kl_layout, sel_block), PARAMS_SELECT,
                           SLOTS_SELECT, 1, topk_grid, 0},
    /* shards.cu.tmpl's kernel with filters, whose entry point is named for
     * the candidates its records carry */
    [KL_K_SHARDS_FILTERED] = {"candidates", offsetof(kl_layout, sel_block), PARAMS_SELECT,
                              SLOTS_SELECT, 1, topk_grid, 0},
    /* a CTA a row, as the row sampler */
    [KL_K_LISTS] = {"lists", offsetof(kl_layout, sel_block), PARAMS_LISTS, SLOTS_NONE, 1,
                    sample_grid, KL_SAMPLE_CTAS_PER_SM},
};

static int wanted(const kl_ctx *c, kl_kernel_id id) { return !rows[id].needs_topk || c->spec.topk; }

static void clear(kl_ctx *c) {
  for (int i = 0; i < KL_K_COUNT; i++) c->kern[i].fn = NULL;
}

CUresult kl_kernels_load(kl_ctx *c) {
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < KL_K_COUNT && r == CUDA_SUCCESS; i++) {
    kl_kernel *k = &c->kern[i];
    k->block = *(const int *)((const char *)&c->layout + rows[i].block_at);
    k->cap = rows[i].cap_per_sm * c->sm_count; /* the polling kernels': at mapping */
    if (!wanted(c, (kl_kernel_id)i)) continue;
    char name[128];
    kl_entry_name(&c->spec, rows[i].kind, name, sizeof name);
    r = c->cu->cuModuleGetFunction(&k->fn, c->mod, name);
    /* Onto the GPU here, at loading: with lazy loading (the driver's
     * default from CUDA 12.2) a first launch may wait for the whole context
     * to go idle, and ranks that share a GPU spin on each other's kernels. Drivers without
     * cuFuncLoad load eagerly. */
    if (r == CUDA_SUCCESS && c->cu->cuFuncLoad) r = c->cu->cuFuncLoad(k->fn);
    int per_sm = 0;
    if (r == CUDA_SUCCESS && c->cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(
                                 &per_sm, k->fn, k->block, 0) == CUDA_SUCCESS)
      k->wave = per_sm * c->sm_count;
  }
  if (r != CUDA_SUCCESS) clear(c);
  return r;
}

static CUdeviceptr *peers_of(kl_kernel *k, enum params_kind p) {
  if (p == PARAMS_ONESHOT) return k->prm.oneshot.peers;
  if (p == PARAMS_SELECT) return k->prm.select.peers;
  return NULL;
}

void kl_kernels_set_peers(kl_ctx *c) {
  for (int i = 0; i < KL_K_COUNT; i++) {
    CUdeviceptr *p = peers_of(&c->kern[i], rows[i].params);
    if (p) memcpy(p, c->peers, sizeof c->peers);
  }
}

/* CTAs per rank such that every rank's CTAs on this GPU are resident at once:
 * a spinning CTA must never keep a peer's unscheduled CTA off the GPU. From
 * the kernel's wave (its occupancy at loading; 0 if unknown: no cap fits). */
static int residency_cap(const kl_kernel *k, int on_device) {
  /* Alone on a GPU a rank cannot starve itself; sharing one, it could starve
   * a peer, so the ranks there split it (and PDL is off: transport.c). The
   * grids are of different kernels (the gather, the select kernels), whose
   * CTAs pack into a multiprocessor less well than each alone, and a rank
   * behind its peers still has kernels that poll nothing (the relayout, the
   * row sampler) to run beside their spinning grids: each grid gets a
   * quarter of its share. At half a share, at max_tokens, where every grid
   * is at its cap, a late rank's row sampler can find no room beside its
   * peers' spinning grids, which then wait for it until they time out. */
  int grids = on_device > 1 ? 4 * on_device : 1;
  const int cap = k->wave / grids;
  /* a small GPU (a MIG slice) shared by many ranks: half a share, if that fits */
  return cap >= 1 || on_device < 2 ? cap : k->wave / (2 * on_device);
}

/* Each polling kernel its own cap (the top-k kernel, with more registers,
 * may fit fewer CTAs). 0, or -1 when one cannot be resident at all. */
static int set_caps(kl_ctx *c, int on_device) {
  int ok = 1;
  for (int i = 0; i < KL_K_COUNT; i++) {
    kl_kernel *k = &c->kern[i];
    if (!rows[i].slots || !k->fn) continue;
    k->cap = residency_cap(k, on_device);
    ok &= k->cap >= 1;
  }
  return ok ? 0 : -1;
}

void kl_kernels_forget(kl_ctx *c) {
  for (int i = 0; i < KL_K_COUNT; i++) {
    c->kern[i].slots = NULL;
    c->kern[i].nslots = 0;
    memset(&c->kern[i].prm, 0, sizeof c->kern[i].prm);
  }
}

static unsigned long long *group_slots(const kl_ctx *c, enum slot_group g) {
  unsigned long long *gather = (unsigned long long *)(c->state + sizeof(kl_state));
  return g == SLOTS_GATHER ? gather : gather + c->layout.max_ctas;
}

/* Slots a group's region in the state block holds (transport.c sizes it
 * from the layout): the table's grids must stay within it. */
static long long group_capacity(const kl_ctx *c, enum slot_group g) {
  return g == SLOTS_GATHER ? c->layout.max_ctas : c->layout.sel_max_ctas;
}

/* Kernels that share slots share their number: the largest grid any of
 * them launches, at max_tokens and its cap. -1 if that is more than the
 * layout made room for (a row whose grid rule the layout does not know). */
static int set_slots(kl_ctx *c) {
  int most[SLOTS_COUNT] = {0};
  for (int i = 0; i < KL_K_COUNT; i++) {
    enum slot_group g = rows[i].slots;
    if (!g || !c->kern[i].fn) continue;
    int n = rows[i].grid(c, (int)c->spec.max_tokens, c->kern[i].cap);
    if (n > most[g]) most[g] = n;
  }
  for (int g = 1; g < SLOTS_COUNT; g++)
    if (most[g] > group_capacity(c, (enum slot_group)g)) return -1;
  for (int i = 0; i < KL_K_COUNT; i++) {
    enum slot_group g = rows[i].slots;
    if (!g) continue;
    c->kern[i].slots = group_slots(c, g);
    c->kern[i].nslots = most[g];
  }
  return 0;
}

/* The parameter of a one-shot step with no work (tokens 0). */
static void idle_params(kl_ctx *c, kl_kernel *k, enum params_kind p) {
  if (p == PARAMS_ONESHOT) {
    k->prm.oneshot.a = (kl_oneshot_args){NULL, NULL, (kl_state *)c->state, kl_fault_word(c), 0,
                                         c->rank, k->nslots, 0};
  } else if (p == PARAMS_SELECT) {
    kl_select_args a = {0};
    a.state = (kl_state *)c->state;
    a.fault = kl_fault_word(c);
    a.slots = k->slots;
    a.rank = c->rank;
    a.nslots = k->nslots;
    a.mode = KL_SELECT_ONESHOT;
    k->prm.select.a = a;
  } else if (p == PARAMS_SAMPLE) {
    k->prm.sample = (kl_sample_args){0};
  } else if (p == PARAMS_LISTS) {
    k->prm.lists = (kl_lists_args){0};
  } else {
    k->prm.relayout = (kl_relayout_args){NULL, NULL, 0, 0};
  }
}

/* One launch of each kernel with no work, here, where a slow first launch
 * (lazy loading of the code) costs nothing: in a step it would make this rank
 * late and its peers' grids spin. tokens = 0 moves nothing; it advances each
 * kernel's step slots once (the select kernels' shared ones once each), on
 * every rank alike. */
static int warm_up(kl_ctx *c, char *why) {
  CUresult r = CUDA_SUCCESS;
  for (int i = 0; i < KL_K_COUNT && r == CUDA_SUCCESS; i++) {
    if (!c->kern[i].fn) continue;
    idle_params(c, &c->kern[i], rows[i].params);
    r = kl_launch(c, (kl_kernel_id)i, 1, rows[i].slots != SLOTS_NONE, c->stream);
  }
  if (r == CUDA_SUCCESS) r = c->cu->cuStreamSynchronize(c->stream);
  if (r != CUDA_SUCCESS) {
    snprintf(why, KL_PEER_WHY, "rank %d: first launch of the kernels: %s", c->rank, kl_cu_errstr(r));
    return -1;
  }
  return 0;
}

int kl_kernels_ready(kl_ctx *c, int on_device, char *why) {
  if (set_caps(c, on_device) != 0) {
    snprintf(why, KL_PEER_WHY, "rank %d: the one-shot kernels cannot be resident", c->rank);
    return -1;
  }
  if (set_slots(c) != 0) {
    snprintf(why, KL_PEER_WHY, "rank %d: a kernel's grid has more CTAs than the state block "
             "has step slots for", c->rank);
    return -1;
  }
  kl_kernels_set_peers(c);
  return warm_up(c, why);
}

int kl_grid(const kl_ctx *c, kl_kernel_id id, int items, int capped) {
  return rows[id].grid(c, items, capped ? c->kern[id].cap : 0);
}

CUresult kl_launch(kl_ctx *c, kl_kernel_id id, int grid, int overlap, CUstream s) {
  kl_kernel *k = &c->kern[id];
  void *args[] = {&k->prm};
  /* PDL: this launch may begin while the previous kernel (the LM head, or
   * the last step's) drains; the kernel waits for it before reading. */
  CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg = {.gridDimX = (unsigned)grid, .gridDimY = 1, .gridDimZ = 1,
                        .blockDimX = (unsigned)k->block, .blockDimY = 1, .blockDimZ = 1,
                        .hStream = s, .attrs = &attr, .numAttrs = overlap && c->pdl ? 1 : 0};
  return c->cu->cuLaunchKernelEx(&cfg, k->fn, args, NULL);
}
