/* NVRTC, loaded at run time (gen/dynlib.h): inside a PyTorch process the copy
 * torch or the nvidia-cuda-nvrtc wheel brought, elsewhere the toolkit's.
 * nvrtc.h is used for types only. */
#ifndef KL_NVRTC_API_H
#define KL_NVRTC_API_H

#include <nvrtc.h>

#define KL_NVRTC_FUNCS(X)                                                        \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram)                   \
  X(nvrtcCompileProgram) X(nvrtcDestroyProgram) X(nvrtcGetProgramLogSize)        \
  X(nvrtcGetProgramLog) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)

#define KL_NVRTC_MEMBER(name) __typeof__(&name) name;
typedef struct kl_nvrtc_api {
  KL_NVRTC_FUNCS(KL_NVRTC_MEMBER)
} kl_nvrtc_api;
#undef KL_NVRTC_MEMBER

/* The table, loaded on first use (thread-safe); NULL with a message in why
 * (what was searched) when no NVRTC can be had. */
const kl_nvrtc_api *kl_nvrtc_api_get(char *why, size_t n);

#endif
