/* The NCCL bootstrap of rank processes (gpu_nccl.h). */
#include "gpu_nccl.h"

#include <unistd.h>

int gpu_nccl_rank(const kl_cu *cu, int rank, int n, const int pipe[2], CUcontext *ctx,
                  ncclComm_t *comm) {
  ncclUniqueId id;
  if (rank == 0) {
    ncclGetUniqueId(&id);
    for (int i = 1; i < n; i++)
      if (write(pipe[1], &id, sizeof id) != (ssize_t)sizeof id) return -1;
  } else if (read(pipe[0], &id, sizeof id) != (ssize_t)sizeof id) {
    return -1;
  }
  CUcontext cuctx = gpu_primary(cu, rank, 1);
  if (ctx) *ctx = cuctx;
  return ncclCommInitRank(comm, n, id, rank) == ncclSuccess ? 0 : -1;
}
