/* The crossover: per-rank bytes per step above which the NCCL path is faster
 * than the one-shot kernel, so the dispatch sends larger steps there.
 *
 * In order: the caller's kl_config.crossover_bytes; $KLGEN_CROSSOVER_BYTES;
 * the table `klbench --tune` writes ($KLGEN_TUNE_FILE, else tune.txt in the JIT
 * cache directory), nearest shard size in it for this arch and group size;
 * the default for the architecture, from klbench (README). The table
 * decides which path a gather takes, so it is read only from a directory
 * trusted as the cache's is (jit.c), and only if root or this user wrote it. */
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt.h"

/* From klbench on sm_90 (docs/BENCHMARKS.md): the one-shot kernel is the
 * faster path at every size klbench compares, up to 16 MiB per rank; past
 * that, NCCL. */
static const struct {
  const char *arch;
  long long bytes;
} defaults[] = {{"sm_90", 16LL << 20}};
#define FALLBACK (4LL << 20)

#define TABLE_MAX (1 << 20)

/* One line into buf; a line longer than buf is read to its end and returned
 * as "" (no data line is that long; a long comment must not become data). */
static int next_line(FILE *f, char *buf, int n) {
  if (!fgets(buf, n, f)) return 0;
  size_t len = strlen(buf);
  if (len > 0 && buf[len - 1] != '\n' && !feof(f)) {
    int ch;
    while ((ch = fgetc(f)) != EOF && ch != '\n') {
    }
    buf[0] = 0;
  }
  return 1;
}

/* The table file `name` in the directory dfd: a regular file (a FIFO or
 * /dev/zero must not hang or flood creation), never through a link, of
 * root's or this user's and writable by no one else. NULL if not. */
static FILE *open_table(int dfd, const char *name) {
  int fd = kl_open_regular_at(dfd, name, 1);
  struct stat st;
  if (fd < 0) return NULL;
  FILE *f = NULL;
  if (fstat(fd, &st) == 0 && st.st_size <= TABLE_MAX && !(st.st_mode & 022) &&
      (st.st_uid == geteuid() || st.st_uid == 0))
    f = fdopen(fd, "r");
  if (!f) close(fd);
  return f;
}

static long long from_table(FILE *f, const char *arch, int nranks, long long shard) {
  char line[256], a[32];
  int n;
  long long s, x, best = 0;
  double dist = 1e300;
  while (next_line(f, line, sizeof line)) {
    if (line[0] == '#' || sscanf(line, "%31s %d %lld %lld", a, &n, &s, &x) != 4) continue;
    if (strcmp(a, arch) != 0 || n != nranks || s <= 0 || x <= 0) continue;
    double d = fabs(log((double)s / (double)shard));
    if (d < dist) dist = d, best = x;
  }
  return best;
}

/* The tuned crossover from $KLGEN_TUNE_FILE or cache_dir/tune.txt; 0 if
 * there is none that may be trusted. */
static long long tuned(const char *arch, int nranks, long long shard, const char *cache_dir) {
  char d[4200], b[4200], why[4400];
  const char *dir, *name, *tf = kl_param_str(KL_P_TUNE_FILE);
  if (tf && *tf) { /* dirname and basename may write to what they are given */
    snprintf(d, sizeof d, "%s", tf);
    snprintf(b, sizeof b, "%s", tf);
    dir = dirname(d), name = basename(b);
  } else if (cache_dir) {
    dir = cache_dir, name = "tune.txt";
  } else {
    return 0;
  }
  int dfd = kl_trusted_dir(dir, !(tf && *tf), why, sizeof why);
  if (dfd < 0) {
    if (kl_log_enabled()) kl_log("tune file not read: %s", why);
    return 0;
  }
  FILE *f = open_table(dfd, name);
  close(dfd);
  if (!f) return 0;
  long long best = from_table(f, arch, nranks, shard);
  fclose(f);
  return best;
}

long long kl_crossover(const char *arch, int nranks, long long shard_bytes, long long configured,
                       const char *cache_dir, const char **source) {
  int given;
  if (configured > 0) return *source = "kl_config", configured;
  long long v = kl_param_int(KL_P_CROSSOVER_BYTES, &given);
  if (given) return *source = "KLGEN_CROSSOVER_BYTES", v;
  long long t = tuned(arch, nranks, shard_bytes, cache_dir);
  if (t > 0) return *source = "tuned table", t;
  for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++)
    if (!strcmp(defaults[i].arch, arch)) return *source = "default for the arch", defaults[i].bytes;
  return *source = "fallback default", FALLBACK;
}
