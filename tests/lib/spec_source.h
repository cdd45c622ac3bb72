/* A spec's rendered source with a test's kernels after it: they call the
 * templates' functions (noise, keys, the sampler) exactly as that spec's own
 * kernels do, compiled in one unit with them. */
#ifndef KL_SPEC_SOURCE_H
#define KL_SPEC_SOURCE_H

#include "klgen.h"

/* The spec's source (kl_render of its layout) followed by tail, a printf
 * format whose one conversion, %s, is the spec's name (for `using namespace
 * kl_%s;`). Returns the whole source (free it), or NULL with err set. */
char *spec_source_with(const kl_spec *spec, const char *tail, kl_err *err);

#endif
