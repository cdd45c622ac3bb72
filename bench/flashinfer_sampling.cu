// libkl_flashinfer (flashinfer_sampling.h): FlashInfer 0.7.2.post1's
// sampling and top-k kernels, from the wheel's headers, called as its Python
// API calls them, for klbench --grid and python -m klgen.bench --grid.
// What its Python does with torch ops (the temperature before it, the
// int32 -> int64 indices, the choice of top-k backend) is done here with a
// kernel or a rule of the same effect, each named where it is.
#define CUB_DISABLE_TOPK_UNSUPPORTED_ARCH_ASSERT  // as flashinfer/data/csrc/cub_topk.cu

#include <cuda/__execution/determinism.h>
#include <cuda/__execution/output_ordering.h>
#include <cuda/__execution/require.h>
#include <cuda/__execution/tie_break.h>
#include <cuda/std/__execution/env.h>

#include <cub/device/device_batched_topk.cuh>
#include <cub/version.cuh>
#include <cuda/argument>
#include <cuda/iterator>

#include <cuda_bf16.h>

#include <cstdarg>
#include <cstdio>
#include <flashinfer/sampling.cuh>
#include <flashinfer/topk.cuh>

#include "flashinfer_sampling.h"

using namespace flashinfer;

namespace {

thread_local char last_error[512];

int fail(cudaError_t e, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof last_error)
    snprintf(last_error + n, sizeof last_error - n, ": %s", cudaGetErrorString(e));
  return e == cudaSuccess ? (int)cudaErrorUnknown : (int)e;
}

#define FI(call, what)                                    \
  do {                                                    \
    cudaError_t e_ = (call);                              \
    if (e_ != cudaSuccess) return fail(e_, "%s", (what)); \
  } while (0)

constexpr int BF16 = 0, FP32 = 2;
constexpr size_t SOFTMAX_WORKSPACE = 1 << 20;  // flashinfer.sampling.softmax's
constexpr size_t ROW_STATES = 1 << 20;         // flashinfer.top_k's radix row states
constexpr int64_t CUB_MAX_LEN = int64_t{1} << 21;  // DeviceBatchedTopK's per-segment limit

}  // namespace

struct kl_fi {
  int device, dtype, sms, major;
  int max_rows, cols, max_k;
  float *y, *probs, *masked;  // [max_rows, cols] fp32
  bool *valid;
  int32_t *idx32;  // the radix kernels' indices
  void *softmax_ws;
  sampling::RadixRowState *topk_states, *mask_states;
  void *cub_ws;
  size_t cub_ws_bytes;
};

namespace {

// ---- the engine's steps around FlashInfer ----

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (sizeof(T) == 2) return __bfloat162float(v);
  else return v;
}

// y = float(x) / T[row] (divide) or float(x): the engine's fp32 logits with
// its temperature (vLLM: logits.float(), then div_ by the row's T; IEEE
// division, as torch's, though this file is built with -use_fast_math as
// FlashInfer's own JIT builds its kernels).
template <typename T>
__global__ void prepare_kernel(const T *__restrict__ x, const float *__restrict__ temperature,
                               float *__restrict__ y, uint32_t cols, bool divide) {
  constexpr uint32_t VEC = 16 / sizeof(T);
  const size_t row = blockIdx.y;
  const float d = divide ? temperature[row] : 1.f;
  const T *xr = x + row * cols;
  float *yr = y + row * cols;
  for (uint32_t c = (blockIdx.x * blockDim.x + threadIdx.x) * VEC; c < cols;
       c += gridDim.x * blockDim.x * VEC) {
    union {
      uint4 v;
      T e[VEC];
    } u;
    u.v = *reinterpret_cast<const uint4 *>(xr + c);
#pragma unroll
    for (uint32_t i = 0; i < VEC; i += 4) {
      float4 o;
      o.x = divide ? __fdiv_rn(to_float(u.e[i]), d) : to_float(u.e[i]);
      o.y = divide ? __fdiv_rn(to_float(u.e[i + 1]), d) : to_float(u.e[i + 1]);
      o.z = divide ? __fdiv_rn(to_float(u.e[i + 2]), d) : to_float(u.e[i + 2]);
      o.w = divide ? __fdiv_rn(to_float(u.e[i + 3]), d) : to_float(u.e[i + 3]);
      *reinterpret_cast<float4 *>(yr + c + i) = o;
    }
  }
}

int prepare(kl_fi *fi, const void *x, int rows, const float *temperature, bool divide,
            cudaStream_t s) {
  const uint32_t vec = fi->dtype == BF16 ? 8 : 4, per = 256 * vec;
  const dim3 grid((fi->cols + per - 1) / per, (unsigned)rows);
  if (fi->dtype == BF16)
    prepare_kernel<<<grid, 256, 0, s>>>(static_cast<const __nv_bfloat16 *>(x), temperature, fi->y,
                                        (uint32_t)fi->cols, divide);
  else
    prepare_kernel<<<grid, 256, 0, s>>>(static_cast<const float *>(x), temperature, fi->y,
                                        (uint32_t)fi->cols, divide);
  FI(cudaGetLastError(), "the temperature kernel");
  return 0;
}

// indices.long(): what flashinfer.top_k does with the radix kernels' int32.
__global__ void widen_kernel(const int32_t *in, int64_t *out, uint32_t n) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}

// ---- top-k: CUB's DeviceBatchedTopK, as flashinfer/data/csrc/cub_topk.cu
// runs it for flashinfer.top_k (full rows, unsorted, no tie-break) ----

struct CastToInt64 {
  __device__ int64_t operator()(int32_t i) const { return i; }
};

template <typename T, int64_t BOUND>
cudaError_t cub_top_k(const T *x, T *values, int64_t *indices, void *ws, size_t *ws_bytes,
                      int64_t rows, int64_t cols, int64_t k, cudaStream_t s) {
  namespace exec = cuda::execution;
  auto req = exec::require(exec::determinism::not_guaranteed, exec::tie_break::unspecified,
                           exec::output_ordering::unsorted);
  auto env = cuda::std::execution::env{req, cuda::stream_ref{s}};
  auto keys_in = cuda::make_strided_iterator(cuda::make_counting_iterator(x), cols);
  auto keys_out = cuda::make_strided_iterator(cuda::make_counting_iterator(values), k);
  auto values_in = cuda::make_constant_iterator(cuda::make_counting_iterator(int32_t{0}));
  auto flat = cuda::make_transform_output_iterator(indices, CastToInt64{});
  auto values_out = cuda::make_strided_iterator(cuda::make_counting_iterator(flat), k);
  auto k_arg = cuda::args::immediate{k, cuda::args::bounds<int64_t{1}, BOUND>()};
  auto segments = cuda::args::immediate{rows};
  auto sizes = cuda::args::immediate{cols, cuda::args::bounds<int64_t{1}, BOUND>()};
  return cub::DeviceBatchedTopK::MaxPairs(ws, *ws_bytes, keys_in, keys_out, values_in, values_out,
                                          sizes, k_arg, segments, env);
}

// ws NULL: *ws_bytes gets the workspace the call needs, nothing runs.
template <typename T>
cudaError_t cub_top_k_any(const T *x, T *values, int64_t *indices, void *ws, size_t *ws_bytes,
                          int64_t rows, int64_t cols, int64_t k, cudaStream_t s) {
  if (cols <= 8192)  // the single-block backend's bound, as cub_topk.cu's tiers
    return cub_top_k<T, int64_t{8192}>(x, values, indices, ws, ws_bytes, rows, cols, k, s);
  return cub_top_k<T, CUB_MAX_LEN>(x, values, indices, ws, ws_bytes, rows, cols, k, s);
}

// flashinfer.top_k's choice on a capturing stream (topk.py, can_use_cub_topk
// and is_cub_topk_beneficial, with sorted and deterministic off): CUB, but
// for 128 rows or more of over 8192 columns that are under 32768 (fp32) or
// 65536 (16-bit) wide, and where CUB cannot serve.
bool use_cub(const kl_fi *fi, int rows) {
  const int64_t d = fi->cols;
  const bool supported = d <= CUB_MAX_LEN && (d <= 8192 || fi->major >= 9);
  const bool better = rows < 128 || d <= 8192 || d >= (fi->dtype == FP32 ? 32768 : 65536);
  return supported && better;
}

template <typename T>
int top_k(kl_fi *fi, const T *x, int rows, int k, T *values, int64_t *indices, cudaStream_t s) {
  if (use_cub(fi, rows)) {
    size_t need = 0;
    FI((cub_top_k_any<T>(x, values, indices, nullptr, &need, rows, fi->cols, k, s)),
       "DeviceBatchedTopK's workspace size");
    if (need > fi->cub_ws_bytes)
      return fail(cudaErrorInvalidValue, "DeviceBatchedTopK wants %zu bytes of workspace, %zu made",
                  need, fi->cub_ws_bytes);
    size_t have = fi->cub_ws_bytes;
    FI((cub_top_k_any<T>(x, values, indices, fi->cub_ws, &have, rows, fi->cols, k, s)),
       "DeviceBatchedTopK::MaxPairs");
    return 0;
  }
  FI((sampling::TopKDispatch<T, int32_t>(const_cast<T *>(x), fi->idx32, values, (uint32_t)rows,
                                         (uint32_t)k, (uint32_t)fi->cols, fi->topk_states, false,
                                         false, sampling::TopKTieBreak::None, s, false)),
     "TopKDispatch (radix)");
  const uint32_t n = (uint32_t)rows * (uint32_t)k;
  widen_kernel<<<(n + 255) / 256, 256, 0, s>>>(fi->idx32, indices, n);
  FI(cudaGetLastError(), "the int64 indices");
  return 0;
}

int check_call(const kl_fi *fi, const void *x, int rows, const void *out) {
  if (!fi || !x || !out) return fail(cudaErrorInvalidValue, "a NULL handle or pointer");
  if (rows < 1 || rows > fi->max_rows)
    return fail(cudaErrorInvalidValue, "%d rows, made for 1..%d", rows, fi->max_rows);
  FI(cudaSetDevice(fi->device), "cudaSetDevice");
  return 0;
}

size_t cub_workspace(const kl_fi *fi, int64_t rows, int64_t k) {
  size_t need = 0;
  cudaError_t e =
      fi->dtype == BF16
          ? cub_top_k_any<__nv_bfloat16>(nullptr, nullptr, nullptr, nullptr, &need, rows, fi->cols,
                                         k, 0)
          : cub_top_k_any<float>(nullptr, nullptr, nullptr, nullptr, &need, rows, fi->cols, k, 0);
  return e == cudaSuccess ? need : 0;
}

}  // namespace

extern "C" {

int kl_fi_abi(void) { return KL_FI_ABI; }

const char *kl_fi_about(void) {
  static char about[160];
  snprintf(about, sizeof about, "FlashInfer 0.7.2.post1 headers, CUB %d.%d.%d, built for %s",
           CUB_VERSION / 100000, CUB_VERSION / 100 % 1000, CUB_VERSION % 100, KL_FI_ARCHS);
  return about;
}

const char *kl_fi_error(void) { return last_error; }

void kl_fi_destroy(kl_fi *fi) {
  if (!fi) return;
  cudaSetDevice(fi->device);
  void *all[] = {fi->y, fi->probs, fi->masked, fi->valid, fi->idx32, fi->softmax_ws,
                 fi->topk_states, fi->mask_states, fi->cub_ws};
  for (void *p : all) cudaFree(p);
  delete fi;
}

int kl_fi_create(kl_fi **out, int device, int dtype, int max_rows, int cols, int max_k) {
  if (!out) return fail(cudaErrorInvalidValue, "kl_fi_create: out is NULL");
  *out = nullptr;
  if ((dtype != BF16 && dtype != FP32) || max_rows < 1 || max_rows > 65535 || cols < 8 ||
      cols % 8 || cols > CUB_MAX_LEN || max_k < 1 || max_k > 1024)
    return fail(cudaErrorInvalidValue,
                "kl_fi_create: dtype %d (0 bf16, 2 fp32), %d rows (1..65535), %d columns "
                "(multiple of 8, up to 2^21), k %d (1..1024)",
                dtype, max_rows, cols, max_k);
  kl_fi *fi = new kl_fi();
  fi->device = device, fi->dtype = dtype, fi->max_rows = max_rows, fi->cols = cols;
  fi->max_k = max_k;
  const size_t n = (size_t)max_rows * (size_t)cols;
  int rc = 0;
#define MAKE(call, what)                                    \
  if (!rc) {                                                \
    cudaError_t e_ = (call);                                \
    if (e_ != cudaSuccess) rc = fail(e_, "kl_fi_create: %s", what); \
  }
  MAKE(cudaSetDevice(device), "cudaSetDevice");
  MAKE(cudaDeviceGetAttribute(&fi->sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  MAKE(cudaDeviceGetAttribute(&fi->major, cudaDevAttrComputeCapabilityMajor, device), "arch");
  MAKE(cudaMalloc(&fi->y, n * 4), "fp32 logits");
  MAKE(cudaMalloc(&fi->probs, n * 4), "probabilities");
  MAKE(cudaMalloc(&fi->masked, n * 4), "masked logits");
  MAKE(cudaMalloc(&fi->valid, (size_t)max_rows), "valid flags");
  MAKE(cudaMalloc(&fi->idx32, (size_t)max_rows * (size_t)max_k * 4), "int32 indices");
  MAKE(cudaMalloc(&fi->softmax_ws, SOFTMAX_WORKSPACE), "softmax workspace");
  MAKE(cudaMalloc(&fi->topk_states, ROW_STATES), "top-k row states");
  MAKE(cudaMalloc(&fi->mask_states, ROW_STATES), "mask row states");
  MAKE(cudaMemset(fi->topk_states, 0, ROW_STATES), "top-k row states");
  MAKE(cudaMemset(fi->mask_states, 0, ROW_STATES), "mask row states");
  if (!rc) {  // the most any call of up to max_rows rows and k <= max_k asks
    const int64_t ks[] = {1, 8, 64, max_k};
    for (int64_t k : ks)
      if (k <= max_k)
        for (int64_t r : {int64_t{1}, int64_t{127}, int64_t{128}, int64_t{max_rows}})
          if (r <= max_rows) {
            size_t need = cub_workspace(fi, r, k);
            if (need > fi->cub_ws_bytes) fi->cub_ws_bytes = need;
          }
    MAKE(cudaMalloc(&fi->cub_ws, fi->cub_ws_bytes ? fi->cub_ws_bytes : 16), "CUB workspace");
  }
  MAKE(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#undef MAKE
  if (rc) {
    kl_fi_destroy(fi);
    return rc;
  }
  *out = fi;
  return 0;
}

int kl_fi_top_k(kl_fi *fi, const void *x, int rows, int k, void *values, int64_t *indices,
                void *stream) {
  if (int rc = check_call(fi, x, rows, values)) return rc;
  if (!indices || k < 1 || k > fi->max_k || k > fi->cols)
    return fail(cudaErrorInvalidValue, "kl_fi_top_k: k %d (1..%d) or indices NULL", k, fi->max_k);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (fi->dtype == BF16)
    return top_k(fi, static_cast<const __nv_bfloat16 *>(x), rows, k,
                 static_cast<__nv_bfloat16 *>(values), indices, s);
  return top_k(fi, static_cast<const float *>(x), rows, k, static_cast<float *>(values), indices,
               s);
}

int kl_fi_plain(kl_fi *fi, const void *x, int rows, const float *temperature,
                const uint64_t *seed, const uint64_t *offset, int32_t *token, void *stream) {
  if (int rc = check_call(fi, x, rows, token)) return rc;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (int rc = prepare(fi, x, rows, temperature, true, s)) return rc;
  FI((sampling::SamplingFromLogits<float, int32_t>(
         fi->y, token, nullptr, (uint32_t)rows, (uint32_t)fi->cols, true,
         const_cast<uint64_t *>(seed), 0, const_cast<uint64_t *>(offset), 0, s, 1, 1)),
     "SamplingFromLogits");
  return 0;
}

int kl_fi_filtered(kl_fi *fi, const void *x, int rows, const float *temperature,
                   const int32_t *top_k, const float *top_p, const uint64_t *seed,
                   const uint64_t *offset, int32_t *token, void *stream) {
  if (int rc = check_call(fi, x, rows, token)) return rc;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (int rc = prepare(fi, x, rows, temperature, true, s)) return rc;
  FI((sampling::RadixTopKMaskLogitsMultiCTA<float, int32_t>(
         fi->y, fi->masked, const_cast<int32_t *>(top_k), (uint32_t)rows, 0, (uint32_t)fi->cols,
         fi->mask_states, s)),
     "RadixTopKMaskLogitsMultiCTA");
  FI((sampling::OnlineSoftmax<float>(fi->masked, fi->probs, (uint32_t)rows, (uint32_t)fi->cols,
                                     nullptr, 1.f, fi->softmax_ws, SOFTMAX_WORKSPACE,
                                     fi->major >= 9, s)),
     "OnlineSoftmax");
  FI((sampling::TopPSamplingFromProb<float, int32_t>(
         fi->probs, token, fi->valid, nullptr, const_cast<float *>(top_p), (uint32_t)rows, 1.f,
         (uint32_t)fi->cols, true, const_cast<uint64_t *>(seed), 0,
         const_cast<uint64_t *>(offset), 0, s, 1, 1)),
     "TopPSamplingFromProb");
  return 0;
}

int kl_fi_min_p(kl_fi *fi, const void *x, int rows, const float *temperature,
                const float *min_p, const uint64_t *seed, const uint64_t *offset,
                int32_t *token, void *stream) {
  if (int rc = check_call(fi, x, rows, token)) return rc;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const float *logits = static_cast<const float *>(x);
  if (fi->dtype == BF16) {  // its softmax takes fp32 (softmax(): logits.float())
    if (int rc = prepare(fi, x, rows, nullptr, false, s)) return rc;
    logits = fi->y;
  }
  FI((sampling::OnlineSoftmax<float>(const_cast<float *>(logits), fi->probs, (uint32_t)rows,
                                     (uint32_t)fi->cols, const_cast<float *>(temperature), 1.f,
                                     fi->softmax_ws, SOFTMAX_WORKSPACE, fi->major >= 9, s)),
     "OnlineSoftmax");
  FI((sampling::MinPSamplingFromProb<float, int32_t>(
         fi->probs, const_cast<float *>(min_p), token, fi->valid, nullptr, (uint32_t)rows, 0.f,
         (uint32_t)fi->cols, true, const_cast<uint64_t *>(seed), 0,
         const_cast<uint64_t *>(offset), 0, s, 1, 1)),
     "MinPSamplingFromProb");
  return 0;
}

}  // extern "C"
