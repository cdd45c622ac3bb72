/* A spec's rendered source with a test's kernels after it (spec_source.h). */
#include "spec_source.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *spec_source_with(const kl_spec *spec, const char *tail, kl_err *err) {
  kl_layout l;
  char *src = NULL;
  if (kl_layout_derive(spec, &l, err) || kl_render(spec, &l, NULL, &src, err)) return NULL;
  const size_t head = strlen(src), n = head + strlen(tail) + strlen(spec->name) + 1;
  char *all = malloc(n);
  if (!all) {
    free(src);
    kl_fail(err, KL_ENOMEM, "out of memory");
    return NULL;
  }
  memcpy(all, src, head);
  snprintf(all + head, n - head, tail, spec->name);
  free(src);
  return all;
}
