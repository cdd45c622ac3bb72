/* The JIT cache: miss, hit (no NVRTC), corrupt entries rebuilt, unwritable
 * directory = no cache, concurrent processes, and the directory's resolution. */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "rt.h"

static const char *src_a = "extern \"C\" __global__ void k(int *p) { *p = 1; }\n";
static const char *src_b = "extern \"C\" __global__ void k(int *p) { *p = 2; }\n";

/* The only entry in dir (path into buf); -1 unless exactly one, no temp files. */
static int only_entry(const char *dir, char *buf, size_t n) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int count = 0, temps = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (e->d_name[0] != '.') count++, snprintf(buf, n, "%s/%s", dir, e->d_name);
    else if (strncmp(e->d_name, ".tmp", 4) == 0) temps++;
  closedir(d);
  return count == 1 && temps == 0 ? 0 : -1;
}

static int jit(const char *src, const char *arch, const char *dir, kl_binary *b, int *hit) {
  kl_err e;
  int rc = kl_jit_cubin(src, "k", arch, dir, b, hit, &e);
  if (rc) fprintf(stderr, "jit: %s\n", e.msg);
  return rc;
}

static void hit_miss_corrupt(const char *root) {
  char dir[512], entry[1024];
  snprintf(dir, sizeof dir, "%s/c1/nested", root); /* created on demand */
  kl_binary b1, b2;
  int hit = -1;
  unsigned long before = kl_nvrtc_compiles();
  CHECK(jit(src_a, "sm_90", dir, &b1, &hit) == 0 && hit == 0, "first call is a miss");
  CHECK(kl_nvrtc_compiles() == before + 1, "a miss compiles");
  CHECK(only_entry(dir, entry, sizeof entry) == 0, "one entry, no temp files");
  CHECK(jit(src_a, "sm_90", dir, &b2, &hit) == 0 && hit == 1, "second call is a hit");
  CHECK(kl_nvrtc_compiles() == before + 1, "a hit skips NVRTC");
  CHECK(b1.size == b2.size && !memcmp(b1.data, b2.data, b1.size), "hit returns the same cubin");
  kl_binary_free(&b2);
  /* Different source or arch: different entries. */
  CHECK(jit(src_b, "sm_90", dir, &b2, &hit) == 0 && hit == 0, "other source misses");
  kl_binary_free(&b2);
  CHECK(jit(src_a, "sm_100", dir, &b2, &hit) == 0 && hit == 0, "other arch misses");
  kl_binary_free(&b2);
  /* Corruption: a flipped byte, a truncated file, garbage. Each is rebuilt. */
  struct stat st;
  stat(entry, &st);
  const char *how[] = {"flip", "truncate", "garbage"};
  for (int k = 0; k < 3; k++) {
    if (k == 0) {
      FILE *f = fopen(entry, "r+b");
      fseek(f, st.st_size - 10, SEEK_SET);
      int byte = fgetc(f);
      fseek(f, st.st_size - 10, SEEK_SET);
      fputc(byte ^ 0x01, f);
      fclose(f);
    } else if (k == 1 && truncate(entry, st.st_size / 2) != 0) {
      perror("truncate");
    } else if (k == 2) {
      FILE *f = fopen(entry, "wb");
      fputs("not a cubin", f);
      fclose(f);
    }
    CHECK(jit(src_a, "sm_90", dir, &b2, &hit) == 0 && hit == 0, "%s: entry not rebuilt", how[k]);
    CHECK(b2.size == b1.size && !memcmp(b2.data, b1.data, b1.size), "%s: wrong cubin", how[k]);
    kl_binary_free(&b2);
    CHECK(jit(src_a, "sm_90", dir, &b2, &hit) == 0 && hit == 1, "%s: rebuilt entry not used",
          how[k]);
    kl_binary_free(&b2);
  }
  kl_binary_free(&b1);
}

static void unwritable(void) {
  kl_binary b;
  int hit = -1;
  CHECK(jit(src_a, "sm_90", "/dev/null/klgen", &b, &hit) == 0 && hit == 0, "no cache: compiles");
  kl_binary_free(&b);
  CHECK(jit(src_a, "sm_90", NULL, &b, &hit) == 0 && hit == 0, "NULL dir: compiles");
  kl_binary_free(&b);
}

/* Eight processes compile the same kernel into one empty directory at once. */
static void concurrent(const char *root) {
  char dir[512], entry[1024];
  snprintf(dir, sizeof dir, "%s/c2", root);
  pid_t pid[8];
  for (int i = 0; i < 8; i++)
    if ((pid[i] = fork()) == 0) {
      kl_binary b;
      int hit;
      _exit(jit(src_b, "sm_90", dir, &b, &hit) == 0 && b.size > 0 ? 0 : 1);
    }
  int bad = 0;
  for (int i = 0; i < 8; i++) {
    int st;
    waitpid(pid[i], &st, 0);
    bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  CHECK(bad == 0, "%d concurrent compilers failed", bad);
  CHECK(only_entry(dir, entry, sizeof entry) == 0, "concurrent: not exactly one entry");
  kl_binary b;
  int hit = 0;
  CHECK(jit(src_b, "sm_90", dir, &b, &hit) == 0 && hit == 1, "concurrent: entry is valid");
  kl_binary_free(&b);
}

static void resolution(void) {
  char buf[512];
  setenv("KLGEN_CACHE_DIR", "/a", 1);
  setenv("XDG_CACHE_HOME", "/x", 1);
  setenv("HOME", "/h", 1);
  CHECK(kl_cache_dir("/cfg", buf, sizeof buf) && !strcmp(buf, "/cfg"), "configured first");
  CHECK(kl_cache_dir(NULL, buf, sizeof buf) && !strcmp(buf, "/a"), "then KLGEN_CACHE_DIR");
  unsetenv("KLGEN_CACHE_DIR");
  CHECK(kl_cache_dir(NULL, buf, sizeof buf) && !strcmp(buf, "/x/klgen"), "then XDG_CACHE_HOME");
  unsetenv("XDG_CACHE_HOME");
  CHECK(kl_cache_dir(NULL, buf, sizeof buf) && !strcmp(buf, "/h/.cache/klgen"), "then HOME");
  unsetenv("HOME");
  CHECK(kl_cache_dir(NULL, buf, sizeof buf) == 0, "nothing: no cache");
}

int main(void) {
  char root[] = "/tmp/klgen-cache-test.XXXXXX";
  if (!mkdtemp(root)) return 1;
  hit_miss_corrupt(root);
  unwritable();
  concurrent(root);
  resolution();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  return check_done();
}
