/* Rank threads and processes of a test (see ranks.h). */
#include "ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

void ranks_start(rank_threads *t, int n, void *(*fn)(void *), void *args, size_t stride) {
  t->n = n;
  t->th = calloc((size_t)n, sizeof *t->th);
  if (!t->th) {
    fprintf(stderr, "ranks_start: out of memory\n");
    exit(1);
  }
  /* both barriers exist before any thread may reach one */
  pthread_barrier_init(&t->ranks, NULL, (unsigned)n);
  pthread_barrier_init(&t->all, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; i++)
    if (pthread_create(&t->th[i], NULL, fn, (char *)args + (size_t)i * stride) != 0) {
      fprintf(stderr, "ranks_start: no thread for rank %d\n", i);
      exit(1);
    }
}

void ranks_join(rank_threads *t) {
  for (int i = 0; i < t->n; i++) pthread_join(t->th[i], NULL);
  pthread_barrier_destroy(&t->ranks);
  pthread_barrier_destroy(&t->all);
  free(t->th);
  t->th = NULL;
}

void ranks_run(int n, void *(*fn)(void *), void *args, size_t stride) {
  rank_threads t;
  ranks_start(&t, n, fn, args, stride);
  ranks_join(&t);
}

void ranks_sync(rank_threads *t) { pthread_barrier_wait(&t->ranks); }

void ranks_sync_all(rank_threads *t) { pthread_barrier_wait(&t->all); }

int ranks_fork(int n, int (*fn)(int rank, const int pipe[2], void *arg), void *arg) {
  int fd[2], fails = 0;
  pid_t *pid = calloc((size_t)n, sizeof *pid);
  if (!pid || pipe(fd) != 0) return free(pid), -1;
  for (int r = 0; r < n; r++) {
    fflush(stdout);
    if ((pid[r] = fork()) == 0) {
      int rc = fn(r, fd, arg);
      fflush(stdout);
      fflush(stderr);
      _exit(rc);
    }
  }
  for (int r = 0; r < n; r++) {
    int st = 0;
    if (pid[r] < 0 || waitpid(pid[r], &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
      fails++;
  }
  close(fd[0]), close(fd[1]);
  free(pid);
  return fails;
}

int rank_fail(rank_status *s, const char *what, const char *detail) {
  snprintf(s->msg, sizeof s->msg, "rank %d: %s: %s", s->rank, what, detail);
  s->failed = 1;
  return -1;
}

int rank_failed(const rank_status *s) {
  if (s->failed) fprintf(stderr, "FAIL %s\n", s->msg);
  return s->failed;
}

int rank_created(rank_status *s, kl_result made, kl_ctx *ctx) {
  if (made != KLRT_OK) return rank_fail(s, "create", kl_last_error());
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(ctx, &st);
  return st.oneshot_ready ? 0 : rank_fail(s, "one-shot not ready", st.not_ready);
}

kl_result rank_result_set(rank_result *r, kl_result rc, const char *ok) {
  r->rc = rc;
  snprintf(r->err, sizeof r->err, "%s", rc != KLRT_OK ? kl_last_error() : ok);
  return rc;
}

kl_config rank_config(int rank, int n, int device, kl_group *group) {
  kl_config cfg = KL_CONFIG_INIT;
  cfg.rank = rank, cfg.nranks = n, cfg.device = device, cfg.group = group;
  return cfg;
}
