/* NVRTC compiles every spec of the files given for sm_90 and sm_100 into a
 * non-empty cubin with its entry points (topk only for a spec with topk),
 * with no warnings; a spec with topk with gpu_sample's kernels too (they call
 * the sampler's pieces no kernel of the spec calls yet). With --cache, the
 * cubins go to (and come from) the JIT cache at DIR, as libklrt and the GPU
 * tests compile the same sources: runs beside each other on a GPU
 * machine's cores (--only, --arch of its GPU) fill the cache the GPU tests
 * then read. Without it every source is compiled (a cached one would skip
 * NVRTC's warnings).
 *   test_nvrtc [--only NAME] [--arch sm_XY] [--cache DIR] SPEC...
 *   (--only: that spec of the files alone; --arch: that architecture alone) */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "klgen.h"
#include "rt.h" /* kl_jit_cubin */
#include "sample_kernels.h"
#include "spec_source.h"

static const char *only_arch, *cache; /* --arch, --cache */
/* NVRTC's cubin for src on arch, or with --cache the cache's. */
static int compile(const char *src, const char *name, const char *arch, kl_binary *b,
                   kl_err *e) {
  int hit = 0;
  return kl_jit_cubin(src, name, arch, cache, b, &hit, e);
}

static int has(const kl_binary *b, const char *s) {
  size_t n = strlen(s);
  const char *p = b->data;
  for (size_t i = 0; i + n <= b->size; i++)
    if (!memcmp(p + i, s, n)) return 1;
  return 0;
}

static void compile_spec(const kl_spec *s) {
  kl_layout l;
  kl_err e;
  char *src = NULL;
  if (kl_layout_derive(s, &l, &e) || kl_render(s, &l, NULL, &src, &e)) {
    CHECK(0, "%s: %s", s->name, e.msg);
    return;
  }
  const char *arch[] = {"sm_90", "sm_100"};
  for (int a = 0; a < 2; a++) {
    if (only_arch && strcmp(only_arch, arch[a])) continue;
    kl_binary b;
    int rc = compile(src, s->name, arch[a], &b, &e);
    CHECK(rc == 0, "%s %s: %s", s->name, arch[a], e.msg);
    if (rc) continue;
    char sym[160];
    CHECK(b.size > 1000 && !memcmp(b.data, "\177ELF", 4), "%s %s: not a cubin", s->name, arch[a]);
    snprintf(sym, sizeof sym, ".text.kl_%s_oneshot", s->name);
    CHECK(has(&b, sym), "%s %s: no %s", s->name, arch[a], sym);
    snprintf(sym, sizeof sym, ".text.kl_%s_relayout", s->name);
    CHECK(has(&b, sym), "%s %s: no %s", s->name, arch[a], sym);
    snprintf(sym, sizeof sym, ".text.kl_%s_argmax", s->name);
    CHECK(has(&b, sym), "%s %s: no %s", s->name, arch[a], sym);
    /* the kernels of a spec with topk: kl_topk's and kl_sample's */
    static const char *const topk_kinds[] = {"topk", "sample", "shards", "shards_lists",
                                             "candidates", "lists"};
    for (size_t i = 0; i < sizeof topk_kinds / sizeof *topk_kinds; i++) {
      snprintf(sym, sizeof sym, ".text.kl_%s_%s", s->name, topk_kinds[i]);
      CHECK(has(&b, sym) == (s->topk > 0), "%s %s: %s should %sbe there", s->name, arch[a], sym,
            s->topk ? "" : "not ");
    }
    CHECK(b.log == NULL || b.log[0] == 0, "%s %s: NVRTC warnings:\n%s", s->name, arch[a], b.log);
    printf("%s %s: %zu-byte cubin\n", s->name, arch[a], b.size);
    kl_binary_free(&b);
  }
  free(src);
}

static void compile_sample_kernels(const kl_spec *s) {
  kl_err e;
  char *src = spec_source_with(s, sample_test_kernels, &e);
  CHECK(src != NULL, "%s: %s", s->name, e.msg);
  if (!src) return;
  kl_binary b;
  const int rc = compile(src, s->name, only_arch ? only_arch : "sm_90", &b, &e);
  free(src);
  CHECK(rc == 0, "%s with gpu_sample's kernels: %s", s->name, e.msg);
  if (rc) return;
  CHECK(has(&b, ".text.row_decide") && has(&b, ".text.row_aux"), "%s: gpu_sample's kernels "
        "are not in the cubin", s->name);
  CHECK(b.log == NULL || b.log[0] == 0, "%s with gpu_sample's kernels: NVRTC warnings:\n%s",
        s->name, b.log);
  printf("%s %s with gpu_sample's kernels: %zu-byte cubin\n", s->name,
         only_arch ? only_arch : "sm_90", b.size);
  kl_binary_free(&b);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* a line per cubin as it is made: the progress */
  const char *only = NULL;
  int first = 1, compiled = 0;
  for (; first + 1 < argc && argv[first][0] == '-'; first += 2) {
    if (!strcmp(argv[first], "--only")) only = argv[first + 1];
    else if (!strcmp(argv[first], "--arch")) only_arch = argv[first + 1];
    else if (!strcmp(argv[first], "--cache")) cache = argv[first + 1];
    else break;
  }
  for (int i = first; i < argc; i++) {
    kl_spec_list l;
    kl_err e;
    int rc = kl_spec_load_file(argv[i], NULL, &l, &e);
    CHECK(rc == 0, "%s", e.msg);
    for (int k = 0; rc == 0 && k < l.n; k++) {
      if (only && strcmp(l.v[k].name, only)) continue;
      compile_spec(&l.v[k]);
      if (l.v[k].topk) compile_sample_kernels(&l.v[k]);
      compiled++;
    }
    kl_spec_list_free(&l);
  }
  CHECK(compiled > 0, "no spec compiled%s%s", only ? ": none is named " : "", only ? only : "");
  kl_err e;
  kl_binary b;
  CHECK(kl_nvrtc_compile("x", "n", "compute_90", &b, &e) == KL_EARG, "bad arch accepted");
  CHECK(kl_nvrtc_compile("int main( {", "n", "sm_90", &b, &e) == KL_ECOMPILE &&
            strstr(e.msg, "n.cu"), "syntax error: %s", e.msg);
  return check_done();
}
