/* NCCL, loaded at run time like the driver (gen/dynlib.h): libklrt only calls
 * it on a communicator the host made, so it must use the host's NCCL (in a
 * PyTorch process, torch's), never a second copy. nccl.h is for types only. */
#ifndef KL_NCCL_API_H
#define KL_NCCL_API_H

#include <nccl.h>

#define KL_NCCL_FUNCS(X) X(ncclAllGather) X(ncclCommCount) X(ncclCommUserRank) X(ncclGetErrorString)

#define KL_NCCL_MEMBER(name) __typeof__(&name) name;
typedef struct kl_nccl_api {
  KL_NCCL_FUNCS(KL_NCCL_MEMBER)
} kl_nccl_api;
#undef KL_NCCL_MEMBER

/* The table (thread-safe, loaded once): the NCCL already in the process,
 * else hint (a path; NULL: none), else libnccl.so.2 through the system's
 * search, else the one this was built with. NULL with what was searched in
 * why when there is none. */
const kl_nccl_api *kl_nccl_api_get(const char *hint, char *why, size_t n);

#ifdef KL_TESTING
/* klrt_testing only: the NCCL a test gave (kl_testing_fakes), or NULL. */
extern const kl_nccl_api *kl_testing_nccl;
#endif

#endif
