/* The CUDA driver, loaded with dlopen (docs/design/build.md): the build machine and CI have
 * no libcuda, and a binary linked to the stub would not start there. cuda.h is
 * used for types only. */
#ifndef KL_CU_H
#define KL_CU_H

#include <cuda.h>

#define KL_CU_FUNCS(X)                                                                 \
  X(cuInit) X(cuGetErrorString) X(cuGetErrorName)                                     \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceGetUuid)        \
  X(cuDeviceCanAccessPeer) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)    \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent)         \
  X(cuCtxGetDevice) X(cuCtxEnablePeerAccess) X(cuCtxSynchronize)                       \
  X(cuMemAlloc) X(cuMemFree) X(cuMemsetD32) X(cuMemsetD32Async) X(cuMemsetD8Async)     \
  X(cuMemcpyHtoD)                                                                      \
  X(cuMemcpyDtoH) X(cuMemcpyAsync) X(cuMemcpyHtoDAsync) X(cuMemcpyDtoHAsync)            \
  X(cuMemcpy2DAsync) X(cuMemAllocHost) X(cuMemFreeHost)                                \
  X(cuPointerGetAttributes)                                                            \
  X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)                    \
  X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)        \
  X(cuLaunchKernelEx) X(cuOccupancyMaxActiveBlocksPerMultiprocessor)                    \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize) X(cuStreamWaitEvent)     \
  X(cuEventCreate) X(cuEventRecord) X(cuEventDestroy)                                 \
  X(cuStreamIsCapturing) X(cuStreamBeginCapture) X(cuStreamEndCapture)                  \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphDestroy) X(cuGraphExecDestroy)

/* Newer than the oldest driver the runtime runs on: NULL where the driver lacks them. */
#define KL_CU_OPTIONAL(X) X(cuFuncLoad) X(cuEventElapsedTime)

#define KL_CU_MEMBER(name) __typeof__(&name) name;
typedef struct kl_cu {
  KL_CU_FUNCS(KL_CU_MEMBER)
  KL_CU_OPTIONAL(KL_CU_MEMBER)
} kl_cu;
#undef KL_CU_MEMBER

/* Loads libcuda once per process and calls cuInit(0). Returns the table, or
 * NULL with a message in *why (static storage) when no driver or GPU is usable. */
const kl_cu *kl_cu_get(const char **why);

/* "CUDA_ERROR_X: description" for r. */
const char *kl_cu_errstr(CUresult r);

#ifdef KL_TESTING
/* klrt_testing only: the driver a test gave (kl_testing_fakes), or NULL. */
extern const kl_cu *kl_testing_cu;
#endif

#endif
