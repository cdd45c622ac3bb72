/* The kernel table: the generated kernels a context loads, an entry each
 * (rt.h's kl_kernel), filled from the rows below; and the one launcher.
 * Everything here runs at creation but kl_launch, which every step calls. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "rt.h"

/* How each kernel takes its parameter (kl_kernel_params' members). */
enum params_kind { PARAMS_ONESHOT, PARAMS_RELAYOUT, PARAMS_SELECT };

static const struct row {
  const char *kind;   /* its entry point: kl_<spec>_<kind> (kl_entry_name) */
  size_t block_at;    /* offsetof(kl_layout, its threads a CTA) */
  enum params_kind params;
  int polls;          /* it polls its peers' pushes: co-residency cap, step slots, PDL */
  int needs_topk;     /* loaded only for a spec with topk */
} rows[KL_K_COUNT] = {
    [KL_K_ONESHOT] = {"oneshot", offsetof(kl_layout, block), PARAMS_ONESHOT, 1, 0},
    [KL_K_RELAYOUT] = {"relayout", offsetof(kl_layout, relayout_block), PARAMS_RELAYOUT, 0, 0},
    [KL_K_ARGMAX] = {"argmax", offsetof(kl_layout, sel_block), PARAMS_SELECT, 1, 0},
    [KL_K_TOPK] = {"topk", offsetof(kl_layout, sel_block), PARAMS_SELECT, 1, 1},
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
    if (!wanted(c, (kl_kernel_id)i)) continue;
    char name[128];
    kl_entry_name(&c->spec, rows[i].kind, name, sizeof name);
    r = c->cu->cuModuleGetFunction(&k->fn, c->mod, name);
  }
  c->kern[KL_K_RELAYOUT].cap = KL_RELAYOUT_CTAS_PER_SM * c->sm_count;
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
 * a spinning CTA must never keep a peer's unscheduled CTA off the GPU. */
static int residency_cap(kl_ctx *c, const kl_kernel *k, int on_device) {
  int per_sm = 0;
  if (c->cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k->fn, k->block, 0) !=
      CUDA_SUCCESS)
    return 0;
  /* Alone on a GPU a rank cannot starve itself; sharing one, it could starve
   * a peer, so the ranks there split it (and PDL is off: transport.c). The
   * grids are of different kernels (the gather, the select kernels), whose
   * CTAs pack into a multiprocessor less well than each alone: each grid gets
   * half its share. Seen on one H200 with 8 ranks without that half: a step
   * now and then timed out at max_tokens, where every grid is at its cap. */
  int grids = on_device > 1 ? 2 * on_device : 1;
  return per_sm * c->sm_count / (grids ? grids : 1);
}

/* Each polling kernel its own cap (the top-k kernel, with more registers,
 * may fit fewer CTAs). 0, or -1 when one cannot be resident at all. */
static int set_caps(kl_ctx *c, int on_device) {
  int ok = 1;
  for (int i = 0; i < KL_K_COUNT; i++) {
    kl_kernel *k = &c->kern[i];
    if (!rows[i].polls || !k->fn) continue;
    k->cap = residency_cap(c, k, on_device);
    ok &= k->cap >= 1;
  }
  return ok ? 0 : -1;
}

/* The state block holds kl_state, the gather's step slots, then the select
 * kernels' (kl_abi.h), which they share: as many as the larger grid. */
static void set_slots(kl_ctx *c) {
  kl_kernel *k = c->kern;
  int most = (int)c->spec.max_tokens;
  unsigned long long *gather = (unsigned long long *)(c->state + sizeof(kl_state));
  k[KL_K_ONESHOT].slots = gather;
  k[KL_K_ONESHOT].nslots = kl_layout_grid(&c->layout, most, k[KL_K_ONESHOT].cap);
  int sel = kl_layout_select_slots(&c->layout, most, k[KL_K_ARGMAX].cap, k[KL_K_TOPK].cap,
                                   k[KL_K_TOPK].fn != NULL);
  for (int i = KL_K_ARGMAX; i <= KL_K_TOPK; i++) {
    k[i].slots = gather + c->layout.max_ctas;
    k[i].nslots = sel;
  }
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
    r = kl_launch(c, (kl_kernel_id)i, 1, rows[i].polls, c->stream);
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
  set_slots(c);
  kl_kernels_set_peers(c);
  return warm_up(c, why);
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
