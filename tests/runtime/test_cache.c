/* The JIT cache: miss, hit (no NVRTC), corrupt and forged entries rebuilt,
 * unwritable or untrusted directory = no cache, entries that are not regular
 * files, concurrent processes, the directory's resolution, and the tune file. */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
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

static int hit_of(const char *src, const char *dir) {
  kl_binary b;
  int hit = -1;
  if (jit(src, "sm_90", dir, &b, &hit) != 0) return -1;
  kl_binary_free(&b);
  return hit;
}

/* An entry whose checksum was recomputed over a payload that is no cubin: the
 * header alone must not make it trusted. */
static void forged(const char *entry, const kl_binary *good) {
  FILE *f = fopen(entry, "r+b");
  unsigned char head[56];
  CHECK(f && fread(head, 1, 56, f) == 56, "read header");
  if (!f) return;
  /* header (56 bytes): magic 8, version 4, reserved 4, key 16, size 8, checksum 16 */
  uint64_t size;
  memcpy(&size, head + 32, 8);
  unsigned char *payload = malloc(size);
  memset(payload, 0x90, size);
  uint64_t c[2];
  kl_cache_checksum(payload, size, c); /* as a forger would: recomputed */
  fseek(f, 40, SEEK_SET);
  fwrite(c, 8, 2, f);
  fseek(f, 56, SEEK_SET);
  fwrite(payload, 1, size, f);
  fclose(f);
  free(payload);
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", entry);
  *strrchr(dir, '/') = 0;
  CHECK(hit_of(src_a, dir) == 0, "forged payload: not rebuilt");
  kl_binary b;
  int hit;
  CHECK(jit(src_a, "sm_90", dir, &b, &hit) == 0 && hit == 1 && b.size == good->size &&
            !memcmp(b.data, good->data, b.size), "forged payload: rebuilt entry wrong");
  kl_binary_free(&b);
}

/* Bytes this process has read (read(2) and kin), from /proc/self/io. */
static long long bytes_read(void) {
  FILE *f = fopen("/proc/self/io", "r");
  long long n = -1;
  char line[128];
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "rchar: %lld", &n) == 1) break;
  if (f) fclose(f);
  return n;
}

/* An entry's size is checked before it is read: a file far larger than a
 * cubin, with a valid header, costs no read of its payload. */
static void oversized(const char *entry, const kl_binary *good) {
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", entry);
  *strrchr(dir, '/') = 0;
  FILE *f = fopen(entry, "r+b");
  unsigned char head[56];
  CHECK(f && fread(head, 1, 56, f) == 56, "read header");
  if (!f) return;
  uint64_t size = (64u << 20) - 56; /* the whole file 64 MiB */
  memcpy(head + 32, &size, 8);
  fseek(f, 0, SEEK_SET);
  fwrite(head, 1, 56, f);
  fclose(f);
  CHECK(truncate(entry, 64 << 20) == 0, "truncate to 64 MiB");
  long long before = bytes_read();
  CHECK(hit_of(src_a, dir) == 0, "a 64 MiB entry: not rebuilt");
  long long read = bytes_read() - before;
  CHECK(before >= 0 && read < (1 << 20), "a 64 MiB entry: %lld bytes read", read);
  kl_binary b;
  int hit;
  CHECK(jit(src_a, "sm_90", dir, &b, &hit) == 0 && hit == 1 && b.size == good->size &&
            !memcmp(b.data, good->data, b.size), "oversized: rebuilt entry wrong");
  kl_binary_free(&b);
}

/* A FIFO, a link, a directory where the entry belongs: never followed, never
 * waited on; compiled instead. */
static void not_regular(const char *entry, const kl_binary *good) {
  char dir[1024], elsewhere[1100];
  snprintf(dir, sizeof dir, "%s", entry);
  *strrchr(dir, '/') = 0;
  snprintf(elsewhere, sizeof elsewhere, "%s.copy", dir);
  rename(entry, elsewhere);
  CHECK(symlink(elsewhere, entry) == 0, "symlink");
  CHECK(hit_of(src_a, dir) == 0, "a link to a valid entry was followed");
  unlink(entry);
  unlink(elsewhere);
  CHECK(mkfifo(entry, 0600) == 0, "mkfifo");
  time_t t0 = time(NULL);
  CHECK(hit_of(src_a, dir) == 0, "FIFO entry: not compiled");
  CHECK(time(NULL) - t0 < 20, "FIFO entry: waited");
  struct stat st;
  CHECK(lstat(entry, &st) == 0 && S_ISREG(st.st_mode), "FIFO not replaced by an entry");
  (void)good;
}

/* Directories the cache must not trust: writable by others, or someone
 * else's. Used, they would let another user choose the code we load. */
static void untrusted(const char *root) {
  char dir[512], why[600];
  snprintf(dir, sizeof dir, "%s/shared", root);
  mkdir(dir, 0700);
  chmod(dir, 0777);
  CHECK(hit_of(src_a, dir) == 0 && hit_of(src_a, dir) == 0, "world-writable dir used as a cache");
  CHECK(kl_cache_open(dir, why, sizeof why) < 0 && strstr(why, "writable by others"), "%s", why);
  chmod(dir, 01777); /* sticky: still others could add entries */
  CHECK(kl_cache_open(dir, why, sizeof why) < 0 && strstr(why, "writable by others"), "%s", why);
  chmod(dir, 0700);
  int fd = kl_cache_open(dir, why, sizeof why);
  CHECK(fd >= 0, "own 0700 dir refused: %s", why);
  if (fd >= 0) close(fd);
  if (geteuid() == 0 && chown(dir, 65534, 65534) == 0) {
    CHECK(hit_of(src_a, dir) == 0 && hit_of(src_a, dir) == 0, "another user's dir used");
    CHECK(kl_cache_open(dir, why, sizeof why) < 0 && strstr(why, "belongs to uid 65534"), "%s",
          why);
  }
}

/* The path to the cache: a directory above it that another user can write
 * could swap what follows it (ssh's StrictModes), sticky /tmp aside; a link
 * on the path is followed only where a trusted directory holds it. */
static void ancestors(const char *root, const char *good_dir) {
  char open_dir[512], dir[600], why[800], link[600];
  snprintf(open_dir, sizeof open_dir, "%s/open", root);
  mkdir(open_dir, 0777);
  chmod(open_dir, 0777);
  snprintf(dir, sizeof dir, "%s/cache", open_dir);
  CHECK(hit_of(src_a, dir) == 0 && hit_of(src_a, dir) == 0, "cache under a 0777 parent used");
  CHECK(kl_cache_open(dir, why, sizeof why) < 0 && strstr(why, "/open is writable by others"),
        "%s", why);
  /* a link to a trusted cache, from a directory anyone could change it in */
  snprintf(link, sizeof link, "%s/to-good", open_dir);
  CHECK(symlink(good_dir, link) == 0, "symlink");
  CHECK(kl_cache_open(link, why, sizeof why) >= 0, "the link's target is trusted: %s", why);
  chmod(open_dir, 01777); /* sticky, like /tmp */
  int fd = kl_cache_open(dir, why, sizeof why);
  CHECK(fd >= 0, "cache under a sticky parent refused: %s", why);
  if (fd >= 0) close(fd);
  /* a link held by a trusted directory is the owner's choice: followed */
  snprintf(link, sizeof link, "%s/alias", root);
  CHECK(symlink(good_dir, link) == 0, "symlink");
  CHECK(hit_of(src_a, link) == 1, "a trusted link to a trusted cache not used");
  if (geteuid() == 0) {
    snprintf(dir, sizeof dir, "%s/theirs", root);
    mkdir(dir, 0755);
    CHECK(chown(dir, 65534, 65534) == 0, "chown");
    snprintf(dir, sizeof dir, "%s/theirs/cache", root);
    mkdir(dir, 0700);
    CHECK(kl_cache_open(dir, why, sizeof why) < 0 && strstr(why, "/theirs belongs to uid 65534"),
          "%s", why);
  }
}

/* A link on the path swapped, as fast as a process can, between a trusted
 * cache and another directory holding a forged entry (a valid cubin of other
 * code, checksum and all): the directory checked is the one read, so the
 * forged cubin never comes back. */
static void swapped_link(const char *root, const char *good_entry, const kl_binary *good) {
  char evil[512], link[512], tmp[512], entry[1024], good_dir[1024];
  snprintf(good_dir, sizeof good_dir, "%s", good_entry);
  *strrchr(good_dir, '/') = 0;
  snprintf(evil, sizeof evil, "%s/evil", root);
  mkdir(evil, 0777);
  chmod(evil, 0777);
  snprintf(entry, sizeof entry, "%s%s", evil, strrchr(good_entry, '/'));
  FILE *in = fopen(good_entry, "rb"), *out = fopen(entry, "wb");
  unsigned char *e = malloc(56 + good->size);
  CHECK(in && out && e && fread(e, 1, 56 + good->size, in) == 56 + good->size, "copy entry");
  if (!in || !out || !e) return;
  e[56 + good->size - 1] ^= 0x5a; /* other code, then a checksum to match */
  uint64_t c[2];
  kl_cache_checksum(e + 56, good->size, c);
  memcpy(e + 40, c, 16);
  fwrite(e, 1, 56 + good->size, out);
  fclose(in);
  fclose(out);
  chmod(entry, 0644);
  snprintf(link, sizeof link, "%s/swap", root);
  snprintf(tmp, sizeof tmp, "%s/swap.tmp", root);
  symlink(good_dir, link);
  pid_t pid = fork();
  if (pid == 0) {
    for (unsigned i = 0;; i++) { /* rename: the link is always there, one or the other */
      unlink(tmp);
      if (symlink(i & 1 ? evil : good_dir, tmp) == 0) rename(tmp, link);
    }
  }
  int forged = 0, hits = 0;
  for (int i = 0; i < 40; i++) {
    kl_binary b;
    int hit = 0;
    if (jit(src_a, "sm_90", link, &b, &hit) != 0) continue;
    hits += hit;
    forged += b.size != good->size || memcmp(b.data, good->data, b.size) != 0;
    kl_binary_free(&b);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  CHECK(forged == 0, "a forged cubin came back %d times in 40 (%d hits)", forged, hits);
  free(e);
}

static long long crossover_from(const char *tune_file, const char *cache_dir, const char **src) {
  if (tune_file) setenv("KLGEN_TUNE_FILE", tune_file, 1);
  else unsetenv("KLGEN_TUNE_FILE");
  return kl_crossover("sm_80", 2, 4096, 0, cache_dir, src);
}

static void write_table(const char *path, long long x, int mode) {
  FILE *f = fopen(path, "w");
  fprintf(f, "sm_80 2 4096 %lld\n", x);
  fclose(f);
  chmod(path, (mode_t)mode);
}

/* The tune file: a link to /dev/zero, a FIFO, a comment longer than a line
 * buffer that holds data-looking text; none may hang or be read as data.
 * It decides which path a gather takes, so it is read only from a directory
 * trusted as the cache's is, and only if root or this user wrote it. */
static void tune_file(const char *root) {
  const char *src;
  char path[600], fifo[512], dir[512];
  snprintf(path, sizeof path, "%s/tune-zero", root);
  CHECK(symlink("/dev/zero", path) == 0, "symlink");
  time_t t0 = time(NULL);
  long long x = crossover_from(path, NULL, &src);
  CHECK(time(NULL) - t0 < 10 && !strcmp(src, "fallback default"), "/dev/zero: %lld from %s", x, src);
  x = crossover_from("/dev/zero", NULL, &src);
  CHECK(!strcmp(src, "fallback default"), "/dev/zero itself: %lld from %s", x, src);
  snprintf(fifo, sizeof fifo, "%s/tune-fifo", root);
  mkfifo(fifo, 0600);
  x = crossover_from(fifo, NULL, &src);
  CHECK(time(NULL) - t0 < 10 && !strcmp(src, "fallback default"), "FIFO: %lld from %s", x, src);
  snprintf(path, sizeof path, "%s/tune.txt", root);
  FILE *f = fopen(path, "w");
  fprintf(f, "#");
  for (int i = 0; i < 300; i++) fputc(i < 255 ? '-' : ' ', f);
  fprintf(f, "sm_80 2 4096 777\nsm_80 2 4096 12345\n");
  fclose(f);
  x = crossover_from(path, NULL, &src);
  CHECK(x == 12345 && !strcmp(src, "tuned table"), "long comment read as data: %lld from %s", x,
        src);
  /* the cache directory's tune.txt: only where the cache itself would be */
  snprintf(dir, sizeof dir, "%s/tcache", root);
  mkdir(dir, 0700);
  snprintf(path, sizeof path, "%s/tune.txt", dir);
  write_table(path, 4242, 0600);
  CHECK(crossover_from(NULL, dir, &src) == 4242, "own cache dir's table not read (%s)", src);
  chmod(dir, 0777);
  x = crossover_from(NULL, dir, &src);
  CHECK(!strcmp(src, "fallback default"), "table read from a refused cache dir: %lld", x);
  x = crossover_from(path, NULL, &src);
  CHECK(!strcmp(src, "fallback default"), "KLGEN_TUNE_FILE in a 0777 dir read: %lld", x);
  chmod(dir, 0700);
  write_table(path, 4343, 0666);
  x = crossover_from(path, NULL, &src);
  CHECK(!strcmp(src, "fallback default"), "a table others can write was read: %lld", x);
  if (geteuid() == 0) {
    write_table(path, 4444, 0644);
    CHECK(chown(path, 65534, 65534) == 0, "chown");
    x = crossover_from(path, NULL, &src);
    CHECK(!strcmp(src, "fallback default"), "another user's table was read: %lld", x);
  }
  unsetenv("KLGEN_TUNE_FILE");
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
  const char *base = strrchr(entry, '/') + 1;
  CHECK(strncmp(base, "k.sm_90.", 8) == 0 && strlen(base) == 8 + 32 + 6 &&
            !strcmp(base + 40, ".cubin"), "entry named <name>.<arch>.<key>.cubin: %s", base);
  struct stat ds;
  CHECK(stat(dir, &ds) == 0 && (ds.st_mode & 0777) == 0700, "directory made 0700: %o",
        (unsigned)(ds.st_mode & 0777));
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
  forged(entry, &b1);
  oversized(entry, &b1);
  not_regular(entry, &b1);
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
  /* Relative paths: XDG's are invalid and ignored (HOME's too); a relative
   * KLGEN_CACHE_DIR fails creation (test_api), and is never the cache; a
   * configured one is taken from the working directory, once. */
  setenv("XDG_CACHE_HOME", "rel/xdg", 1);
  setenv("HOME", "/h", 1);
  CHECK(kl_cache_dir(NULL, buf, sizeof buf) && !strcmp(buf, "/h/.cache/klgen"),
        "a relative XDG_CACHE_HOME: %s", buf);
  setenv("HOME", "rel", 1);
  CHECK(kl_cache_dir(NULL, buf, sizeof buf) == 0, "a relative HOME: %s", buf);
  setenv("KLGEN_CACHE_DIR", "rel/klgen", 1);
  CHECK(kl_cache_dir(NULL, buf, sizeof buf) == 0, "a relative KLGEN_CACHE_DIR: %s", buf);
  unsetenv("KLGEN_CACHE_DIR");
  unsetenv("XDG_CACHE_HOME");
  unsetenv("HOME");
  char cwd[400], want[512];
  CHECK(getcwd(cwd, sizeof cwd) != NULL, "getcwd");
  snprintf(want, sizeof want, "%s/rel/cache", cwd);
  CHECK(kl_cache_dir("rel/cache", buf, sizeof buf) && !strcmp(buf, want),
        "a relative cache_dir: %s", buf);
}


int main(void) {
  char root[] = "/tmp/klgen-cache-test.XXXXXX";
  if (!mkdtemp(root)) return 1;
  hit_miss_corrupt(root);
  unwritable();
  concurrent(root);
  untrusted(root);
  char good_dir[512], good_entry[1024];
  snprintf(good_dir, sizeof good_dir, "%s/good", root);
  kl_binary good;
  int hit;
  if (jit(src_a, "sm_90", good_dir, &good, &hit) == 0) {
    CHECK(only_entry(good_dir, good_entry, sizeof good_entry) == 0, "good: one entry");
    ancestors(root, good_dir);
    swapped_link(root, good_entry, &good);
    kl_binary_free(&good);
  }
  tune_file(root);
  resolution();
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", root);
  return check_done();
}
