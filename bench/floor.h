/* The kernel boundary: empty kernels chained in a CUDA graph, the launch
 * floor of a step. klfloor times it alone; klbench --grid takes it as the
 * floor of every kernel's roofline. One kernel source and one launch for
 * both, so the two tools measure the same thing. */
#ifndef KL_BENCH_FLOOR_H
#define KL_BENCH_FLOOR_H

#include <cuda.h>

/* kl_floor_empty(): a PDL wait, then the trigger, as the gather does;
 * kl_floor_store(uint4 *dst): the same, then one 16-byte store a thread.
 * NVRTC source, no headers. */
extern const char floor_boundary_src[];

/* Launches f (one of the above; args NULL for kl_floor_empty) on s, ctas x
 * threads, with programmatic dependent launch when pdl. */
CUresult floor_launch(CUfunction f, void **args, CUstream s, int ctas, int threads, int pdl);

#endif
