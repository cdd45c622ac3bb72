/* Test-only hooks of libklrt: compiled into the tests' copy of the library
 * (klrt_testing, KL_TESTING) and never into the installed one. */
#ifndef KLRT_TESTING_H
#define KLRT_TESTING_H

#include <stdint.h>

#include "klrt/klrt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Moves the context's step counters (the one-shot kernel's and the select
 * kernels', each on its own) to the largest value <= near that keeps its
 * residue modulo 6, so the three buffers (and kl_sample's two staged rows)
 * keep their roles: tests start them
 * just below the point where they wrap. Waits for the context's work; call it
 * on every rank between the same two steps. *gather_step and *select_step
 * (NULL: not written) get the values set. */
kl_result kl_testing_set_steps(kl_ctx *ctx, uint32_t near, uint32_t *gather_step,
                               uint32_t *select_step);

/* Where this rank's staged-row marks are (kl_sample with filters): *marks,
 * device memory of the context's device that its peers read, *bytes both
 * buffers together (0: the spec has none), *sentinel the word they hold
 * until a step marks them, and *per_token the marks a token has (its parts:
 * a step of n tokens writes n x *per_token). A test that fills them with the
 * sentinel while a step is in flight makes the step's rows sampled whole
 * wait for marks that never come: the marks' time-out. */
kl_result kl_testing_marks(kl_ctx *ctx, void **marks, size_t *bytes, uint32_t *sentinel,
                           int *per_token);

#ifdef __cplusplus
}
#endif
#endif
