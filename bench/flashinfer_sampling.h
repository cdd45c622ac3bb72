/* libkl_flashinfer: FlashInfer's sampling and top-k kernels, built from its
 * headers (bench/flashinfer.sh), as the comparators of klbench --grid and
 * python -m klgen.bench --grid (ctypes). C linkage, no CUDA header: klbench
 * dlopens it and calls through these prototypes.
 *
 * Each comparator is what an engine runs on the rows it would give
 * FlashInfer: the logits [rows, cols] (bf16 or fp32, row-major, 16-byte
 * aligned, cols a multiple of 8), per-row parameters in device memory, and
 * the stream; everything is enqueued on that stream (capturable in a CUDA
 * graph) and nothing is allocated after kl_fi_create. Every function returns
 * 0, or a cudaError_t value with kl_fi_error() saying what failed. */
#ifndef KL_FLASHINFER_SAMPLING_H
#define KL_FLASHINFER_SAMPLING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KL_FI_ABI 1

typedef struct kl_fi kl_fi;

/* KL_FI_ABI, as this library was built. */
int kl_fi_abi(void);
/* One line: the FlashInfer and CCCL versions and the architectures built. */
const char *kl_fi_about(void);
/* The last failure's message on this thread ("" if none). */
const char *kl_fi_error(void);

/* Scratch for calls of up to max_rows rows of cols columns (dtype: 0 bf16,
 * 2 fp32, as kl_dtype) and top-k's k up to max_k, on device (made current
 * in this library's CUDA runtime, as every call makes it). */
int kl_fi_create(kl_fi **fi, int device, int dtype, int max_rows, int cols, int max_k);
void kl_fi_destroy(kl_fi *fi);

/* flashinfer.top_k(x, k) as it runs inside a CUDA graph (topk.py: CUB's
 * DeviceBatchedTopK or the radix kernels by its rule for a capturing
 * stream; unsorted, not deterministic): values [rows, k] in x's dtype,
 * indices [rows, k] int64. k 1 is its argmax. */
int kl_fi_top_k(kl_fi *fi, const void *x, int rows, int k, void *values, int64_t *indices,
                void *stream);

/* Temperature as an engine applies it before FlashInfer: y = float(x) / T
 * (one kernel into fp32 scratch), then sampling_from_logits(y) (its
 * Gumbel-max), token int32. */
int kl_fi_plain(kl_fi *fi, const void *x, int rows, const float *temperature,
                const uint64_t *seed, const uint64_t *offset, int32_t *token, void *stream);

/* y = float(x) / T, then top_k_top_p_sampling_from_logits(y, top_k, top_p)
 * with per-row tensors, as vLLM calls it: its "top_k_first" order with
 * tensor top_k, which is top_k_mask_logits, a softmax (FlashInfer's
 * OnlineSoftmax here, torch.softmax in its Python), and
 * top_p_sampling_from_probs; deterministic. */
int kl_fi_filtered(kl_fi *fi, const void *x, int rows, const float *temperature,
                   const int32_t *top_k, const float *top_p, const uint64_t *seed,
                   const uint64_t *offset, int32_t *token, void *stream);

/* probs = softmax(x / T) (FlashInfer's OnlineSoftmax with the temperature
 * tensor; a bf16 x is first made fp32), then min_p_sampling_from_probs;
 * deterministic. */
int kl_fi_min_p(kl_fi *fi, const void *x, int rows, const float *temperature,
                const float *min_p, const uint64_t *seed, const uint64_t *offset,
                int32_t *token, void *stream);

#ifdef __cplusplus
}
#endif

#endif
