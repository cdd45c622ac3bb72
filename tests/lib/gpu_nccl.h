/* The NCCL bootstrap of rank processes, for the tests that run real NCCL
 * (gpu_tp2, gpu_select --tp2). Apart from gpu_util: a test that links it
 * has libnccl in its process, which libklrt then uses before any library
 * KLGEN_NCCL_LIBRARY names, so the tests on the NCCL stand-in must not. */
#ifndef KL_GPU_NCCL_H
#define KL_GPU_NCCL_H

#include <nccl.h> /* klrt.h includes no NCCL header */

#include "gpu_util.h"

/* Rank `rank` of n processes (ranks_fork): GPU `rank`'s primary context made
 * current (NCCL's runtime uses the current context; *ctx gets it unless ctx
 * is NULL) and a communicator of the n, whose unique id rank 0 sends through
 * `pipe`. 0, or -1 if the id or the communicator could not be had. */
int gpu_nccl_rank(const kl_cu *cu, int rank, int n, const int pipe[2], CUcontext *ctx,
                  ncclComm_t *comm);

#endif
