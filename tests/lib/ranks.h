/* The ranks of a test: threads of one process (a kl_group's ranks) or
 * forked processes (a GPU each, NCCL between them); what a rank thread
 * reports; the kl_config a rank's context is made with. Nothing here needs a
 * GPU: test_host runs its ranks on a fake driver through it. */
#ifndef KL_TEST_RANKS_H
#define KL_TEST_RANKS_H

#include <pthread.h>
#include <stddef.h>

#include "klrt/klrt.h"

/* n threads, thread i running fn((char *)args + i * stride), and two
 * barriers: of the n threads, and of them with the thread that started them
 * (a thread that plans each step while the ranks run it). */
typedef struct rank_threads {
  int n;
  pthread_t *th;
  pthread_barrier_t ranks, all;
} rank_threads;

/* Starts the threads; exits the process if it cannot (the test cannot run). */
void ranks_start(rank_threads *t, int n, void *(*fn)(void *), void *args, size_t stride);
/* Waits for every thread to return; the barriers go with them. */
void ranks_join(rank_threads *t);
/* ranks_start, then ranks_join. */
void ranks_run(int n, void *(*fn)(void *), void *args, size_t stride);
/* The n rank threads meet (called by each of them). */
void ranks_sync(rank_threads *t);
/* The n rank threads and the starting thread meet. */
void ranks_sync_all(rank_threads *t);

/* n forked processes: process `rank` runs fn(rank, pipe, arg) and exits with
 * what it returns; `pipe`, shared by all, is their bootstrap channel (rank 0
 * sends the NCCL id). stdout is flushed before each fork and a process's
 * stdout and stderr before its exit. Returns how many did not exit with 0,
 * or -1 if it could not start (nothing forked). */
int ranks_fork(int n, int (*fn)(int rank, const int pipe[2], void *arg), void *arg);

/* What a rank thread reports once joined: whether it failed, and its last
 * failure as "rank R: what: detail". */
typedef struct rank_status {
  int rank, failed;
  char msg[512];
} rank_status;
/* Records a failure of the rank; returns -1. */
int rank_fail(rank_status *s, const char *what, const char *detail);
/* Prints "FAIL <msg>" on stderr if the rank failed; whether it did. */
int rank_failed(const rank_status *s);
/* Creation's result `made`: 0 for a context ready for the one-shot path,
 * else -1 with the rank failed ("create" and libklrt's last error, or
 * "one-shot not ready" and why). */
int rank_created(rank_status *s, kl_result made, kl_ctx *ctx);

/* A libklrt call's result on a rank thread, and its message: libklrt's
 * last error is the calling thread's, so it is read there. */
typedef struct rank_result {
  kl_result rc;
  char err[512];
} rank_result;
/* Records rc with libklrt's last error if it failed, else with `ok`;
 * returns rc. */
kl_result rank_result_set(rank_result *r, kl_result rc, const char *ok);

/* The kl_config of rank `rank` of n on CUDA device `device`, in `group`
 * (NULL: none); every other field as KL_CONFIG_INIT leaves it. */
kl_config rank_config(int rank, int n, int device, kl_group *group);

#endif
